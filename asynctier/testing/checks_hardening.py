"""Checks against hostile input: something other than a chunk at a chunk's name, a credential
in the config, and config values of the wrong type.

They run once per class, on asyncio (or the class's first backend): they are about the tier,
not the event loop. Three hooks of the test class feed them:
:meth:`~asynctier.testing.TierConformance.chunk_path` (where a stored chunk lives, for a tier
that keeps chunks under file names), :meth:`~asynctier.testing.TierConformance.credential`
(a config carrying a secret) and :attr:`~asynctier.testing.TierConformance.skip_parameters`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import traceback
from pathlib import Path

import anyio.to_thread
import pytest

from ..errors import TierConfigError
from ..factory import SecondaryTierFactory, accepted_parameters
from .backends import Backend
from .harness import Harness, new_keys
from .suite import SuiteBase, once_per_class

__all__ = ["HardeningChecks", "wrong_values"]

#: How long a load may stay blocked on a FIFO before the check opens the FIFO's other end to
#: set it free and fails (a bound on a hang, not a timing: a correct tier never blocks).
HANG_BOUND_S = 30.0
_REFUSALS = (TierConfigError, TypeError, ValueError)


def wrong_values(annotation: object) -> list[object]:
    """Values of a type a parameter annotated ``annotation`` must refuse: always an
    ``object()``; besides, by the annotation's type names, the near misses that used to pass
    (an int for a bool, a bool for a number, a float for an int, ...)."""
    names = set(re.findall(r"[A-Za-z_]+", annotation if isinstance(annotation, str) else repr(annotation)))
    out: list[object] = [object()]
    if "Any" in names or "object" in names:
        return out
    number = names & {"int", "float"}
    if "bool" in names and not number:
        out += [1, 0]
    if number and "bool" not in names:
        out.append(True)
    if "int" in names and not names & {"float", "bool"}:
        out.append(2.0)
    if "float" in names and not names & {"str", "bool"}:
        out.append("1")
    if names & {"str", "PathLike", "Literal"} and not number and "bool" not in names:
        out.append(1)  # a number for a string, a path or a choice of strings
    if names & {"Mapping", "dict"}:
        out.append([("key", "value")])
    return out


class _Captured(logging.Handler):
    """Every log record, formatted with its traceback, while attached to the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(self.format(record))


def _all_text(exc: BaseException) -> list[str]:
    """What a caller or a log can show of an exception: str, repr and the whole traceback."""
    return [str(exc), repr(exc), "".join(traceback.format_exception(exc))]


class HardeningChecks(SuiteBase):
    # -- a FIFO at a chunk's name ---------------------------------------------------------------
    @once_per_class
    def test_a_fifo_at_a_chunks_name_fails_the_key_and_never_blocks(self, tmp_path: Path, backend: Backend) -> None:
        """A FIFO where a stored chunk's file was: opening it for reading blocks until a writer
        comes, so a tier that opens it without O_NONBLOCK (or does not check it is a regular
        file) hangs the load and its worker forever."""
        if type(self).chunk_path is SuiteBase.chunk_path:
            pytest.skip(f"{type(self).__name__} gives no chunk_path hook: the tier keeps no chunk under a file name")

        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(41)
                keys = new_keys(3, "fifo")
                assert (await h.tier.offload(keys, [0, 1, 2])).ok
                path = await anyio.to_thread.run_sync(self._fifo_in_place_of, h, keys[1])
                done = threading.Event()
                rescued: list[bool] = []
                guard = threading.Thread(target=_free_readers, args=(path, done, rescued), daemon=True)
                guard.start()
                h.zero()
                try:
                    res = await h.tier.load(keys, [3, 4, 5])
                finally:
                    done.set()
                    await anyio.to_thread.run_sync(guard.join)
                assert not rescued, f"the load blocked on the FIFO at {path} until the check opened its other end"
                assert keys[1] in res.failed, "a FIFO at a chunk's name was loaded as the chunk"
                assert res.succeeded == [keys[0], keys[2]], f"intact chunks failed beside the FIFO: {res.failed}"
                assert h.chunk(3) == data[0] and h.chunk(5) == data[2]

        self.run(backend, check)

    def _fifo_in_place_of(self, h: Harness, key: bytes) -> str | os.PathLike[str]:
        """Replace the file of ``key``'s stored chunk with a FIFO; its path."""
        path = self.chunk_path(h, key)
        assert path is not None and os.path.lexists(path), f"chunk_path gave {path!r}: no file there"
        os.unlink(path)
        os.mkfifo(path, 0o600)
        return path

    # -- a credential never shown ---------------------------------------------------------------
    @once_per_class
    def test_a_credential_never_shows_in_reprs_errors_stats_or_logs(self, tmp_path: Path, backend: Backend) -> None:
        """Build, open, store, load (a missing key too) and close a tier whose config carries a
        secret (:meth:`credential`); the secret appears in no text the tier produces: repr,
        str, stats, every error (str, repr, traceback) and every log record."""
        given = self.credential(tmp_path)
        if given is None:
            pytest.skip(f"{type(self).__name__} names no parameter carrying a credential (credential hook)")
        overrides, secret = given
        assert len(secret) >= 8, "credential() must return a secret of 8 characters or more"

        async def check(texts: list[str]) -> None:
            try:
                h = self.make(tmp_path, **overrides)
            except Exception as e:  # refused at construction: its message must not show it either
                texts += _all_text(e)
                return
            texts += [repr(h.tier), str(h.tier)]
            try:
                await h.tier.open()
            except Exception as e:
                texts += _all_text(e)
                return
            try:
                h.fill(43)
                keys = new_keys(2, "secret")
                for err in (await h.tier.offload(keys, [0, 1])).failed.values():
                    texts += _all_text(err)
                res = await h.tier.load([*keys, *new_keys(1, "absent")], [2, 3, 4])
                for err in res.failed.values():
                    texts += _all_text(err)
                texts += [repr(h.tier.stats()), repr(h.tier)]
            finally:
                await h.tier.aclose()

        texts: list[str] = []
        logs = _Captured()
        root = logging.getLogger()
        level = root.level
        root.addHandler(logs)
        root.setLevel(logging.DEBUG)
        try:
            self.run(backend, check, texts)
        finally:
            root.removeHandler(logs)
            root.setLevel(level)
        for text in [*texts, *logs.texts]:
            assert secret not in text, f"the credential shows in: {text[:2000]}"

    # -- wrong-typed parameters -------------------------------------------------------------------
    @once_per_class
    def test_every_parameter_refuses_a_value_of_the_wrong_type(self, tmp_path: Path, backend: Backend) -> None:
        """Each parameter the factory accepts (``asynctier info`` lists them), given a value of
        the wrong type (:func:`wrong_values`), is refused with TierConfigError, TypeError or
        ValueError at construction or at ``open()``, never taken to mean something else."""
        config = self.tier_config(tmp_path)
        params = accepted_parameters(SecondaryTierFactory.get_tier_class(config))
        unknown = set(self.skip_parameters) - set(params)
        assert not unknown, f"skip_parameters names parameters the tier does not take: {sorted(unknown)}"

        async def check(problems: list[str]) -> None:
            for name, p in params.items():
                if name in self.skip_parameters:
                    continue
                for bad in wrong_values(p.annotation):
                    what = await self._refusal(tmp_path / f"wrong-{name}", name, bad)
                    if what is not None:
                        problems.append(f"{name}={bad!r}: {what}")

        problems: list[str] = []
        self.run(backend, check, problems)
        assert not problems, "values of the wrong type were not refused:\n" + "\n".join(problems)

    async def _refusal(self, where: Path, name: str, bad: object) -> str | None:
        """None if ``name=bad`` is refused as it should be; else what happened instead."""
        try:
            h = self.make(where, **{name: bad})
        except _REFUSALS:
            return None
        except Exception as e:
            return f"construction raised {type(e).__name__}: {e}"
        try:
            await h.tier.open()
        except _REFUSALS:
            return None
        except Exception as e:
            return f"open() raised {type(e).__name__}: {e}"
        await h.tier.aclose()
        return "accepted"


def _free_readers(path: str | os.PathLike[str], done: threading.Event, rescued: list[bool]) -> None:
    """Wait for ``done``; past :data:`HANG_BOUND_S`, open the FIFO's writing end (and close
    it) until ``done``, so a reader blocked in open() gets end-of-file and the check ends."""
    if done.wait(HANG_BOUND_S):
        return
    rescued.append(True)
    while not done.wait(0.05):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader at this instant
