"""Integrity a tier inherits from the base classes (``frames_own_bytes = False``): a tier that
writes only the four primitives, with no checksum code, still never delivers a damaged,
truncated or misplaced chunk.

* a BlockingChunkTier on a real sqlite3 file passes the whole conformance suite, integrity
  checks included;
* a tier whose ``read_chunk`` hands back a byte changed fails that key (IntegrityError, one
  checksum failure), where a tier trusted with its own bytes reported it loaded;
* the AsyncChunkTier example (examples/async_dict_tier.py, on a dict) and the README's DirTier
  rely on the same framing and pass the suite in test_conformance_builtin.py.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import anyio.lowlevel
import pytest

from asynctier import (
    AsyncChunkTier,
    BlockingChunkTier,
    ChunkNotFoundError,
    IntegrityError,
    OffloadingSpec,
    SecondaryTierFactory,
)
from asynctier.testing import BACKENDS, TierConformance, run_on_backend


class SqliteTier(BlockingChunkTier):
    """One row per chunk in a sqlite3 file: the four primitives and nothing else."""

    frames_own_bytes = False

    def __init__(self, *, path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = path
        # one file may hold several layouts (models): each keeps to its own rows
        self._scope = self.offloading_spec.layout_id.encode() + b"/"
        self._local = threading.local()  # a connection per worker thread
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=OFF")  # a cache: durability="none"
            self._local.db = db
            with self._lock:
                self._all.append(db)
        return db

    def open_medium(self) -> None:
        self._db().execute("CREATE TABLE IF NOT EXISTS chunks (key BLOB PRIMARY KEY, record BLOB NOT NULL)")

    def close_medium(self) -> None:
        with self._lock:
            for db in self._all:
                db.close()
            self._all.clear()

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        self._db().execute("INSERT OR REPLACE INTO chunks (key, record) VALUES (?, ?)", (self._scope + key, data))

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        row = self._db().execute("SELECT record FROM chunks WHERE key = ?", (self._scope + key,)).fetchone()
        if row is None:
            raise ChunkNotFoundError("not stored", key)
        record: bytes = row[0]
        if len(record) != len(out):  # a bad copy: the base class removes it
            raise IntegrityError(f"stored record is {len(record)} bytes, expected {len(out)}", key)
        out[:] = record

    def chunk_exists(self, key: bytes) -> bool:
        return self._db().execute("SELECT 1 FROM chunks WHERE key = ?", (self._scope + key,)).fetchone() is not None

    def delete_chunk(self, key: bytes) -> bool:
        return self._db().execute("DELETE FROM chunks WHERE key = ?", (self._scope + key,)).rowcount > 0


class FlippingSqliteTier(SqliteTier):
    """Hands back every record with one payload byte changed (a medium that corrupts reads)."""

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        super().read_chunk(key, out)
        out[-1] ^= 0x01


class AsyncFlippingDictTier(AsyncChunkTier):
    """The coroutine counterpart: records in a dict, every read handed back with a byte changed."""

    frames_own_bytes = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._records: dict[bytes, bytes] = {}

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        await anyio.lowlevel.checkpoint()
        self._records[key] = bytes(data)

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
        await anyio.lowlevel.checkpoint()
        out[:] = self._records[key]
        out[-1] ^= 0x01

    async def chunk_exists(self, key: bytes) -> bool:
        return key in self._records

    async def delete_chunk(self, key: bytes) -> bool:
        return self._records.pop(key, None) is not None


class TestSqliteTier(TierConformance):
    backends = ("asyncio", "trio")  # uvloop: covered by the memory, native fs, nvme and chain classes

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "SqliteTier", "module_path": __name__, "path": str(tmp_path / "kv.sqlite3")}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"type": "FlippingSqliteTier", "module_path": __name__}, id="blocking"),
        pytest.param({"type": "AsyncFlippingDictTier", "module_path": __name__}, id="coroutine"),
    ],
)
def test_a_read_handed_back_changed_fails_its_key(tmp_path: Path, config: dict[str, Any], backend: str) -> None:
    spec = OffloadingSpec(4096, 4, namespace="integrity/inherited")
    buf = bytearray(b"\xa5" * spec.total_bytes)
    if config["type"] == "FlippingSqliteTier":
        config = {**config, "path": str(tmp_path / "kv.sqlite3")}
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(buf), spec)

    async def check() -> None:
        async with tier:
            assert (await tier.offload([b"k0", b"k1"], [0, 1])).ok
            buf[2 * 4096 :] = bytes(2 * 4096)
            res = await tier.load([b"k0"], [2])
            assert not res.succeeded, "a chunk read back changed was reported loaded"
            assert isinstance(res.failed[b"k0"], IntegrityError), res.failed
            s = tier.stats()
            assert s.failures["checksum"] == 1 and s.loaded == 0
            assert await tier.lookup([b"k0", b"k1"]) == [False, True], "the bad copy was not removed"

    run_on_backend(backend, check)


_SHORT: dict[bytes, bytes] = {}  # the records of the two sloppy tiers below


class SloppyBlockingTier(BlockingChunkTier):
    """Copies what it has and returns no count (allowed), so a truncated record fills part of
    the buffer; one worker thread, so two reads share the thread's record buffer."""

    frames_own_bytes = False

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        _SHORT[key] = bytes(data)

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        rec = _SHORT[key]
        out[: len(rec)] = rec

    def chunk_exists(self, key: bytes) -> bool:
        return key in _SHORT

    def delete_chunk(self, key: bytes) -> bool:
        return _SHORT.pop(key, None) is not None


class SloppyAsyncTier(AsyncChunkTier):
    frames_own_bytes = False

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        _SHORT[key] = bytes(data)

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
        rec = _SHORT[key]
        out[: len(rec)] = rec

    async def chunk_exists(self, key: bytes) -> bool:
        return key in _SHORT

    async def delete_chunk(self, key: bytes) -> bool:
        return _SHORT.pop(key, None) is not None


def sloppy(kind: str, namespace: str, first: bytes, **config: Any) -> tuple[Any, bytearray]:
    """A tier of ``kind`` (one worker thread) over a fresh buffer whose chunk 0 is ``first``
    repeated, with the records of the sloppy tiers cleared."""
    _SHORT.clear()
    spec = OffloadingSpec(4096, 8, namespace=namespace)
    buf = bytearray(spec.total_bytes)
    buf[:4096] = first * (4096 // len(first))
    config = {"type": kind, "module_path": __name__, "max_inflight": 1, **config}
    return SecondaryTierFactory.create_secondary_tier(config, memoryview(buf), spec), buf


def _truncate(key: bytes, keep: int | None = None) -> None:
    """Cut ``key``'s stored record (to ``keep`` bytes; half of it by default) on the medium."""
    rec = _SHORT[key]
    _SHORT[key] = rec[: len(rec) // 2 if keep is None else keep]


@pytest.mark.parametrize("kind", ["SloppyBlockingTier", "SloppyAsyncTier"])
def test_a_short_copy_without_a_count_fails_with_verify_off(kind: str) -> None:
    """verify=False skips the payload checksum; with no count from read_chunk, a short copy was
    then delivered as loaded, its tail another key's record left in the reused buffer."""
    tier, buf = sloppy(kind, "integrity/short", b"A", verify=False)
    buf[4096:8192] = b"B" * 4096

    async def check() -> None:
        async with tier:
            assert (await tier.offload([b"key-a", b"key-b"], [0, 1])).ok
            _truncate(b"key-b", len(_SHORT[b"key-b"]) - 1000)
            assert (await tier.load([b"key-a"], [4])).ok
            res = await tier.load([b"key-b"], [5])
            assert isinstance(res.failed.get(b"key-b"), IntegrityError), res
            assert b"A" not in bytes(buf[5 * 4096 : 6 * 4096])

    run_on_backend("asyncio", check)


def test_a_truncated_copy_without_a_count_fails_every_check_not_every_other() -> None:
    """The reused record buffer's last byte was flipped before each read: two short copies
    in a row flipped it back, so every second ``verify_chunks`` found the truncated copy
    good (the buffer still held the whole record an earlier load had read)."""
    tier, _ = sloppy("SloppyBlockingTier", "integrity/short-again", bytes(range(256)))

    async def check() -> None:
        async with tier:
            assert (await tier.offload([b"key-a"], [0])).ok
            assert (await tier.load([b"key-a"], [1])).ok  # the thread's buffer holds the whole record
            _truncate(b"key-a", len(_SHORT[b"key-a"]) - 100)
            for _ in range(4):
                res = await tier.verify_chunks([b"key-a"])
                assert isinstance(res.failed.get(b"key-a"), IntegrityError), res

    run_on_backend("asyncio", check)


def test_a_truncated_copy_fails_after_a_read_that_raised_too() -> None:
    """The first fix flipped the reused buffer's last byte before each read until a read came
    back without a count: a read that raised (a miss) left it flipped, and the next short copy
    flipped it back onto the whole record the store had framed there. It passed."""
    tier, _ = sloppy("SloppyBlockingTier", "integrity/short-after-miss", bytes(range(256)))

    async def check() -> None:
        async with tier:
            assert (await tier.offload([b"key-k"], [0])).ok  # framed in the thread's buffer
            _truncate(b"key-k")
            assert not (await tier.load([b"key-m"], [1])).ok  # read_chunk raises (a key of the same length)
            for _ in range(3):
                res = await tier.verify_chunks([b"key-k"])
                assert isinstance(res.failed.get(b"key-k"), IntegrityError), res

    run_on_backend("asyncio", check)


class CopyThenRaiseTier(SloppyBlockingTier):
    """Copies the record, then raises (a check after the copy: an expiry, a client error)."""

    raise_after_copy = False

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        super().read_chunk(key, out)
        if self.raise_after_copy:
            raise ChunkNotFoundError("expired after the copy", key)


def test_a_truncated_copy_fails_after_a_read_that_copied_and_raised() -> None:
    """The second fix tracked which whole records the reused buffer held: a read that copied a
    whole record and then raised left one it did not know of, and the next short copy ended
    on it (a re-review: a stale version delivered as loaded, 5 runs of 8 on two threads). Reads
    now get a fresh buffer each."""
    tier, _ = sloppy("CopyThenRaiseTier", "integrity/copy-then-raise", bytes(range(256)))

    async def check() -> None:
        async with tier:
            assert (await tier.offload([b"key-k"], [0])).ok
            tier.raise_after_copy = True
            assert not (await tier.load([b"key-k"], [1])).ok  # the whole record copied, then a raise
            tier.raise_after_copy = False
            _truncate(b"key-k")
            res = await tier.verify_chunks([b"key-k"])
            assert isinstance(res.failed.get(b"key-k"), IntegrityError), res

    run_on_backend("asyncio", check)


def test_a_zero_padded_chunk_cut_short_fails_its_check() -> None:
    """A fresh buffer is zeros: a record cut short in a zero-padded chunk passed (its missing
    bytes were zeros). The buffer now ends in 0xFF."""
    tier, buf = sloppy("SloppyBlockingTier", "integrity/zero-tail", bytes(range(256)))
    buf[1024:4096] = bytes(3072)  # then zeros

    async def check() -> None:
        async with tier:
            assert (await tier.offload([b"key-z"], [0])).ok
            _truncate(b"key-z", len(_SHORT[b"key-z"]) - 3000)
            for _ in range(2):
                res = await tier.verify_chunks([b"key-z"])
                assert isinstance(res.failed.get(b"key-z"), IntegrityError), res

    run_on_backend("asyncio", check)


class AsyncFlippingNamingTier(AsyncFlippingDictTier):
    """Records which hook dropped a bad copy."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dropped: list[tuple[bytes, str]] = []

    async def delete_bad_copy(self, key: bytes, exc: BaseException) -> None:
        self.dropped.append((key, type(exc).__name__))
        await super().delete_bad_copy(key, exc)


def test_an_async_tier_drops_a_bad_copy_through_delete_bad_copy() -> None:
    """AsyncChunkTier called delete_chunk(key) for a bad copy: the documented hook that lets a
    tier delete exactly the copy that failed (not one stored since) was the blocking tiers' only."""
    spec = OffloadingSpec(4096, 4, namespace="integrity/hook")
    buf = bytearray(b"\xa5" * spec.total_bytes)
    tier: Any = SecondaryTierFactory.create_secondary_tier(
        {"type": "AsyncFlippingNamingTier", "module_path": __name__}, memoryview(buf), spec
    )

    async def check() -> None:
        async with tier:
            assert (await tier.offload([b"k0", b"k1"], [0, 1])).ok
            assert isinstance((await tier.load([b"k0"], [2])).failed[b"k0"], IntegrityError)
            assert isinstance((await tier.verify_chunks([b"k1"], remove_bad=True)).failed[b"k1"], IntegrityError)
            assert tier.dropped == [(b"k0", "IntegrityError"), (b"k1", "IntegrityError")]
            assert await tier.lookup([b"k0", b"k1"]) == [False, False]

    run_on_backend("asyncio", check)
