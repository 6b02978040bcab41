"""How fast does `shardlab memory` answer? (target: well under half a second of wall time, imports included)

Runs the real command in fresh processes, so Python start-up and imports are counted.
Usage: python benchmarks/bench_memory.py [repeats]
"""

import statistics
import subprocess
import sys
import time

CASES = [
    ["memory", "llama-3.1-8b", "--gpus", "8", "--zero", "3"],
    ["memory", "llama-3.1-405b", "--gpus", "1024", "--tp", "8", "--pp", "16", "--vpp", "2", "--schedule", "interleaved",
     "--microbatches", "32", "--sequence-parallel", "--recompute", "selective", "--zero", "1"],
    ["memory", "deepseek-v3", "--gpus", "256", "--tp", "8", "--pp", "8", "--ep", "4", "--zero", "1"],
    ["memory", "--params", "7.5e9", "--dp", "64", "--zero", "3"],
]


def main(repeats: int = 5) -> None:
    print(f"{'case':60s} {'median s':>9s} {'max s':>7s}")
    for args in CASES:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "shardlab", *args, "--json"], check=True, capture_output=True)
            times.append(time.perf_counter() - t)
        print(f"{' '.join(args)[:60]:60s} {statistics.median(times):9.3f} {max(times):7.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
