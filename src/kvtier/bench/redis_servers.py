"""Throw-away Redis / Valkey servers for the shared-tier tests and bench: standalone and a
3-master Cluster (joined with the server's own commands: no redis-cli needed).

Every server binds 127.0.0.1 only, keeps nothing on disk (``--save '' --appendonly no``), runs
in its own temporary folder and is stopped with SIGKILL by PID. Ports are picked at random in
[20000, 55535] and checked free together with port + 10000, because a Cluster node's bus
listens there (a port above 55535 has no bus port, and the node cannot join a Cluster).

Fault helpers act on one server process: ``pause`` (SIGSTOP: a hung server), ``resume``
(SIGCONT), ``kill`` (SIGKILL) and ``restart`` (same port, same folder: a Cluster node keeps its
nodes.conf and so its slots, but every key is gone).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Environment variable naming a server binary to use instead of ``redis-server`` on PATH.
SERVER_ENV = "KVTIER_REDIS_SERVER"
_MAX_PORT = 55535
_READY_TIMEOUT_S = 10.0


def server_binary() -> str | None:
    """Path of the redis-server (or valkey-server) binary, or None when none is installed."""
    named = os.environ.get(SERVER_ENV)
    if named:
        return named if shutil.which(named) else None
    return shutil.which("redis-server") or shutil.which("valkey-server")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(rng: random.Random | None = None) -> int:
    """A loopback port <= 55535 that is free, with its cluster-bus port (+10000) free too."""
    rng = rng or random.Random()
    for _ in range(500):
        port = rng.randint(20000, _MAX_PORT - 10000)
        if _port_free(port) and _port_free(port + 10000):
            return port
    raise RuntimeError("no free loopback port pair found in 500 tries")


def _send(port: int, *args: str, timeout_s: float = 1.0, tls: bool = False) -> bytes:
    """One RESP command over a fresh socket (no client library); returns the raw reply."""
    payload = f"*{len(args)}\r\n".encode() + b"".join(
        f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args
    )
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        return sock.recv(65536)


@dataclass
class RedisServer:
    """One redis-server process on 127.0.0.1; ``start`` it, ``stop`` it at teardown."""

    #: The folder holding its log and (for Cluster nodes) nodes.conf.
    folder: Path
    #: TCP port on 127.0.0.1 (the TLS port when ``tls_args`` are given).
    port: int
    #: Server memory cap, bytes.
    maxmemory_bytes: int = 256 * 1024 * 1024
    #: "allkeys-lru" (a cache) or "noeviction" (writes fail when full).
    maxmemory_policy: str = "allkeys-lru"
    #: Extra command-line arguments (``--requirepass``, ``--user``, cluster options...).
    extra_args: Sequence[str] = ()
    #: TLS arguments; when set, the plain port is closed and ``port`` speaks TLS only.
    tls_args: Sequence[str] = ()
    #: The server binary (redis-server or valkey-server); None: ``server_binary()``.
    binary: str | None = None
    #: The running process, if any.
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` (``rediss://`` with TLS)."""
        return f"{'rediss' if self.tls_args else 'redis'}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("server is not running")
        return self.process.pid

    def command_line(self) -> list[str]:
        binary = self.binary or server_binary()
        if binary is None:
            raise RuntimeError("no redis-server on PATH; run scripts/redis-server.sh")
        ports = (
            ["--port", "0", "--tls-port", str(self.port), *self.tls_args]
            if self.tls_args
            else ["--port", str(self.port)]
        )
        return [
            binary,
            *ports,
            "--bind", "127.0.0.1",
            "--dir", str(self.folder),
            "--logfile", str(self.folder / "server.log"),
            "--save", "",
            "--appendonly", "no",
            "--maxmemory", str(self.maxmemory_bytes),
            "--maxmemory-policy", self.maxmemory_policy,
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        """Start the process and wait until it accepts connections."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command_line(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self._name} exited at start-up:\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"{self._name} on port {self.port} not ready:\n{self.log_tail()}")

    @property
    def _name(self) -> str:
        return Path(self.binary or server_binary() or "redis-server").name

    def log_tail(self, lines: int = 20) -> str:
        log = self.folder / "server.log"
        if not log.exists():
            return ""
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def pause(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing (a hung server)."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL and reap; a no-op when the server is not running."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a stopped process dies either way
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> RedisServer:
        """Kill (if running) and start again on the same port: every key is gone."""
        self.kill()
        return self.start()

    stop = kill


@dataclass
class RedisClusterServers:
    """Three masters, no replicas, ``cluster-require-full-coverage no``, node-timeout 1 s."""

    nodes: list[RedisServer]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()

    def wait_ok(self, timeout_s: float = 20.0, nodes: Sequence[RedisServer] | None = None) -> None:
        """Wait until every given (running) node reports cluster_state:ok."""
        deadline = time.monotonic() + timeout_s
        for node in nodes if nodes is not None else self.nodes:
            while b"cluster_state:ok" not in _info(node.port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster not ok on port {node.port}:\n{node.log_tail()}")
                time.sleep(0.1)


def _info(port: int) -> bytes:
    try:
        return _send(port, "CLUSTER", "INFO")
    except OSError:
        return b""


#: Hash slots of a Cluster.
_SLOTS = 16384


def join(nodes: Sequence[RedisServer]) -> None:
    """Make fresh cluster-enabled nodes one Cluster of masters, as ``redis-cli --cluster
    create`` does but without a cli binary and its one-second polls: a distinct config epoch
    each, an equal share of the slots each, and every node met by the first. The caller waits
    for ``cluster_state:ok`` (``RedisClusterServers.wait_ok``)."""
    share = _SLOTS // len(nodes)
    for i, node in enumerate(nodes):
        first = i * share
        last = _SLOTS - 1 if i == len(nodes) - 1 else first + share - 1
        _ok(node.port, "CLUSTER", "SET-CONFIG-EPOCH", str(i + 1))
        # ADDSLOTS, not ADDSLOTSRANGE: the range form is Redis >= 7.0 only.
        _ok(node.port, "CLUSTER", "ADDSLOTS", *(str(s) for s in range(first, last + 1)))
    for node in nodes[1:]:
        _ok(nodes[0].port, "CLUSTER", "MEET", "127.0.0.1", str(node.port))


def _ok(port: int, *args: str) -> None:
    reply = _send(port, *args, timeout_s=5.0)
    if not reply.startswith(b"+OK"):
        raise RuntimeError(f"{' '.join(args[:2])} on port {port}: {reply[:200]!r}")


def start_standalone(folder: Path, **options: object) -> RedisServer:
    """Start a standalone server in ``folder`` on a free port (retried on a port race)."""
    for attempt in range(5):
        server = RedisServer(folder=folder / f"s{attempt}", port=free_port(), **options)  # type: ignore[arg-type]
        try:
            return server.start()
        except RuntimeError:
            server.kill()
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def start_cluster(
    folder: Path, maxmemory_bytes: int = 128 * 1024 * 1024, binary: str | None = None
) -> RedisClusterServers:
    """Start three masters (``binary``; None: ``server_binary()``) and join them into one
    Cluster (``join``)."""
    cluster_args = [
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", "1000",
        "--cluster-require-full-coverage", "no",
        "--cluster-allow-reads-when-down", "yes",
    ]  # fmt: skip
    nodes: list[RedisServer] = []
    try:
        for i in range(3):
            nodes.append(
                start_standalone(folder / f"node{i}", maxmemory_bytes=maxmemory_bytes,
                                 extra_args=cluster_args, binary=binary)
            )  # fmt: skip
        join(nodes)
        cluster = RedisClusterServers(nodes)
        cluster.wait_ok()
        return cluster
    except BaseException:
        for node in nodes:
            node.kill()
        raise
