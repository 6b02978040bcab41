"""Capacity-search speed: `plan --inference --serve` with latency targets and no load (target: under 3 CPU seconds
for the whole command, start-up included, at p50 and at p99).

Times `shardlab plan llama-3.1-8b --inference --serve --gpus 8 --gpu h100-sxm --prompt-len 4000 --output-len 500
--ttft-slo 1 --tpot-slo 0.025` with --slo-percentile p50 (the steady state, all layouts bisected at once) and p99
(plus a few simulations per layout that can win), each in a fresh interpreter: CPU seconds (user + system of the
child process), the median of the repeats; and the winner's capacity from the JSON document. The package's bytecode
is cached first (one untimed run that may write it, as `pip install` compiles it), so the times do not include
compiling the sources, whatever PYTHONDONTWRITEBYTECODE says in the calling shell.
Then the same question at 1,024, 4,096 and 16,384 GPUs (p50, one run each; no target, a figure): the search holds
every aggregated layout and every prefill/decode split of whole nodes (127 pool sizes at 1,024 GPUs, 2,047 at 16,384,
each with every pair of replica layouts).
Usage: python benchmarks/bench_capacity.py [repeats]
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time

COMMAND = ["plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--gpu", "h100-sxm", "--prompt-len", "4000",
           "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025"]
TARGET_CPU_S = 3.0
SCALE_GPUS = (1024, 4096, 16384)
"""GPU counts timed beside the target's 8."""


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(percentile: str, gpus: int = 8) -> tuple[float, float, dict]:
    """(CPU seconds, wall seconds, JSON document) of one command in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [str(gpus) if i > 0 and COMMAND[i - 1] == "--gpus" else a for i, a in enumerate(COMMAND)]
    cpu0, t0 = _child_cpu(), time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "shardlab", *cmd, "--slo-percentile", percentile, "--json"],
                         capture_output=True, text=True, check=True, env=env, timeout=600)
    return _child_cpu() - cpu0, time.perf_counter() - t0, json.loads(out.stdout)


def main(repeats: int = 3) -> None:
    print("shardlab " + " ".join(COMMAND))
    run_once("p50")                               # untimed: writes the bytecode cache
    for pct in ("p50", "p99"):
        runs = [run_once(pct) for _ in range(repeats)]
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        cap = runs[-1][2]["capacity"]
        lay = cap["layout"]
        print(f"--slo-percentile {pct}: {cpu:.2f} CPU s (median of {repeats}; min {min(r[0] for r in runs):.2f}), "
              f"{wall:.2f} s wall; {'within' if cpu < TARGET_CPU_S else 'OVER'} the {TARGET_CPU_S:g} s target")
        print(f"  winner: {lay['replicas']} × TP {lay['tp']} × PP {lay['pp']}, max-num-seqs {lay['max_num_seqs']}: "
              f"{cap['max_request_rate']:.2f} requests/s, {cap['goodput_tokens_per_s_per_gpu']:,.0f} output tokens/s "
              f"per GPU, {cap['max_concurrency']:,.0f} in flight; {cap['binds']} binds ({cap['binds_statistic']}); "
              f"{pct} TTFT {1e3 * cap['ttft_s']:.1f} ms, TPOT {1e3 * cap['tpot_s']:.1f} ms")
    for gpus in SCALE_GPUS:
        cpu, wall, doc = run_once("p50", gpus)
        lay = doc["capacity"]["layout"]
        split = (doc.get("disaggregated") or [{}])[0]
        print(f"--gpus {gpus:,}: {cpu:.2f} CPU s, {wall:.2f} s wall; winner {lay['replicas']} × TP {lay['tp']} × PP "
              f"{lay['pp']}, {doc['capacity']['goodput_tokens_per_s_per_gpu']:,.0f} output tokens/s per GPU; best split "
              f"{split.get('prefill', {}).get('gpus')} prefill + {split.get('decode', {}).get('gpus')} decode GPUs")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
