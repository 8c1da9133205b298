"""Checks of integrity: a chunk damaged on the medium (a flipped byte, a truncated copy, two
chunks' bytes swapped under their keys) fails its key on load and is never delivered as good.

The damage is done by the hooks :meth:`~asynctier.testing.TierConformance.corrupt_stored` and
:meth:`~asynctier.testing.TierConformance.swap_stored`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from ..errors import IntegrityError, failure_kind
from .backends import Backend
from .harness import Harness, new_keys
from .suite import SuiteBase

__all__ = ["IntegrityChecks"]


class IntegrityChecks(SuiteBase):
    async def _damaged_keys_fail(
        self, h: Harness, damage: Callable[[list[bytes]], Awaitable[list[bytes]]], what: str
    ) -> None:
        """Store a few chunks, ``damage(keys)`` some (it returns which), and load them all."""
        n = min(8, self.num_chunks // 2)
        assert n >= 3, f"the integrity checks need num_chunks >= 6; this class has {self.num_chunks}"
        data = h.fill(21)
        keys = new_keys(n, "intact")
        assert (await h.tier.offload(keys, list(range(n)))).ok
        bad = await damage(keys)
        good = [k for k in keys if k not in bad]
        checksum_failures = h.tier.stats().failures["checksum"]
        h.zero()
        slots = [n + i for i in range(n)]
        res = await h.tier.load(keys, slots)
        for k in bad:
            assert k not in res.succeeded, f"a {what} chunk was loaded as good: its slot holds wrong bytes"
            assert isinstance(res.failed.get(k), IntegrityError), (
                f"a {what} chunk failed with {res.failed.get(k)!r}; expected an IntegrityError"
            )
        assert res.succeeded == good, f"intact chunks failed beside the {what} one: {res.failed}"
        for i, k in enumerate(keys):
            if k in good:
                assert h.chunk(slots[i]) == data[i], f"intact chunk {i} loaded wrong bytes"
        counted = h.tier.stats().failures["checksum"] - checksum_failures
        assert counted >= len(bad), f"{len(bad)} {what} chunk(s) failed but stats counted {counted} checksum failures"
        # the bad copy is gone: not reported stored, not loaded later, and the key can be stored again
        assert await h.tier.lookup(bad) == [False] * len(bad), f"a {what} chunk is still reported stored"
        again = await h.tier.load(bad, slots[: len(bad)])
        assert not again.succeeded, f"a {what} chunk was loaded as good on a second load"
        kinds = {failure_kind(e) for e in again.failed.values()}
        assert kinds <= {"not_found", "checksum"}, f"a second load of a {what} chunk failed with {again.failed}"
        ids = [keys.index(k) for k in bad]
        h.refill(data)
        assert (await h.tier.offload(bad, ids)).ok
        assert (await h.tier.load(bad, slots[: len(bad)])).ok
        for slot, i in zip(slots, ids):
            assert h.chunk(slot) == data[i], f"a {what} chunk stored again loads wrong bytes"

    def _corruption_check(self, tmp_path: Path, backend: Backend, how: str, what: str) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:

                async def damage(keys: list[bytes]) -> list[bytes]:
                    bad = keys[len(keys) // 2]
                    await self.corrupt_stored(h, bad, how)
                    return [bad]

                await self._damaged_keys_fail(h, damage, what)

        self.run(backend, check)

    def _swap_check(self, tmp_path: Path, backend: Backend, verify: bool) -> None:
        async def check() -> None:
            h = self.make(tmp_path, verify=verify)
            async with h.tier:

                async def damage(keys: list[bytes]) -> list[bytes]:
                    a, b = keys[1], keys[-1]  # keys[0] stays intact
                    await self.swap_stored(h, a, b)
                    return [a, b]

                await self._damaged_keys_fail(h, damage, "swapped" if verify else "swapped (verify=False)")

        self.run(backend, check)

    def test_flipped_byte_fails_its_key(self, tmp_path: Path, backend: Backend) -> None:
        self._corruption_check(tmp_path, backend, "flip", "corrupted")

    def test_truncated_chunk_fails_its_key(self, tmp_path: Path, backend: Backend) -> None:
        self._corruption_check(tmp_path, backend, "truncate", "truncated")

    def test_swapped_chunks_fail_their_keys(self, tmp_path: Path, backend: Backend) -> None:
        self._swap_check(tmp_path, backend, verify=True)

    def test_swapped_chunks_fail_their_keys_without_verify(self, tmp_path: Path, backend: Backend) -> None:
        """``verify=False`` skips the payload checksum, never the check of whose chunk it is."""
        self._swap_check(tmp_path, backend, verify=False)
