"""Achieved matmul FLOP/s over the GEMMs of a transformer layer, and the efficiency curve fitted to them.

For hidden size h and T tokens (T = micro-batch × sequence length) one block multiplies (T×K)·(K×N):
    qkv       K = h,  N = 3h   (fused Q, K, V of multi-head attention)
    attn_out  K = h,  N = h
    mlp_up    K = h,  N = 4h
    mlp_down  K = 4h, N = h
at 2·T·K·N FLOPs each (one multiply and one add per term). The curve ``eff(n)·peak`` is fitted against
n = min(T, K, N) (``shardlab.calibration.gemm_size``).

CPU: the default dtype is fp32 — PyTorch emulates bf16 matmuls on most CPUs (they run several times
slower than fp32), and the CPU runtime trains in fp32 — and one thread is used, because every rank of a
CPU run is pinned to one core (OMP_NUM_THREADS=1). CUDA: bf16 by default, timed with CUDA events.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

GEMMS = (("qkv", 1, 3), ("attn_out", 1, 1), ("mlp_up", 1, 4), ("mlp_down", 4, 1))
"""(name, K in units of h, N in units of h) of the four GEMMs of a block."""
CPU_HIDDEN = (32, 64, 128, 256, 512, 1024)
"""Default hidden sizes on CPU: the tiny GPTs the CPU runtime trains, up to 1024 (~0.1 s per GEMM on one core)."""
CPU_TOKENS = (128, 512)
"""Default token counts on CPU (micro-batch × sequence length)."""
CPU_STREAM = (2 ** 16, 2 ** 18, 2 ** 20)
"""Elements of the memory-bound benchmark on CPU (activations of the runtime's small GPTs: 256 KB - 4 MB)."""
GPU_STREAM = (2 ** 24, 2 ** 26)
"""Elements of the memory-bound benchmark on CUDA (64 - 256 MB: past the L2 cache)."""
GPU_HIDDEN = (512, 1024, 2048, 4096, 8192)
"""Default hidden sizes on CUDA (8192: Llama-3-70B)."""
GPU_TOKENS = (512, 4096, 16384)
"""Default token counts on CUDA."""
TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class MatmulRow:
    """One measured GEMM."""

    gemm: str
    """qkv, attn_out, mlp_up or mlp_down."""
    hidden: int
    """Hidden size h of the layer."""
    tokens: int
    """Rows M = tokens of the activation."""
    m: int
    """M (tokens)."""
    k: int
    """K (inner dimension)."""
    n: int
    """N (output features)."""
    size: int
    """min(M, N, K): the x of the efficiency curve."""
    flops: float
    """2·M·N·K."""
    time_s: float
    """Median time of one GEMM."""
    tflops: float
    """Achieved TFLOP/s (1e12)."""


def _timer(torch, device: str):
    """A function (fn, reps) -> seconds per call: perf_counter on CPU, CUDA events on GPU."""
    if device == "cuda":
        def run(fn, reps: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3 / reps
        return run

    def run(fn, reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps
    return run


def time_gemm(torch, m: int, k: int, n: int, dtype, device: str, min_time_s: float, max_reps: int = 200) -> float:
    """Median seconds of one (m×k)·(k×n) product: one warm-up, then up to 5 samples of enough reps to fill
    ``min_time_s`` / 5 each. Inputs are random normals (never zeros: they can run faster than real data)."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=dtype, generator=g)
    b = torch.randn(k, n, device=device, dtype=dtype, generator=g)
    out = torch.empty(m, n, device=device, dtype=dtype)
    fn = lambda: torch.mm(a, b, out=out)  # noqa: E731
    run = _timer(torch, device)
    first = run(fn, 1)  # warm-up (kernel choice, caches); also a first estimate
    reps = max(1, min(max_reps, int(min_time_s / 5 / max(first, 1e-9))))
    return statistics.median(run(fn, reps) for _ in range(5))


def bench_stream(torch, device: str, numels: tuple[int, ...], min_time_s: float = 0.05) -> dict:
    """Effective rate of the memory-bound kernels of a block, run eagerly as PyTorch runs them: add and mul
    (residuals, SwiGLU's product; 2 reads + 1 write), SiLU, RMSNorm, softmax over 64 (1 read + 1 write).

    rate = bytes moved / time summed over the five ops, fp32, rows of 256; the median over ``numels``. On a
    GPU this approaches HBM bandwidth; on a CPU SiLU and softmax are compute-bound and the rate is far
    below the memory bandwidth: what the estimate's memory-bound term should use there.
    """
    import torch.nn.functional as F

    run = _timer(torch, device)
    rates, per_op = [], {}
    for numel in numels:
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(numel // 256, 256, device=device, generator=g)
        y, w, out = torch.randn_like(x), torch.ones(256, device=device), torch.empty_like(x)
        ops = {"add": (lambda: torch.add(x, y, out=out), 3), "mul": (lambda: torch.mul(x, y, out=out), 3),
               "silu": (lambda: F.silu(x), 2), "rms_norm": (lambda: F.rms_norm(x, (256,), w), 2),
               "softmax": (lambda: torch.softmax(x.view(-1, 64), -1), 2)}
        total_b = total_t = 0.0
        for name, (fn, passes) in ops.items():
            first = run(fn, 1)
            reps = max(1, min(1000, int(min_time_s / 5 / max(first, 1e-9))))
            t = statistics.median(run(fn, reps) for _ in range(5))
            total_b, total_t = total_b + passes * x.numel() * 4, total_t + t
            per_op.setdefault(name, []).append(passes * x.numel() * 4 / t / 1e9)
        rates.append(total_b / total_t / 1e9)
    return {"gbps": statistics.median(rates), "numels": list(numels), "gbps_by_size": rates,
            "gbps_by_op": {k: statistics.median(v) for k, v in per_op.items()},
            "definition": "bytes (inputs read once + output written once) / time, summed over add, mul, silu, "
                          "rms_norm, softmax; fp32; median over sizes"}


def bench_op_overhead(torch, device: str, ops: int = 240) -> dict:
    """Host time per operator that eager PyTorch cannot hide (``Accelerator.op_overhead_us``), CPU only.

    A chain of ``ops`` operators on a (8, 64) tensor — multiply, add, SiLU, RMSNorm, a 64-wide linear, in turn
    — run forward and backward with autograd; the work is negligible, so the time is dispatch and autograd
    bookkeeping. The estimate charges each forward operator once in forward and twice in backward (backward =
    2 × forward), so op_overhead_us = (forward + backward time) / (3 · ops). On CUDA launches are asynchronous
    and hidden behind kernels longer than a launch: None (the catalog's 0 stays).
    """
    if device == "cuda":
        return None
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g, requires_grad=True)
    w = (torch.randn(64, 64, generator=g) / 8).requires_grad_()
    chain = (lambda y: y * 1.001, lambda y: y + 0.01, F.silu, lambda y: F.rms_norm(y, (64,)), lambda y: y @ w)

    def step():
        y = x
        for i in range(ops):
            y = chain[i % len(chain)](y)
        y.sum().backward()

    step()
    t = statistics.median(_timer(torch, "cpu")(step, 3) for _ in range(5))
    return {"op_overhead_us": t / (3 * ops) * 1e6, "ops": ops, "step_s": t,
            "definition": "(forward + backward of a chain of tiny operators) / (3 x operators)"}


def default_grid(device: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (GPU_HIDDEN, GPU_TOKENS) if device == "cuda" else (CPU_HIDDEN, CPU_TOKENS)


def bench_matmul(dtype: str, device: str, hidden: tuple[int, ...], tokens: tuple[int, ...], *,
                 min_time_s: float = 0.2, threads: int | None = 1, progress=None, stream_bench: bool = True) -> dict:
    """Measure every GEMM of ``hidden`` × ``tokens`` (and the memory-bound kernels' rate, :func:`bench_stream`);
    returns rows and the run's settings (no fit)."""
    from shardlab.calibration import gemm_size
    from shardlab.runtime import require_torch

    torch = require_torch()
    if threads and device == "cpu":
        torch.set_num_threads(threads)
    if device == "cuda" and dtype == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    rows = []
    for h in hidden:
        for t in tokens:
            for name, kk, nn in GEMMS:
                k, n = kk * h, nn * h
                s = time_gemm(torch, t, k, n, tdtype, device, min_time_s)
                fl = 2.0 * t * k * n
                rows.append(MatmulRow(name, h, t, t, k, n, gemm_size(t, n, k), fl, s, fl / s / 1e12))
                if progress:
                    progress(rows[-1])
    stream = bench_stream(torch, device, GPU_STREAM if device == "cuda" else CPU_STREAM) if stream_bench else None
    return {
        "device": device,
        "device_name": device_name(torch, device),
        "stream": stream,
        "op_overhead": bench_op_overhead(torch, device) if stream_bench else None,
        "dtype": dtype,
        "threads": torch.get_num_threads() if device == "cpu" else None,
        "torch_version": torch.__version__,
        "rows": [asdict(r) for r in rows],
    }


def analyse(doc: dict, accelerator) -> dict:
    """Fit eff(n)·peak to the rows (peak = ``accelerator``'s for the dtype, or the best measured when it has none)."""
    from shardlab.calibration import efficiency_fit_problems, fit_efficiency
    from shardlab.runtime.calibrate import fit_summary

    rows = doc["rows"]
    peak = accelerator.peak_tflops.get(doc["dtype"]) or max(r["tflops"] for r in rows)
    fit = fit_efficiency([r["size"] for r in rows], [r["tflops"] * 1e12 for r in rows], peak * 1e12)
    undetermined, warnings = efficiency_fit_problems([r["size"] for r in rows], fit)
    for r in rows:
        r["fitted_tflops"] = float(fit.predict_flops(r["size"])) / 1e12
        r["fraction_of_peak"] = r["tflops"] / peak
    doc["accelerator"] = accelerator.id
    doc["peak_tflops"] = peak
    doc["fit"] = {**fit_summary(fit), "determined": not undetermined, "warnings": undetermined + warnings}
    doc["size_definition"] = "n = min(M, N, K) of the (M x K)(K x N) product; M = tokens"
    return doc


def render(doc: dict) -> str:
    """Measured vs fitted FLOP/s per GEMM, then the fit."""
    from shardlab.render.table import table

    scale, unit = (1e3, "GFLOP/s") if max(r["tflops"] for r in doc["rows"]) < 1 else (1.0, "TFLOP/s")
    rows = [[r["gemm"], r["hidden"], r["tokens"], f"{r['m']}x{r['k']}x{r['n']}", r["size"],
             f"{r['time_s'] * 1e3:.3f}", f"{r['tflops'] * scale:.4g}", f"{r['fitted_tflops'] * scale:.4g}",
             f"{r['fraction_of_peak']:.1%}"] for r in doc["rows"]]
    threads = f", {doc['threads']} thread(s)" if doc.get("threads") else ""
    f = doc["fit"]
    out = [table(["gemm", "h", "tokens", "MxKxN", "n=min", "time (ms)", f"measured {unit}", f"fitted {unit}",
                  "of peak"], rows,
                 title=f"{doc['dtype']} matmul on {doc['device_name']} ({doc['device']}{threads}, torch "
                       f"{doc['torch_version']}); peak {doc['peak_tflops'] * scale:.4g} {unit} ({doc['accelerator']})"),
           "",
           f"fit: achieved = {f['max_fraction']:.4g} * n/(n + {f['half_size']:.4g}) x peak, n = min(M, N, K); "
           f"rel. rms {f['rel_rms']:.1%} over {f['points']} GEMMs"]
    fix = "" if f.get("determined", True) else "; the fit means nothing: give --hidden and --tokens a range of sizes"
    out += [f"warning: {w}{fix}" for w in f.get("warnings") or []]
    st = doc.get("stream")
    if st:
        out.append(f"memory-bound kernels (add, mul, silu, rms_norm, softmax; eager, fp32): {st['gbps']:.3g} GB/s "
                   f"effective (" + ", ".join(f"{k} {v:.3g}" for k, v in st["gbps_by_op"].items()) + ")")
    if doc.get("op_overhead"):
        out.append(f"operator overhead (eager dispatch + autograd, forward + backward / 3): "
                   f"{doc['op_overhead']['op_overhead_us']:.1f} us per operator")
    if doc.get("note"):
        out.append(f"note: {doc['note']}")
    if doc.get("plot"):
        out.append(f"plot: {doc['plot']}")
    return "\n".join(out)


def device_name(torch, device: str) -> str:
    """GPU name from CUDA, or the CPU model from /proc/cpuinfo (platform.processor() as a fallback)."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
