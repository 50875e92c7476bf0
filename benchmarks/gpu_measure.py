"""Raw GPU evidence: disk, host->GPU, GPUDirect Storage and prefill timings on a CUDA machine.

The measuring half of ``benchmarks.gpu_evidence`` (which also holds the report).
Imports torch lazily, inside the functions that need it, so the report can run without it.
Every section is wrapped: a failing section records its error in the results and the run
goes on, because device time is scarce and one broken probe must not cost the rest.

Sections, in order (each one appends to the JSON file as soon as it is done):

1. ``env``: GPU, driver, kernel, file system of the store folder, whether the page cache can
   be dropped and whether the nvidia-fs driver (needed for true GPUDirect Storage) is there.
2. ``prefill``: bf16 decoder layers of real model shapes (Llama-3-8B, Llama-3-70B, a
   Mixtral-8x7B-like MoE) timed with CUDA events for ``n`` new tokens over ``m`` cached;
   a few layers are timed and the per-layer median is scaled to the model's layer count.
3. ``h2d``: pinned host -> GPU copies (one big copy; 32 MiB and 2 MiB chunks on 1 and 4
   streams) and a pageable reference.
4. ``disk``: kvtier's ``DiskStore``: put records, then cold ``get_into`` pinned host memory
   with several threads; the plain sequential read of the same files for reference; and a
   whole-context restore (cold read + one H2D copy) for each KV size the report needs.
5. ``gds``: cuFile (libcufile through ctypes) reads of the same record payloads straight
   into GPU memory, checked byte for byte against the store's read; whether it ran in
   compat mode (a CPU bounce buffer) or through nvidia-fs is recorded, not assumed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import json
import math
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvtier.bench.report import drop_page_cache

MiB = 1 << 20
GiB = 1 << 30

#: Model shapes: attention layers, hidden size, query heads, KV heads, head dim, MLP width,
#: experts (0: dense) and experts per token.
MODELS: dict[str, dict[str, int]] = {
    "llama3-8b": dict(layers=32, hidden=4096, q_heads=32, kv_heads=8, head_dim=128,
                      mlp=14336, experts=0, top_k=0, timed_layers=4),
    "llama3-70b": dict(layers=80, hidden=8192, q_heads=64, kv_heads=8, head_dim=128,
                       mlp=28672, experts=0, top_k=0, timed_layers=2),
    "mixtral-8x7b": dict(layers=32, hidden=4096, q_heads=32, kv_heads=8, head_dim=128,
                         mlp=14336, experts=8, top_k=2, timed_layers=2),
}  # fmt: skip

CONTEXTS = (2048, 8192, 16384, 32768)

#: (cached, new) prefill steps timed per model: full prefills, prefix-cached halves and
#: short suffixes over long prefixes, so the report can fit and check t(m, n).
STEPS: tuple[tuple[int, int], ...] = (
    (0, 512), (0, 1024), (0, 2048), (0, 4096), (0, 8192), (0, 16384), (0, 32768),
    (1024, 1024), (4096, 4096), (8192, 8192), (16384, 16384),
    (6144, 2048), (14336, 2048), (30720, 2048),
)  # fmt: skip


def kv_bytes_per_token(shape: dict[str, int], dtype_bytes: int = 2) -> int:
    """K and V of every layer for one token."""
    return shape["layers"] * 2 * shape["kv_heads"] * shape["head_dim"] * dtype_bytes


class Results:
    """The JSON document being built; written out after every section."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "started_unix": time.time(),
            "argv": [sys.executable, "-m", "benchmarks", *sys.argv[1:]],
            "sections": {},
        }

    def section(self, name: str, fn: Callable[[], Any]) -> Any:
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        try:
            value = fn()
            self.data["sections"][name] = {"ok": True, "result": value}
        except Exception as exc:
            value = None
            self.data["sections"][name] = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
            print(traceback.format_exc(), flush=True)
        self.data["sections"][name]["wall_s"] = time.perf_counter() - start
        self.write()
        return value

    def write(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"<{exc}>"


# -- env ----------------------------------------------------------------------------------


def measure_env(store_dir: Path) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": props.name,
        "gpu_memory_bytes": props.total_memory,
        "sm_count": props.multi_processor_count,
        "nvidia_smi": _run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,pcie.link.gen.current,"
                "pcie.link.width.current,clocks.sm,clocks.mem",
                "--format=csv",
            ]
        ),
        "meminfo": Path("/proc/meminfo").read_text().splitlines()[:3],
        "store_dir_df": _run(["df", "-T", "-B1", str(store_dir)]),
        "mounts_for_dir": _run(["findmnt", "-T", str(store_dir)]),
        "block_devices": _run(["lsblk", "-o", "NAME,SIZE,ROTA,TYPE,MOUNTPOINT,MODEL"]),
        "drop_caches_allowed": drop_page_cache(),
        "nvidia_fs_proc": os.path.exists("/proc/driver/nvidia-fs"),
        "nvidia_fs_devices": sorted(glob.glob("/dev/nvidia-fs*")),
        "nvidia_fs_module": "nvidia_fs" in Path("/proc/modules").read_text()
        if os.path.exists("/proc/modules")
        else None,
        "user": os.geteuid(),
    }


# -- prefill ------------------------------------------------------------------------------


def _prefill_layers(shape: dict[str, int], max_cached: int) -> Any:
    """Random bf16 weights for ``timed_layers`` layers and random cached K/V for each."""
    import torch

    dev, dt = "cuda", torch.bfloat16
    h, hd = shape["hidden"], shape["head_dim"]
    nq, nkv, mlp, experts = shape["q_heads"], shape["kv_heads"], shape["mlp"], shape["experts"]
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*size: int) -> torch.Tensor:
        return (torch.randn(*size, generator=gen, device=dev, dtype=torch.float32) * 0.02).to(dt)

    layers = []
    for _ in range(shape["timed_layers"]):
        w: dict[str, Any] = {
            "wqkv": rand(h, (nq + 2 * nkv) * hd),
            "wo": rand(nq * hd, h),
            "ln1": torch.ones(h, device=dev, dtype=dt),
            "ln2": torch.ones(h, device=dev, dtype=dt),
            "k_cache": rand(max_cached, nkv, hd) * 50,
            "v_cache": rand(max_cached, nkv, hd) * 50,
        }
        if experts:
            w["router"] = rand(h, experts)
            w["w13"] = [rand(h, 2 * mlp) for _ in range(experts)]
            w["w2"] = [rand(mlp, h) for _ in range(experts)]
        else:
            w["w13"] = rand(h, 2 * mlp)
            w["w2"] = rand(mlp, h)
        layers.append(w)
    return layers


def _rope(x: Any, cos: Any, sin: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _attention(q: Any, k: Any, v: Any, cached: int, gqa: bool) -> Any:
    """Causal attention of ``n`` queries over ``cached + n`` keys (bottom-right aligned)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    if not gqa:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    kwargs = {"enable_gqa": True} if gqa else {}
    if cached == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
    mask = causal_lower_right(q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)


def _layer_forward(
    x: Any, w: dict[str, Any], shape: dict[str, int], cached: int, rope: Any, gqa: bool
) -> Any:
    import torch
    import torch.nn.functional as F

    n = x.shape[0]
    hd, nq, nkv = shape["head_dim"], shape["q_heads"], shape["kv_heads"]
    cos, sin = rope[0][cached : cached + n], rope[1][cached : cached + n]
    r = x
    x = F.rms_norm(x, (x.shape[-1],), w["ln1"])
    qkv = x @ w["wqkv"]
    q = qkv[:, : nq * hd].view(n, nq, hd)
    k = qkv[:, nq * hd : (nq + nkv) * hd].view(n, nkv, hd)
    v = qkv[:, (nq + nkv) * hd :].view(n, nkv, hd)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    if cached:
        k = torch.cat((w["k_cache"][:cached], k))
        v = torch.cat((w["v_cache"][:cached], v))
    out = _attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        cached,
        gqa,
    )
    x = r + out.squeeze(0).transpose(0, 1).reshape(n, nq * hd) @ w["wo"]
    r = x
    x = F.rms_norm(x, (x.shape[-1],), w["ln2"])
    if shape["experts"]:
        y = _moe(x, w, shape)
    else:
        gate, up = (x @ w["w13"]).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w["w2"]
    return r + y


def _moe(x: Any, w: dict[str, Any], shape: dict[str, int]) -> Any:
    """Top-k routing, tokens grouped per expert (a plain torch loop, no fused kernel)."""
    import torch
    import torch.nn.functional as F

    top_k = shape["top_k"]
    weights, chosen = (x @ w["router"]).float().topk(top_k, dim=-1)
    weights = weights.softmax(dim=-1).to(x.dtype).reshape(-1)
    flat = chosen.reshape(-1)
    order = flat.argsort()
    counts = torch.bincount(flat, minlength=shape["experts"]).tolist()
    out = torch.zeros_like(x)
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        sel = order[start : start + count]
        start += count
        tokens = sel // top_k
        xe = x[tokens]
        gate, up = (xe @ w["w13"][e]).chunk(2, dim=-1)
        ye = (F.silu(gate) * up) @ w["w2"][e]
        out.index_add_(0, tokens, ye * weights[sel].unsqueeze(1))
    return out


def _check_lower_right_mask() -> dict[str, Any]:
    """The masked SDPA path against a hand-built mask (float32, small)."""
    import torch

    torch.manual_seed(1)
    q = torch.randn(1, 4, 3, 16, device="cuda")
    k = torch.randn(1, 2, 7, 16, device="cuda")
    v = torch.randn(1, 2, 7, 16, device="cuda")
    out = {}
    for gqa in (True, False):
        try:
            got = _attention(q, k, v, cached=4, gqa=gqa)
        except Exception as exc:
            out[f"gqa={gqa}"] = f"{type(exc).__name__}: {exc}"
            continue
        kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = (q @ kk.transpose(-1, -2)) / 4.0
        allowed = torch.ones(3, 7, dtype=torch.bool, device="cuda").tril(diagonal=4)
        ref = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vv
        out[f"gqa={gqa}"] = float((got - ref).norm() / ref.norm())
    return out


def _time_layers(
    layers: list[dict[str, Any]], shape: dict[str, int], x: Any, cached: int, rope: Any, gqa: bool
) -> float:
    """Seconds per layer of one pass of ``x`` through ``layers`` (CUDA events)."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    y = x
    for w in layers:
        y = _layer_forward(y, w, shape, cached, rope, gqa)
    end.record()
    end.synchronize()
    if not torch.isfinite(y).all():
        raise RuntimeError(f"non-finite output at m={cached} n={x.shape[0]}")
    return start.elapsed_time(end) / 1000.0 / len(layers)


def measure_prefill(reps: int, budget: Callable[[], bool]) -> dict[str, Any]:
    import torch

    check = _check_lower_right_mask()
    gqa = isinstance(check.get("gqa=True"), float) and check["gqa=True"] < 1e-3
    result: dict[str, Any] = {"mask_check_rel_err": check, "gqa_native": gqa, "models": {}}
    max_len = max(m + n for m, n in STEPS)
    for name, shape in MODELS.items():
        if not budget():
            result["models"][name] = {"skipped": "time budget"}
            continue
        hd = shape["head_dim"]
        inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
        angles = torch.outer(torch.arange(max_len, device="cuda").float(), inv)
        rope = (angles.cos().to(torch.bfloat16)[:, None, :],
                angles.sin().to(torch.bfloat16)[:, None, :])  # fmt: skip
        layers = _prefill_layers(shape, max(m for m, _ in STEPS))
        gen = torch.Generator(device="cuda").manual_seed(2)
        steps = []
        for cached, new in STEPS:
            x = torch.randn(new, shape["hidden"], generator=gen, device="cuda").to(torch.bfloat16)

            with torch.inference_mode():
                try:
                    # Warm-up: kernels selected, allocator grown.
                    _time_layers(layers, shape, x, cached, rope, gqa)
                except RuntimeError:
                    if not gqa:
                        raise
                    # Native GQA refused on this path: expand K/V instead (and say so).
                    gqa = False
                    result["gqa_native"] = f"off from {name} m={cached} n={new}"
                    _time_layers(layers, shape, x, cached, rope, gqa)
                per_layer = [_time_layers(layers, shape, x, cached, rope, gqa) for _ in range(reps)]
            med = statistics.median(per_layer)
            steps.append({
                "cached": cached, "new": new,
                "per_layer_s": per_layer, "per_layer_median_s": med,
                "model_s": med * shape["layers"],
            })  # fmt: skip
            print(f"  {name} m={cached} n={new}: {med * shape['layers']:.4f} s", flush=True)
            del x
        result["models"][name] = {
            "shape": shape,
            "kv_bytes_per_token": kv_bytes_per_token(shape),
            "scaled_from_layers": shape["timed_layers"],
            "steps": steps,
        }
        layers.clear()
        torch.cuda.empty_cache()
    return result


# -- host -> GPU --------------------------------------------------------------------------


def _cuda_time(fn: Callable[[], None], reps: int) -> list[float]:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def measure_h2d(pinned: Any, gpu: Any, reps: int) -> dict[str, Any]:
    import torch

    total = min(pinned.numel(), 4 * GiB)
    streams = [torch.cuda.Stream() for _ in range(4)]
    pinned_u8, gpu_u8 = pinned[:total], gpu[:total]
    out: dict[str, Any] = {"bytes": total, "cases": {}, "sizes": []}

    def chunked(chunk: int, n_streams: int) -> Callable[[], None]:
        def go() -> None:
            for i, off in enumerate(range(0, total, chunk)):
                with torch.cuda.stream(streams[i % n_streams]):
                    gpu_u8[off : off + chunk].copy_(pinned_u8[off : off + chunk], non_blocking=True)

        return go

    cases: dict[str, Callable[[], None]] = {
        "one copy, 1 stream": lambda: gpu_u8.copy_(pinned_u8, non_blocking=True),
        "32 MiB chunks, 1 stream": chunked(32 * MiB, 1),
        "32 MiB chunks, 4 streams": chunked(32 * MiB, 4),
        "2 MiB chunks, 1 stream": chunked(2 * MiB, 1),
        "2 MiB chunks, 4 streams": chunked(2 * MiB, 4),
    }
    for name, fn in cases.items():
        times = _cuda_time(fn, reps)
        out["cases"][name] = {"times_s": times, "GBps": total / statistics.median(times) / 1e9}
        print(f"  h2d {name}: {out['cases'][name]['GBps']:.1f} GB/s", flush=True)
    pageable = torch.empty(1 * GiB, dtype=torch.uint8)
    pageable.fill_(7)
    times = _cuda_time(lambda: gpu_u8[: 1 * GiB].copy_(pageable, non_blocking=True), reps)
    out["cases"]["pageable 1 GiB, one copy"] = {
        "times_s": times,
        "GBps": GiB / statistics.median(times) / 1e9,
    }
    # One-copy sizes, for fitting the host pool -> GPU restore model (latency + bytes/bw).
    for size in (256 << 10, 2 * MiB, 32 * MiB, 256 * MiB, 1 * GiB):
        times = _cuda_time(lambda s=size: gpu_u8[:s].copy_(pinned_u8[:s], non_blocking=True), reps)
        out["sizes"].append({"bytes": size, "times_s": times})
    return out


# -- disk ---------------------------------------------------------------------------------


def _namespace(record_bytes: int) -> Any:
    from kvtier.format import Namespace

    return Namespace(
        model="llama3-8b-shape", weights_fingerprint="", kv_dtype="bfloat16",
        block_size_tokens=record_bytes // (128 << 10), num_groups=1, num_layers=32,
        num_kv_heads=8, head_size=128, block_bytes=record_bytes, hash_algorithm="synthetic",
    )  # fmt: skip


def _fill_records(store: Any, record_bytes: int, count: int, prefix: bytes) -> dict[str, Any]:
    """Put ``count`` records of random-looking bytes; returns the keys and the put rate."""
    src = mmap.mmap(-1, record_bytes)
    view = memoryview(src)
    block = os.urandom(min(record_bytes, 4 * MiB))
    for off in range(0, record_bytes, len(block)):
        view[off : off + len(block)] = block[: record_bytes - off]
    keys = []
    start = time.perf_counter()
    for i in range(count):
        view[:8] = i.to_bytes(8, "little")  # each record differs, so checksums differ
        key = prefix + i.to_bytes(8, "big")
        if not store.put(key, view):
            raise RuntimeError(f"put {i} of {count} failed (see the log)")
        keys.append(key)
    elapsed = time.perf_counter() - start
    view.release()
    src.close()
    return {"keys": keys, "put_s": elapsed, "put_GBps": record_bytes * count / elapsed / 1e9}


def _store_read(
    store: Any, keys: list[bytes], record_bytes: int, host: memoryview, threads: int
) -> float:
    """Cold-read ``keys`` into consecutive slices of ``host`` with ``threads`` threads."""
    drop_page_cache()

    def one(i: int) -> bool:
        return store.get_into(keys[i], host[i * record_bytes : (i + 1) * record_bytes])

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        ok = list(pool.map(one, range(len(keys))))
    elapsed = time.perf_counter() - start
    if not all(ok):
        raise RuntimeError(f"{ok.count(False)} of {len(keys)} get_into calls missed")
    return elapsed


def _plain_read(paths: list[Path], host: memoryview, direct: bool) -> float:
    """Sequential one-thread read of whole files into ``host`` (cold), for reference."""
    drop_page_cache()
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    off = 0
    start = time.perf_counter()
    for path in paths:
        fd = os.open(path, flags)
        try:
            size = os.fstat(fd).st_size
            got = os.preadv(fd, [host[off : off + size]], 0)
            if got != size:
                raise RuntimeError(f"short read of {path}: {got} of {size}")
            off += size
        finally:
            os.close(fd)
    return time.perf_counter() - start


def measure_disk(
    store_dir: Path,
    pinned: Any,
    gpu: Any,
    restore_sizes: list[int],
    thread_counts: tuple[int, ...],
    budget: Callable[[], bool],
    reps: int = 2,
) -> dict[str, Any]:
    import torch

    from kvtier.store import DiskStore

    host = memoryview(pinned.numpy())
    address = pinned.data_ptr()
    out: dict[str, Any] = {
        "pinned_page_aligned": address % mmap.PAGESIZE == 0,
        "drop_caches_allowed": drop_page_cache(),
        "record_sets": {},
    }
    free = shutil.disk_usage(store_dir).free
    big_bytes = 32 * MiB
    want_big = max([*restore_sizes, 2 * GiB])
    floor = 4 * GiB
    big_count = min(math.ceil(want_big / big_bytes), int((free - floor - 2 * GiB) // big_bytes))
    out["free_bytes_before"] = free
    sets = {"256 tokens (32 MiB)": (big_bytes, big_count), "16 tokens (2 MiB)": (2 * MiB, 512)}
    stores = {}
    for label, (record_bytes, count) in sets.items():
        store = DiskStore(
            store_dir / label.split()[0], _namespace(record_bytes),
            capacity_bytes=(record_bytes + 8192) * count + GiB, free_space_floor_bytes=GiB,
        )  # fmt: skip
        filled = _fill_records(store, record_bytes, count, label.split()[0].encode().ljust(8))
        keys = filled.pop("keys")
        stores[label] = (store, keys, record_bytes)
        print(f"  put {label} x{count}: {filled['put_GBps']:.2f} GB/s", flush=True)
        entry: dict[str, Any] = {"record_bytes": record_bytes, "records": count, **filled}
        sweep_target = 1 * GiB if record_bytes < big_bytes else 2 * GiB
        sweep_keys = keys[: max(1, sweep_target // record_bytes)]
        sweep_bytes = len(sweep_keys) * record_bytes
        entry["sweep_bytes"] = sweep_bytes
        entry["threads"] = {}
        for threads in thread_counts:
            if threads != thread_counts[0] and not budget():
                break
            times = [_store_read(store, sweep_keys, record_bytes, host, threads) for _ in range(2)]
            rate = sweep_bytes / statistics.median(times) / 1e9
            entry["threads"][threads] = {"times_s": times, "GBps": rate}
            print(f"  get_into {label} {threads} threads: "
                  f"{entry['threads'][threads]['GBps']:.2f} GB/s", flush=True)  # fmt: skip
        paths = [store.record_path(k) for k in sweep_keys]
        for direct in (False, True):
            name = "plain sequential, O_DIRECT" if direct else "plain sequential, buffered"
            plain_view = host if direct else memoryview(bytearray(sweep_bytes + len(paths) * 4096))
            times = [_plain_read(paths, plain_view, direct) for _ in range(2)]
            file_bytes = sum(p.stat().st_size for p in paths)
            entry[name] = {"times_s": times, "GBps": file_bytes / statistics.median(times) / 1e9}
            print(f"  {name} {label}: {entry[name]['GBps']:.2f} GB/s", flush=True)
        out["record_sets"][label] = entry
    # Whole-hit restores: cold read of the KV bytes into pinned memory, then one H2D copy;
    # and the H2D copy alone (the host pool -> GPU restore of the same bytes).
    store, keys, record_bytes = stores["256 tokens (32 MiB)"]
    best = max(out["record_sets"]["256 tokens (32 MiB)"]["threads"].items(),
               key=lambda kv: kv[1]["GBps"])[0]  # fmt: skip
    out["restore_threads"] = best
    out["restore_sizes"] = sorted(set(restore_sizes))
    out["restores"] = []
    for size in out["restore_sizes"]:
        count = math.ceil(size / record_bytes)
        if count > len(keys) or not budget():
            out["restores"].append({"bytes": size, "skipped": "not enough records or time"})
            continue
        row: dict[str, Any] = {"bytes": size, "records": count, "read_s": [], "h2d_s": []}
        for _ in range(reps):
            row["read_s"].append(_store_read(store, keys[:count], record_bytes, host, best))
            start = time.perf_counter()
            gpu[:size].copy_(pinned[:size], non_blocking=True)
            torch.cuda.synchronize()
            row["h2d_s"].append(time.perf_counter() - start)
        out["restores"].append(row)
        print(f"  restore {size / GiB:.2f} GiB: read {statistics.median(row['read_s']):.3f} s"
              f" + h2d {statistics.median(row['h2d_s']):.4f} s", flush=True)  # fmt: skip
    out["_stores"] = {label: (str(s.namespace_dir), len(k), rb)
                      for label, (s, k, rb) in stores.items()}  # fmt: skip
    for store, _, _ in stores.values():
        store.close()
    return out


# -- GPUDirect Storage (cuFile) -----------------------------------------------------------


class _CUfileError(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]


class _CUfileHandleUnion(ctypes.Union):
    _fields_ = [("fd", ctypes.c_int), ("handle", ctypes.c_void_p)]


class _CUfileDescr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handle", _CUfileHandleUnion), ("fs_ops", ctypes.c_void_p)]


def _find_libcufile() -> list[str]:
    found: list[str] = []
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    for root in roots:
        for pattern in ("nvidia/cufile/lib/libcufile.so*", "nvidia/cu*/lib/libcufile.so*"):
            found += glob.glob(os.path.join(root, pattern))
    for pattern in ("/usr/local/cuda*/lib64/libcufile.so*",
                    "/usr/local/cuda*/targets/x86_64-linux/lib/libcufile.so*",
                    "/usr/lib/x86_64-linux-gnu/libcufile.so*"):  # fmt: skip
        found += glob.glob(pattern)
    name = ctypes.util.find_library("cufile")
    if name:
        found.append(name)
    return sorted(set(f for f in found if "rdma" not in f))


def _load_cufile(out: dict[str, Any]) -> ctypes.CDLL:
    lib = None
    for candidate in out["libraries"]:
        try:
            lib = ctypes.CDLL(candidate)
            out["library"] = candidate
            break
        except OSError as exc:
            out.setdefault("load_errors", []).append(f"{candidate}: {exc}")
    if lib is None:
        raise RuntimeError("no libcufile could be loaded")
    for name in ("cuFileDriverOpen", "cuFileHandleRegister", "cuFileBufRegister",
                 "cuFileBufDeregister", "cuFileDriverGetProperties"):  # fmt: skip
        getattr(lib, name).restype = _CUfileError
    lib.cuFileHandleRegister.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(_CUfileDescr)]  # fmt: skip
    lib.cuFileHandleDeregister.restype = None
    lib.cuFileHandleDeregister.argtypes = [ctypes.c_void_p]
    lib.cuFileRead.restype = ctypes.c_ssize_t
    lib.cuFileRead.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                               ctypes.c_longlong, ctypes.c_longlong]  # fmt: skip
    lib.cuFileBufRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.cuFileBufDeregister.argtypes = [ctypes.c_void_p]
    return lib


def _driver_properties(lib: ctypes.CDLL) -> dict[str, Any]:
    props = ctypes.create_string_buffer(256)
    err = lib.cuFileDriverGetProperties(props)
    raw = props.raw
    # CUfileDrvProps_t starts with nvfs {major, minor, poll_thresh_size, max_direct_io_size,
    # dstatusflags, dcontrolflags}; nvfs version 0 means no nvidia-fs (compat mode only).
    return {
        "err": err.err,
        "nvfs_major": int.from_bytes(raw[0:4], "little"),
        "nvfs_minor": int.from_bytes(raw[4:8], "little"),
        "dstatusflags": int.from_bytes(raw[24:28], "little"),
        "dcontrolflags": int.from_bytes(raw[28:32], "little"),
        "raw64": raw[:64].hex(),
    }


def _udev_record(folder: str) -> str | None:
    """Write the udev properties cuFile asks for about the store's block device, if absent.

    cuFile looks up ``ID_FS_USAGE``/``ID_FS_TYPE`` of the device through libudev; a microVM
    without udev has no database, and handle registration then fails (error 5027) even in
    compat mode. Returns the path written, or None when one was already there.
    """
    st = os.stat(folder)
    path = Path(f"/run/udev/data/b{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if path.exists():
        return None
    fstype = _run(["findmnt", "-n", "-o", "FSTYPE", "-T", folder]) or "ext4"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE={fstype}\n")
    return str(path)


class _CuFile:
    """The few cuFile calls a record read needs (synchronous ``cuFileRead`` per record)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        err = lib.cuFileDriverOpen()
        if err.err != 0:
            raise RuntimeError(f"cuFileDriverOpen: err={err.err} cu_err={err.cu_err}")

    def close(self) -> None:
        close = getattr(self.lib, "cuFileDriverClose_v2", None) or self.lib.cuFileDriverClose
        close.restype = _CUfileError
        close()

    def read(self, path: Path, dev_ptr: int, nbytes: int, file_offset: int, dev_offset: int) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            descr = _CUfileDescr()
            descr.type = 1  # CU_FILE_HANDLE_TYPE_OPAQUE_FD
            descr.handle.fd = fd
            handle = ctypes.c_void_p()
            err = self.lib.cuFileHandleRegister(ctypes.byref(handle), ctypes.byref(descr))
            if err.err != 0:
                raise RuntimeError(f"cuFileHandleRegister: err={err.err} cu_err={err.cu_err}")
            try:
                got = self.lib.cuFileRead(handle, ctypes.c_void_p(dev_ptr), nbytes,
                                          file_offset, dev_offset)  # fmt: skip
            finally:
                self.lib.cuFileHandleDeregister(handle)
            if got != nbytes:
                raise RuntimeError(f"cuFileRead returned {got} for {path}")
            return got
        finally:
            os.close(fd)


def measure_gds(
    disk: dict[str, Any], gpu: Any, pinned: Any, reps: int, budget: Callable[[], bool]
) -> dict[str, Any]:
    """cuFile reads of record payloads into GPU memory; errors are recorded, not raised."""
    import torch

    out: dict[str, Any] = {"libraries": _find_libcufile()}
    folder, _, record_bytes = disk["_stores"]["256 tokens (32 MiB)"]
    paths = sorted(Path(folder, "blocks").rglob("*.kvb"), key=lambda p: p.name)
    cufile = None
    try:
        lib = _load_cufile(out)
        cufile = _CuFile(lib)
        out["driver_properties"] = _driver_properties(lib)
        try:
            cufile.read(paths[0], gpu.data_ptr(), record_bytes, 4096, 0)
        except RuntimeError as exc:
            out["first_attempt"] = str(exc)
            if "err=5027" not in str(exc) or os.geteuid() != 0:
                raise
            out["udev_record_written"] = _udev_record(folder)
            cufile.close()
            cufile = _CuFile(lib)
            cufile.read(paths[0], gpu.data_ptr(), record_bytes, 4096, 0)
        out["driver_properties_after_open"] = _driver_properties(lib)
        sweep = paths[: (2 * GiB) // record_bytes]
        total = len(sweep) * record_bytes
        out["sweep_bytes"] = total
        reg = lib.cuFileBufRegister(ctypes.c_void_p(gpu.data_ptr()), total, 0)
        out["buf_register"] = [reg.err, reg.cu_err]

        reader = cufile

        def read_into_gpu(files: list[Path], threads: int) -> float:
            def one(i: int) -> int:
                return reader.read(files[i], gpu.data_ptr(), record_bytes, 4096, i * record_bytes)

            drop_page_cache()
            start = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, range(len(files))))
            torch.cuda.synchronize()
            return time.perf_counter() - start

        out["threads"] = {}
        for threads in (1, 4, 8, 16):
            times = [read_into_gpu(sweep, threads) for _ in range(reps)]
            out["threads"][threads] = {"times_s": times,
                                       "GBps": total / statistics.median(times) / 1e9}  # fmt: skip
            print(f"  gds {threads} threads: {out['threads'][threads]['GBps']:.2f} GB/s",
                  flush=True)  # fmt: skip
        # Byte check: the same payloads read plainly into pinned memory must equal the GPU's.
        host = memoryview(pinned.numpy())
        for i, path in enumerate(sweep):
            with open(path, "rb") as f:
                f.seek(4096)
                f.readinto(host[i * record_bytes : (i + 1) * record_bytes])
        out["bytes_equal"] = bool(torch.equal(gpu[:total].cpu(), pinned[:total]))
        lib.cuFileBufDeregister(ctypes.c_void_p(gpu.data_ptr()))
        best = max(out["threads"].items(), key=lambda kv: kv[1]["GBps"])[0]
        out["restore_threads"] = best
        out["restores"] = []
        for size in disk["restore_sizes"]:
            n = math.ceil(size / record_bytes)
            if n > len(paths) or not budget():
                out["restores"].append({"bytes": size, "skipped": "not enough records or time"})
                continue
            times = [read_into_gpu(paths[:n], best) for _ in range(reps)]
            out["restores"].append({"bytes": size, "records": n, "times_s": times})
            print(f"  gds restore {size / GiB:.2f} GiB: {statistics.median(times):.3f} s",
                  flush=True)  # fmt: skip
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
        print(out["traceback"], flush=True)
    finally:
        if cufile is not None:
            cufile.close()
    logs = glob.glob("cufile*.log") + glob.glob("/tmp/cufile*.log")
    out["cufile_log_tail"] = {p: Path(p).read_text()[-6000:] for p in logs}
    return out


# -- driver -------------------------------------------------------------------------------


def restore_sizes() -> list[int]:
    """KV bytes of every model's whole contexts and of their second halves."""
    sizes = set()
    for shape in MODELS.values():
        for ctx in CONTEXTS:
            sizes |= {kv_bytes_per_token(shape) * ctx, kv_bytes_per_token(shape) * ctx // 2}
    return sorted(sizes)


def measure_all(out_path: Path, store_dir: Path, budget_s: float, reps: int) -> dict[str, Any]:
    import torch

    t0 = time.monotonic()

    def budget() -> bool:
        return time.monotonic() - t0 < budget_s

    results = Results(out_path)
    store_dir.mkdir(parents=True, exist_ok=True)
    results.section("env", lambda: measure_env(store_dir))
    results.section("prefill", lambda: measure_prefill(reps, budget))
    sizes = restore_sizes()
    pinned_bytes = max(sizes)
    start = time.perf_counter()
    raw = torch.empty(pinned_bytes + 4096, dtype=torch.uint8, pin_memory=True)
    # Page-align the start so the store's O_DIRECT reads apply (its buffers must be aligned).
    skip = -raw.data_ptr() % 4096
    pinned = raw[skip : skip + pinned_bytes]
    pinned.fill_(1)
    gpu = torch.empty(pinned_bytes, dtype=torch.uint8, device="cuda")
    results.data["pinned_alloc_s"] = time.perf_counter() - start
    results.section("h2d", lambda: measure_h2d(pinned, gpu, reps))
    disk = results.section(
        "disk", lambda: measure_disk(store_dir, pinned, gpu, sizes, (1, 4, 8, 16), budget)
    )
    if disk is not None:
        results.section("gds", lambda: measure_gds(disk, gpu, pinned, 2, budget))
    results.data["total_wall_s"] = time.monotonic() - t0
    results.write()
    shutil.rmtree(store_dir, ignore_errors=True)
    return results.data
