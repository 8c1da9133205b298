"""The native workers' job descriptors as Python sees them: what one job is (:class:`Job`,
laid out as ``struct at_job`` in ``asynctier/engines/_nativeio.h``, and :data:`JobFields`,
the hot path's tuple form), its kinds and limits, and how it ended (:class:`Outcome`).
:mod:`asynctier.engines.native` (the pool) re-exports each name.
"""

from __future__ import annotations

import ctypes
import errno
import struct
from typing import NamedTuple

__all__ = [
    "COMMIT",
    "COMMIT_FDS_MAX",
    "GROUP",
    "GROUP_MAX",
    "JOB_LAYOUT",
    "MODE_CLOSE",
    "MODE_FIX",
    "NAME_MAX",
    "READ",
    "READV",
    "READV_MAX",
    "RECYCLE",
    "RESULT_LAYOUT",
    "SPARE",
    "ST_DATASYNC",
    "ST_DIRSYNC",
    "ST_IO",
    "ST_LINK",
    "ST_OPEN",
    "ST_RENAME",
    "ST_UNLINK",
    "ST_WITHDRAWN",
    "UNLINK",
    "WRITE",
    "WRITEV",
    "Job",
    "JobFields",
    "Outcome",
    "Result",
    "fields",
    "job",
]

#: Job kinds (:attr:`Job.kind`).
READ, WRITE, SPARE, UNLINK, RECYCLE, READV, WRITEV, COMMIT, GROUP = 1, 2, 3, 4, 5, 6, 7, 8, 9
#: Jobs of one :data:`GROUP` at most (:meth:`NativePool.group`). 32, not 16: a call of 32 fs
#: chunks is then one job, not two, and each job costs the loop thread some 850 bytecodes of
#: planning and booking (docs/benchmarks-issue-28.md, thirty-second pass). Equal to _nativeio.h's.
GROUP_MAX = 32
#: Descriptors one :data:`COMMIT` job syncs at most.
COMMIT_FDS_MAX = 64
#: Slots of one :data:`READV` or :data:`WRITEV` job at most (two ``iovec`` each, within the kernel's IOV_MAX).
READV_MAX = 512
#: The step a job failed at (:attr:`Outcome.stage`); 0 when it did not fail.
ST_OPEN, ST_IO, ST_DATASYNC, ST_LINK, ST_DIRSYNC, ST_RENAME, ST_UNLINK = 1, 2, 3, 4, 5, 6, 7
#: A job of a group taken back after its call was cancelled (:meth:`NativePool.take_back`): no I/O.
ST_WITHDRAWN = 9
#: A name field of a descriptor, its terminating NUL included.
NAME_MAX = 256


class Outcome(NamedTuple):
    """How a native job ended."""

    result: int  #: bytes moved, or ``-errno`` of the step that failed
    csum: int  #: xxh3-64 of the payload (reads that got all of it, when asked; writes)
    stage: int  #: ``ST_*`` of the failed step, 0 if none
    info: int  #: writes: 1 if the name was taken already (another writer published first)


#: or'ed into a job's ``mode``: the umask would strip bits of it, fchmod the new file
MODE_FIX = 0x10000
#: or'ed into a ``WRITE`` job's ``mode``: the worker closes its ``fd`` once done, whatever
#: happened (the caller hands the file over: its close is not a system call on the loop thread)
MODE_CLOSE = 0x20000


class Job(ctypes.Structure):
    """One job for the workers, laid out as ``struct at_job`` in ``asynctier/engines/_nativeio.h``.

    ``kind`` (:data:`READ` ...), ``prio`` (0 runs first), the directory ``dfd`` and ``name``
    of the file, open ``flags``; writes: ``fd`` (a file to fill, left open unless ``mode`` has
    ``MODE_CLOSE``; -1: the worker makes one), ``name2`` in ``dfd2`` (publish by renaming that
    name; empty: by linkat),
    ``sync``, ``body_len`` (> 0: the worker fills in the header's checksums), ``mode`` (of a
    file it makes; 0: 0644; ``MODE_FIX`` or'ed in: set after creation too); spares: the
    new name ``name2`` in ``dfd2``; reads: ``hashed``; recycling (:data:`RECYCLE`): the
    victim's file ``name2`` in ``dfd2``, its name ``name3`` in ``dfd`` while it is filled, the
    namespace lock's descriptor ``fd``; reads of a file the caller holds open (an nvme slab):
    ``fd`` >= 0 and the byte offset ``off`` (no name); :data:`READV`, one run of adjacent slots
    of such a file: ``hb`` the address of ``hb_len`` ``struct iovec`` (each slot's header block,
    then its payload), ``buf`` of ``len`` u64 for the payloads' xxh3 (``hashed``), ``len`` the
    slots; its :attr:`Outcome.info` is 1 when the read was whole; :data:`WRITEV`, the same
    for a write (each header's checksums filled in first, over its first ``body_len`` bytes);
    :data:`COMMIT`, a journal write: ``hb`` the address of ``hb_len`` int32 descriptors to
    ``fdatasync`` first, ``buf``/``len`` the bytes written at ``off`` of ``fd``, ``sync`` to
    ``fdatasync`` it after; :data:`GROUP`, several reads (:data:`READ`, :data:`READV`), or
    several writes (:data:`WRITE`, :data:`RECYCLE`, :data:`WRITEV`), in one slot, spread over
    the workers, each under a token of its own (:meth:`NativePool.group`). ``hb``/``hb_len``
    and ``buf``/``len``: the header block and the payload (addresses that stay valid until the
    job ends).
    """

    _fields_ = [
        ("group", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("kind", ctypes.c_int32),
        ("prio", ctypes.c_int32),
        ("dfd", ctypes.c_int32),
        ("flags", ctypes.c_int32),
        ("fd", ctypes.c_int32),
        ("dfd2", ctypes.c_int32),
        ("sync", ctypes.c_int32),
        ("hashed", ctypes.c_int32),
        ("body_len", ctypes.c_int32),
        ("mode", ctypes.c_int32),
        ("hb", ctypes.c_void_p),
        ("hb_len", ctypes.c_size_t),
        ("buf", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("off", ctypes.c_int64),
        ("name", ctypes.c_char * NAME_MAX),
        ("name2", ctypes.c_char * NAME_MAX),
        ("name3", ctypes.c_char * NAME_MAX),
    ]


def job(
    kind: int,
    prio: int,
    dfd: int,
    name: bytes,
    *,
    flags: int = 0,
    fd: int = -1,
    dfd2: int = -1,
    name2: bytes = b"",
    sync: bool = False,
    hb: int = 0,
    hb_len: int = 0,
    buf: int = 0,
    n: int = 0,
    body_len: int = 0,
    hashed: bool = False,
    mode: int = 0,
    off: int = 0,
) -> Job:
    """A :class:`Job`; a name that does not fit the descriptor is refused here (OSError)."""
    if len(name) >= NAME_MAX or len(name2) >= NAME_MAX:
        raise OSError(errno.ENAMETOOLONG, f"native I/O job refused: a name of {NAME_MAX} bytes or more")
    return Job(-1, 0, kind, prio, dfd, flags, fd, dfd2, int(sync), int(hashed), body_len, mode, hb or None,
               hb_len, buf or None, n, off, name, name2, b"")  # fmt: skip


#: A job's fields in :class:`Job`'s order without ``group`` and ``pad`` (the hot path's
#: form: a tuple, packed straight into the pool's submission table).
JobFields = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, bytes, bytes, bytes]
#: :class:`Job` as packed bytes (``group`` and ``pad`` first, then :data:`JobFields`).
JOB_LAYOUT = struct.Struct("<12i4Qq256s256s256s")


def fields(
    kind: int, prio: int, dfd: int, name: bytes, *, flags: int = 0, fd: int = -1, dfd2: int = -1,
    name2: bytes = b"", sync: bool = False, hb: int = 0, hb_len: int = 0, buf: int = 0, n: int = 0,
    body_len: int = 0, hashed: bool = False, mode: int = 0, off: int = 0,
) -> JobFields:  # fmt: skip
    """:func:`job` as :data:`JobFields`, for :meth:`NativePool.submit_many`."""
    if len(name) >= NAME_MAX or len(name2) >= NAME_MAX:
        raise OSError(errno.ENAMETOOLONG, f"native I/O job refused: a name of {NAME_MAX} bytes or more")
    return (kind, prio, dfd, flags, fd, dfd2, int(sync), int(hashed), body_len, mode, hb, hb_len, buf, n, off, name,
            name2, b"")  # fmt: skip


class Result(ctypes.Structure):
    """An :class:`Outcome` as the workers write it (``struct at_res``)."""

    _fields_ = [("result", ctypes.c_int64), ("csum", ctypes.c_uint64), ("stage", ctypes.c_int32),
                ("info", ctypes.c_int32)]  # fmt: skip


#: An :class:`Outcome` as the workers write it.
RESULT_LAYOUT = struct.Struct("<qQii")
