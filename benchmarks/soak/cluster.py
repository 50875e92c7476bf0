"""What the soak drives: kvtier servers (restarted after every exit), one Redis, disk folders
on small tmpfs mounts, and plain vLLM reference servers for the oracle."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.bench.harness.server import ServerEngine, free_port
from kvtier.bench.redis_servers import RedisServer
from kvtier.units import parse_size

#: Seconds a server may take to become ready (a restart on a loaded 2-core machine is slow).
READY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ModelSpec:
    """One model the soak serves, with the engine and tier sizes that make it evict."""

    #: Short name in the event log ("tiny-llama", "smollm2").
    name: str
    path: Path
    vocab: int
    #: vLLM KV blocks of each kvtier engine (its own prefix cache), so hits come from tiers.
    engine_blocks: int
    host_pool: str
    max_prompt_tokens: int
    #: False for the tiny random models, which ship no tokenizer (prompts are token ids).
    tokenizer: bool = True
    #: Relative share of new sessions among the servers of a group that serve this model.
    session_weight: float = 1.0

    @property
    def vllm_args(self) -> list[str]:
        """vLLM settings of every server of this model, reference included."""
        args = ["--max-num-batched-tokens", str(MAX_BATCHED_TOKENS)]
        return args if self.tokenizer else [*args, "--skip-tokenizer-init"]


@dataclass(frozen=True)
class FolderSpec:
    label: str
    #: The file system's root (a tmpfs mount point when mounts are possible); the disk folder
    #: is its ``cache`` subfolder, so a balloon filling the file system sits outside it.
    mount: Path
    #: ``--disk-capacity`` of every server on the folder (a setting of the folder).
    capacity: str
    #: Size of the tmpfs (room above the cap to fill).
    mount_size: str

    @property
    def path(self) -> Path:
        return self.mount / "cache"

    @property
    def cap_bytes(self) -> int:
        return parse_size(self.capacity, "disk capacity")


@dataclass(frozen=True)
class ServerSpec:
    label: str
    model: ModelSpec
    #: "replica" (shares Redis) or "folder-pair" (shares a disk folder); "+"-joined for both.
    role: str
    folder: FolderSpec
    shared: bool
    #: Sessions stay within a group, so a turn's prefix may be on a neighbour's tier.
    group: str
    #: Its folder reads go through a throttle the soak controls (``benchmarks.soak.throttle``).
    throttled: bool = False


#: vLLM settings common to every server and the reference, so batch shapes match.
MAX_MODEL_LEN = 2048
MAX_BATCHED_TOKENS = 2048


class Served:
    """One ``kvtier serve`` server across its incarnations; ``ready`` is set while it serves."""

    def __init__(self, spec: ServerSpec, logs: Path, redis_url: str | None, work: Path) -> None:
        self.spec = spec
        self.label = spec.label
        self.port = free_port()
        self.log = logs / f"{spec.label}.log"
        self._redis_url = redis_url
        self.engine: ServerEngine | None = None
        self.ready = threading.Event()
        #: Set by whoever kills the server on purpose, cleared once it is ready again.
        self.kill_expected = False
        self.incarnation = 0
        #: Session leaders of every incarnation (for the after-shutdown check).
        self.pids: list[int] = []
        #: Callbacks run (once) when the current restart is ready: kill faults end there.
        self.on_ready: list[Callable[[], None]] = []
        #: The read throttle of a throttled server (outside its folder, which faults fill).
        self.throttle = None
        if spec.throttled:
            from tests.support.throttled_tier import throttled_disk

            self.throttle = throttled_disk(work / f"throttle-{spec.label}")

    def spawn(self) -> None:
        spec = self.spec
        self.incarnation += 1
        tiers = {
            "host_pool": spec.model.host_pool,
            "disk_dir": str(spec.folder.path),
            "disk_capacity": spec.folder.capacity,
            "shared": self._redis_url if spec.shared else None,
            # Every hit is restored: the data path is what the soak exercises (recompute is
            # about as fast as a restore with the tiny model, so the decision may refuse one).
            "restore_decision": False,
            "allow_small_tiers": True,
        }
        vllm_args = [
            "--num-gpu-blocks-override",
            str(spec.model.engine_blocks),
            *spec.model.vllm_args,
        ]
        env = None
        if self.throttle is not None:
            # What ``kvtier serve`` runs (vLLM's server with kvtier's config), its disk tier
            # reading through the throttle.
            from benchmarks.soak.throttle import transfer_config
            from tests.support.throttled_tier import CONTROL_ENV, REPO_ROOT

            vllm_args += ["--kv-transfer-config", json.dumps(transfer_config(**tiers))]
            paths = (str(REPO_ROOT / "src"), str(REPO_ROOT), os.environ.get("PYTHONPATH", ""))
            env = {
                CONTROL_ENV: str(self.throttle.control),
                "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            }
        self.engine = ServerEngine(
            spec.model.path,
            self.log,
            host_pool=spec.model.host_pool,
            disk_dir=spec.folder.path,
            port=self.port,
            max_model_len=MAX_MODEL_LEN,
            ready_timeout_s=READY_TIMEOUT_S,
            allow_small_tiers=True,
            shared=tiers["shared"],
            restore_decision=False,
            wait=False,
            extra_args=(
                vllm_args if env else ["--disk-capacity", spec.folder.capacity, *vllm_args]
            ),
            kvtier=env is None,
            env_overrides=env,
        )
        self.pids.append(self.engine.proc.pid)

    def wait_ready(self) -> None:
        assert self.engine is not None
        self.engine.wait_ready()
        self.kill_expected = False
        self.ready.set()
        callbacks, self.on_ready = self.on_ready, []
        for callback in callbacks:
            callback()

    @property
    def pid(self) -> int | None:
        engine = self.engine
        if engine is None or engine.proc.poll() is not None:
            return None
        return engine.proc.pid

    def sigkill(self) -> None:
        """SIGKILL the server's whole session (API server, EngineCore, workers)."""
        pid = self.pid
        if pid is None:
            return
        self.kill_expected = True
        self.ready.clear()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> int | None:
        """SIGTERM, then SIGKILL after 30 s (5 s for one still starting: it serves nothing and
        vLLM handles SIGTERM only once started)."""
        serving = self.ready.is_set()
        self.ready.clear()
        if self.engine is None:
            return None
        return self.engine.close(timeout_s=30 if serving else 5)


class Supervisor:
    """Watches every server; records each exit as a ``crash`` and restarts the server.

    A restart runs on its own thread (it takes tens of seconds); requests to the server wait
    on ``Served.ready`` meanwhile.
    """

    def __init__(self, servers: list[Served], emit: Callable[..., None]) -> None:
        self.servers = servers
        self._emit = emit
        self._stop = threading.Event()
        self._restarting: set[str] = set()
        self._restarts: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._watch, name="soak-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; restarts in progress give up (``join_restarts`` after closing the
        servers, whose close ends a restart's wait)."""
        self._stop.set()
        self._thread.join(timeout=5)

    def join_restarts(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._restarts:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            for server in self.servers:
                engine = server.engine
                if engine is None or server.label in self._restarting:
                    continue
                code = engine.proc.poll()
                if code is None:
                    continue
                server.ready.clear()
                self._emit(
                    "crash",
                    server=server.label,
                    returncode=code,
                    injected=server.kill_expected,
                    log_tail=server.log_tail(),
                )
                self._restarting.add(server.label)
                thread = threading.Thread(
                    target=self._restart, args=(server,), name=f"restart-{server.label}"
                )
                thread.start()
                self._restarts.append(thread)

    def _restart(self, server: Served) -> None:
        try:
            while not self._stop.is_set():
                if server.engine is not None:
                    # What is left of the dead incarnation's session (an EngineCore whose API
                    # server crashed) goes before the new one takes the port and the folder.
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(server.engine.proc.pid, signal.SIGKILL)
                    server.engine.close(timeout_s=5)
                server.spawn()
                try:
                    server.wait_ready()
                    return
                except (RuntimeError, TimeoutError) as exc:
                    if self._stop.is_set():
                        return
                    code = server.engine.proc.poll() if server.engine else None
                    self._emit(
                        "crash",
                        server=server.label,
                        returncode=code,
                        injected=False,
                        log_tail=f"restart failed: {exc}\n{server.log_tail()}",
                    )
                    self._stop.wait(5)
        finally:
            self._restarting.discard(server.label)


def start_reference(model: ModelSpec, logs: Path) -> ServerEngine:
    """vLLM's API server for ``model`` without offloading: the oracle's engine."""
    return ServerEngine(
        model.path,
        logs / f"reference-{model.name}.log",
        port=free_port(),
        max_model_len=MAX_MODEL_LEN,
        ready_timeout_s=READY_TIMEOUT_S,
        wait=False,
        kvtier=False,
        extra_args=model.vllm_args,
    )


# -- mounts ------------------------------------------------------------------------------------


@dataclass
class Mounts:
    """tmpfs mounts this run made (unmounted in ``unmount_all``, lazily if busy)."""

    paths: list[Path] = field(default_factory=list)

    def tmpfs(self, path: Path, size: str) -> None:
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )
        self.paths.append(path)

    def unmount_all(self) -> list[str]:
        """Unmount every mount (a read-only bind left over its cache folder first); returns
        what could not be unmounted."""
        failed = []
        for mount in reversed(self.paths):
            for path in (mount / "cache", mount):
                for _ in range(4):
                    if not is_mount_point(path):
                        break
                    if subprocess.run(["umount", str(path)], capture_output=True).returncode:
                        subprocess.run(["umount", "-l", str(path)], capture_output=True)
                if is_mount_point(path):
                    failed.append(str(path))
        return failed


def is_mount_point(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        return any(line.split()[1] == target for line in mounts if len(line.split()) > 1)


def redis_pid(redis: RedisServer) -> int | None:
    process = redis.process
    return process.pid if process is not None and process.poll() is None else None


def kvtier_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m kvtier.cli ARGS`` (the ops commands run on a live folder)."""
    from kvtier.launch import serve_env

    return subprocess.run(
        [sys.executable, "-m", "kvtier.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=serve_env(),
        check=False,
    )


def session_alive(leader: int) -> list[int]:
    """Pids (not zombies) of the session led by ``leader`` that are still alive."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, fields[3] the session id
        if int(fields[3]) == leader and fields[0] != "Z":
            alive.append(int(entry))
    return alive


def wait_all_ready(servers: list[Served], references: list[ServerEngine]) -> None:
    for ref in references:
        ref.wait_ready()
    for server in servers:
        server.wait_ready()


def sleep_until(deadline: float, stop: threading.Event) -> bool:
    """Sleep until ``time.monotonic() >= deadline``; False if ``stop`` was set first."""
    return not stop.wait(max(0.0, deadline - time.monotonic()))
