"""Does communication overlap computation on this machine? (the profile's ``comm_overlap``)

Every rank times, with the same work: an all-reduce of S bytes alone (t_comm); k matmuls alone, k chosen so
they take about t_comm (t_comp); the all-reduce issued with ``async_op=True``, the k matmuls, then the wait
(t_both). The three are timed back to back in each of 7 trials (means over ranks), and

    share = (t_comp + t_comm − t_both) / min(t_comp, t_comm), clipped to [0, 1], median over the trials

1 when the shorter of the two hides entirely under the longer (NCCL on its own CUDA stream), 0 when they
serialise (gloo on CPU ranks that have one core each: the communication thread needs the core the matmuls
hold). ``overlaps`` = share ≥ 0.5: what the estimate's ``dp_overlap`` assumes (gradient all-reduce under the
last backward, ZeRO-3 gathers under the previous block).
"""

from __future__ import annotations

import statistics
import time

OVERLAP_THRESHOLD = 0.5
"""Share of the shorter activity hidden above which the machine counts as overlapping."""


def measure_overlap(torch, dist, ctx, size_bytes: int, matmul_n: int, trials_n: int = 7) -> dict:
    """Run the test on every rank (a collective call: all ranks must call it); returns the same dict on each."""
    dev = ctx.device
    sync = torch.cuda.synchronize if ctx.device_type == "cuda" else (lambda: None)
    x = torch.randn(size_bytes // 4, device=dev)
    a, b = torch.randn(matmul_n, matmul_n, device=dev), torch.randn(matmul_n, matmul_n, device=dev)

    def timed(fn) -> float:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    dist.all_reduce(x)  # warm-up (connections, buffers)
    t_comm = statistics.median(timed(lambda: dist.all_reduce(x)) for _ in range(3))
    t_mm = statistics.median(timed(lambda: torch.mm(a, b)) for _ in range(3))
    k = torch.tensor([max(1.0, round(t_comm / max(t_mm, 1e-9)))], dtype=torch.float64, device=dev)
    dist.all_reduce(k, op=dist.ReduceOp.MAX)  # every rank runs the same work
    reps = int(k.item())

    def compute():
        for _ in range(reps):
            torch.mm(a, b)

    def both():
        work = dist.all_reduce(x, async_op=True)
        compute()
        work.wait()

    trials = []  # (comm, compute, both) back to back, so that a busy moment hits all three alike
    for _ in range(trials_n):
        trials.append([timed(lambda: dist.all_reduce(x)), timed(compute), timed(both)])
    times = torch.tensor(trials, dtype=torch.float64, device=dev)
    dist.all_reduce(times)
    times = (times / ctx.world_size).tolist()
    shares = [min(1.0, max(0.0, (c + p - b) / max(min(c, p), 1e-12))) for c, p, b in times]
    share = statistics.median(shares)
    med = [statistics.median(t[i] for t in times) for i in range(3)]
    return {"size_bytes": size_bytes, "matmuls": reps, "matmul_n": matmul_n, "comm_s": med[0], "compute_s": med[1],
            "both_s": med[2], "share": share, "shares": shares, "overlaps": share >= OVERLAP_THRESHOLD}


def describe(ov: dict) -> str:
    """One line for the human output."""
    return (f"communication/compute overlap: {ov['share']:.0%} of the shorter hidden (all-reduce "
            f"{ov['size_bytes'] / 1e6:.0f} MB {ov['comm_s'] * 1e3:.1f} ms, {ov['matmuls']} matmuls "
            f"{ov['compute_s'] * 1e3:.1f} ms, both {ov['both_s'] * 1e3:.1f} ms) -> comm_overlap: "
            f"{'true' if ov['overlaps'] else 'false'}")
