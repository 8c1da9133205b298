"""Building valkey-py's asyncio client (one server, or a cluster from its seeds) and running
one batch of commands as a non-transactional pipeline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from valkey import exceptions as vx
from valkey.asyncio import Valkey
from valkey.asyncio.cluster import ClusterNode, PipelineCommand, ValkeyCluster
from valkey.asyncio.retry import Retry
from valkey.backoff import ExponentialBackoff

from .errors import refused
from .url import Target

__all__ = [
    "Client",
    "ClientOptions",
    "UNREACHABLE",
    "ValkeyCluster",
    "build_client",
    "run_pipeline",
    "scan_names",
    "unreachable",
]

Client = Valkey | ValkeyCluster
#: A command: its name and arguments (bytes or ints).
Command = tuple[Any, ...]


@dataclass(frozen=True)
class ClientOptions:
    """Deadlines and retries handed to the client (a batch's own deadline is the tier's)."""

    connect_timeout_s: float
    max_retries: int
    retry_backoff_s: float
    tls_ca_file: str | None = None


def build_client(target: Target, opts: ClientOptions) -> Client:
    """The client for ``target``; it connects on first use."""
    # Connection failures (a restart, a reset) are retried with backoff; a timeout is not: a
    # server that does not answer has had its timeout_s.
    retry = Retry(
        ExponentialBackoff(cap=max(opts.retry_backoff_s, 8 * opts.retry_backoff_s), base=opts.retry_backoff_s),
        opts.max_retries,
        supported_errors=(vx.ConnectionError,),
    )
    common: dict[str, Any] = {
        "username": target.username,
        "password": target.password,
        # no socket timeout: each batch runs under the tier's own deadline (timeout_s), whose expiry
        # cancels the read and drops the connection; valkey-py would wrap every send in a task
        "socket_timeout": None,
        "socket_connect_timeout": opts.connect_timeout_s,
        "retry": retry,
        "ssl": target.tls,
        "lib_name": None,  # no CLIENT SETINFO round trip on each new connection
        "lib_version": None,
        "decode_responses": False,
    }
    if target.tls:  # the certificate and the host name it is for, against the system's or the given CAs
        common.update(ssl_cert_reqs="required", ssl_check_hostname=True, ssl_ca_certs=opts.tls_ca_file)
    if target.cluster:
        return ValkeyCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in target.seeds],
            cluster_error_retry_attempts=max(1, opts.max_retries),
            # a MOVED updates that slot's owner only: the periodic full re-initialisation
            # (every 5th MOVED by default) closes every node while other pipelines are in
            # flight, which fails them in the client (valkey-py 6.2's ClusterPipeline)
            reinitialize_steps=0,
            connection_error_retry_attempts=max(1, opts.max_retries),
            **common,
        )
    host, port = target.seeds[0]
    return Valkey(host=host, port=port, db=target.db, **common)


def pack(commands: Sequence[Command]) -> bytes:
    """``commands`` in the server's protocol (RESP), as one ``bytes``: the one copy a store
    makes of its payload. An argument given as a tuple of buffers is sent as one argument
    (a chunk's header and payload, never joined on their own)."""
    out: list[Any] = []
    for cmd in commands:
        out.append(b"*%d\r\n" % len(cmd))
        for arg in cmd:
            parts = arg if isinstance(arg, tuple) else (_arg_bytes(arg),)
            out.append(b"$%d\r\n" % sum(memoryview(p).nbytes for p in parts))
            out += parts
            out.append(b"\r\n")
    return b"".join(out)


def _arg_bytes(arg: object) -> bytes | memoryview:
    if isinstance(arg, (bytes, memoryview)):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int) and not isinstance(arg, bool):
        return b"%d" % arg
    raise TypeError(f"a command argument must be bytes, str or int; got {type(arg).__name__}")


def _joined(cmd: Command) -> Command:
    return tuple(b"".join(a) if isinstance(a, tuple) else a for a in cmd)


async def run_pipeline(client: Client, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` in one pipeline (per node in a cluster; not a transaction) and return
    each one's reply (``b"OK"`` for a SET), or the error reply it got in its place. A failure
    of the whole batch (the server unreachable) is raised.

    On one server the batch goes out as one ``bytes`` packed here (valkey-py's own pipeline
    would pack a chunk's header and payload into one value first, then join the command again
    on Python 3.11: two copies of each payload instead of one); a cluster's batch goes through
    valkey-py's cluster pipeline, which routes each command to its slot's node."""
    if isinstance(client, Valkey):
        return await _run_packed(client, commands)
    joined = [_joined(cmd) for cmd in commands]
    try:
        replies = await _cluster_batch(client, joined)
    except UNREACHABLE:
        # a node of the batch is gone: each command alone, so that the keys of the nodes that
        # answer go through; the batch is unreachable only if none answers. One after another:
        # the client resets every node's connections when one fails, and commands in flight
        # on them failed too, each dropping its node from the startup nodes until none was left
        replies = [await _alone(client, cmd) for cmd in joined]
        if all(unreachable(r) for r in replies):
            raise replies[0] from None
        return replies
    for i, r in enumerate(replies):
        if isinstance(r, (vx.MovedError, vx.TryAgainError)):
            replies[i] = await _one(client, joined[i])  # the client follows MOVED, updating its slot map
        elif isinstance(r, vx.AskError):
            replies[i] = await _asking(client, r, joined[i])
    return replies


#: Attempts of a cluster batch that the client fails in its own bookkeeping (below).
_CLUSTER_ATTEMPTS = 3


async def _cluster_batch(client: ValkeyCluster, commands: list[Command]) -> list[Any]:
    """One cluster pipeline. valkey-py 6.2's ClusterPipeline reads the client's default node
    after the batch, and another batch that lost a connection meanwhile may have cleared it
    while re-reading the cluster's layout: the batch then fails with an AttributeError although
    its commands went through. They are idempotent: the batch is sent again once the layout is
    read (and counts as the server unreachable if that keeps happening)."""
    for _ in range(_CLUSTER_ATTEMPTS):
        cpipe = client.pipeline()
        for cmd in commands:
            cpipe.execute_command(*cmd)
        try:
            return list(await cpipe.execute(raise_on_error=False, allow_redirections=False))
        except AttributeError:
            await client.initialize()
    raise vx.ConnectionError("the cluster client kept re-reading the cluster's layout (a node is unreachable)")


async def _run_packed(client: Valkey, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` packed (:func:`pack`) on one pooled connection and read every reply; a
    connection that breaks is dropped and the batch packed and sent again on a new one (the
    client's retry policy). A cancelled read drops its connection (valkey-py does)."""
    pool = client.connection_pool
    conn = await pool.get_connection("PIPELINE")  # type: ignore[no-untyped-call]

    async def attempt() -> list[Any]:
        # packed here and let go once sent: the packed bytes lives only while the socket (or
        # asyncio's reused transport buffer) takes it, as a raw client's command does, so the
        # allocator reuses its memory instead of mapping fresh pages for every batch
        await conn.send_packed_command(pack(commands))
        replies: list[Any] = []
        for _ in range(len(commands)):
            try:
                replies.append(await conn.read_response())
            except vx.ResponseError as e:  # an error reply: the connection is still in step
                replies.append(e)
        return replies

    try:
        return list(await conn.retry.call_with_retry(attempt, lambda _e: conn.disconnect()))
    finally:
        await pool.release(conn)


#: A node that did not answer (as :func:`.errors.map_client_error` reads it): a reply of a
#: cluster batch that one node failed.
UNREACHABLE = (vx.ConnectionError, vx.TimeoutError, TimeoutError, OSError, vx.ClusterDownError)


def unreachable(reply: object) -> bool:
    """Whether a reply says its node did not answer: an :data:`UNREACHABLE` error, but not a
    refused password (valkey-py's AuthenticationError is a ConnectionError: the server answered)."""
    return isinstance(reply, UNREACHABLE) and not refused(reply)


async def _alone(client: ValkeyCluster, cmd: Command) -> Any:
    """One command of a batch on its own; a node that does not answer is its reply."""
    try:
        return await _one(client, cmd)
    except UNREACHABLE as e:
        return e


async def _one(client: ValkeyCluster, cmd: Command) -> Any:
    try:
        return await client.execute_command(*cmd)
    except vx.ResponseError as e:  # an error reply stays the command's
        return e


async def _asking(client: ValkeyCluster, ask: vx.AskError, cmd: Command) -> Any:
    """Follow ASK (a slot in migration): ASKING and the command on one connection of the node
    named. valkey-py's own ASK handling may send them on two connections of that node, and the
    node then answers MOVED back: the command goes round until the client gives up."""
    node = client.get_node(host=ask.host, port=ask.port)
    if node is None:
        return await _one(client, cmd)
    asking, command = PipelineCommand(0, "ASKING"), PipelineCommand(1, *cmd)
    await node.execute_pipeline([asking, command])
    return command.result


async def scan_names(client: Client, pattern: bytes) -> list[bytes]:
    """Every key name matching ``pattern``: SCAN to the end on the server, or on each node of a
    cluster, replicas too (the client may take a primary for a replica after a slot moved
    away from it), names seen twice counted once. A cluster client that has not read the
    cluster's layout yet (no call went through it) reads it first: it knew no node, and the
    listing came back empty (fsck "clean, 0 chunks", the cluster up or down)."""
    nodes: list[Any] = [client]
    if isinstance(client, ValkeyCluster):
        if not client.get_nodes():
            await client.initialize()
        nodes = client.get_nodes()
        if not nodes:
            raise vx.ConnectionError("the cluster client knows no node to list")
    found: list[bytes] = []
    for node in nodes:
        cursor = 0
        while True:
            reply = await node.execute_command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            cursor, names = int(reply[0]), reply[1]
            found += names
            if cursor == 0:
                break
    return list(dict.fromkeys(found))
