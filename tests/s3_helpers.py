"""Test helpers for the obj tier: a moto S3 server on loopback, a fault-injecting TCP proxy,
and the rig (spec, primary buffer, keys) the obj tests build tiers on.

Only loopback traffic: the server and the proxy listen on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.errors import failure_kind

__all__ = [
    "BUCKET",
    "CHUNK",
    "FAST_FAULTS",
    "FaultProxy",
    "MotoS3",
    "Rig",
    "create_bucket",
    "env",
    "keys",
    "kinds",
    "moto",
    "on_asyncio_only",
    "s3_config",
    "until_ok",
]

CREDS = {"AWS_ACCESS_KEY_ID": "testing-akid", "AWS_SECRET_ACCESS_KEY": "testing-secret-do-not-log"}


class MotoS3:
    """moto's S3 in server mode (``moto_server``) in a child process on a free 127.0.0.1 port.

    A child process rather than moto's in-process thread: the server then neither competes
    for the test process's GIL nor shows up in its memory measurements.
    """

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        atexit.register(self.stop)
        for _ in range(400):
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return
            except OSError:
                if self._proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("moto_server did not start")

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def create_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` with a plain HTTP PUT (moto accepts it unsigned)."""
    req = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200, resp.status


def _rst_close(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0): what a killed server's peer sees."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # shutdown first: close() alone leaves the socket open while another thread is blocked
    # in recv() on it, and the peer would see nothing at all
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """A loopback TCP proxy in front of ``target_port`` whose faults the test switches live.

    * ``delay_s``: sleep this long before forwarding each piece of a response (slow server).
    * ``kill_after_bytes``: reset a connection once it has carried this many bytes in either
      direction (server dying mid-transfer).
    * ``inject_503``: answer the next N HTTP requests with ``503 Slow Down`` instead of
      forwarding them (then forward again).
    * :meth:`kill`: reset every connection and stop listening (connection refused);
      :meth:`revive`: listen again on the same port.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.delay_s = 0.0
        self.kill_after_bytes: int | None = None
        self.inject_503 = 0
        self.injected_503 = 0
        self.bytes_down = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()

    # -- lifecycle ---------------------------------------------------------------------------
    def _listen(self) -> None:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(128)
        self.port = ls.getsockname()[1]
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True, name="fault-proxy-accept").start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop_connections(self) -> None:
        """Reset every open connection (the client reconnects, seeing the new fault settings)."""
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            _rst_close(c)

    def kill(self) -> None:
        """The server dies: connections reset, new ones refused."""
        ls, self._listener = self._listener, None
        if ls is not None:
            with contextlib.suppress(OSError):
                ls.shutdown(socket.SHUT_RDWR)
            ls.close()
        self.drop_connections()

    def revive(self) -> None:
        """The server is back, on the same port, with no faults."""
        self.delay_s = 0.0
        self.kill_after_bytes = None
        self.inject_503 = 0
        if self._listener is None:
            for _ in range(100):  # the port may linger briefly after close
                try:
                    self._listen()
                    return
                except OSError:
                    time.sleep(0.05)
            raise RuntimeError(f"could not listen on 127.0.0.1:{self.port} again")

    def close(self) -> None:
        self.kill()

    # -- plumbing ----------------------------------------------------------------------------
    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._conns.update(socks)

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            if self._listener is not ls:
                _rst_close(client)
                return
            self._track(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="fault-proxy-conn").start()

    def _serve(self, client: socket.socket) -> None:
        pending = b""
        try:
            if self.inject_503 > 0:
                pending = self._answer_503s(client)
                if pending is None:
                    return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._track(upstream)
            if pending:
                upstream.sendall(pending)
            threading.Thread(target=self._pump_up, args=(client, upstream), daemon=True).start()
            self._pump_down(upstream, client)
        except OSError:
            _rst_close(client)

    def _pump_up(self, client: socket.socket, upstream: socket.socket) -> None:
        carried = 0
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    with contextlib.suppress(OSError):
                        upstream.shutdown(socket.SHUT_WR)
                    return
                limit = self.kill_after_bytes
                if limit is not None and carried + len(data) > limit:
                    _rst_close(client)
                    _rst_close(upstream)
                    return
                upstream.sendall(data)
                carried += len(data)
        except OSError:
            _rst_close(upstream)
            _rst_close(client)

    def _pump_down(self, upstream: socket.socket, client: socket.socket) -> None:
        carried = 0
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    with contextlib.suppress(OSError):
                        client.shutdown(socket.SHUT_WR)
                    return
                if self.delay_s:
                    time.sleep(self.delay_s)
                limit = self.kill_after_bytes
                if limit is not None and carried + len(data) > limit:
                    client.sendall(data[: max(0, limit - carried)])
                    _rst_close(client)
                    _rst_close(upstream)
                    return
                client.sendall(data)
                carried += len(data)
                self.bytes_down += len(data)
        except OSError:
            _rst_close(upstream)
            _rst_close(client)

    def _answer_503s(self, client: socket.socket) -> bytes | None:
        """Serve whole HTTP requests with 503 while ``inject_503`` lasts; return the unread rest."""
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = client.recv(65536)
                if not data:
                    client.close()
                    return None
                buf += data
            head, _, rest = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if self.inject_503 <= 0:
                return buf  # forward this request and all later ones
            while len(rest) < length:
                data = client.recv(65536)
                if not data:
                    client.close()
                    return None
                rest += data
            buf = rest[length:]
            with self._lock:
                self.inject_503 -= 1
                self.injected_503 += 1
            body = b"<Error><Code>SlowDown</Code><Message>injected by the test proxy</Message></Error>"
            client.sendall(
                b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )


@contextlib.contextmanager
def env(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of a block."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- the obj tests' rig ----------------------------------------------------------------------
BUCKET = "asynctier-test"
_MOTO: MotoS3 | None = None


def moto() -> MotoS3:
    """One moto server for the whole test session (started on first use, stopped at exit)."""
    global _MOTO
    if _MOTO is None:
        _MOTO = MotoS3()
        create_bucket(_MOTO.endpoint, BUCKET)
    return _MOTO


def s3_config(endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
    ep = endpoint or moto().endpoint
    return {
        "type": "obj",
        "url": f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}",
        "endpoint": ep,
        "region": "us-east-1",
        "credentials": {
            "access_key_id": CREDS["AWS_ACCESS_KEY_ID"],
            "secret_access_key": CREDS["AWS_SECRET_ACCESS_KEY"],
        },
        "client_options": {"allow_http": True},
        **extra,
    }


CHUNK = 64 * 1024


class Rig:
    """A spec, a primary buffer with random chunks, and tiers built on it."""

    def __init__(self, chunk_bytes: int = CHUNK, num_chunks: int = 16, namespace: str = "obj/test") -> None:
        self.spec = OffloadingSpec(chunk_bytes, num_chunks, namespace=namespace)
        self.buf = bytearray(os.urandom(self.spec.total_bytes))
        self.orig = bytes(self.buf)

    def tier(self, config: dict[str, Any]) -> Any:
        return SecondaryTierFactory.create_secondary_tier(dict(config), memoryview(self.buf), self.spec)

    def chunk(self, cid: int) -> bytes:
        c = self.spec.chunk_bytes
        return bytes(self.buf[cid * c : (cid + 1) * c])

    def orig_chunk(self, cid: int) -> bytes:
        c = self.spec.chunk_bytes
        return self.orig[cid * c : (cid + 1) * c]

    def zero(self) -> None:
        self.buf[:] = bytes(len(self.buf))


def keys(n: int, tag: str = "k") -> list[bytes]:
    salt = uuid.uuid4().hex[:8]
    return [f"{tag}-{salt}-{i}".encode() for i in range(n)]


def kinds(res: Any) -> set[str]:
    return {failure_kind(e) for e in res.failed.values()}


async def until_ok(make_call: Any, attempts: int = 100, pause: float = 0.1) -> Any:
    """Retry a call until it fully succeeds (bounded attempts; no timing assertion)."""
    res = None
    for _ in range(attempts):
        res = await make_call()
        if res.ok:
            return res
        await asyncio.sleep(pause)
    raise AssertionError(f"never recovered: {res.failed if res is not None else None}")


def on_asyncio_only(fn: Any) -> Any:
    """Run an async test once, on the stock asyncio loop (not once per loop: these tests are
    about the server, not the loop, and moto is slow)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


FAST_FAULTS = {
    "timeout_s": 1.0,
    "connect_timeout_s": 0.5,
    "max_retries": 2,
    "retry_timeout_s": 1.0,
    "retry_backoff_s": 0.02,
    "retry_max_backoff_s": 0.1,
    "breaker_threshold": 3,
    "breaker_cooldown_s": 0.2,
    "max_inflight": 4,
}
