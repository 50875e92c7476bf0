"""``python -m benchmarks soak``: start everything, run the load and the fault schedule, log,
shut down cleanly on every path, write the report."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.soak.cluster import (
    FolderSpec,
    ModelSpec,
    Mounts,
    Served,
    ServerSpec,
    Supervisor,
    redis_pid,
    session_alive,
    start_reference,
)
from benchmarks.soak.eventlog import EventLog
from benchmarks.soak.events import reference_label
from benchmarks.soak.faults import (
    KINDS,
    FaultBook,
    Faults,
    leftover_mounts,
    plan,
    unavailable_kinds,
)
from benchmarks.soak.load import Bounds, Load, Oracle, Prompts, Sessions, disconnector

SAMPLE_EVERY_S = 5.0


@dataclass(frozen=True)
class Shape:
    """How big a run is: the servers, the pace of requests and faults."""

    warmup_s: float
    rate_per_s: float
    workers: int
    mean_fault_gap_s: float
    kill_gap_s: float


LONG = Shape(warmup_s=30, rate_per_s=1.5, workers=6, mean_fault_gap_s=2.8, kill_gap_s=300)
SHORT = Shape(warmup_s=8, rate_per_s=2.0, workers=3, mean_fault_gap_s=1.5, kill_gap_s=60)


def tiny_spec() -> ModelSpec:
    from tests.support.models import tiny_llama

    # 40 engine blocks (5,120 tokens) of 256 KiB records; a 16 MiB host pool (64 rows).
    return ModelSpec("tiny-llama", tiny_llama(), 2048, 40, "16MiB", 1800, tokenizer=False)


def smollm_spec() -> ModelSpec:
    from kvtier.bench.common import default_model

    # Records of 5.6 MiB (30 layers, 3 KV heads of 64, float32): 24 engine blocks, a host pool
    # of 36 rows. Its prefill is 50-100x the tiny model's here (2-5 s cold on 2 busy cores,
    # paid again by the oracle), so its sessions are fewer and shorter: at an equal share a
    # 2-minute run made 0.7 requests/s, short of the hour's 3,000.
    return ModelSpec(
        "smollm2", Path(default_model()), 49152, 24, "208MiB", 1200, session_weight=0.3
    )


def layout(root: Path, short: bool, smollm: bool) -> tuple[list[ServerSpec], dict[str, FolderSpec]]:
    """The servers and folders. Long: two replicas sharing Redis (each its own folder) and two
    engines sharing one folder (one of them SmolLM2 with ``smollm``). Short: two servers that
    share Redis and one folder, the least that exercises both kinds of sharing."""
    tiny = tiny_spec()
    if short:
        folder = FolderSpec("disk-shared", root / "disk-shared", "24MiB", "64m")
        servers = [
            ServerSpec(label, tiny, "replica+folder-pair", folder, True, "all", label == "srv-a")
            for label in ("srv-a", "srv-b")
        ]
        return servers, {folder.label: folder}
    rep_a = FolderSpec("disk-rep-a", root / "disk-rep-a", "24MiB", "64m")
    rep_b = FolderSpec("disk-rep-b", root / "disk-rep-b", "24MiB", "64m")
    pair_cap = "320MiB" if smollm else "24MiB"
    pair = FolderSpec("disk-pair", root / "disk-pair", pair_cap, "680m" if smollm else "64m")
    servers = [
        ServerSpec("rep-a", tiny, "replica", rep_a, True, "replicas"),
        ServerSpec("rep-b", tiny, "replica", rep_b, True, "replicas"),
        ServerSpec("pair-a", tiny, "folder-pair", pair, False, "pair", throttled=True),
        ServerSpec("pair-b", smollm_spec() if smollm else tiny, "folder-pair", pair, False, "pair"),
    ]
    return servers, {f.label: f for f in (rep_a, rep_b, pair)}


def command_line() -> str:
    argv = sys.argv
    if argv and argv[0].endswith(f"benchmarks{os.sep}__main__.py"):
        return shlex.join(["python", "-m", "benchmarks", *argv[1:]])
    return shlex.join(argv)


def git_rev() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        check=False,
    )
    rev = done.stdout.strip() or "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        check=False,
    ).stdout.strip()
    return rev + ("-dirty" if dirty else "")


def machine() -> str:
    return (
        f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Linux {platform.release()}"
    )


def run(duration_s: float, seed: int, out: Path, smollm: bool, short: bool) -> int:
    """The whole soak; returns the exit code (0 when the report's verdict passed)."""
    from benchmarks.soak import report, sample
    from kvtier.bench.redis_servers import server_binary, start_standalone
    from tests.support.host import mount_unavailable

    shape = SHORT if short else LONG
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    rng = random.Random(seed)
    events = EventLog(out / "events.jsonl")
    root = Path(tempfile.mkdtemp(prefix="kvtier-soak-"))
    mounts = Mounts()
    stop = threading.Event()
    servers: list[Served] = []
    references = {}
    redis = None
    supervisor = None
    faults: Faults | None = None
    book: FaultBook | None = None
    load: Load | None = None
    threads: list[threading.Thread] = []
    folders: dict[str, FolderSpec] = {}
    started_wall = time.monotonic()
    # Ctrl-C and SIGTERM both take the same way out (finally below).
    previous_term = signal.signal(signal.SIGTERM, lambda *_: _raise_interrupt())
    try:
        if server_binary() is None:
            raise SystemExit(
                "soak: no redis-server or valkey-server on PATH (scripts/redis-server.sh)"
            )
        specs, folders = layout(root, short, smollm)
        mount_reason = mount_unavailable()
        left_out = unavailable_kinds(mount_reason)
        for folder in folders.values():
            if mount_reason is None:
                mounts.tmpfs(folder.mount, folder.mount_size)
            folder.path.mkdir(parents=True)
        outside = root / "outside-file"
        outside.write_bytes(b"not a record\n")
        redis = start_standalone(root / "redis", maxmemory_bytes=64 << 20)
        servers = [Served(spec, logs, redis.url, root) for spec in specs]
        models = {s.model.name: s.model for s in specs}
        for model in models.values():
            references[model.name] = start_reference(model, logs)
        for server in servers:
            server.spawn()
        for reference in references.values():
            reference.wait_ready()
        for server in servers:
            server.wait_ready()
        oracles = {name: Oracle(ref) for name, ref in references.items()}
        bounds = Bounds(oracles)
        calibration = {
            name: bounds.calibrate(model, random.Random(seed ^ 0x5EED))
            for name, model in models.items()
        }
        startup_s = time.monotonic() - started_wall

        targets = {
            "engine_sigkill": [s.label for s in servers],
            "disk_throttled": [s.label for s in servers if s.throttle is not None],
            "client_disconnect": [s.label for s in servers],
            "redis_kill": ["redis"],
            "redis_restart_empty": ["redis"],
            "redis_sigstop": ["redis"],
            "cpu_burst": ["cpu"],
            **{
                k: sorted(folders)
                for k in ("disk_full", "disk_read_only", "records_damaged", "gc_to", "verify_fix")
            },
        }
        if short:
            # A restart takes longer than the whole short run on 2 busy cores, and its start-up
            # starves the other server: the CI soak kills Redis, not engines.
            left_out["engine_sigkill"] = "left out of --short: a restart outlasts the run here"
        kinds = [k for k in KINDS if k not in left_out and targets.get(k)]
        schedule = plan(
            random.Random(rng.getrandbits(64)),
            duration_s,
            shape.warmup_s,
            shape.mean_fault_gap_s,
            kinds,
            targets,
            shape.kill_gap_s,
        )

        events.start()
        events.emit(
            "run",
            seed=seed,
            duration_s=duration_s,
            warmup_s=shape.warmup_s,
            command=command_line(),
            started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            git_rev=git_rev(),
            machine=machine(),
            servers=[
                {
                    "label": s.label,
                    "model": s.spec.model.name,
                    "role": s.spec.role,
                    "disk_dir": str(s.spec.folder.path),
                    "shared": s.spec.shared,
                }
                for s in servers
            ],
            folders=[
                {"label": f.label, "path": str(f.path), "cap_bytes": f.cap_bytes}
                for f in folders.values()
            ],
            short=short,
            startup_s=round(startup_s, 2),
            fault_kinds=kinds,
            fault_kinds_left_out=left_out,
            faults_planned=len(schedule),
            cold_prefill_s={
                name: {str(k): round(v, 4) for k, v in c.items()} for name, c in calibration.items()
            },
            deadline_ceiling_s=bounds.deadline_s,
            redis=redis.url,
        )
        book = FaultBook(events.emit, events.now)
        supervisor = Supervisor(servers, events.emit)
        supervisor.start()

        prompts = {name: Prompts.build(model, rng) for name, model in models.items()}
        groups: dict[str, list[Served]] = {}
        for server in servers:
            groups.setdefault(server.spec.group, []).append(server)
        by_label = {s.label: s for s in servers}

        def resources(server: Served) -> set[str]:
            res = {server.label, server.spec.folder.label, "cpu"}
            if server.spec.shared:
                res.add("redis")
            return res

        load = Load(
            servers=servers,
            sessions=Sessions(groups, prompts, random.Random(rng.getrandbits(64))),
            oracles=oracles,
            bounds=bounds,
            resources=resources,
            active_faults=book.active,
            emit=events.emit,
            now=events.now,
            stop=stop,
            rate_per_s=shape.rate_per_s,
            workers=shape.workers,
        )
        faults = Faults(
            book=book,
            servers=by_label,
            folders=folders,
            redis=redis,
            stop=stop,
            disconnect=disconnector(load, prompts),
            outside_file=outside,
        )

        def sampling() -> None:
            while True:
                # A server counts once ready: a starting one grows its descriptors and
                # threads as it should, which is no leak.
                processes = {
                    s.label: s.pid for s in servers if s.pid is not None and s.ready.is_set()
                }
                if (pid := redis_pid(redis)) is not None:
                    processes["redis"] = pid
                for name, ref in references.items():
                    if ref.proc.poll() is None:
                        processes[reference_label(name)] = ref.proc.pid
                try:
                    fields = sample.take(
                        processes, {f.label: (f.path, f.cap_bytes) for f in folders.values()}
                    )
                    events.emit("sample", **fields)
                except Exception as exc:
                    print(f"soak: sample failed: {exc!r}", file=sys.stderr, flush=True)
                if stop.wait(SAMPLE_EVERY_S):
                    return

        load.start()
        for target, name in ((sampling, "soak-sample"),):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            threads.append(thread)
        fault_thread = threading.Thread(
            target=faults.run_schedule, args=(schedule, events.now), name="soak-faults", daemon=True
        )
        fault_thread.start()
        threads.append(fault_thread)
        _progress(events, load, book, duration_s, stop)
    except KeyboardInterrupt:
        print("soak: interrupted; shutting down", file=sys.stderr, flush=True)
    finally:
        stop.set()
        signal.signal(signal.SIGTERM, previous_term)
        after = _shut_down(
            load, faults, book, supervisor, servers, references, redis, threads, folders
        )
        unmount_failed = mounts.unmount_all()
        if unmount_failed:
            print(f"soak: could not unmount {unmount_failed}", file=sys.stderr)
        after["mounts_left"] = leftover_mounts(folders)
        shutil.rmtree(root, ignore_errors=True)
        after["temp_root_left"] = root.exists()
        summary = {"requests": events.counts["request"], "faults": events.counts["fault"]}
        if events.counts["run"]:
            events.emit("end", **summary, after_shutdown=after)
        events.close()
    if events.counts["run"] == 0:
        return 2  # start-up failed; the exception (if any) has been raised already
    verdict = report.write_report(events.path, out)
    print(
        f"soak: {summary['requests']} requests, {summary['faults']} faults; "
        f"verdict {'PASSED' if verdict.passed else 'FAILED'}"
    )
    for failure in verdict.failures:
        print(f"  - {failure}")
    return 0 if verdict.passed else 1


REGION_NAME = re.compile(r"/dev/shm/(vllm_offload_[\w.-]+?\.mmap)")


def own_regions(logs: list[Path]) -> list[str]:
    """Host-pool region files named in ``logs`` that still exist in /dev/shm."""
    names: set[str] = set()
    for log in logs:
        with contextlib.suppress(OSError):
            names.update(REGION_NAME.findall(log.read_text(errors="replace")))
    return sorted(n for n in names if (Path("/dev/shm") / n).exists())


def _all_at_once(calls: list) -> None:
    """Run ``calls`` on threads of their own and wait for all; errors are ignored."""

    def quietly(call) -> None:  # type: ignore[no-untyped-def]
        with contextlib.suppress(Exception):
            call()

    threads = [threading.Thread(target=quietly, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def _progress(
    events: EventLog, load: Load, book: FaultBook, duration_s: float, stop: threading.Event
) -> None:
    """Wait out the run, printing a line a minute (results go to the event log)."""
    next_line = 60.0
    while (left := duration_s - events.now()) > 0:
        if stop.wait(min(left, 1.0)):
            return
        if events.now() >= next_line:
            next_line += 60
            print(
                f"soak: t={events.now():.0f} s, {load.requests} requests, {book.injected} faults",
                flush=True,
            )


#: How long a server's other processes (vLLM's engine core) may take to exit after the API
#: server itself has: the engine core is told to stop by its parent's exit and frees its
#: memory first, a second or two on a busy machine. One alive after that is left behind.
SURVIVOR_GRACE_S = 15.0


def _survivors(leaders: list[int], grace_s: float) -> list[dict[str, object]]:
    """The processes of the sessions led by ``leaders`` still alive ``grace_s`` after the
    servers' exit (none sooner: waits only while some remain), each with its command line."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = sorted({pid for leader in leaders for pid in session_alive(leader)})
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    return [{"pid": pid, "cmdline": _cmdline(pid)} for pid in alive]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _shut_down(
    load: Load | None,
    faults: Faults | None,
    book: FaultBook | None,
    supervisor: Supervisor | None,
    servers: list[Served],
    references: dict,
    redis: object,
    threads: list[threading.Thread],
    folders: dict[str, FolderSpec],
) -> dict[str, object]:
    """Stop load, faults (each undoes itself), servers, Redis; what was left after."""
    from benchmarks.soak import sample

    if load is not None:
        load.join(timeout_s=90)
    if faults is not None:
        faults.join(timeout_s=30)
        faults.kill_burners()
    if book is not None:
        book.close_open("ended by the run's shutdown")
    for thread in threads:
        thread.join(timeout=10)
    if supervisor is not None:
        supervisor.stop()
    closers = [server.close for server in servers] + [
        lambda r=reference: r.close(timeout_s=30) for reference in references.values()
    ]
    _all_at_once(closers)  # each waits for its server's exit: SIGTERM them together
    if supervisor is not None:
        supervisor.join_restarts(timeout_s=30)
        _all_at_once([server.close for server in servers])  # one a restart spawned meanwhile
    if redis is not None:
        with contextlib.suppress(Exception):
            redis.kill()  # type: ignore[attr-defined]
    leaders = [pid for s in servers for pid in s.pids] + [r.proc.pid for r in references.values()]
    alive = _survivors(leaders, grace_s=SURVIVOR_GRACE_S)
    after: dict[str, object] = {
        "servers_alive": len(alive),
        "survivors": alive,
        "survivor_grace_s": SURVIVOR_GRACE_S,
    }
    for survivor in alive:  # counted as a failure; killed so the run leaves nothing behind
        with contextlib.suppress(ProcessLookupError, KeyError):
            os.kill(int(survivor["pid"]), signal.SIGKILL)
    try:
        measured = sample.take({}, {f.label: (f.path, f.cap_bytes) for f in folders.values()})
        # /dev/shm is the machine's: other engines' regions are not this run's leak, so
        # ``shm_regions`` counts the regions this run's servers logged; ``_all`` every one.
        ours = own_regions([s.log for s in servers])
        after["shm_regions"] = len(ours)
        after["shm_region_files"] = ours
        after["shm_regions_all"] = measured.get("shm_regions")
        after["temp_files"] = measured.get("temp_files")
    except Exception as exc:
        after["shm_regions"] = after["temp_files"] = None
        after["error"] = repr(exc)
    return after
