from collections.abc import Iterable, Mapping, Sequence
from typing import Any

def b32(key: bytes) -> str: ...
def use_xxh3(address: int) -> None: ...
def untrack(index: list[Any] | dict[Any, Any]) -> None: ...
def name_of(key: bytes) -> tuple[int, bytes]: ...
def pack_header_into(block: memoryview, used: int, key: bytes, payload_len: int, layout_digest: bytes) -> int: ...
def header_matches(
    buf: bytes | bytearray | memoryview, key: bytes, payload_len: int, csum: int, layout_digest: bytes, seq: int
) -> bool: ...
def pack_reads(
    table: bytearray,
    offset: int,
    prio: int,
    keys: Sequence[bytes],
    cids: Sequence[int],
    blocks: Sequence[int],
    dfds: Sequence[int],
    flags: int,
    hashed: int,
    hb_addr: int,
    hb_len: int,
    view_addr: int,
    n: int,
) -> None: ...
def reads_failed(
    res: memoryview,
    offset: int,
    keys: Sequence[bytes],
    blocks: Sequence[int],
    hbs: memoryview,
    hb_len: int,
    n: int,
    layout_digest: bytes,
) -> list[int]: ...
def pack_writes(
    table: bytearray,
    offset: int,
    prio: int,
    keys: Sequence[bytes],
    cids: Sequence[int],
    blocks: Sequence[int],
    fds: Sequence[int],
    dfds: Sequence[int],
    flags: int,
    sync: int,
    mode: int,
    hbs: memoryview,
    hb_addr: int,
    hb_len: int,
    view_addr: int,
    n: int,
    layout_digest: bytes,
) -> None: ...
def pack_recycles(
    table: bytearray,
    offset: int,
    prio: int,
    keys: Sequence[bytes],
    victims: Sequence[bytes],
    temps: Sequence[str],
    cids: Sequence[int],
    blocks: Sequence[int],
    dfds: Sequence[int],
    flags: int,
    lock_fd: int,
    sync: int,
    mode: int,
    hbs: memoryview,
    hb_addr: int,
    hb_len: int,
    view_addr: int,
    n: int,
    layout_digest: bytes,
) -> None: ...
def jobs_failed(res: memoryview, offset: int, m: int) -> list[int]: ...
def split_plain(
    keys: Sequence[bytes], cids: Sequence[int], reserved: Sequence[object], tmpfile: bool, recycle: bool
) -> tuple[list[int], list[int], list[int], list[bytes], list[bytes], list[int], list[bytes], list[int]]: ...
def pack_records(typ: int, items: Sequence[tuple[bytes, int, int, int]]) -> list[bytes]: ...

# an nvme store job's steps (index: a tiers.nvme.slots.SlotIndex)
_Record = tuple[bytes, int, int, int]
_Run = list[tuple[int, int, int, int]]

def evict_oldest(index: object, n: int, more: int) -> list[_Record]: ...
def release_many(index: object, slots: Sequence[int], first_ticket: int) -> None: ...
def take_free(index: object, n: int, pick_max: int) -> list[int]: ...
def pack_keys(keys: list[bytes], start: int, stop: int) -> tuple[bytes, bytes]: ...
def begin_writes(index: object, keys: Sequence[bytes], taken: Sequence[int], first_seq: int) -> int: ...
def end_writes(
    index: object,
    keys: Sequence[bytes],
    written: Sequence[int],
    slots: dict[int, tuple[int, int]],
    csums: dict[int, int],
) -> list[tuple[bytes, int, int, int]]: ...
def put_published(
    index: object, recs: Sequence[tuple[bytes, int, int, int]], first_ticket: int
) -> list[tuple[int, int]]: ...
def pack_slot_writes(
    table: bytearray,
    offset: int,
    prio: int,
    runs: Sequence[_Run],
    keys: Sequence[bytes],
    cids: Sequence[int],
    slots: dict[int, tuple[int, int]],
    fds: Sequence[int],
    hbs: Any,
    hb_addr: int,
    hb_len: int,
    iovs: Any,
    iov_addr: int,
    sums_addr: int,
    view_addr: int,
    n: int,
    layout_digest: bytes,
) -> None: ...
def pin_many(index: object, keys: Sequence[bytes]) -> tuple[dict[int, tuple[int, int, int]], list[int]]: ...
def unpin_many(index: object, slots: Sequence[int]) -> None: ...
def slot_runs(
    slots: Mapping[int, tuple[int, ...]], nstripes: int, data_off: int, slot_size: int, limit: int
) -> list[_Run]: ...
def runs_written(
    res: Any,
    offset: int,
    runs: Sequence[_Run],
    sums: Any,
    csums: dict[int, int],
    written: list[int],
) -> list[int]: ...

# the LRU index's plain reservations and commits (index: an asynctier.lru.LRUIndex)
def lru_reserve_plain(
    index: Any, entry_type: Any, keys: list[bytes], start: int, nbytes: int, out: list[Any]
) -> int: ...
def lru_commit_all(index: Any, keys: Iterable[bytes]) -> None: ...
def lru_pin_all(index: Any, keys: Iterable[bytes]) -> list[Any]: ...
def lru_unpin_all(index: Any, entry_type: Any, keys: Iterable[bytes], entries: Iterable[object]) -> None: ...
def lru_removed_all(index: Any, keys: Iterable[bytes]) -> None: ...

class LRUEntry:
    """An LRU index's entry (asynctier.lru._PyEntry's twin)."""

    nbytes: int
    committed: bool
    writers: int
    pins: int
    def __init__(self, nbytes: int, committed: bool, writers: int = 0) -> None: ...

# a call's arguments, the plain case checked in one call (asynctier.core.validation)
def plain_keys(keys: list[Any], max_len: int) -> bool: ...
def plain_ids(ids: list[Any], n: int) -> bool: ...
