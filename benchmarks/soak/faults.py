"""The soak's fault schedule (drawn up front from ``random.Random(seed)``) and its injectors.

Every fault acts on one *target*: a server label, ``redis``, a folder label or ``cpu`` (the
machine). A request is attributed the faults on its server's resources (the server, its
folder, Redis if it shares it, the CPU) whose window ``[t, end_t + RECOVERY_S]`` overlaps the
request. One fault per target at a time: a fault whose target is still busy waits for it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.soak.cluster import FolderSpec, Served, is_mount_point, kvtier_cli

#: Seconds after a fault ends during which requests are still attributed to it (caches
#: refilling, a restarted server's first requests, the tier's slow mark decaying).
RECOVERY_S = 5.0

KINDS = (
    "engine_sigkill",
    "redis_kill",
    "redis_restart_empty",
    "redis_sigstop",
    "disk_full",
    "disk_read_only",
    "disk_throttled",
    "records_damaged",
    "gc_to",
    "verify_fix",
    "cpu_burst",
    "client_disconnect",
)

#: Relative frequency of each kind: most are quick; kills and restarts are rarer, since a
#: restart of a server takes tens of seconds here.
WEIGHTS = {
    "records_damaged": 20,
    "client_disconnect": 14,
    "cpu_burst": 12,
    "redis_sigstop": 10,
    "gc_to": 9,
    "verify_fix": 8,
    "disk_read_only": 8,
    "disk_full": 8,
    "disk_throttled": 6,
    "redis_restart_empty": 2,
    "redis_kill": 2,
    "engine_sigkill": 2,
}

#: Damage kinds of tests.support.faults.DAMAGES applied to live records. Left out: "the same
#: key's record of another namespace" (needs a second namespace holding that very key).
DAMAGE_NAMES = (
    "bit flip in the payload",
    "bit flip in the header fields",
    "bit flip in the header padding",
    "truncated",
    "extended",
    "zero-filled",
    "wrong header (unknown format version)",
    "replaced by another key's valid record",
    "hard link to another key's valid record",
    "symlink to a file outside the cache",
    "FIFO",
    "directory",
    "owned by another user (uid 65534, 0644)",
    "world-writable (0666)",
)


@dataclass
class Planned:
    """One scheduled fault: when, what, on which target, with its own random parameters."""

    at_s: float
    kind: str
    target: str
    hold_s: float
    seed: int


@dataclass
class Fault:
    id: int
    kind: str
    target: str
    t: float
    end_t: float | None = None
    detail: str = ""
    injected_kill: bool = False
    #: The injecting thread (a failed injection closes what it opened).
    owner: int = 0


def plan(
    rng: random.Random,
    duration_s: float,
    warmup_s: float,
    mean_gap_s: float,
    kinds: list[str],
    targets: dict[str, list[str]],
    kill_gap_s: float,
) -> list[Planned]:
    """The whole schedule, from ``rng`` alone (same seed, same schedule): exponential gaps of
    ``mean_gap_s``, kinds by ``WEIGHTS``, at least ``kill_gap_s`` between process kills, none
    in the last ``RECOVERY_S`` seconds."""
    weights = [WEIGHTS.get(k, 1) for k in kinds]
    schedule: list[Planned] = []
    t = warmup_s
    last_kill = {"engine": -1e9, "redis": -1e9}
    while True:
        t += rng.expovariate(1.0 / mean_gap_s)
        if t >= duration_s - RECOVERY_S:
            return schedule
        kind = rng.choices(kinds, weights)[0]
        if kind in KILLS:
            family = "engine" if kind == "engine_sigkill" else "redis"
            if t - last_kill[family] < kill_gap_s:
                kind = rng.choice([k for k in kinds if k not in KILLS])
            else:
                last_kill[family] = t
        hold = {
            "redis_kill": rng.uniform(1, 5),
            "redis_sigstop": rng.uniform(1, 3),
            "disk_full": rng.uniform(2, 6),
            "disk_read_only": rng.uniform(2, 6),
            "cpu_burst": rng.uniform(2, 5),
            "disk_throttled": rng.uniform(3, 8),
        }.get(kind, 0.0)
        schedule.append(
            Planned(t, kind, rng.choice(targets[kind]), round(hold, 3), rng.getrandbits(32))
        )


KILLS = ("engine_sigkill", "redis_kill", "redis_restart_empty")


class FaultBook:
    """Every fault of the run, for attribution and the ``fault`` events."""

    def __init__(self, emit: Callable[..., None], now: Callable[[], float]) -> None:
        self._emit = emit
        self._now = now
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self.injected = 0

    def now(self) -> float:
        return self._now()

    def open(self, kind: str, target: str, injected_kill: bool = False) -> Fault:
        with self._lock:
            fault = Fault(
                len(self._faults) + 1,
                kind,
                target,
                self._now(),
                injected_kill=injected_kill,
                owner=threading.get_ident(),
            )
            self._faults.append(fault)
            return fault

    def close(self, fault: Fault, detail: str | None = None) -> None:
        with self._lock:
            if fault.end_t is not None:
                return
            fault.end_t = self._now()
            if detail is not None:
                fault.detail = detail
            self.injected += 1
        self._emit(
            "fault",
            t=fault.t,
            id=fault.id,
            end_t=round(fault.end_t, 4),
            kind=fault.kind,
            target=fault.target,
            detail=fault.detail,
            injected_kill=fault.injected_kill,
        )

    def close_open(self, detail: str, owner: int | None = None) -> None:
        """Close every fault still open (of thread ``owner`` only, if given)."""
        with self._lock:
            still = [
                f for f in self._faults if f.end_t is None and (owner is None or f.owner == owner)
            ]
        for fault in still:
            self.close(fault, f"{fault.detail}; {detail}".strip("; "))

    def active(self, resources: set[str], start_t: float, end_t: float) -> list[int]:
        """Ids of faults on ``resources`` whose window overlaps ``[start_t, end_t]``."""
        with self._lock:
            return [
                f.id
                for f in self._faults
                if f.target in resources
                and f.t <= end_t
                and (f.end_t is None or f.end_t + RECOVERY_S >= start_t)
            ]


@dataclass
class Faults:
    """The injectors; each runs on its own thread and undoes itself early when ``stop`` is set."""

    book: FaultBook
    servers: dict[str, Served]
    folders: dict[str, FolderSpec]
    redis: Any  # kvtier.bench.redis_servers.RedisServer
    stop: threading.Event
    #: (server, rng, fault) -> None: one request that hangs up after its first token.
    disconnect: Callable[[Served, random.Random, Fault], None]
    outside_file: Path
    _target_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _burners: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    #: Faults that could not be injected (target busy too long, nothing to damage...).
    skipped: dict[str, int] = field(default_factory=dict)

    def run_schedule(self, schedule: list[Planned], now: Callable[[], float]) -> None:
        """Inject ``schedule`` in order (``at_s`` on the run's clock) until ``stop``."""
        for planned in schedule:
            wait = planned.at_s - now()
            if wait > 0 and self.stop.wait(wait):
                return
            if self.stop.is_set():
                return
            thread = threading.Thread(
                target=self._inject, args=(planned,), name=f"fault-{planned.kind}", daemon=True
            )
            thread.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _skip(self, kind: str) -> None:
        self.skipped[kind] = self.skipped.get(kind, 0) + 1

    def _inject(self, planned: Planned) -> None:
        lock = self._target_locks.setdefault(planned.target, threading.Lock())
        if not lock.acquire(timeout=30):
            self._skip(planned.kind)
            return
        try:
            if self.stop.is_set():
                return
            getattr(self, planned.kind)(planned, random.Random(planned.seed))
        except Exception as exc:
            self._skip(planned.kind)
            self.book.close_open(f"injection failed: {exc!r}"[:300], owner=threading.get_ident())
            print(f"soak: {planned.kind} on {planned.target} failed: {exc!r}", flush=True)
        finally:
            lock.release()

    # -- servers ---------------------------------------------------------------------------

    def engine_sigkill(self, planned: Planned, rng: random.Random) -> None:
        server = self.servers[planned.target]
        if not server.ready.wait(60) or self.stop.is_set():
            self._skip(planned.kind)
            return
        fault = self.book.open(planned.kind, planned.target, injected_kill=True)
        done = threading.Event()
        server.on_ready.append(done.set)
        pid = server.pid
        server.sigkill()
        fault.detail = f"SIGKILL to the session of pid {pid}"
        # The fault lasts until the restarted server is ready (the supervisor restarts it).
        while not done.wait(1):
            if self.stop.is_set():
                self.book.close(fault, fault.detail + "; run ended before the restart was ready")
                return
        self.book.close(fault, fault.detail + f"; restarted, ready after {self._age(fault):.1f} s")

    def client_disconnect(self, planned: Planned, rng: random.Random) -> None:
        server = self.servers[planned.target]
        if not server.ready.wait(30) or self.stop.is_set():
            self._skip(planned.kind)
            return
        fault = self.book.open(planned.kind, planned.target)
        try:
            self.disconnect(server, rng, fault)
        finally:
            self.book.close(fault)

    # -- Redis -----------------------------------------------------------------------------

    def redis_kill(self, planned: Planned, rng: random.Random) -> None:
        fault = self.book.open(planned.kind, "redis", injected_kill=True)
        self.redis.kill()
        self.stop.wait(planned.hold_s)
        self.redis.start()
        self.book.close(fault, f"SIGKILL; down {planned.hold_s:.1f} s, restarted empty")

    def redis_restart_empty(self, planned: Planned, rng: random.Random) -> None:
        fault = self.book.open(planned.kind, "redis", injected_kill=True)
        self.redis.restart()
        self.book.close(fault, "SIGKILL and restart on the same port: every key gone")

    def redis_sigstop(self, planned: Planned, rng: random.Random) -> None:
        fault = self.book.open(planned.kind, "redis")
        self.redis.pause()
        try:
            self.stop.wait(planned.hold_s)
        finally:
            self.redis.resume()
        self.book.close(fault, f"SIGSTOP for {planned.hold_s:.1f} s, then SIGCONT")

    # -- disk folders ----------------------------------------------------------------------

    def disk_full(self, planned: Planned, rng: random.Random) -> None:
        from tests.support.faults import fill

        folder = self.folders[planned.target]
        fault = self.book.open(planned.kind, planned.target)
        balloon = fill(folder.mount, f"balloon-{fault.id}")
        try:
            size = balloon.stat().st_size
            self.stop.wait(planned.hold_s)
        finally:
            balloon.unlink(missing_ok=True)
        self.book.close(
            fault, f"{size >> 20} MiB balloon filled the file system for {planned.hold_s:.1f} s"
        )

    def disk_read_only(self, planned: Planned, rng: random.Random) -> None:
        folder = self.folders[planned.target]
        fault = self.book.open(planned.kind, planned.target)
        # A remount ro is refused (EBUSY) while a file is open for writing (the index); then
        # a read-only bind over the folder, as an admin's ro remount of a busy volume acts.
        how = "remount ro"
        tried = subprocess.run(
            ["mount", "-o", "remount,ro", str(folder.mount)], capture_output=True, text=True
        )
        if tried.returncode != 0:
            from tests.support.faults import bind_readonly

            how = "read-only bind mount (remount ro refused: busy)"
            bind_readonly(folder.path)
        try:
            self.stop.wait(planned.hold_s)
        finally:
            if how == "remount ro":
                subprocess.run(["mount", "-o", "remount,rw", str(folder.mount)], check=True)
            else:
                subprocess.run(["umount", str(folder.path)], check=True)
        self.book.close(fault, f"{how} for {planned.hold_s:.1f} s, then rw")

    def records_damaged(self, planned: Planned, rng: random.Random) -> None:
        from tests.support.faults import DAMAGES, Sources

        folder = self.folders[planned.target]
        records = sorted(folder.path.glob("*/blocks/**/*.kvb"))
        if len(records) < 2:
            self._skip(planned.kind)
            return
        fault = self.book.open(planned.kind, planned.target)
        done = []
        for _ in range(rng.randint(1, 3)):
            victim = rng.choice(records)
            name = rng.choice(DAMAGE_NAMES)
            siblings = [r for r in records if r.parent.parent == victim.parent.parent]
            others = [r for r in siblings if r.name.split(".")[0] != victim.name.split(".")[0]]

            def other_key(others: list[Path] = others) -> Path:
                return rng.choice(others)

            sources = Sources(other_key, None, self.outside_file)
            if not others and "another key" in name:
                name = "bit flip in the payload"
            try:
                DAMAGES[name][1](victim, rng, sources)
                done.append(f"{victim.name[:12]}: {name}")
            except (OSError, IndexError, ValueError) as exc:  # evicted while we aimed at it
                done.append(f"{victim.name[:12]}: {name} failed ({type(exc).__name__})")
        self.book.close(fault, "; ".join(done))

    def gc_to(self, planned: Planned, rng: random.Random) -> None:
        folder = self.folders[planned.target]
        # Below what the load keeps in the folder (40-60% of the cap), so gc evicts.
        to_mib = max(1, int(folder.cap_bytes * rng.uniform(0.1, 0.4)) >> 20)
        fault = self.book.open(planned.kind, planned.target)
        done = kvtier_cli("gc", str(folder.path), "--to", f"{to_mib}MiB", "--json")
        self.book.close(fault, f"kvtier gc --to {to_mib}MiB: rc {done.returncode} {_tail(done)}")

    def verify_fix(self, planned: Planned, rng: random.Random) -> None:
        folder = self.folders[planned.target]
        fault = self.book.open(planned.kind, planned.target)
        done = kvtier_cli("verify", str(folder.path), "--fix", "--json")
        self.book.close(fault, f"kvtier verify --fix: rc {done.returncode} {_tail(done)}")

    def disk_throttled(self, planned: Planned, rng: random.Random) -> None:
        server = self.servers[planned.target]
        assert server.throttle is not None
        # A slow disk (a 256 KiB record in 0.25-1 s) or a stall (4 KiB/s): the tier's load
        # deadline must abandon such loads and recompute.
        read_bps = rng.choice((256 << 10, 1 << 20, 4 << 10))
        fault = self.book.open(planned.kind, planned.target)
        before = server.throttle.bytes_read()
        server.throttle.throttle(read_bps)
        try:
            self.stop.wait(planned.hold_s)
        finally:
            server.throttle.throttle(None)
        read = server.throttle.bytes_read() - before
        self.book.close(
            fault,
            f"folder reads throttled to {read_bps >> 10} KiB/s for {planned.hold_s:.1f} s "
            f"({read >> 10} KiB read meanwhile)",
        )

    # -- the machine -----------------------------------------------------------------------

    def cpu_burst(self, planned: Planned, rng: random.Random) -> None:
        cores = os.cpu_count() or 1
        fault = self.book.open(planned.kind, "cpu")
        burners = [
            subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"], start_new_session=True)
            for _ in range(cores)
        ]
        self._burners += burners
        try:
            self.stop.wait(planned.hold_s)
        finally:
            for burner in burners:
                with contextlib.suppress(ProcessLookupError):
                    burner.kill()
                burner.wait()
                self._burners.remove(burner)
        self.book.close(fault, f"{cores} busy processes for {planned.hold_s:.1f} s")

    def kill_burners(self) -> None:
        for burner in list(self._burners):
            with contextlib.suppress(ProcessLookupError):
                burner.kill()
            burner.wait()

    def _age(self, fault: Fault) -> float:
        return self.book.now() - fault.t


def _tail(done: subprocess.CompletedProcess[str], chars: int = 160) -> str:
    text = (done.stdout.strip() or done.stderr.strip()).replace("\n", " ")
    return text[-chars:]


def unavailable_kinds(mounts_reason: str | None) -> dict[str, str]:
    """Fault kinds this host or runner cannot inject -> why (recorded in the ``run`` line)."""
    out: dict[str, str] = {}
    if mounts_reason is not None:
        out["disk_full"] = f"needs a tmpfs mount: {mounts_reason}"
        out["disk_read_only"] = f"needs a mount: {mounts_reason}"
    if shutil.which("/bin/sh") is None:
        out["cpu_burst"] = "no /bin/sh"
    return out


def leftover_mounts(folders: dict[str, FolderSpec]) -> list[str]:
    return [str(p) for f in folders.values() for p in (f.path, f.mount) if is_mount_point(p)]
