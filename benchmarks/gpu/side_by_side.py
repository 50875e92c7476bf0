"""Serving workloads side by side on one GPU: a fresh vLLM OpenAI server per configuration and
workload, driven by ``kvtier bench workload``, every configuration's results in one folder.

Configurations (``KVTIER_SXS_CONFIGS``, space-separated, in this order by default):

* ``prefix-only``: vLLM's prefix cache, no offloading;
* ``vllm-cpu``: vLLM's own CPU offloading as a user turns it on (``--kv-offloading-size``);
* ``vllm-fs``: vLLM's CPU pool and its stock ``fs`` tier (``TieringOffloadingSpec``);
* ``kvtier``: vLLM's host pool with kvtier's disk tier and decision (``kvtier.kv_transfer_config``);
* ``kvtier-chunk256``: ``kvtier`` with vLLM's offloaded chunk set to 256 tokens (the
  ``block_size`` option; vLLM's default is one GPU block, 16 tokens): a record per 256 tokens;
* ``kvtier-shm``: ``kvtier`` with its disk folder on tmpfs (``/dev/shm``): the device out of the
  write path, for telling the device's cost from the rest;
* ``kvtier-io1``: ``kvtier`` with one disk thread for reads and one for writes (four by default);
* ``kvtier-nosync``, ``kvtier-nochecksum``, ``kvtier-switch``: trials, ``kvtier`` with one change
  applied in every process of its server by a ``sitecustomize`` module (``TRIALS``): its disk
  index with ``synchronous=OFF`` (no device flush at all); records written with no payload
  checksum (a diagnosis only: such records never load); the interpreter's switch interval at
  0.5 ms instead of 5. A change is so measured beside the code it would replace, on one host,
  before it lands;
* ``kvtier-shared``: the same with kvtier's shared tier on a loopback Redis
  (``KVTIER_SXS_REDIS_SERVER``: the carried ``redis-server``);
* ``lmcache``: vLLM's ``LMCacheConnectorV1`` with LMCache's CPU and local-disk backends, set by
  ``benchmarks/gpu/lmcache-env.sh``.

Every offloading configuration gets the same host-memory bytes (``KVTIER_SXS_CPU_GB``) and, where
it has a disk, the same folder size (``KVTIER_SXS_DISK_GB``; vLLM's ``fs`` tier has no bound).
The engine's own KV cache is cut to ``KVTIER_SXS_GPU_BLOCKS`` blocks so that the workloads'
histories fall out of it between a user's rounds.

Workloads (``KVTIER_SXS_WORKLOADS``: ``chat``, ``no-reuse``, ``restart``, ``documents``) take
their sizes from ``KVTIER_SXS_CHAT`` and ``KVTIER_SXS_DOCUMENTS`` (the driver's options);
``KVTIER_SXS_REPEATS`` passes of every configuration per workload (pass N > 1 in folder
``WORKLOAD-N``). The
``restart`` workload restarts the configuration's server with ``side_by_side.py restart``
between two rounds; kvtier's and vLLM's disk folders survive it, the host memory does not.

The model is the Llama-3-8B shape (``KVTIER_SXS_SHAPE``: another of the end-to-end runner's
shapes, e.g. ``llama-3-70b-20l``) with dummy weights and SmolLM2's tokenizer (its vocabulary,
49,152 tokens, replaces Llama 3's so that text prompts tokenize on a machine with no model
hub; the KV shape, which is what offloading moves, is the named model's).

Run on the GPU host by ``on-host.sh sxs NAME``; the results folder gets, per workload, the
driver's table, plot and JSON, and each server's log. A run stops starting servers when fewer
than ``KVTIER_SXS_MIN_LEFT_S`` seconds remain of ``KVTIER_SXS_BUDGET_S``, so its results come
back inside one call.

After each run the results folder gets the bytes left in the configuration's disk folder
(``disk-CONFIG.txt``); what each engine-core thread did while the driver ran: its CPU seconds,
the times it waited (a lock, the GIL, I/O) and was preempted, its moves between CPUs
(``cpu-threads-CONFIG.txt``, by thread, with the process's total and the wall time); and the
whole machine's CPU time by kind (steal and iowait included) and each disk's requests, flushes
included, over the same span (``system-CONFIG.txt``, from ``/proc/stat`` and ``/proc/diskstats``).

Profiles (``KVTIER_SXS_PROFILE``: the configurations to profile, space-separated;
``KVTIER_SXS_PYSPY``: a ``py-spy`` binary): ``KVTIER_SXS_PROFILE_AT`` seconds into each of their
workloads, the engine-core process is sampled by ``py-spy`` twice, as collapsed stacks per
thread: for ``KVTIER_SXS_PROFILE_S`` seconds only the thread holding the GIL
(``profile-CONFIG-gil.txt``: whose Python runs while the engine's loop may wait), then as long
every thread, idle ones included (``profile-CONFIG-all.txt``).

The engine runs eager by default (every kernel launched from Python: the engine at its most
sensitive to work beside it in its process); ``KVTIER_SXS_GRAPHS=1`` runs decode batches as
CUDA graphs instead (``CUDA_GRAPHS``).

For a trial of the runner itself on a CPU machine (vllm-cpu): ``KVTIER_SXS_MODEL`` names a model
folder used as it is, ``KVTIER_SXS_ENGINE_ARGS`` replaces the GPU engine options and
``KVTIER_SXS_PLATFORM=cpu`` builds kvtier's CPU configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# What vLLM needs on the GPU host, and the throw-away loopback Redis: the end-to-end runner's
# (standard library only at import).
from kvtier_cuda_e2e import ENV, SHAPES, start_redis  # noqa: E402

WORK = Path(os.environ.get("KVTIER_SXS_WORK", "/var/tmp/kvtier-sxs"))
OUT = Path(os.environ.get("KVTIER_SXS_OUT", "sxs-out"))
TOKENIZER = Path(os.environ.get("KVTIER_SXS_TOKENIZER", ".gpu26/model"))
CONFIGS = os.environ.get(
    "KVTIER_SXS_CONFIGS", "prefix-only vllm-cpu vllm-fs kvtier kvtier-shared lmcache"
).split()
WORKLOADS = os.environ.get("KVTIER_SXS_WORKLOADS", "chat").split()
#: Times each workload runs every configuration, in turn (ABC ABC ...): a second pass shows
#: the run-to-run spread, which on a shared host can exceed the differences measured.
REPEATS = int(os.environ.get("KVTIER_SXS_REPEATS", "1"))
CPU_GB = int(os.environ.get("KVTIER_SXS_CPU_GB", "8"))
DISK_GB = int(os.environ.get("KVTIER_SXS_DISK_GB", "40"))
GPU_BLOCKS = int(os.environ.get("KVTIER_SXS_GPU_BLOCKS", "3072"))
MAX_MODEL_LEN = int(os.environ.get("KVTIER_SXS_MAX_MODEL_LEN", "10240"))
CHAT = os.environ.get(
    "KVTIER_SXS_CHAT",
    "--users 20 --rounds 6 --system-tokens 1000 --question-tokens 1000 --answer-tokens 48 "
    "--concurrency 4",
)
DOCUMENTS = os.environ.get(
    "KVTIER_SXS_DOCUMENTS",
    "--documents 24 --document-tokens 6000 --questions 2 --question-tokens 100 "
    "--answer-tokens 48 --order tile --concurrency 4",
)
#: Full CUDA graphs for decode batches, without torch.compile (vLLM's graphs do not need its
#: compiler), captured for the batch sizes the workloads reach: a decode step is then a graph
#: replay, as in a default deployment, where eager mode launches every kernel from Python.
CUDA_GRAPHS = "--compilation-config " + shlex.quote(
    json.dumps(
        {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4, 8]}
    )
)
ENGINE_ARGS = os.environ.get(
    "KVTIER_SXS_ENGINE_ARGS",
    "--load-format dummy --dtype bfloat16 --attention-backend FLASH_ATTN "
    "--max-num-batched-tokens 8192 --gpu-memory-utilization 0.6 "
    + (CUDA_GRAPHS if os.environ.get("KVTIER_SXS_GRAPHS") == "1" else "--enforce-eager"),
)
PLATFORM = os.environ.get("KVTIER_SXS_PLATFORM", "cuda")
BUDGET_S = float(os.environ.get("KVTIER_SXS_BUDGET_S", "540"))
MIN_LEFT_S = float(os.environ.get("KVTIER_SXS_MIN_LEFT_S", "100"))
PORT = int(os.environ.get("KVTIER_SXS_PORT", "8100"))
SHM_DISK = Path(os.environ.get("KVTIER_SXS_SHM_DISK", "/dev/shm/kvtier-sxs-disk"))
PROFILED = os.environ.get("KVTIER_SXS_PROFILE", "").split()
PYSPY = os.environ.get("KVTIER_SXS_PYSPY", "py-spy")
PROFILE_AT_S = float(os.environ.get("KVTIER_SXS_PROFILE_AT", "10"))
PROFILE_S = float(os.environ.get("KVTIER_SXS_PROFILE_S", "12"))
#: The model shape (``KVTIER_SXS_SHAPE``, a name of ``kvtier_cuda_e2e.SHAPES``): by default
#: Llama-3-8B's (32 layers, 8 KV heads of 128: 128 KiB of KV per token); ``llama-3-70b-20l``
#: computes about 3x more per byte of KV, which moves the disk's break-even with prefill.
#: Either with SmolLM2's vocabulary.
SHAPE_NAME = os.environ.get("KVTIER_SXS_SHAPE", "llama-3-8b")
SERVED_NAME = f"{SHAPE_NAME}-shape"
SHAPE = {**SHAPES[SHAPE_NAME], "vocab_size": 49152}
STARTED = time.monotonic()


def model_dir() -> Path:
    if os.environ.get("KVTIER_SXS_MODEL"):
        return Path(os.environ["KVTIER_SXS_MODEL"])
    folder = WORK / "model"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, folder / name)
    (folder / "config.json").write_text(json.dumps(SHAPE))
    return folder


def transfer_config(config: str) -> dict | None:
    """The ``--kv-transfer-config`` of a configuration (None: none)."""
    if config in KVTIER_CONFIGS:
        import kvtier

        return kvtier.kv_transfer_config(
            extra={"block_size": 256} if config == "kvtier-chunk256" else None,
            disk_threads=1 if config == "kvtier-io1" else 4,
            host_pool=f"{CPU_GB}GiB",
            disk_dir=disk_folder(config),
            disk_capacity=f"{DISK_GB}GiB",
            platform=PLATFORM,
            shared=os.environ["KVTIER_SXS_SHARED_URL"] if config == "kvtier-shared" else None,
        )
    if config == "vllm-fs":
        return {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": CPU_GB << 30,
                "secondary_tiers": [{"type": "fs", "root_dir": str(disk_folder("vllm-fs"))}],
            },
        }
    if config == "lmcache":
        return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    return None


#: Trial configurations: the Python run at every interpreter's start of their servers (their
#: ``sitecustomize``), each one change to kvtier; otherwise they are ``kvtier``.
TRIALS = {
    "kvtier-nosync": (
        "from kvtier.store.disk import index\n"
        "_init = index.Index.__init__\n"
        "def _init_unsynced(self, *args, **kwargs):\n"
        "    _init(self, *args, **kwargs)\n"
        "    self._conn.execute('PRAGMA synchronous=OFF')\n"
        "index.Index.__init__ = _init_unsynced\n"
    ),
    "kvtier-nochecksum": (
        f"import sys\nsys.path.append({str(HERE.parents[1])!r})  # the checkout's benchmarks\n"
        "import kvtier.store.disk.store as store\n"
        "from benchmarks.write_cost import skip_checksums\n"
        "skip_checksums(store)\n"
    ),
    # A thread waiting for the GIL takes it from one running Python after this long (5 ms by
    # default): shorter, the engine's loop waits less behind a write thread's Python.
    "kvtier-switch": "import sys\nsys.setswitchinterval(0.0005)\n",
}
KVTIER_CONFIGS = (
    "kvtier", "kvtier-shared", "kvtier-chunk256", "kvtier-shm", "kvtier-io1", *TRIALS
)  # fmt: skip


def trial_path(config: str) -> str | None:
    """A folder holding the ``sitecustomize`` of a trial configuration (None: not a trial)."""
    if config not in TRIALS:
        return None
    folder = WORK / f"trial-{config}"
    folder.mkdir(parents=True, exist_ok=True)
    code = TRIALS[config]
    (folder / "sitecustomize.py").write_text(
        f"try:\n{''.join('    ' + line + chr(10) for line in code.splitlines())}"
        f"except Exception as exc:  # a trial that cannot apply must not pass for one\n"
        f"    raise SystemExit(f'trial {config} not applied: {{exc}}')\n"
        f"import os, sys\n"
        f"print(f'trial {config} applied in pid {{os.getpid()}}', file=sys.stderr)\n"
    )
    return str(folder)


def system_counters() -> dict[str, float]:
    """The machine's CPU seconds by kind and each disk's request counters, cumulative."""
    counters: dict[str, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    kinds = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    with contextlib.suppress(OSError):
        first = Path("/proc/stat").read_text().splitlines()[0].split()
        for kind, value in zip(kinds, first[1:], strict=False):
            counters[f"cpu {kind} s"] = int(value) / ticks
    fields = {3: "reads", 5: "read sectors", 7: "writes", 9: "written sectors", 10: "write ms",
              18: "flushes", 19: "flush ms"}  # fmt: skip
    with contextlib.suppress(OSError):
        for line in Path("/proc/diskstats").read_text().splitlines():
            parts = line.split()
            if len(parts) < 20 or parts[2].startswith(("loop", "ram")):
                continue
            for index, name in fields.items():
                counters[f"{parts[2]} {name}"] = int(parts[index])
    return counters


def write_system(out: Path, config: str, before: dict[str, float], wall_s: float) -> None:
    """What the machine did while a configuration's workload ran (the changed counters)."""
    after = system_counters()
    lines = [f"{config}: {wall_s:.1f} s of driver, whole machine"]
    for name, value in after.items():
        change = value - before.get(name, 0.0)
        if change:
            lines.append(f"{change:14.1f}  {name}")
    (out / f"system-{config}.txt").write_text("\n".join(lines) + "\n")


def disk_folder(config: str) -> Path:
    """Where a configuration keeps its disk tier's files."""
    if config == "kvtier-shm":
        return SHM_DISK
    if config.startswith("kvtier"):
        return WORK / "disk-kvtier"
    return WORK / ("disk-lmcache" if config == "lmcache" else "disk-fs")


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when it does not exist)."""
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


#: Per-thread counters read from ``/proc``: CPU seconds, context switches the thread asked for
#: (it waited: I/O, a lock, the GIL) and ones forced on it, and moves to another CPU.
THREAD_COUNTERS = ("cpu s", "waits", "preempted", "migrations")


def thread_counters(pid: int) -> dict[str, tuple[float, ...]]:
    """``THREAD_COUNTERS`` of each thread of ``pid``, by ``name (tid)`` (migrations 0 where the
    kernel does not report them)."""
    ticks = os.sysconf("SC_CLK_TCK")
    counted: dict[str, tuple[float, ...]] = {}
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines())
        except (OSError, ValueError):
            continue
        migrations = 0
        with contextlib.suppress(OSError):
            for line in (task / "sched").read_text().splitlines():
                if line.startswith("se.nr_migrations"):
                    migrations = int(line.split(":")[1])
        counted[f"{name} ({task.name})"] = (
            (int(fields[11]) + int(fields[12])) / ticks,
            int(status.get("voluntary_ctxt_switches", "0")),
            int(status.get("nonvoluntary_ctxt_switches", "0")),
            migrations,
        )
    return counted


def write_thread_cpu(
    out: Path, config: str, before: dict[str, tuple[float, ...]], pid: int, wall_s: float
) -> None:
    """Each engine-core thread's ``THREAD_COUNTERS`` since ``before`` (nothing when the engine
    is gone: the restart workload replaced it)."""
    after = thread_counters(pid)
    if not after:
        return
    zero = (0.0,) * len(THREAD_COUNTERS)
    spent = {
        t: tuple(a - b for a, b in zip(after[t], before.get(t, zero), strict=True)) for t in after
    }
    busy = sorted(((t, c) for t, c in spent.items() if c[0] > 0), key=lambda tc: -tc[1][0])
    lines = [
        f"{config}: engine core {pid}, {wall_s:.1f} s of driver, by thread",
        "".join(f"{name:>12}" for name in THREAD_COUNTERS) + "  thread",
    ]
    lines += ["".join(f"{value:12.2f}" for value in c) + f"  {t}" for t, c in busy]
    lines.append(f"{sum(c[0] for c in spent.values()):12.2f}  total CPU s")
    (out / f"cpu-threads-{config}.txt").write_text("\n".join(lines) + "\n")


def lmcache_env() -> dict[str, str]:
    """The variables ``lmcache-env.sh`` sets, for this run's sizes and folder."""
    script = HERE / "lmcache-env.sh"
    env = {
        **os.environ,
        "KVTIER_SXS_CPU_GB": str(CPU_GB),
        "KVTIER_SXS_DISK_GB": str(DISK_GB),
        "KVTIER_SXS_LMCACHE_DISK_DIR": str(disk_folder("lmcache")),
    }
    dump = subprocess.run(
        ["bash", "-c", f"set -a; source {shlex.quote(str(script))}; env -0"],
        env=env,
        capture_output=True,
        check=True,
    ).stdout
    pairs = (item.split("=", 1) for item in dump.decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k.startswith("LMCACHE_") or k.startswith("PYTHON")}


def server_argv(config: str) -> list[str]:
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir()), "--served-model-name", SERVED_NAME, "--seed", "0",
        "--host", "127.0.0.1", "--port", str(PORT), *shlex.split(ENGINE_ARGS),
        "--max-model-len", str(MAX_MODEL_LEN), "--num-gpu-blocks-override", str(GPU_BLOCKS),
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
    ]  # fmt: skip
    if config == "vllm-cpu":
        argv += ["--kv-offloading-size", str(CPU_GB), "--kv-offloading-backend", "native"]
    transfer = transfer_config(config)
    if transfer is not None:
        argv += ["--kv-transfer-config", json.dumps(transfer)]
    return argv


def pid_file(config: str) -> Path:
    return WORK / f"server-{config}.pid"


def start(config: str, log: Path) -> None:
    """A server of ``config`` in a session of its own (a restart command outlives it)."""
    env = {**os.environ, **ENV}
    if config == "lmcache":
        env.update(lmcache_env())
    trial = trial_path(config)
    if trial is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (trial, env.get("PYTHONPATH")) if p)
    with log.open("a") as sink:
        command = shlex.join(server_argv(config))
        sink.write(f"\n== {time.strftime('%H:%M:%S')} start {config}: {command}\n")
        sink.flush()
        server = subprocess.Popen(
            server_argv(config), env=env, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    pid_file(config).write_text(str(server.pid))


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. Zombies do not count: a server the
    runner started and a restart command stopped stays a zombie until the runner reaps it,
    and ``killpg(pgid, 0)`` would find it."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop(config: str) -> None:
    """Stop the configuration's server (its whole session) and wait for the port."""
    path = pid_file(config)
    if not path.exists():
        return
    pid = int(path.read_text())
    path.unlink()
    for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not group_alive(pid):
            break
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", PORT)) != 0:
                return
        time.sleep(0.5)


def wait_ready(config: str, timeout_s: float = 300.0) -> bool:
    url = f"http://127.0.0.1:{PORT}/health"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_alive(int(pid_file(config).read_text())):
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


def workload_argv(workload: str, config: str, out: Path) -> list[str]:
    sizes = DOCUMENTS if workload == "documents" else CHAT
    argv = [
        sys.executable, "-m", "kvtier.cli", "bench", "workload",
        "--url", f"http://127.0.0.1:{PORT}", "--workload", workload, "--model", SERVED_NAME,
        "--endpoint", "completions", "--label", config, "--out", str(out), *shlex.split(sizes),
    ]  # fmt: skip
    if workload == "restart":
        restart = f"{shlex.quote(sys.executable)} {shlex.quote(__file__)} restart {config}"
        argv += ["--restart-command", restart]
    return argv


def engine_core_pid(server_pid: int) -> int | None:
    """The engine-core process under the API server: the one vLLM titles ``VLLM::EngineCore``
    where ``setproctitle`` is installed, else the server's largest other process (the one
    holding the model)."""
    members: list[tuple[int, int]] = []  # (resident KiB, pid)
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            pgid = int(status.with_name("stat").read_text().rsplit(")", 1)[1].split()[2])
            if pgid != server_pid or int(status.parent.name) == server_pid:
                continue
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
            cmdline = status.with_name("cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if "EngineCor" in fields.get("Name", "") or b"EngineCore" in cmdline:
            return int(status.parent.name)
        members.append((int(fields.get("VmRSS", "0 kB").split()[0]), int(status.parent.name)))
    return max(members)[1] if members else None


def profile(config: str, out: Path, driver: subprocess.Popen, pid: int | None) -> None:
    """Sample the engine core ``pid`` with py-spy while the driver runs (see the module
    docstring)."""
    deadline = time.monotonic() + PROFILE_AT_S
    while time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.2)
    if pid is None or driver.poll() is not None:
        print(f"{config}: not profiled (engine core {pid}, driver ended)", flush=True)
        return
    for name, flags in (("gil", ["--gil"]), ("all", ["--idle"])):
        argv = [
            PYSPY, "record", "--pid", str(pid), "--threads", "--nonblocking", "--format", "raw",
            "--rate", "200", "--duration", str(int(PROFILE_S)), *flags,
            "--output", str(out / f"profile-{config}-{name}.txt"),
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True)
        print(f"{config}: py-spy {name} rc {done.returncode} {done.stderr[-300:]}", flush=True)


def clean_folders() -> None:
    for config in ("kvtier", "kvtier-shm", "vllm-fs", "lmcache"):  # every folder there is
        shutil.rmtree(disk_folder(config), ignore_errors=True)


def flush_shared() -> None:
    url = os.environ.get("KVTIER_SXS_SHARED_URL")
    if url:
        host, port = url.removeprefix("redis://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"*1\r\n$8\r\nFLUSHALL\r\n")
            sock.recv(64)


def run_one(workload: str, config: str, repeat: int = 1) -> str:
    """One fresh server of ``config`` driven through ``workload``; its results go to the
    workload's folder (``WORKLOAD-N`` for pass N > 1)."""
    out = OUT / (workload if repeat == 1 else f"{workload}-{repeat}")
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"server-{config}.log"
    clean_folders()
    flush_shared()
    started = time.monotonic()
    start(config, log)
    try:
        if not wait_ready(config):
            return f"{workload} {config}: server did not become ready (see {log.name})"
        ready_s = time.monotonic() - started
        engine = engine_core_pid(int(pid_file(config).read_text()))
        cpu_before = thread_counters(engine) if engine is not None else {}
        system_before = system_counters()
        driven = time.monotonic()
        drive = subprocess.Popen(workload_argv(workload, config, out), env={**os.environ, **ENV})
        if config in PROFILED:
            profile(config, out, drive, engine)
        drive.wait()
        driven_s = time.monotonic() - driven
        write_system(out, config, system_before, driven_s)
        if engine is not None:
            write_thread_cpu(out, config, cpu_before, engine, driven_s)
        folder = disk_folder(config)
        (out / f"disk-{config}.txt").write_text(f"{folder_bytes(folder)} bytes in {folder}\n")
        return (
            f"{workload} {config}: driver rc {drive.returncode}, server ready in {ready_s:.0f} s, "
            f"run {time.monotonic() - started - ready_s:.0f} s"
        )
    finally:
        stop(config)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "restart":  # the restart workload's command
        config = sys.argv[2]
        log = sorted(OUT.glob(f"*/server-{config}.log"), key=lambda p: p.stat().st_mtime)[-1]
        stop(config)
        start(config, log)
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    model_dir()
    # ``timeout`` stops this process with SIGTERM: the servers, in sessions of their own, are
    # stopped in the ``finally`` below, not left holding the GPU for the next call.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    redis = None
    binary = os.environ.get("KVTIER_SXS_REDIS_SERVER")
    if "kvtier-shared" in CONFIGS and binary:
        redis, os.environ["KVTIER_SXS_SHARED_URL"] = start_redis(binary)
    print(
        f"side by side: configs {CONFIGS}, workloads {WORKLOADS}, host memory {CPU_GB} GiB, "
        f"disk {DISK_GB} GiB, GPU blocks {GPU_BLOCKS}, chat {CHAT!r}",
        flush=True,
    )
    status = 0
    try:
        for workload, repeat, config in (
            (w, r, c) for w in WORKLOADS for r in range(1, REPEATS + 1) for c in CONFIGS
        ):
            left = BUDGET_S - (time.monotonic() - STARTED)
            if left < MIN_LEFT_S:
                print(f"{workload} {config}: skipped, {left:.0f} s left", flush=True)
                continue
            if config == "kvtier-shared" and "KVTIER_SXS_SHARED_URL" not in os.environ:
                print(f"{workload} {config}: skipped, no KVTIER_SXS_REDIS_SERVER", flush=True)
                continue
            line = run_one(workload, config, repeat)
            status |= "rc 0" not in line
            print(f"{line} (pass {repeat})" if REPEATS > 1 else line, flush=True)
    finally:
        for config in CONFIGS:
            stop(config)
        clean_folders()
        if redis is not None:
            redis.terminate()
    return status


if __name__ == "__main__":
    sys.exit(main())
