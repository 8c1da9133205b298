"""The nvme tier never destroys what it did not write: a slab of another layout, or a file that
is not a slab, is refused unless ``reformat=True``; a failed open leaves no slab it created."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from nvme_helpers import CHUNK, chunk_at, crash, fill, make, slab_capacity

from asynctier import TierConfigError


def _snapshot(d: Path) -> dict[str, str]:
    """Every file under ``d`` with a digest of its bytes."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}  # fmt: skip


async def _store_one(p: Path, **cfg: Any) -> bytes:
    """A slab at ``p`` holding chunk ``b"kept"``; returns its bytes."""
    tier, view = make(p, **cfg)
    data = fill(view, cfg.get("chunk", CHUNK), 1)
    async with tier:
        assert (await tier.offload([b"kept"], [0])).ok
    return data[0]


async def _still_there(p: Path, data: bytes, **cfg: Any) -> None:
    tier, view = make(p, **cfg)
    async with tier:
        assert (await tier.load([b"kept"], [1])).ok
        assert chunk_at(view, cfg.get("chunk", CHUNK), 1) == data


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"namespace": "another/model"}, "layout digest"),
        ({"chunk": 2 * CHUNK}, "chunk_bytes"),
        ({"slots": 32}, "slots"),
    ],
    ids=["namespace", "chunk_bytes", "capacity"],
)
async def test_a_slab_of_another_layout_is_refused_and_left_as_it_was(
    tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    p = tmp_path / "kv.slab"
    data = await _store_one(p)
    before = await asyncio.to_thread(_snapshot, tmp_path)
    tier, _ = make(p, **change)
    with pytest.raises(TierConfigError) as ei:
        await tier.open()
    msg = str(ei.value)
    assert str(p) in msg and "another layout" in msg and says in msg, msg
    assert "reformat=True" in msg and "another path" in msg, msg
    assert not tier.is_open
    assert await asyncio.to_thread(_snapshot, tmp_path) == before  # not a byte changed, index included
    await _still_there(p, data)


async def test_reformat_true_formats_a_slab_of_another_layout(tmp_path: Path) -> None:
    p = tmp_path / "kv.slab"
    await _store_one(p)
    tier, view = make(p, namespace="another/model", reformat=True)
    async with tier:
        assert await tier.lookup([b"kept"]) == [False] and tier.stats().stored_chunks == 0
        fill(view, CHUNK, 2)
        assert (await tier.offload([b"new"], [0])).ok
    tier, _ = make(p, namespace="another/model")  # now a slab of this layout: reused, no flag needed
    async with tier:
        assert await tier.lookup([b"new"]) == [True]


async def test_reformat_true_reuses_a_slab_of_this_layout(tmp_path: Path) -> None:
    """reformat allows formatting over something else; it does not wipe a slab it can use."""
    p = tmp_path / "kv.slab"
    data = await _store_one(p)
    await _still_there(p, data, reformat=True)


@pytest.mark.parametrize("size", [1, 3000, 300_000])
async def test_a_file_that_is_not_a_slab_is_never_written(tmp_path: Path, size: int) -> None:
    p = tmp_path / "precious.db"
    content = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    p.write_bytes(content)
    tier, _ = make(p)
    with pytest.raises(TierConfigError) as ei:
        await tier.open()
    msg = str(ei.value)
    assert str(p) in msg and "not an nvme slab" in msg and "reformat=True" in msg, msg
    assert p.read_bytes() == content
    assert not await asyncio.to_thread(lambda: list(tmp_path.glob("precious.db.atidx*")))  # nor an index


async def test_reformat_true_takes_over_a_file_that_is_not_a_slab(tmp_path: Path) -> None:
    p = tmp_path / "scratch.bin"
    p.write_bytes(b"\x01" * 5000)
    tier, view = make(p, reformat=True)
    data = fill(view, CHUNK, 3)
    async with tier:
        assert (await tier.offload([b"k"], [0])).ok
    tier, view = make(p)
    async with tier:
        assert (await tier.load([b"k"], [1])).ok and chunk_at(view, CHUNK, 1) == data[0]


async def test_an_empty_file_is_taken_as_a_new_slab(tmp_path: Path) -> None:
    p = tmp_path / "kv.slab"
    p.touch()
    tier, view = make(p)
    fill(view, CHUNK, 4)
    async with tier:
        assert (await tier.offload([b"k"], [0])).ok


async def test_a_stripe_that_is_not_a_slab_refuses_the_set_and_the_new_stripe_goes(tmp_path: Path) -> None:
    new, foreign = tmp_path / "s0.slab", tmp_path / "s1.slab"
    foreign.write_bytes(b"\x07" * 8192)
    tier, _ = make([new, foreign], slots=8)
    with pytest.raises(TierConfigError, match=r"s1\.slab.*not an nvme slab"):
        await tier.open()
    assert not new.exists()  # created by this open, which failed: removed
    assert foreign.read_bytes() == b"\x07" * 8192


def test_reformat_must_be_a_bool(tmp_path: Path) -> None:
    for bad in ("yes", 1, None):
        with pytest.raises(TierConfigError, match="reformat"):
            make(tmp_path / "kv.slab", reformat=bad)


async def test_a_failed_open_leaves_no_slab_it_created(tmp_path: Path) -> None:
    """Too small for one slot: the open fails after creating the file; the file goes."""
    p = tmp_path / "new.slab"
    tier, _ = make(p, slots=None, capacity_bytes=CHUNK)  # (a chunk, without its header block)
    with pytest.raises(TierConfigError, match="no room"):
        await tier.open()
    assert not p.exists()


@pytest.mark.parametrize("existed", [False, True], ids=["created", "empty-before"])
async def test_a_failed_recovery_leaves_no_freshly_formatted_slab(tmp_path: Path, existed: bool) -> None:
    """The index directory cannot be made (a file holds its name): the slab had been formatted
    by then. A slab this open created is removed; an empty file it was given is empty again."""
    p = tmp_path / "kv.slab"
    if existed:
        p.touch()
    blocker = tmp_path / "idx"
    blocker.write_bytes(b"not a directory")
    tier, _ = make(p, index_dir=str(blocker / "sub"))
    with pytest.raises(TierConfigError, match="is a file; give a directory"):
        await tier.open()
    assert not tier.is_open
    if existed:
        assert p.stat().st_size == 0
    else:
        assert not p.exists()
    assert blocker.read_bytes() == b"not a directory"
    blocker.unlink()
    tier, view = make(p, index_dir=str(blocker))  # the same path works once the cause is gone
    fill(view, CHUNK, 5)
    async with tier:
        assert (await tier.offload([b"k"], [0])).ok


async def test_capacity_is_not_applied_to_a_refused_file(tmp_path: Path) -> None:
    """A file refused is not resized either (the old open extended it before looking)."""
    p = tmp_path / "small.bin"
    p.write_bytes(b"z" * 4096)
    tier, _ = make(p, slots=64)
    with pytest.raises(TierConfigError):
        await tier.open()
    assert p.stat().st_size == 4096
    assert slab_capacity(64) > 4096


async def test_stripes_of_different_slab_sets_are_refused(tmp_path: Path) -> None:
    a, b, c, d = (tmp_path / f"{n}.slab" for n in "abcd")
    for pair in ([a, b], [c, d]):
        tier, view = make(pair, slots=8)
        fill(view, CHUNK, 6)
        async with tier:
            assert (await tier.offload([b"k"], [0])).ok
    before = await asyncio.to_thread(_snapshot, tmp_path)
    tier, _ = make([a, d], slots=8)
    with pytest.raises(TierConfigError, match="different slab sets"):
        await tier.open()
    assert await asyncio.to_thread(_snapshot, tmp_path) == before


async def test_an_incomplete_slab_set_of_this_layout_is_formatted_afresh(tmp_path: Path) -> None:
    """A stripe gone (its file deleted): the rest is a slab of this very layout, no foreign
    data; the set starts over."""
    a, b = tmp_path / "a.slab", tmp_path / "b.slab"
    tier, view = make([a, b], slots=8)
    fill(view, CHUNK, 7)
    async with tier:
        assert (await tier.offload([b"k"], [0])).ok
    b.unlink()
    tier, _ = make([a, b], slots=8)
    async with tier:
        assert await tier.lookup([b"k"]) == [False] and tier.stats().stored_chunks == 0


async def test_a_slab_whose_superblock_is_torn_is_formatted_afresh(tmp_path: Path) -> None:
    """The slab magic with a bad checksum is a superblock of ours torn by a crash: the set
    starts over (its chunks are lost, never misread) rather than refusing to open."""
    p = tmp_path / "kv.slab"
    await _store_one(p)
    with open(p, "r+b") as f:  # noqa: ASYNC230 - a one-byte edit
        f.seek(40)  # the epoch
        f.write(b"\xee")
    tier, _ = make(p)
    async with tier:
        assert await tier.lookup([b"kept"]) == [False] and tier.stats().stored_chunks == 0


async def test_a_slab_cut_to_its_superblock_opens_and_is_sized_again(tmp_path: Path) -> None:
    """What a format killed before sizing leaves (superblocks are written first): a slab of
    ours, reused and extended, not a file of zeros taken for foreign data."""
    p = tmp_path / "kv.slab"
    tier, _ = make(p, slots=8)
    async with tier:
        pass
    os.truncate(p, 4096)
    tier, view = make(p, slots=8)
    fill(view, CHUNK, 8)
    async with tier:
        assert (await tier.offload([b"k"], [0])).ok
    assert p.stat().st_size == slab_capacity(8)


async def test_a_lost_index_is_counted_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint that fails its checksum (or no index at all for a slab set of ours): the
    chunks it listed cannot be served. That was one log line; it is counted now, for fsck
    and for monitoring, and said as a loss."""
    p = tmp_path / "kv.slab"
    tier, view = make(p)
    fill(view, CHUNK, 4)
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    with open(tmp_path / "kv.slab.atidx.ckpt", "r+b") as f:  # noqa: ASYNC230 (a test's setup)
        f.seek(60)
        f.write(os.urandom(64))
    tier, _ = make(p)
    async with tier:
        assert tier.stats().extra["index_lost_at_open"] == 1
        assert await tier.lookup([b"a", b"b"]) == [False, False]
    assert "the chunks it listed are lost" in caplog.text
    tier, _ = make(p)  # its own index since: nothing lost at this open
    async with tier:
        assert tier.stats().extra.get("index_lost_at_open", 0) == 0


async def test_a_lost_index_is_lost_once_even_if_the_repairing_open_crashes(tmp_path: Path) -> None:
    """The open that accepted the loss wrote no checkpoint until its close (or 65,536 records):
    killed before, every later open said the index lost again and fsck called the set damaged,
    with every chunk since held and served."""
    p = tmp_path / "kv.slab"
    tier, view = make(p)
    fill(view, CHUNK, 4)
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    os.unlink(tmp_path / "kv.slab.atidx.ckpt")
    tier, view = make(p)
    await tier.open()
    assert tier.stats().extra["index_lost_at_open"] == 1
    assert (await tier.offload([b"c"], [2])).ok
    crash(tier)
    tier, _ = make(p, create=False)  # as fsck opens it
    async with tier:
        assert tier.stats().extra.get("index_lost_at_open", 0) == 0
        assert await tier.lookup([b"c"]) == [True]


@pytest.mark.parametrize("what", ["missing", "empty"])
async def test_create_false_makes_nothing(tmp_path: Path, what: str) -> None:
    p = tmp_path / "kv.slab"
    if what == "empty":
        p.touch()
    tier, _ = make(p, create=False)
    with pytest.raises(TierConfigError, match="create=False"):
        await tier.open()
    assert (p.exists() and p.stat().st_size == 0) if what == "empty" else not p.exists()
    assert sorted(q.name for q in tmp_path.iterdir()) == (["kv.slab"] if what == "empty" else [])  # noqa: ASYNC240


async def test_two_slabs_of_one_file_name_never_share_an_index_dir(tmp_path: Path) -> None:
    """Slabs a/kv.slab and b/kv.slab with one index_dir: their index files have the same
    names. A new set there deleted the other's checkpoint and journal (all its chunks lost,
    durability="fsync" or not), and a set of ours took another's checkpoint for torn. Both
    are refused now, and the index there is left as it was."""
    idx = tmp_path / "idx"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    tier, view = make(tmp_path / "a" / "kv.slab", index_dir=str(idx))
    fill(view, CHUNK, 4)
    async with tier:
        assert (await tier.offload([b"a0", b"a1"], [0, 1])).ok
    before = {p.name: p.read_bytes() for p in idx.iterdir()}
    tier, _ = make(tmp_path / "b" / "kv.slab", index_dir=str(idx))
    with pytest.raises(TierConfigError, match=r"already holds index files named kv\.slab\.atidx"):
        await tier.open()
    assert not (tmp_path / "b" / "kv.slab").exists()  # (the slab this open made is removed)
    # a set of its own elsewhere, then pointed at the other's index_dir
    tier, _ = make(tmp_path / "b" / "kv.slab", index_dir=str(tmp_path / "idx-b"))
    async with tier:
        assert (await tier.offload([b"b0"], [2])).ok
    tier, _ = make(tmp_path / "b" / "kv.slab", index_dir=str(idx))
    with pytest.raises(TierConfigError, match="is another slab set's"):
        await tier.open()
    assert {p.name: p.read_bytes() for p in idx.iterdir()} == before
    tier, _ = make(tmp_path / "a" / "kv.slab", index_dir=str(idx))
    async with tier:
        assert await tier.lookup([b"a0", b"a1"]) == [True, True]


async def _open_failing_after_recovery(tier: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Open ``tier`` with a step after recovery failing (a full disk): the open fails."""

    def full(*_: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(tier), "_native_run_slots", full)
    with pytest.raises(OSError):
        await tier.open()
    monkeypatch.undo()


async def test_a_failed_first_open_leaves_no_index_that_blocks_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new set's open failed after its journal's first generation was made (a full disk):
    the slab went, the generation stayed, and every later open took it for another set's."""
    p = tmp_path / "kv.slab"
    await _open_failing_after_recovery(make(p)[0], monkeypatch)
    assert sorted(q.name for q in tmp_path.iterdir()) == []  # noqa: ASYNC240
    tier, view = make(p)
    fill(view, CHUNK, 1)
    async with tier:
        assert (await tier.offload([b"a"], [0])).ok


def test_a_reformat_killed_before_its_index_is_written_reopens(tmp_path: Path) -> None:
    """A set formatted over one of its own (reformat=True) and killed once its superblock was
    written, before recovery ran: the old set's checkpoint stayed and was taken for another
    set's at every later open. The old index goes before the new superblock now."""
    import subprocess
    import sys
    import textwrap

    p = tmp_path / "kv.slab"

    async def first() -> None:
        tier, view = make(p, namespace="layout/a")
        fill(view, CHUNK, 1)
        async with tier:
            assert (await tier.offload([b"a"], [0])).ok

    asyncio.run(first())
    child = textwrap.dedent(
        f"""
        import asyncio, os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from nvme_helpers import make
        from asynctier.tiers.nvme.catalog import Catalog
        Catalog.recover = lambda *a, **k: os._exit(3)  # killed here: the superblock is written
        tier, _ = make({str(p)!r}, namespace="layout/b", reformat=True)
        asyncio.run(tier.open())
        """
    )
    assert subprocess.run([sys.executable, "-c", child], timeout=120).returncode == 3

    async def again() -> None:
        tier, view = make(p, namespace="layout/b")
        fill(view, CHUNK, 2)
        async with tier:
            assert (await tier.offload([b"b"], [0])).ok

    asyncio.run(again())


async def test_a_failed_reformat_leaves_a_set_that_reopens_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reformat over a set of another layout that failed after recovery began: its new
    superblock stays (the slab was neither made nor empty), and so must the journal it began,
    or every later open reads the index as lost."""
    p = tmp_path / "kv.slab"
    tier, view = make(p, namespace="layout/a")
    fill(view, CHUNK, 1)
    async with tier:
        assert (await tier.offload([b"a"], [0])).ok
    await _open_failing_after_recovery(make(p, namespace="layout/b", reformat=True)[0], monkeypatch)
    tier, _ = make(p, namespace="layout/b", create=False)  # (fsck's open: a lost index is refused)
    async with tier:
        assert tier.stats().extra.get("index_lost_at_open", 0) == 0
