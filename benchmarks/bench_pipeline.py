"""Time the pipeline simulator at scale: p = 64 stages, m = 1024 micro-batches (131k passes for 1F1B).

Run: .venv/bin/python benchmarks/bench_pipeline.py [--repeat 3]
Prints wall and CPU seconds per schedule (best of the repeats) and checks the bubble against its closed form.
The target: well under a second for 1F1B on a laptop-class core.
"""

from __future__ import annotations

import argparse
import time

from shardlab.pipeline import bubble_fraction_closed_form, simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    p, m = args.stages, args.microbatches
    print(f"pipeline simulator, p = {p}, m = {m} (best of {args.repeat})")
    print(f"{'schedule':<16}{'passes':>9}{'wall s':>9}{'cpu s':>9}  bubble sim vs closed form")
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)):
        best_wall = best_cpu = float("inf")
        for _ in range(args.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            r = simulate(schedule, p, m, v)
            best_wall = min(best_wall, time.perf_counter() - w0)
            best_cpu = min(best_cpu, time.process_time() - c0)
        cf = bubble_fraction_closed_form(schedule, p, m, v)
        name = schedule + (f" v={v}" if v > 1 else "")
        print(f"{name:<16}{len(r.timeline['kind']):>9,}{best_wall:>9.3f}{best_cpu:>9.3f}  "
              f"{r.bubble_fraction:.6f} vs {cf:.6f} (|Δ| = {abs(r.bubble_fraction - cf):.1e})")


if __name__ == "__main__":
    main()
