"""The valkey tier's wiring: chunks as string values on a Valkey or Redis server (or cluster),
moved in pipelined batches through the circuit breaker, each value checked before one byte of
it reaches the caller's slot."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar

import anyio
import sniffio

from asynctier import AsyncChunkTier, ChunkError, ChunkNotFoundError, IntegrityError
from asynctier.core import MAX_KEY_BYTES
from asynctier.core.backend import current_loop
from asynctier.core.breaker import Breaker
from asynctier.core.ops import Op
from asynctier.core.validation import check_keys, integer, positive_int, seconds
from asynctier.errors import TierConfigError, TierStateError, TierUnavailableError
from asynctier.stats import TierStats

from .bridge import LoopThread
from .client import Client, ClientOptions, Command, ValkeyCluster, build_client, run_pipeline, scan_names, unreachable
from .errors import ValkeyIOError, map_client_error
from .format import check_key_prefix, checksums, frame, name_prefix, stored, unframe_into
from .redact import Scrubber
from .url import check_ca_file, parse_url, unusable_ca_file

__all__ = ["ValkeyTier"]

log = logging.getLogger(__name__)

_MIB = 1 << 20
#: Keys per pipeline of a lookup (EXISTS replies are a few bytes each).
LOOKUP_BATCH = 512
#: Keys per pipeline of a removal.
REMOVE_BATCH = 256

Outcomes = list[BaseException | None]
T = TypeVar("T")


class ValkeyTier(AsyncChunkTier):
    """Chunks as values on a Valkey or Redis server or cluster, through valkey-py's asyncio
    client (docs/tiers/valkey.md).

    Args:
        url: ``redis://``, ``rediss://`` (TLS), ``valkey://`` or ``valkeys://``
            ``[user[:password]@]host[:port][,host[:port]...][/db]``; several seeds mean a
            cluster. Without credentials in the URL, ``VALKEY_USERNAME`` / ``VALKEY_PASSWORD``
            are read from the environment. Never shown with its credentials.
        cluster: the seeds are nodes of a cluster (implied by several seeds).
        key_prefix: every key name starts with ``<key_prefix>:<layout id>:`` (default
            ``"asynctier"``).
        ttl_s: expire each chunk this long after its store (None: never; the server's
            eviction policy bounds memory either way).
        pipeline_bytes: stores and loads go in pipelines of at most this many payload bytes
            (default 1 MiB, at least one chunk); each pipeline holds one in-flight slot.
        thread_min_bytes: a pipeline of at least this many payload bytes has its checksums (and
            a load's copies into the slots) computed on a worker thread, with the GIL released,
            while the event loop goes on with other pipelines' I/O (default None: always on the
            event loop's thread, measured cheaper: docs/tiers/valkey.md, "Worker threads").
        connect_timeout_s: deadline of a connection attempt (default ``min(2, timeout_s)``).
        max_retries, retry_backoff_s: a batch that loses its connection is sent again up to
            ``max_retries`` times (default 2), after ``retry_backoff_s`` (0.05) doubling.
        breaker_threshold, breaker_cooldown_s: circuit breaker (defaults 5, 5.0).
        tls_ca_file: CA bundle that signs the server's certificate (``rediss://`` and
            ``valkeys://`` only; default: the system's CAs). The host name is checked too.
        timeout_s: deadline of each pipelined batch, retries included (default 5.0).
        **kwargs: the common knobs of :class:`~asynctier.ChunkTier` (``max_inflight``,
            ``verify``, ``store_backpressure``, ...); ``capacity_bytes`` is refused: the
            server's ``maxmemory`` bounds what it holds.
    """

    default_type = "valkey"
    supported_durability: ClassVar[tuple[str, ...]] = ("none",)
    uses_index = False  # the server is the authority; other servers write to it too
    handles_capacity = False  # maxmemory and the eviction policy are the server's
    frames_own_bytes = True  # header and payload travel as one value

    def __init__(
        self,
        *,
        url: str,
        cluster: bool = False,
        key_prefix: str = "asynctier",
        ttl_s: float | None = None,
        pipeline_bytes: int = _MIB,
        thread_min_bytes: int | None = None,
        connect_timeout_s: float | None = None,
        max_retries: int = 2,
        retry_backoff_s: float = 0.05,
        breaker_threshold: int = 5,
        breaker_cooldown_s: float = 5.0,
        tls_ca_file: str | None = None,
        timeout_s: float | None = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(timeout_s=timeout_s, **kwargs)
        if not self.timeout_s:
            raise TierConfigError(
                f"timeout_s must be a number of seconds > 0 for the valkey tier (a server that never "
                f"answers must not hang a call); got {timeout_s!r}"
            )
        self._target = parse_url(url, cluster=cluster)
        self.url = self._target.shown
        self.cluster = self._target.cluster
        self.key_prefix = check_key_prefix(key_prefix)
        self.ttl_s = None if ttl_s is None else seconds("ttl_s", ttl_s, zero_ok=False)
        self._px = None if self.ttl_s is None else max(1, round(self.ttl_s * 1000))
        self.pipeline_bytes = integer("pipeline_bytes", pipeline_bytes)
        self.thread_min_bytes = positive_int("thread_min_bytes", thread_min_bytes, allow_none=True)
        self._opts = ClientOptions(
            connect_timeout_s=seconds(
                "connect_timeout_s",
                min(2.0, self.timeout_s) if connect_timeout_s is None else connect_timeout_s,
                zero_ok=False,
            ),
            max_retries=integer("max_retries", max_retries, minimum=0, maximum=100),
            retry_backoff_s=seconds("retry_backoff_s", retry_backoff_s, zero_ok=False),
            tls_ca_file=check_ca_file(tls_ca_file, self._target.tls),
        )
        self._breaker = Breaker(
            integer("breaker_threshold", breaker_threshold),
            seconds("breaker_cooldown_s", breaker_cooldown_s, zero_ok=True),
            what="valkey server",
        )
        # a cluster: one breaker per node, so that one node gone does not fail the others' keys
        self._node_breakers: dict[str, Breaker] = {}
        self._scrubber = Scrubber(self._target.secrets)
        self._names = name_prefix(self.key_prefix, self.offloading_spec.layout_id)
        self._client: Client | None = None
        self._loop: object = None  # the caller's event loop (current_loop())
        self._bridge: LoopThread | None = None
        self._lookups: anyio.CapacityLimiter | None = None
        self._hint_logged: dict[str, float] = {}  # when a failed lookup or touch was last logged
        self._hashers: anyio.CapacityLimiter | None = None

    def _places(self) -> tuple[str, ...]:
        """Where its chunks live, one name per server it is given (a chain refuses two tiers on one)."""
        db = self._target.db
        return tuple(f"valkey {h}:{p} db {db}, key_prefix {self.key_prefix!r}" for h, p in self._target.seeds)

    # -- representation (never credentials) -----------------------------------------------
    def __repr__(self) -> str:
        return (
            f"<ValkeyTier type={self.tier_type!r} url={self.url!r} cluster={self.cluster} "
            f"namespace={self.offloading_spec.namespace!r}>"
        )

    def name_of(self, key: bytes) -> bytes:
        """The key name a chunk of ``key`` is stored under."""
        return self._names + key

    # -- open and close --------------------------------------------------------------------
    async def open_medium(self) -> None:
        ca = self._opts.tls_ca_file
        # else each connect failed, reported as the server unreachable (and opening the breaker)
        if ca is not None:
            why = await anyio.to_thread.run_sync(unusable_ca_file, ca)
            if why:
                raise TierConfigError(f"tls_ca_file {ca!r} {why}")
        self._loop = current_loop()
        if sniffio.current_async_library() != "asyncio":
            # valkey-py is asyncio-only: under trio its client runs on a loop thread of this tier's own
            self._bridge = LoopThread(name=f"asynctier-valkey-{self.url}")
        # no round trip here: a cache must come up while its server is down
        self._client = build_client(self._target, self._opts)
        self._lookups = anyio.CapacityLimiter(self.max_inflight or 1)
        # checksums and copies are CPU work: no more threads than cores
        self._hashers = anyio.CapacityLimiter(max(1, min(self.max_inflight or 1, os.cpu_count() or 1)))

    async def close_medium(self) -> None:
        client, self._client = self._client, None
        try:
            if client is not None:
                await self._on_client_loop(client.aclose)
        except Exception as e:
            log.warning("valkey tier %s: closing the client failed: %s", self.url, self._scrub(str(e)))
        finally:
            bridge, self._bridge = self._bridge, None
            if bridge is not None:
                await bridge.stop()

    async def _on_client_loop(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` on the client's event loop: the caller's on asyncio, the tier's
        own loop thread under trio (waited for to its end, also when cancelled)."""
        if self._bridge is None:
            return await fn(*args)
        return await self._bridge.call(fn, *args)

    # -- one pipeline: breaker, deadline, error mapping ------------------------------------
    def _scrub(self, text: str) -> str:
        return self._scrubber.scrub(text)

    def _breaker_of(self, client: ValkeyCluster, name: bytes) -> Breaker:
        """The breaker of the cluster node that serves the key name ``name`` (the tier's own
        while its slot's owner is not known)."""
        try:
            node = client.get_node_from_key(name)  # type: ignore[arg-type]
        except Exception:  # (the cluster's layout not read yet)
            node = None
        if node is None:
            return self._breaker
        b = self._node_breakers.get(node.name)
        if b is None:
            b = self._node_breakers[node.name] = Breaker(self._breaker.threshold, self._breaker.cooldown_s)
        return b

    def _admit(self, breaker: Breaker) -> bool:
        try:
            return breaker.before()
        except TierUnavailableError:
            where = "valkey server" if breaker is self._breaker else "the valkey node of this key"
            raise TierUnavailableError(
                f"{where} unreachable: circuit breaker open after {breaker.threshold} "
                f"consecutive connection failures (retrying in at most {breaker.cooldown_s}s)"
            ) from None

    async def _deadline(self, coro: Awaitable[T]) -> T:
        """The base class's per-chunk deadline, left out: every round trip has its own in
        :meth:`_request`. Two of one length, the outer started first, and the outer always
        fired: the inner one's cancellation was booked as no answer, and timeouts never
        opened the breaker."""
        return await coro

    async def _request(self, key: bytes, commands: Sequence[Command]) -> list[Any]:
        """Run ``commands`` as one pipeline; a failure of the whole batch is raised as
        ``key``'s :class:`ChunkError` (error replies of single commands are returned)."""
        client = self._client
        if client is None:
            raise TierUnavailableError("the valkey client is closed", key)
        # a cluster: each node's commands go by that node's breaker (an open one fails its
        # commands at once, not the batch), and each node's breaker is booked by its own
        # commands' replies; one server: the tier's breaker, for the batch
        if isinstance(client, ValkeyCluster):
            of = [self._breaker_of(client, cmd[1]) for cmd in commands]
        else:
            of = [self._breaker] * len(commands)
        probes: dict[int, tuple[Breaker, bool]] = {}
        refused: dict[int, BaseException] = {}
        for b in of:
            if id(b) not in probes and id(b) not in refused:
                try:
                    probes[id(b)] = (b, self._admit(b))
                except TierUnavailableError as e:
                    refused[id(b)] = e
        sent = [i for i, b in enumerate(of) if id(b) in probes]
        if not sent:
            raise TierUnavailableError(str(next(iter(refused.values()))), key)
        parts: dict[int, list[int]] = {}
        for i in sent:
            parts.setdefault(id(of[i]), []).append(i)
        replies: list[Any] = [refused.get(id(b)) for b in of]
        if len(parts) == 1:  # one server, or one node: its failure is the batch's
            self._fill(replies, sent, await self._send(client, key, commands, sent, probes[id(of[sent[0]])]))
        else:
            # each node's part on its own, at once, under its own deadline: a node that hangs
            # (stopped, a partition that drops packets) fails its own keys and opens only its
            # own breaker; as one batch every key waited for it, and every node's breaker opened
            failures: list[BaseException] = []

            async def part(idx: list[int]) -> None:
                try:
                    self._fill(replies, idx, await self._send(client, key, commands, idx, probes[id(of[idx[0]])]))
                except ChunkError as e:
                    failures.append(e)
                    for i in idx:
                        replies[i] = e

            async with anyio.create_task_group() as tg:
                for idx in parts.values():
                    tg.start_soon(part, idx)
            if len(failures) == len(parts):
                raise failures[0]
        self._stats.incr("pipelines")
        return replies

    @staticmethod
    def _fill(replies: list[Any], idx: list[int], got: list[Any]) -> None:
        for i, r in zip(idx, got):
            replies[i] = r

    async def _send(
        self, client: Client, key: bytes, commands: Sequence[Command], idx: list[int], probe: tuple[Breaker, bool]
    ) -> list[Any]:
        """Commands ``idx`` as one pipeline under the deadline, booked on their breaker ``probe``:
        the replies, or the failure of the whole pipeline raised as ``key``'s ChunkError."""
        b, admitted = probe
        try:
            got = await super()._deadline(self._on_client_loop(run_pipeline, client, [commands[i] for i in idx]))
        except Exception as e:
            mapped, reachable = map_client_error(e, key, self._scrub(str(e)))
            if reachable:
                b.success(admitted)
            else:
                b.failure(admitted)
            raise mapped from None
        except BaseException:
            b.neutral(admitted)
            raise
        if any(unreachable(r) for r in got):
            b.failure(admitted)
        else:
            b.success(admitted)
        return got

    @staticmethod
    def _each(exc: ChunkError, keys: Sequence[bytes]) -> list[BaseException | None]:
        """``exc`` (a whole batch's failure) as one error per key, each naming its key."""
        return [type(exc)(str(exc), k) for k in keys]

    def _set(self, key: bytes, value: tuple[bytes, memoryview]) -> Command:
        if self._px is None:
            return ("SET", self.name_of(key), value)
        return ("SET", self.name_of(key), value, "PX", self._px)

    # -- grouped jobs: one pipeline per group ----------------------------------------------
    def group_size(self, op: Op, n: int) -> int:
        if op is Op.REMOVE:
            return REMOVE_BATCH
        if op not in (Op.STORE, Op.LOAD):
            return 1
        per = max(1, self.pipeline_bytes // self.offloading_spec.chunk_bytes)
        spread = -(-n // (self.max_inflight or 1))  # use every in-flight slot before growing a batch
        return max(1, min(per, spread))

    def group_body(self, op: Op) -> Callable[..., Any]:  # coroutine functions: the tasks engine awaits them
        return {Op.STORE: self._store_group, Op.LOAD: self._load_group, Op.REMOVE: self._remove_group}[op]

    async def _batch(
        self, keys: list[bytes], commands: list[Command], end: Callable[[bytes, BaseException | None], None]
    ) -> tuple[list[Any] | None, Outcomes]:
        """:meth:`_request` for a group: (replies, []), or (None, each key's failure) when the
        whole batch failed, each key then booked with ``end``."""
        try:
            return await self._request(keys[0], commands), []
        except ChunkError as e:
            errs = self._each(e, keys)
        except BaseException as e:
            for k in keys:
                end(k, e)
            raise
        for k, err in zip(keys, errs):
            end(k, err)
        return None, errs

    def _on_thread(self, n_chunks: int) -> bool:
        """Whether a batch of ``n_chunks`` has its checksums and copies done on a worker thread."""
        limit = self.thread_min_bytes
        return limit is not None and n_chunks * self.offloading_spec.chunk_bytes >= limit

    async def _store_group(self, keys: list[bytes], cids: list[int], t0: float) -> Outcomes:
        # the slots are read only while this job runs: the checksums now, the one copy as the
        # batch is packed and sent (again if it is resent); the engine keeps a cancelled
        # caller waiting for a running job (and a worker thread is waited for, never
        # abandoned), so no slot is read after the call returns
        commands = await self._frames(keys, [self._chunk(c) for c in cids])

        def end(k: bytes, e: BaseException | None) -> None:
            self._end_store(k, t0, e)

        replies, errs = await self._batch(keys, commands, end)
        if replies is None:
            return errs
        out: Outcomes = []
        for k, r in zip(keys, replies):
            err = None if stored(r) else self._failed(k, r, "SET")
            end(k, err)
            out.append(err)
        return out

    async def _load_group(self, keys: list[bytes], cids: list[int], t0: float) -> Outcomes:
        def end(k: bytes, e: BaseException | None) -> None:
            self._end_load(k, t0, e)

        replies, errs = await self._batch(keys, [("GET", self.name_of(k)) for k in keys], end)
        if replies is None:
            return errs
        out: Outcomes = []
        bad: list[bytes] = []
        each = iter(
            await self._unframe_all(
                [(k, r, self._chunk(c)) for k, c, r in zip(keys, cids, replies) if isinstance(r, bytes)]
            )
        )
        for k, r in zip(keys, replies):
            err: ChunkError | None = None
            if r is None:
                err = ChunkNotFoundError(f"no chunk stored under key {k.hex()[:32]}", k)
            elif isinstance(r, bytes):
                err = next(each)
            else:
                err = self._failed(k, r, "GET")
            if self._end_load(k, t0, err):
                bad.append(k)
            out.append(err)
        if bad:
            await self._delete_bad(bad)
        return out

    async def _frames(self, keys: list[bytes], payloads: list[memoryview]) -> list[Command]:
        """The SET of each payload, its checksum computed on a worker thread for a batch of at
        least ``thread_min_bytes`` (the job waits for it: never abandoned, so no slot is read
        after the job ends)."""
        digest = self.offloading_spec.layout_digest
        if self._on_thread(len(payloads)):
            sums: list[int | None] = await anyio.to_thread.run_sync(checksums, payloads, limiter=self._hashers)
        else:
            sums = [None] * len(payloads)
        return [self._set(k, frame(k, p, digest, s)) for k, p, s in zip(keys, payloads, sums)]

    async def _unframe_all(self, values: list[tuple[bytes, bytes, memoryview]]) -> list[IntegrityError | None]:
        """Check each value read and copy its payload into its slot: each one's failure or None;
        on a worker thread the job waits for (never abandoned) for a batch of at least
        ``thread_min_bytes``, so no slot is written after the job ends."""
        if self._on_thread(len(values)):
            return await anyio.to_thread.run_sync(self._unframe_each, values, True, limiter=self._hashers)
        return self._unframe_each(values, False)

    def _unframe_each(
        self, values: list[tuple[bytes, bytes, memoryview]], release_gil: bool
    ) -> list[IntegrityError | None]:
        digest = self.offloading_spec.layout_digest
        out: list[IntegrityError | None] = []
        for k, value, slot in values:
            try:
                unframe_into(k, value, slot, digest, self.verify, release_gil=release_gil)
            except IntegrityError as e:
                out.append(e)
            else:
                out.append(None)
        return out

    async def _delete_bad(self, keys: list[bytes]) -> None:
        """Delete values that failed verification (by name: see docs, 'A bad value'); a failure
        to delete is logged, the keys' failures stay the verification's."""
        try:
            await self._request(keys[0], [("DEL", self.name_of(k)) for k in keys])
        except Exception as e:
            log.warning("valkey tier %s: removing %d bad chunk(s) failed: %s", self.url, len(keys), e)
        finally:
            self._removed(keys)

    async def _remove_group(self, keys: list[bytes], cids: list[int], t0: float) -> Outcomes:
        def end(k: bytes, e: BaseException | None) -> None:
            self._end_remove(k, t0, e)

        replies, errs = await self._batch(keys, [("DEL", self.name_of(k)) for k in keys], end)
        if replies is None:
            return errs
        out: Outcomes = []
        for k, r in zip(keys, replies):
            err = None if isinstance(r, int) else self._failed(k, r, "DEL")
            end(k, err)
            out.append(err)
        return out

    def _failed(self, key: bytes, reply: object, command: str) -> ChunkError:
        """The failure of one command of a batch, from its reply."""
        if isinstance(reply, ChunkError):  # (a node's breaker refused it: the batch's error, this key's now)
            return type(reply)(str(reply), key)
        if isinstance(reply, BaseException):
            return map_client_error(reply, key, self._scrub(str(reply)))[0]
        return ValkeyIOError(f"unexpected reply to {command}: {type(reply).__name__}", key)

    # -- single-chunk primitives (verify_chunks, fsck) -------------------------------------
    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        (r,) = await self._request(key, await self._frames([key], [data]))
        if not stored(r):
            raise self._failed(key, r, "SET")

    async def read_chunk(self, key: bytes, out: memoryview) -> int | None:
        (r,) = await self._request(key, [("GET", self.name_of(key))])
        if r is None:
            raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key)
        if not isinstance(r, bytes):
            raise self._failed(key, r, "GET")
        (err,) = await self._unframe_all([(key, r, out)])
        if err is not None:
            raise err
        return None

    async def chunk_exists(self, key: bytes) -> bool:
        (r,) = await self._request(key, [("EXISTS", self.name_of(key))])
        if not isinstance(r, int):
            raise self._failed(key, r, "EXISTS")
        return r > 0

    async def delete_chunk(self, key: bytes) -> bool:
        (r,) = await self._request(key, [("DEL", self.name_of(key))])
        if not isinstance(r, int):
            raise self._failed(key, r, "DEL")
        return r > 0

    async def list_chunks(self) -> list[bytes]:
        client = self._client
        if client is None:
            raise TierUnavailableError("the valkey client is closed")
        try:
            with anyio.fail_after(max(60.0, 10 * (self.timeout_s or 5.0))):
                names = await self._on_client_loop(scan_names, client, self._names + b"*")
        except Exception as e:  # said as every other call's failure is (ValkeyClusterException is no ValkeyError)
            err = map_client_error(e, b"", self._scrub(str(e)))[0]
            raise type(err)(f"listing the tier's keys: {err}") from None
        n = len(self._names)
        # a name no key of this tier can have (the prefix alone, a key too long) is not listed
        return [bytes(name[n:]) for name in names if 0 < len(name) - n <= MAX_KEY_BYTES]

    # -- lookup: batched EXISTS ------------------------------------------------------------
    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored: EXISTS in pipelines of up to 512 keys, at most
        ``max_inflight`` pipelines at once. An unreachable server answers "not stored"."""
        ks = check_keys(keys)
        self._check_open()
        self._check_loop()
        assert self._lookups is not None
        answers: list[bool] = []
        for i in range(0, len(ks), LOOKUP_BATCH):
            batch = ks[i : i + LOOKUP_BATCH]
            async with self._lookups:
                try:
                    replies = await self._request(batch[0], [("EXISTS", self.name_of(k)) for k in batch])
                except ChunkError as e:
                    self._hint_failed("lookup", e)
                    replies = [0] * len(batch)  # a lookup is a hint; a load is the truth
            answers += [isinstance(r, int) and r > 0 for r in replies]
            refused = next((r for r in replies if not isinstance(r, int)), None)
            if refused is not None:  # an error reply in place of an answer (an ACL without EXISTS)
                self._hint_failed("lookup", refused)
        return answers

    def _hint_failed(self, what: str, error: object) -> None:
        """A lookup or touch failed: answered "not stored" or let go, as a hint may be; counted
        (``lookup_errors``, ``touch_errors``) and logged at most once a minute, so that a
        server refusing EXISTS does not pass for an empty tier unseen."""
        self._stats.incr(f"{what}_errors")
        now = time.monotonic()
        if now - self._hint_logged.get(what, -60.0) >= 60.0:
            self._hint_logged[what] = now
            log.warning("valkey tier %s: %s failed (answered as a hint; counted in %s_errors): %s", self.url, what,
                        what, self._scrub(str(error)))  # fmt: skip

    async def touch(self, keys: Sequence[bytes]) -> None:
        """Mark keys as used for the server's eviction: with ``ttl_s``, give each its full TTL
        again (PEXPIRE); without, TOUCH them (the server's LRU and LFU count it as an access)."""
        ks = check_keys(keys)
        self._check_open()
        if not ks:
            return
        self._check_loop()
        assert self._lookups is not None
        for i in range(0, len(ks), LOOKUP_BATCH):
            batch = ks[i : i + LOOKUP_BATCH]
            if self._px is None:
                commands: list[Command] = [("TOUCH", self.name_of(k)) for k in batch]
            else:
                commands = [("PEXPIRE", self.name_of(k), self._px) for k in batch]
            async with self._lookups:
                try:
                    replies = await self._request(batch[0], commands)
                except ChunkError as e:
                    self._hint_failed("touch", e)
                    continue
            refused = next((r for r in replies if not isinstance(r, int)), None)
            if refused is not None:
                self._hint_failed("touch", refused)

    def _check_loop(self) -> None:
        if current_loop() is not self._loop:
            raise TierStateError(
                "this valkey tier was opened on another event loop, and its connections belong to that loop: "
                "open one tier per event loop"
            )

    # -- stats -----------------------------------------------------------------------------
    def stats(self) -> TierStats:
        s = super().stats()
        breakers = [self._breaker, *self._node_breakers.values()]
        s.extra["breaker_opened"] = sum(b.opened for b in breakers)
        s.extra["breaker_fast_failed"] = sum(b.fast_failed for b in breakers)
        return s

    @property
    def breaker_state(self) -> str:
        """The circuit breaker: ``closed``, ``open`` or ``half-open``; in a cluster, the most
        open of its nodes' (one per node)."""
        states = {b.state for b in (self._breaker, *self._node_breakers.values())}
        return next(s for s in ("open", "half-open", "closed") if s in states)
