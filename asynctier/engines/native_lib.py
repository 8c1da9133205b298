"""The native workers' shared library (``asynctier/engines/_nativeio``) and the system xxHash
library they hash with, found, checked and typed once for :mod:`.native`."""

from __future__ import annotations

import ctypes
import importlib.machinery
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .descriptors import GROUP_MAX, JOB_LAYOUT, Job

__all__ = ["XXHASH_LIBS", "find_library", "find_xxh3"]

#: Where the system's xxHash library is looked for (dlopen's search path).
XXHASH_LIBS = ("libxxhash.so.0", "libxxhash.so")


def _signatures() -> dict[str, tuple[list[Any], Any]]:
    """The library's calls: argument and result types."""
    vp, c_int, c_size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    return {
        "at_new": ([c_int, c_int, c_int, vp, c_int], vp),
        "at_eventfd": ([vp], c_int),
        "at_results": ([vp], vp),
        "at_group_results": ([vp], vp),
        "at_hash": ([vp, vp, c_size], ctypes.c_uint64),
        "at_submit": ([vp, c_int, ctypes.POINTER(Job)], c_int),
        "at_submit_many": ([vp, c_int, vp, vp], c_int),
        "at_set_low_water": ([vp, c_int], None),
        "at_cancel": ([vp, c_int], c_int),
        "at_withdraw": ([vp, c_int], c_int),
        "at_reap": ([vp, vp, c_int], c_int),
        "at_clear": ([vp], None),
        "at_acquire": ([vp, c_int], c_int),
        "at_try_acquire": ([vp, c_int], c_int),
        "at_release": ([vp], None),
        "at_try_release": ([vp], c_int),
        "at_counts": ([vp, vp], None),
        "at_shutdown": ([vp], None),
        "at_free": ([vp], None),
        "at_group_max": ([], c_int),
        "at_job_size": ([], c_size),
    }


#: The calls that never wait, made through the second handle without giving the GIL up:
#: submitting and reaping, which take no lock the workers share (the rings), emptying the
#: eventfd (nonblocking), and a slow path's token taken or given back while the workers'
#: lock is free (else -EAGAIN, and the caller waits without the GIL), which then costs no GIL
#: hand-off.
_KEEP_GIL = (
    "at_submit",
    "at_submit_many",
    "at_reap",
    "at_clear",
    "at_set_low_water",
    "at_try_acquire",
    "at_try_release",
)


def _typed(lib: Any, names: Iterable[str]) -> Any:
    sigs = _signatures()
    for name in names:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = sigs[name]
    return lib


def find_library() -> tuple[ctypes.CDLL | None, ctypes.PyDLL | None, str | None]:
    """The workers' library with its calls typed, and one more handle on it whose calls keep
    the GIL (the calls of :data:`_KEEP_GIL`); or None and why not."""
    if not sys.platform.startswith("linux"):
        return None, None, f"native I/O workers are built for Linux only (this is {sys.platform})"
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_nativeio{suffix}"
        if path.exists():
            break
    else:
        return (
            None,
            None,
            (
                "asynctier/engines/_nativeio was not built (install asynctier from source with a C compiler: "
                "pip install -e . or pip install .)"
            ),
        )
    rebuild = "rebuild it from this source (pip install -e . or pip install .)"
    try:
        lib = _typed(ctypes.CDLL(str(path), use_errno=True), _signatures())  # at_new reports through errno
        gil_lib = _typed(ctypes.PyDLL(str(path)), _KEEP_GIL)
    except OSError as e:
        return None, None, f"cannot load {path.name}: {e}"
    except AttributeError as e:  # a call this source makes is missing: a library from an older version
        return None, None, f"{path.name} is from another version of asynctier ({e}): {rebuild}"
    built = (lib.at_group_max(), lib.at_job_size())
    if built != (GROUP_MAX, JOB_LAYOUT.size):
        # its tables' layout is not the one this source reads and writes: refused, not corrupted
        return (
            None,
            None,
            (
                f"{path.name} was built for another layout (groups of {built[0]}, {built[1]}-byte jobs; this source: "
                f"{GROUP_MAX}, {JOB_LAYOUT.size}): {rebuild}"
            ),
        )
    return lib, gil_lib, None


def find_xxh3(names: tuple[str, ...] = XXHASH_LIBS) -> tuple[int | None, str | None]:
    """The address of ``XXH3_64bits`` in the system's xxHash library, checked against the
    :mod:`xxhash` module on a sample; or None and why not."""
    import xxhash

    sample = bytes(range(256)) * 33
    tried = []
    for name in names:
        try:
            fn = ctypes.CDLL(name).XXH3_64bits
        except (OSError, AttributeError) as e:
            tried.append(f"{name}: {e}")
            continue
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        fn.restype = ctypes.c_uint64
        if fn(sample, len(sample)) != xxhash.xxh3_64_intdigest(sample):
            tried.append(f"{name}: XXH3_64bits disagrees with the xxhash module")
            continue
        return ctypes.cast(fn, ctypes.c_void_p).value, None
    return None, (
        "the native workers hash with the system xxHash library (libxxhash.so.0; Debian and Ubuntu: "
        f"apt-get install libxxhash0), which was not found ({'; '.join(tried)})"
    )
