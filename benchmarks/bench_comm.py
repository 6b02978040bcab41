"""Time the collective cost model: the vectorized α–β formula over a million (size, ranks) pairs, the
priced dataclass per call, and the `shardlab comm` command's start-up (the target: well under 0.5 s).

Run: .venv/bin/python benchmarks/bench_comm.py
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np

from shardlab.catalog import get_catalog
from shardlab.comm.collectives import alpha_beta_time, collective_time


def main() -> None:
    sizes = np.logspace(0, 30, 1000, base=2.0)
    ranks = np.arange(1, 1001)[:, None]
    t = time.perf_counter()
    out = alpha_beta_time("all-reduce", sizes, ranks, 2e-6, 369e9)
    print(f"alpha_beta_time over {out.size:,} (size, n) pairs: {time.perf_counter() - t:.3f} s")
    cat = get_catalog()
    nvl, ndr = cat.link("nvlink4"), cat.link("ib-ndr")
    t = time.perf_counter()
    for s in range(1000):
        collective_time("all-reduce", 2**20 + s, 64, ndr, nodes=8, intra_link=nvl)
    print(f"collective_time (hierarchical, auto, formula text included): {(time.perf_counter() - t):.3f} ms per call")
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "shardlab", "comm", "all-reduce", "--size", "256MiB", "--ranks", "8",
                        "--link", "nvlink4"], check=True, capture_output=True)
        best = min(best, time.perf_counter() - t)
    print(f"`shardlab comm all-reduce ...` end to end (process start included): {best:.3f} s (best of 3)")


if __name__ == "__main__":
    main()
