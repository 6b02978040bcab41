"""Collectives benchmark in the style of nccl-tests: time per op and size, algbw, busbw, α–β fits.

Host side: :func:`run_collectives` starts this module on ``nproc`` ranks with ``shardlab.runtime.launch``
(torchrun); the rank program (:func:`main`) uses gloo on CPU and NCCL on CUDA (``runtime.dist``).

Definitions (NVIDIA/nccl-tests doc/PERFORMANCE.md): S is the total size of the op — the buffer of an
all-reduce, the gathered output of an all-gather, the input of a reduce-scatter, the whole send buffer of
an all-to-all, the message of a send/recv (each rank sends S to its right neighbour and receives S from its
left one, like nccl-tests' sendrecv). time = mean over ranks (nccl-tests' default ``-a 1``) of the time
per iteration (median of three timed batches, see :func:`_measure`); algbw = S / time; busbw = algbw ×
factor (``shardlab.comm.collectives.bus_factor``).
Buffers are fp32 (reduction ops sum); S is rounded to a multiple of 4·n bytes so every rank's chunk is whole.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

from shardlab.comm.collectives import bus_factor, check_op
from shardlab.errors import ShardlabError

BENCH_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
"""Ops measured by default (broadcast adds nothing the estimate uses)."""
ELEMENT_BYTES = 4
"""fp32 buffers."""


def parse_sizes(text: str) -> list[int]:
    """'1KiB:256MiB' (doubling from the start; the end is included), 'A:B:F' (factor F), or '1KiB,64KiB,1MiB'.
    KiB/MiB (and K/M) are 1024-based as in nccl-tests' -b/-e; KB/MB are 1000-based."""
    from shardlab.units import parse_size

    text = text.strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ShardlabError(f"cannot parse --sizes '{text}': use START:END[:FACTOR], e.g. 1KiB:256MiB")
        lo, hi = parse_size(parts[0], "--sizes start"), parse_size(parts[1], "--sizes end")
        try:
            factor = float(parts[2]) if len(parts) == 3 else 2.0
        except ValueError:
            raise ShardlabError(f"--sizes factor '{parts[2]}' is not a number; use e.g. 1KiB:256MiB:4") from None
        if lo <= 0 or hi < lo or factor <= 1:
            raise ShardlabError(f"--sizes '{text}' needs 0 < START <= END and FACTOR > 1, e.g. 1KiB:256MiB")
        out, s = [], float(lo)
        while s <= hi * (1 + 1e-9):
            out.append(int(round(s)))
            s *= factor
        if out[-1] < hi:
            out.append(hi)
        return out
    out = [parse_size(p, "--sizes entry") for p in text.split(",") if p.strip()]
    if not out or min(out) <= 0:
        raise ShardlabError(f"--sizes '{text}' must list positive sizes, e.g. 1KiB,1MiB or 1KiB:256MiB")
    return out


def parse_ops(text: str) -> list[str]:
    """'all' or a comma list of ops; each checked (unknown op -> one-line error)."""
    if text.strip() in ("", "all"):
        return list(BENCH_OPS)
    return [check_op(o.strip()) for o in text.split(",") if o.strip()]


def round_size(size_bytes: int, n: int) -> int:
    """Round to a whole number of fp32 elements per rank chunk (at least one per rank)."""
    unit = ELEMENT_BYTES * n
    return max(unit, int(round(size_bytes / unit)) * unit)


def summarise_row(op: str, size_bytes: int, time_s: float, n: int) -> dict:
    """One table row with the nccl-tests definitions of algbw and busbw (GB/s = 1e9 bytes/s)."""
    algbw = size_bytes / time_s / 1e9
    return {"op": op, "size_bytes": size_bytes, "time_s": time_s, "algbw_gbps": algbw,
            "busbw_gbps": algbw * bus_factor(op, n), "world_size": n}


def check_gpu_count(nproc: int) -> None:
    """One rank per visible GPU: refuse more ranks than GPUs (one line, with the fix)."""
    import torch

    if nproc > torch.cuda.device_count():
        raise ShardlabError(f"--nproc-per-node {nproc} but only {torch.cuda.device_count()} GPU(s) are visible; "
                            f"use --nproc-per-node {torch.cuda.device_count()} or fewer")


def run_collectives(nproc: int, ops: list[str], sizes: list[int], *, iters: int = 20, warmup: int = 2,
                    min_time_s: float = 0.05, timeout_s: float = 600, device: str | None = None,
                    overlap: bool = True, observe=None) -> dict:
    """Launch the benchmark on ``nproc`` ranks; returns {backend, device, world_size, rows, overlap, launch_s}
    (``overlap``: ``runtime.bench.overlap.measure_overlap``'s result, or None). ``observe``: metrics options
    (``runtime.observe``; each (op, size) measurement is one step)."""
    from shardlab.runtime import check_host_bytes
    from shardlab.runtime.launch import launch
    from shardlab.runtime.observe.report import observation_for

    # every rank holds an input and an output of at most the largest size (_op_fn)
    check_host_bytes(2 * nproc * max(sizes, default=0), f"bench collectives of {max(sizes, default=0):,} B on "
                     f"{nproc} ranks", "give smaller --sizes (the CPU default stops at 64MiB)", device)
    if nproc < 2:
        raise ShardlabError(f"--nproc-per-node must be at least 2 for a collective, got {nproc}")
    args = ["--ops", ",".join(ops), "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters),
            "--warmup", str(warmup), "--min-time", str(min_time_s)] + (["--overlap"] if overlap else [])
    env = {"SHARDLAB_DEVICE": device} if device else None
    obs = observation_for(observe, nproc, nproc, "bench")
    res = launch("shardlab.runtime.bench_collectives", nproc, args, timeout_s=timeout_s, env=env, observer=obs)
    res.raise_for_failure()
    docs = res.rank_results()
    if not docs or "rows" not in docs[0]:
        raise ShardlabError(f"the collectives benchmark finished but rank 0 wrote no results (in {res.run_dir})")
    doc = docs[0]
    doc.pop("rank", None)
    doc["launch_s"] = res.duration_s
    if obs is not None:
        doc["observability"] = {k: v for k, v in obs.finish(skip_steps=0).items() if k in ("metrics", "steps_jsonl")}
    return doc


def analyse(doc: dict) -> dict:
    """Add α–β fits per op (and one 'joint' fit over all ops) and each row's fitted time to a benchmark doc."""
    from shardlab.calibration import fit_alpha_beta
    from shardlab.runtime.calibrate import fit_summary

    rows = doc["rows"]
    fits, errors = {}, {}
    for op in list(dict.fromkeys(r["op"] for r in rows)) + ["joint"]:
        try:  # one op's noisy, flat times must not cost the other ops their fits
            if op == "joint":  # one alpha and beta for every op measured (the link of a profile)
                fits[op] = fit_alpha_beta(rows)
            elif op != "joint" and sum(r["op"] == op for r in rows) >= 2:
                fits[op] = fit_alpha_beta(rows, op)
        except ShardlabError as e:
            errors[op] = str(e)
    for r in rows:
        f = fits.get(r["op"])
        r["fitted_time_s"] = f.predict_s(r["op"], r["size_bytes"]) if f else None
    doc["fits"] = {k: fit_summary(f) for k, f in fits.items()}
    doc["fit_errors"] = errors
    doc["model"] = ("t = steps*alpha + factor*S/beta; steps: all-reduce 2(n-1), all-gather/reduce-scatter/"
                    "all-to-all n-1, send-recv 1; factor = nccl-tests busbw factor; least squares on relative error")
    return doc


def render(doc: dict) -> str:
    """nccl-tests-like table (measured, with the fitted time beside it) and the α–β fits."""
    from shardlab.render.table import table

    n = doc["world_size"]
    rows = [[r["op"], r["size_bytes"], f"{r['time_s'] * 1e6:.1f}",
             "-" if r.get("fitted_time_s") is None else f"{r['fitted_time_s'] * 1e6:.1f}",
             f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}"] for r in doc["rows"]]
    out = [table(["op", "size (B)", "measured time (us)", "fitted time (us)", "algbw (GB/s)", "busbw (GB/s)"], rows,
                 title=(f"{doc.get('backend', '?')} collectives, {n} ranks on {doc.get('device', '?')} "
                        f"(torch {doc.get('torch_version', '?')}); time per iteration (median of 3 batches, mean over ranks); "
                        f"algbw = S/t, busbw = algbw x nccl-tests factor; GB = 1e9 B"))]
    fits = doc.get("fits") or {}
    if fits:
        out.append("")
        out.append(table(["fit", "alpha (us/step)", "beta = busbw (GB/s)", "rel. rms", "points"],
                         [[k, f"{f['latency_us']:.2f}", f"{f['beta_gbps']:.3f}", f"{f['rel_rms']:.1%}", f["points"]]
                          for k, f in fits.items()],
                         title="alpha-beta fits: t = steps*alpha + factor*S/beta (steps: all-reduce 2(n-1), "
                               "all-gather/reduce-scatter/all-to-all n-1, send-recv 1)"))
    for op, err in (doc.get("fit_errors") or {}).items():
        out.append(f"no fit for {op}: {err}")
    if doc.get("overlap"):
        from shardlab.runtime.bench.overlap import describe

        out.append(describe(doc["overlap"]))
    if doc.get("plot"):
        out.append(f"\nplot: {doc['plot']}")
    return "\n".join(out)


# ------------------------------------------------------------------------------------- rank program


def _op_fn(torch, dist, op: str, size_bytes: int, ctx):
    """A zero-argument function running ``op`` once on S = ``size_bytes`` (buffers allocated here)."""
    n, r, dev = ctx.world_size, ctx.rank, ctx.device
    numel = size_bytes // ELEMENT_BYTES
    chunk = numel // n
    g = torch.Generator(device=dev).manual_seed(r)
    rand = lambda k: torch.randn(k, device=dev, generator=g)  # noqa: E731
    if op == "all-reduce":
        x = rand(numel)
        return lambda: dist.all_reduce(x)
    if op == "all-gather":
        x, out = rand(chunk), torch.empty(chunk * n, device=dev)
        return lambda: dist.all_gather_into_tensor(out, x)
    if op == "reduce-scatter":
        x, out = rand(chunk * n), torch.empty(chunk, device=dev)
        return lambda: dist.reduce_scatter_tensor(out, x)
    if op == "all-to-all":
        x, out = rand(chunk * n), torch.empty(chunk * n, device=dev)
        return lambda: dist.all_to_all_single(out, x)
    if op == "broadcast":
        x = rand(numel)
        return lambda: dist.broadcast(x, src=0)
    # send-recv: every rank sends S to its right neighbour and receives S from its left (nccl-tests sendrecv)
    x, out = rand(numel), torch.empty(numel, device=dev)

    def sendrecv():
        ops = [dist.P2POp(dist.isend, x, (r + 1) % n), dist.P2POp(dist.irecv, out, (r - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    return sendrecv


def _measure(torch, dist, fn, ctx, iters: int, warmup: int, min_time_s: float, batches: int = 3) -> float:
    """Seconds per call: on each rank the median over ``batches`` of the mean time per iteration, then the mean
    over ranks. nccl-tests reports one batch's mean; the median of three resists a shared machine's noise.
    Every rank runs the same number of iterations (agreed with a MAX all-reduce of the warm-up time)."""
    sync = torch.cuda.synchronize if ctx.device_type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
        fn()
    sync()
    per = torch.tensor([(time.perf_counter() - t0) / max(warmup, 1)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(per, op=dist.ReduceOp.MAX)
    reps = int(max(1, min(iters, max(3, min_time_s / max(float(per), 1e-9))) // batches))
    samples = []
    for _ in range(batches):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / reps)
    dt = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(dt)
    return float(dt) / ctx.world_size


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="rank program of `shardlab bench collectives` (run by torchrun)")
    p.add_argument("--ops", default=",".join(BENCH_OPS))
    p.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--min-time", type=float, default=0.05)
    p.add_argument("--overlap", action="store_true", help="also test communication/compute overlap")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    import torch.distributed as dist

    from shardlab.runtime.dist import destroy, init_from_env
    from shardlab.runtime.observe.rank import RankObserver
    from shardlab.runtime.worker import RankRun

    ctx = init_from_env()
    rows = []
    sizes = [int(s) for s in a.sizes.split(",")]
    # progress only: the collective tap stays off, so its few microseconds per call never enter the timings
    obs = RankObserver.from_env(ctx, strategy="bench", kind="bench", model="-",
                                planned=len(a.ops.split(",")) * len(sizes), tokens_per_step=0)
    with RankRun(ctx.rank) as rr:
        for op in a.ops.split(","):
            for size in sizes:
                s = round_size(size, ctx.world_size)
                rr.beat(f"{op} {s}")
                t0 = time.perf_counter()
                fn = _op_fn(torch, dist, op, s, ctx)
                rows.append(summarise_row(op, s, _measure(torch, dist, fn, ctx, a.iters, a.warmup, a.min_time),
                                          ctx.world_size))
                del fn
                obs.step_done(len(rows) - 1, time.perf_counter() - t0, wait_s=0.0)
        obs.finish(barrier=False)
        overlap = None
        if a.overlap:
            from shardlab.runtime.bench.overlap import measure_overlap

            rr.beat("overlap")
            cuda = ctx.device_type == "cuda"
            overlap = measure_overlap(torch, dist, ctx, (256 if cuda else 16) * 10**6, 8192 if cuda else 256)
        rr.beat("done")
        if ctx.rank == 0:
            rr.result({"backend": ctx.backend, "device": ctx.device_type, "world_size": ctx.world_size,
                       "torch_version": torch.__version__, "rows": rows, "overlap": overlap,
                       "omp_num_threads": os.environ.get("OMP_NUM_THREADS")})
    destroy()


if __name__ == "__main__":
    main()
