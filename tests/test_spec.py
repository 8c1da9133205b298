"""OffloadingSpec: validation, digest, zero-copy slicing."""

from __future__ import annotations

import array

import pytest

from asynctier import OffloadingSpec, TierConfigError
from asynctier.spec import as_byte_view


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"chunk_bytes": 0, "num_chunks": 4}, "chunk_bytes must be a positive int"),
        ({"chunk_bytes": -1, "num_chunks": 4}, "chunk_bytes"),
        ({"chunk_bytes": 4096, "num_chunks": 0}, "num_chunks"),
        ({"chunk_bytes": 4096.0, "num_chunks": 4}, "chunk_bytes"),
        ({"chunk_bytes": True, "num_chunks": 4}, "chunk_bytes"),
        ({"chunk_bytes": 4096, "num_chunks": 4, "namespace": ""}, "namespace"),
        ({"chunk_bytes": 4096, "num_chunks": 4, "namespace": "a\nb"}, "printable"),
        ({"chunk_bytes": 4096, "num_chunks": 4, "namespace": "x" * 300}, "at most 256"),
    ],
)
def test_bad_spec_says_what_is_accepted(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(TierConfigError, match=needle):
        OffloadingSpec(**kwargs)  # type: ignore[arg-type]
    assert issubclass(TierConfigError, ValueError)


def test_integers_of_other_kinds_are_taken_as_int() -> None:
    """Sizes often come from numpy or torch (``tensor.numel()``, ``np.prod(shape)``)."""
    np = pytest.importorskip("numpy")
    spec = OffloadingSpec(np.int64(4096), np.uint32(8), namespace="m")
    assert type(spec.chunk_bytes) is int and type(spec.num_chunks) is int
    assert spec == OffloadingSpec(4096, 8, namespace="m")
    assert spec.layout_digest == OffloadingSpec(4096, 8, namespace="m").layout_digest
    with pytest.raises(TierConfigError, match="chunk_bytes must be a positive int"):
        OffloadingSpec(np.float64(4096), 8)  # type: ignore[arg-type]
    with pytest.raises(TierConfigError, match="num_chunks must be a positive int"):
        OffloadingSpec(4096, np.int64(-1))


def test_total_bytes_and_digest_scope() -> None:
    a = OffloadingSpec(4096, 8, namespace="m/bf16")
    assert a.total_bytes == 4096 * 8
    assert len(a.layout_digest) == 16 and len(a.layout_id) == 32
    assert a.layout_digest == OffloadingSpec(4096, 99, namespace="m/bf16").layout_digest  # count is not layout
    assert a.layout_digest != OffloadingSpec(8192, 8, namespace="m/bf16").layout_digest
    assert a.layout_digest != OffloadingSpec(4096, 8, namespace="m/fp8").layout_digest


def test_chunk_view_is_zero_copy() -> None:
    spec = OffloadingSpec(16, 4)
    buf = bytearray(64)
    view = spec.check_view(memoryview(buf))
    c2 = spec.chunk_view(view, 2)
    c2[:] = b"z" * 16
    assert buf[32:48] == b"z" * 16
    assert c2.obj is buf


def test_check_view_rejects_unusable_buffers() -> None:
    spec = OffloadingSpec(16, 4)
    with pytest.raises(ValueError, match="holds 63 bytes; this spec needs at least 64"):
        spec.check_view(memoryview(bytearray(63)))
    with pytest.raises(TypeError, match="C-contiguous"):
        spec.check_view(memoryview(bytearray(256))[::2])
    with pytest.raises(TypeError, match="read-only"):
        spec.check_view(memoryview(bytes(64)), writable=True)
    with pytest.raises(TypeError, match="buffer protocol"):
        spec.check_view("not a buffer")  # type: ignore[arg-type]
    assert spec.check_view(memoryview(bytes(64)), writable=False).readonly


def test_typed_buffers_are_cast_to_bytes() -> None:
    arr = array.array("i", range(16))  # 64 bytes of int32
    view = as_byte_view(memoryview(arr))
    assert view.format == "B" and view.nbytes == 64 and view.ndim == 1


@pytest.mark.parametrize(("cid", "exc"), [(-1, IndexError), (4, IndexError), (1.5, TypeError), (True, TypeError)])
def test_chunk_id_checks(cid: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        OffloadingSpec(16, 4).check_chunk_id(cid)
