"""Chunk headers, key tokens, and torch buffers seen as memoryviews."""

from __future__ import annotations

import base64
import os
import random
import subprocess
import sys

import pytest

from asynctier import IntegrityError, OffloadingSpec, SecondaryTierFactory
from asynctier.integrity import ChunkHeader, checksum, header_matches, key_token

DIGEST = OffloadingSpec(4096, 1).layout_digest


def header(key: bytes = b"key", payload: bytes = b"x" * 100) -> ChunkHeader:
    return ChunkHeader(key=key, payload_len=len(payload), checksum=checksum(payload), layout_digest=DIGEST, seq=7)


def test_header_round_trip_and_verify() -> None:
    h = header()
    packed = h.pack()
    assert len(packed) == h.size == ChunkHeader.packed_size(3)
    back = ChunkHeader.unpack(packed + b"trailing payload", key=b"key")
    assert back == h
    back.verify(b"x" * 100, layout_digest=DIGEST, payload_len=100)


@pytest.mark.parametrize("pos", [0, 5, 9, 20, 40, 53, 60])
def test_any_flipped_header_byte_is_caught(pos: int) -> None:
    packed = bytearray(header().pack())
    packed[pos % len(packed)] ^= 0x01
    with pytest.raises(IntegrityError):
        ChunkHeader.unpack(packed, key=b"key")


def test_truncated_foreign_and_mismatched_headers() -> None:
    packed = header().pack()
    with pytest.raises(IntegrityError, match="truncated"):
        ChunkHeader.unpack(packed[:10])
    with pytest.raises(IntegrityError, match="truncated"):
        ChunkHeader.unpack(packed[:-3])
    with pytest.raises(IntegrityError, match="another key"):
        ChunkHeader.unpack(packed, key=b"other")
    h = header()
    with pytest.raises(IntegrityError, match="another layout"):
        h.verify(b"x" * 100, layout_digest=bytes(16), payload_len=100)
    with pytest.raises(IntegrityError, match="expected 99"):
        h.verify(b"x" * 100, layout_digest=DIGEST, payload_len=99)
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        h.verify(b"y" * 100, layout_digest=DIGEST, payload_len=100)


def test_key_tokens_are_safe_names_and_distinct() -> None:
    keys = [b"/", b"..", b"\x00", b"A", b"a", bytes(range(96)), bytes(range(97)), b"\xff" * 1024]
    tokens = [key_token(k) for k in keys]
    assert len(set(tokens)) == len(tokens)
    for t in tokens:
        assert t and len(t) <= 160 and "/" not in t and t not in (".", "..")
        assert t == t.lower()  # safe on case-insensitive file systems
    assert key_token(b"A") != key_token(b"a")


def test_key_tokens_are_rfc4648_base32_of_every_length() -> None:
    """The fast encoder names the files: it must agree with the standard one byte for byte
    (a tier written by an earlier version, or read by a tool, finds its files by these)."""
    rng = random.Random(7)
    for n in range(97):
        for key in (bytes(n), b"\xff" * n, bytes(rng.getrandbits(8) for _ in range(n)), os.urandom(n)):
            assert key_token(key) == base64.b32encode(key).decode().rstrip("=").lower(), key


def test_the_c_and_python_base32_encoders_agree() -> None:
    """The C twin (asynctier/_speedups.c, where it was built) names the same files as the
    Python encoder that is its fallback; neither takes anything but bytes."""
    from asynctier import integrity

    speedups = pytest.importorskip("asynctier._speedups")
    assert integrity._b32_fast is speedups.b32  # key_token uses it where it is built
    rng = random.Random(11)
    for n in range(200):
        for key in (bytes(n), b"\xff" * n, bytes(rng.getrandbits(8) for _ in range(n))):
            assert speedups.b32(key) == integrity._b32(key) == base64.b32encode(key).decode().rstrip("=").lower()
    for bad in ("key", bytearray(b"key"), memoryview(b"key"), None):
        with pytest.raises(TypeError, match="takes bytes"):
            speedups.b32(bad)


def test_header_matches_accepts_exactly_the_expected_header() -> None:
    payload = os.urandom(300)
    good = ChunkHeader(b"key", 300, checksum(payload), DIGEST).pack() + bytes(200)  # padded, as in a slot
    assert header_matches(good, b"key", 300, checksum(payload), DIGEST)
    assert header_matches(memoryview(good), b"key", 300, checksum(payload), DIGEST)
    assert not header_matches(good, b"kez", 300, checksum(payload), DIGEST)
    assert not header_matches(good, b"key", 301, checksum(payload), DIGEST)
    assert not header_matches(good, b"key", 300, checksum(payload) ^ 1, DIGEST)
    assert not header_matches(good, b"key", 300, checksum(payload), bytes(16))
    assert not header_matches(good[:20], b"key", 300, checksum(payload), DIGEST)
    for pos in range(ChunkHeader.packed_size(3)):
        bad = bytearray(good)
        bad[pos] ^= 0x10
        assert not header_matches(bad, b"key", 300, checksum(payload), DIGEST)
    # the sequence number is part of what is expected
    assert not header_matches(header(payload=payload).pack(), b"key", 300, checksum(payload), DIGEST)
    assert header_matches(header(payload=payload).pack(), b"key", 300, checksum(payload), DIGEST, seq=7)


def test_torch_buffer_is_shared_not_copied() -> None:
    torch = pytest.importorskip("torch")
    from asynctier.torch_interop import allocate_primary, tensor_view

    spec = OffloadingSpec(1024, 4)
    t, view = allocate_primary(spec, pin_memory=False)
    assert view.nbytes == spec.total_bytes and not view.readonly
    from asynctier.posix_io import buffer_address

    assert t.data_ptr() % 4096 == 0 and buffer_address(view) == t.data_ptr()  # page-aligned, same memory
    view[0:4] = b"\x01\x02\x03\x04"
    assert t[:4].tolist() == [1, 2, 3, 4]
    bf = torch.zeros(2, 512, dtype=torch.bfloat16)
    bv = tensor_view(bf)
    assert bv.nbytes == 2048
    bv[0:2] = b"\x80\x3f"  # bf16 1.0, little-endian
    assert bf[0, 0].item() == 1.0
    with pytest.raises(TypeError, match="contiguous"):
        tensor_view(torch.zeros(4, 4).t())


async def test_torch_buffer_round_trip_through_a_tier() -> None:
    pytest.importorskip("torch")
    from asynctier.torch_interop import allocate_primary

    spec = OffloadingSpec(4096, 8)
    t, view = allocate_primary(spec)
    t.random_(0, 256)
    original = bytes(view)
    async with SecondaryTierFactory.create_secondary_tier({"type": "memory"}, view, spec) as tier:
        keys = [b"k%d" % i for i in range(8)]
        assert (await tier.offload(keys, range(8))).ok
        t.zero_()
        assert (await tier.load(keys, list(range(8)))).ok
    assert bytes(view) == original


def test_torch_path_needs_no_numpy() -> None:
    """The README's torch line with torch alone installed: numpy is made unimportable in a
    fresh interpreter and allocate_primary still gives a shared view (it crashed with
    'Numpy is not available')."""
    pytest.importorskip("torch")
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "from asynctier import OffloadingSpec\n"
        "from asynctier.torch_interop import allocate_primary\n"
        "t, v = allocate_primary(OffloadingSpec(4096, 2), pin_memory=False)\n"
        "v[0:2] = b'\\x07\\x09'\n"
        "assert t[:2].tolist() == [7, 9], t[:2]\n"
        "assert 'numpy' not in sys.modules or sys.modules['numpy'] is None\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
