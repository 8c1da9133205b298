"""The C twins that pack an nvme job's runs (asynctier/_speedups_nvme_runs.c) and a fs group's
jobs (_speedups_groups.c) write what they checked, whatever Python code their arguments run:
an int-like's ``__index__``, an int subclass's ``__hash__`` and a dict key's ``__eq__`` can
change the caller's lists midway, yet a call is refused or packs the values it checked, never
writing past a buffer or reading freed memory. And the offsets and addresses they compute do
not wrap: what the references refuse (a 64-bit field past 2**64 - 1) the twins refuse too,
nothing written.

The first tests run their case in a fresh interpreter (``PYTHONMALLOC=debug``: a heap overrun
or a freed item read there ends it), so a crash fails the test instead of pytest."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from asynctier.engines.descriptors import JOB_LAYOUT
from asynctier.tiers.fs import bulk as fs_bulk
from asynctier.tiers.nvme import bulk
from asynctier.tiers.nvme.slab import slot_runs

PRELUDE = """
from asynctier.engines.descriptors import JOB_LAYOUT, RESULT_LAYOUT
from asynctier.engines.speedups import speedups

sp = speedups()
assert sp is not None


class Collide:
    # a dict key that hashes as position 1: a lookup of 1 compares it first, running hook
    # once armed (after the dict is made: making it compares them too)
    def __init__(self, hook):
        self.hook, self.armed = hook, False

    def __hash__(self):
        return 1

    def __eq__(self, other):
        if self.armed:
            self.hook()
        return False


def armed(d):
    for k in d:
        if isinstance(k, Collide):
            k.armed = True
    return d
"""
U64 = (1 << 64) - 1


def _outcome(script: str) -> str:
    """The last line ``script`` prints, run after PRELUDE in a fresh interpreter, which must
    exit cleanly."""
    env = dict(os.environ, PYTHONMALLOC="debug")
    code = PRELUDE + textwrap.dedent(script)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout.splitlines()[-1]


def test_a_stripe_read_through_index_is_refused_before_a_load_run_is_packed(speedups: Any) -> None:
    """pack_slot_reads: a stripe that is an int-like (its ``__index__`` passed the check, the
    write pass read it another way: fds[-1]) is refused with TypeError, nothing written."""
    out = _outcome("""
        class Stripe:
            def __index__(self):
                return 0

        table, iovs = bytearray(JOB_LAYOUT.size * 4), bytearray(64 * 8)
        try:
            sp.pack_slot_reads(table, 0, 1, [[(0, 1, Stripe(), 0)]], [0], [7, 9, 11], 0, 512, iovs, 0, 0, 1 << 30,
                               65536, 1)
            print("packed")
        except TypeError:
            print("refused", any(table) or any(iovs))
    """)
    assert out == "refused False"


@pytest.mark.parametrize("change", ["grow", "shrink"])
def test_slots_changed_by_a_slots_index_are_refused_by_slot_runs(speedups: Any, change: str) -> None:
    """slot_runs: a slot whose ``__index__`` grows the dict being walked (the runs were sized
    for its items before: a heap overrun) or shrinks it (runs of uninitialised entries) is
    refused with TypeError."""
    out = _outcome(f"""
        slots = {{}}

        class Slot:
            def __index__(self):
                if {change!r} == "grow":
                    slots.update({{k: (k,) for k in range(1000, 1400)}})
                else:
                    for k in [k for k in slots if k != 0]:
                        del slots[k]
                return 0

        slots[0] = (Slot(),)
        slots.update({{k: (k,) for k in range(1, 6)}})
        try:
            print(sp.slot_runs(slots, 1, 0, 4096, 8))
        except TypeError:
            print("refused")
    """)
    assert out == "refused"


def test_a_store_run_grown_by_a_stripes_index_is_refused_not_written_past(speedups: Any) -> None:
    """pack_slot_writes: run 1's stripe, an int-like, grows run 0 (checked already) by 200
    chunks; the call is refused with TypeError and the buffers, sized for 2 chunks, untouched."""
    out = _outcome("""
        runs = None

        class Stripe:
            def __index__(self):
                runs[0].extend([(0, 1, 0, 0)] * 200)
                return 0

        runs = [[(0, 1, 0, 0)], [(1, 2, Stripe(), 4096)]]
        table, hbs, iovs = bytearray(JOB_LAYOUT.size * 2), bytearray(2 * 512), bytearray(2 * 32)
        try:
            sp.pack_slot_writes(table, 0, 1, runs, [b"k" * 16, b"j" * 16], [0, 1], {0: (1, 5), 1: (2, 6)},
                                [7, 9, 11], hbs, 0, 512, iovs, 0, 0, 1 << 30, 65536, b"d" * 16)
            print("packed")
        except TypeError:
            print("refused", any(table) or any(hbs) or any(iovs))
    """)
    assert out == "refused False"


def test_a_store_run_grown_by_a_slot_lookup_packs_what_was_checked(speedups: Any) -> None:
    """pack_slot_writes, all ints exact: looking up position 1 in slots runs a colliding key's
    ``__eq__``, which grows run 0 (checked already) by 200 chunks. The runs as checked are
    packed, byte for byte as from an unchanged copy; nothing is written past the buffers."""
    out = _outcome("""
        def pack(runs, slots):
            table, hbs, iovs = bytearray(JOB_LAYOUT.size * 2), bytearray(2 * 512), bytearray(2 * 32)
            sp.pack_slot_writes(table, 0, 1, runs, [b"k" * 16, b"j" * 16], [0, 1], slots, [7, 9, 11], hbs, 0, 512,
                                iovs, 0, 0, 1 << 30, 65536, b"d" * 16)
            return table, hbs, iovs

        runs = [[(0, 1, 0, 0)], [(1, 2, 0, 4096)]]
        slots = armed({0: (1, 5), Collide(lambda: runs[0].extend([(0, 1, 0, 0)] * 200)): (0, 0), 1: (2, 6)})
        got = pack(runs, slots)
        print(len(runs[0]), got == pack([[(0, 1, 0, 0)], [(1, 2, 0, 4096)]], {0: (1, 5), 1: (2, 6)}))
    """)
    assert out == "201 True"


def test_positions_hashing_python_code_are_refused_by_runs_written(speedups: Any) -> None:
    """runs_written: a position that is an int subclass whose ``__hash__`` empties its run
    (the items being read freed) is refused with TypeError, csums and written unchanged."""
    out = _outcome("""
        import ctypes

        run = None

        class P(int):
            def __hash__(self):
                run.clear()
                return int.__hash__(self)

        run = [(P(0), 1, 0, 0), (P(1), 2, 0, 4096), (P(2), 3, 0, 8192)]
        res = bytearray(RESULT_LAYOUT.size)
        RESULT_LAYOUT.pack_into(res, 0, 3 * 4096, 0, 0, 1)
        csums, written = {}, []
        try:
            sp.runs_written(memoryview(res), 0, [run], (ctypes.c_uint64 * 3)(1, 2, 3), csums, written)
            print("read")
        except TypeError:
            print("refused", csums, written)
    """)
    assert out == "refused {} []"


def test_a_run_emptied_while_its_checksums_are_stored_is_read_as_it_was(speedups: Any) -> None:
    """runs_written, all ints exact: storing position 1's checksum runs a colliding key's
    ``__eq__`` in csums, which empties the run; its three chunks are read all the same (the
    run as it was when the call began), no freed item read."""
    out = _outcome("""
        import ctypes

        run = [(0, 1, 0, 0), (1, 2, 0, 4096), (2, 3, 0, 8192)]
        res = bytearray(RESULT_LAYOUT.size)
        RESULT_LAYOUT.pack_into(res, 0, 3 * 4096, 0, 0, 1)
        csums, written = armed({Collide(run.clear): 0}), []
        bad = sp.runs_written(memoryview(res), 0, [run], (ctypes.c_uint64 * 3)(11, 12, 13), csums, written)
        print(bad, sorted(v for k, v in csums.items() if type(k) is int), written, run)
    """)
    assert out == "[] [11, 12, 13] [0, 1, 2] []"


def test_positions_hashing_python_code_are_refused_by_runs_loaded(speedups: Any) -> None:
    """runs_loaded: an int-subclass position whose ``__hash__`` replaces a checked item with one
    at position 10**7 is refused with TypeError, bad and unpins unchanged."""
    out = _outcome("""
        import ctypes

        runs = None

        class P(int):
            def __hash__(self):
                runs[0][0] = (10**7, 1, 0, 0)
                return int.__hash__(self)

        runs = [[(0, 1, 0, 0)], [(P(1), 2, 0, 4096)]]
        res, hbs = bytearray(RESULT_LAYOUT.size * 2), bytearray(2 * 512)
        bad, unpins = [], []
        try:
            sp.runs_loaded(memoryview(res), 0, runs, [b"a" * 8, b"b" * 8], {0: (1, 5, 7), 1: (2, 6, 8)},
                           memoryview(hbs), 512, (ctypes.c_uint64 * 2)(), 65536, b"d" * 16, False, bad, unpins)
            print("read")
        except TypeError:
            print("refused", bad, unpins)
    """)
    assert out == "refused [] []"


def test_a_load_run_changed_by_a_found_lookup_is_checked_as_it_was(speedups: Any) -> None:
    """runs_loaded, all ints exact: looking up position 1 in found runs a colliding key's
    ``__eq__``, which replaces run 0's item (checked already) with one at position 10**7. The
    runs are read as checked: both chunks bad (their runs not read whole), both slots unpinned."""
    out = _outcome("""
        import ctypes

        runs = [[(0, 1, 0, 0)], [(1, 2, 0, 4096)]]

        def change():
            runs[0][0] = (10**7, 9, 0, 0)

        found = armed({0: (1, 5, 7), Collide(change): (0, 0, 0), 1: (2, 6, 8)})
        res, hbs = bytearray(RESULT_LAYOUT.size * 2), bytearray(2 * 512)
        bad, unpins = [], []
        good = sp.runs_loaded(memoryview(res), 0, runs, [b"a" * 8, b"b" * 8], found, memoryview(hbs), 512,
                              (ctypes.c_uint64 * 2)(), 65536, b"d" * 16, False, bad, unpins)
        print(good, bad, unpins)
    """)
    assert out == "0 [0, 1] [1, 2]"


def test_a_fd_read_through_index_is_refused_before_a_group_store_is_packed(speedups: Any) -> None:
    """pack_writes: a fd that is an int-like (its ``__index__`` moved a checked block past the
    header blocks' end) is refused with TypeError, nothing written."""
    out = _outcome("""
        blocks = [0, 1]

        class Fd:
            def __index__(self):
                blocks[0] = 100000
                return -1

        table, hbs = bytearray(JOB_LAYOUT.size * 2), bytearray(2 * 512)
        try:
            sp.pack_writes(table, 0, 1, [b"a" * 8, b"b" * 8], [0, 1], blocks, [-1, Fd()], [3] * 256, 0, 0, 0, hbs, 0,
                           512, 1 << 30, 65536, b"d" * 16)
            print("packed")
        except TypeError:
            print("refused", any(table) or any(hbs))
    """)
    assert out == "refused False"


@pytest.mark.parametrize(
    ("slots", "nstripes", "data_off", "size"),
    [
        ({0: (4,), 1: (5,)}, 1, 0, 1 << 62),  # slot // nstripes * slot_size past 2**63 - 1
        ({0: (0,), 1: (1,)}, 1, (1 << 63) - 1, 1),  # data_off + that
        ({0: (6,)}, 3, 1 << 62, 1 << 61),
    ],
)
def test_slot_offsets_past_int64_are_refused(
    speedups: Any, slots: dict[int, tuple[int]], nstripes: int, data_off: int, size: int
) -> None:
    """slot_runs: an offset the reference computes past 2**63 - 1 (an int64 in the descriptor)
    is refused with OverflowError, not wrapped; offsets just below it are cut as the reference
    cuts them (adjacent to the last byte)."""
    with pytest.raises(OverflowError, match="past 2\\*\\*63 - 1"):
        speedups.slot_runs(slots, nstripes, data_off, size, 8)
    near = {0: (0,), 1: (1,), 2: (2,)}
    for args in [(near, 1, (1 << 63) - 1 - 2 * 4096, 4096, 8), (near, 1, 0, ((1 << 63) - 1) // 2, 8)]:
        assert speedups.slot_runs(*args) == slot_runs(*args)


def _nvme_writes(view_addr: int, hb_addr: int, iov_addr: int, sums_addr: int) -> list[Any]:
    runs = [[(0, 1, 0, 0)], [(1, 2, 1, 4096)]]
    return [bytearray(JOB_LAYOUT.size * 2), 0, 1, runs, [b"k" * 8, b"j" * 8], [0, 1], {0: (1, 5), 1: (2, 6)},
            [7, 9], bytearray(2 * 512), hb_addr, 512, bytearray(2 * 32), iov_addr, sums_addr, view_addr, 65536,
            b"d" * 16]  # fmt: skip


def _nvme_reads(view_addr: int, hb_addr: int, iov_addr: int, sums_addr: int) -> list[Any]:
    runs = [[(0, 1, 0, 0)], [(1, 2, 1, 4096)]]
    return [bytearray(JOB_LAYOUT.size * 2), 0, 1, runs, [0, 1], [7, 9], hb_addr, 512, bytearray(2 * 32), iov_addr,
            sums_addr, view_addr, 65536, 1]  # fmt: skip


def _fs_reads(view_addr: int, hb_addr: int) -> list[Any]:
    return [bytearray(JOB_LAYOUT.size * 2), 0, 1, [b"a", b"b"], [0, 1], [0, 1], [3] * 256, 0, 0, hb_addr, 512,
            view_addr, 65536]  # fmt: skip


def _fs_writes(view_addr: int, hb_addr: int) -> list[Any]:
    return [bytearray(JOB_LAYOUT.size * 2), 0, 1, [b"a", b"b"], [0, 1], [0, 1], [-1, -1], [3] * 256, 0, 0, 0o644,
            bytearray(2 * 512), hb_addr, 512, view_addr, 65536, bytes(16)]  # fmt: skip


def _fs_recycles(view_addr: int, hb_addr: int) -> list[Any]:
    return [bytearray(JOB_LAYOUT.size * 2), 0, 1, [b"a", b"b"], [b"v", b"w"], ["t1", "t2"], [0, 1], [0, 1],
            [3] * 256, 0, 9, 0, 0o600, bytearray(2 * 512), hb_addr, 512, view_addr, 65536, bytes(16)]  # fmt: skip


def _buffers(args: list[Any]) -> list[bytes]:
    return [bytes(a) for a in args if isinstance(a, bytearray)]


def test_group_keys_are_exact_bytes(speedups: Any) -> None:
    """pack_reads, pack_writes and pack_recycles take keys (and victims) of exact bytes only,
    as the other twins do: a bytes subclass is refused with TypeError, nothing written."""

    class Key(bytes):
        pass

    for name, args, at in [("pack_reads", _fs_reads(0, 0), 3), ("pack_writes", _fs_writes(0, 0), 3),
                           ("pack_recycles", _fs_recycles(0, 0), 4)]:  # fmt: skip
        args[at] = [args[at][0], Key(b"b")]  # a key (a victim for pack_recycles)
        before = _buffers(args)
        with pytest.raises(TypeError, match="a key is bytes, not Key"):
            getattr(speedups, name)(*args)
        assert _buffers(args) == before, name


# (name, its reference's module, the arguments: their last address is one past 2**64 - 1, or
# exactly 2**64 - 1 where last is U64)
ADDRESS_CASES: list[tuple[str, Any, Any]] = [
    ("pack_slot_writes", bulk, lambda last: _nvme_writes(last - 65536, 0, 0, 0)),  # payload of cid 1
    ("pack_slot_writes", bulk, lambda last: _nvme_writes(0, last - 512, 0, 0)),  # header block 1
    ("pack_slot_writes", bulk, lambda last: _nvme_writes(0, 0, last - 32, 0)),  # run 1's first iovec
    ("pack_slot_writes", bulk, lambda last: _nvme_writes(0, 0, 0, last - 8)),  # run 1's first checksum
    ("pack_slot_reads", bulk, lambda last: _nvme_reads(last - 65536, 0, 0, 0)),
    ("pack_slot_reads", bulk, lambda last: _nvme_reads(0, last - 512, 0, 0)),
    ("pack_slot_reads", bulk, lambda last: _nvme_reads(0, 0, last - 32, 0)),
    ("pack_slot_reads", bulk, lambda last: _nvme_reads(0, 0, 0, last - 8)),
    ("pack_reads", fs_bulk, lambda last: _fs_reads(last - 65536, 0)),
    ("pack_reads", fs_bulk, lambda last: _fs_reads(0, last - 512)),
    ("pack_writes", fs_bulk, lambda last: _fs_writes(last - 65536, 0)),
    ("pack_writes", fs_bulk, lambda last: _fs_writes(0, last - 512)),
    ("pack_recycles", fs_bulk, lambda last: _fs_recycles(last - 65536, 0)),
    ("pack_recycles", fs_bulk, lambda last: _fs_recycles(0, last - 512)),
]


@pytest.mark.parametrize(("name", "reference", "make"), ADDRESS_CASES)
def test_addresses_past_2_64_are_refused_not_wrapped(speedups: Any, name: str, reference: Any, make: Any) -> None:
    """An address a packer computes (base + index * stride) one past 2**64 - 1, which the
    reference refuses (struct.error: its 64-bit field), is refused with OverflowError, nothing
    written; at exactly 2**64 - 1 the twin packs what the reference packs."""
    with pytest.raises(struct.error):
        getattr(reference, name)(*make(U64 + 1))
    args = make(U64 + 1)
    before = _buffers(args)
    with pytest.raises(OverflowError, match="past 2\\*\\*64 - 1"):
        getattr(speedups, name)(*args)
    assert _buffers(args) == before
    got, want = make(U64), make(U64)
    getattr(speedups, name)(*got)
    getattr(reference, name)(*want)
    assert _buffers(got) == _buffers(want)


@pytest.mark.parametrize("fn", ["pack_slot_writes", "pack_slot_reads", "runs_written", "runs_loaded"])
def test_a_buffer_that_cannot_be_taken_leaves_the_others_released(speedups: Any, fn: str) -> None:
    """The last buffer argument cannot be taken (read-only where it is written, or no buffer at
    all): the call raises, and the buffers taken before it are released (a bytearray the call
    still held could not be resized)."""
    held = [bytearray(4096) for _ in range(2)]
    digest = bytes(16)
    args: tuple[Any, ...]
    if fn == "pack_slot_writes":  # table, hbs taken; iovs read-only
        args = (held[0], 0, 0, [], [], [], {}, [], held[1], 0, 4096, bytes(64), 0, 0, 0, 4096, digest)
    elif fn == "pack_slot_reads":  # table taken; iovs read-only
        held = held[:1]
        args = (held[0], 0, 0, [], [], [], 0, 4096, bytes(64), 0, 0, 0, 4096, 0)
    elif fn == "runs_written":  # res taken; sums not a buffer
        held = held[:1]
        args = (held[0], 0, [], object(), {}, [])
    else:  # res, hbs taken; sums not a buffer
        args = (held[0], 0, [], [], {}, held[1], 4096, object(), 4096, digest, False, [], [])
    with pytest.raises((TypeError, BufferError)):
        getattr(speedups, fn)(*args)
    for b in held:
        b.extend(b"x")  # BufferError while an export is left
