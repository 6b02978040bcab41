"""shard-check at target scale: PyTorch's FSDP2/TP shards on a fake process group vs the memory model, byte
for byte, for models up to Llama-3.1-405B on up to 128 ranks. Prints one line per case (exact or not, shard
classes, ranks executed, wall time) and exits 1 if any case differs.

Run: .venv/bin/python benchmarks/bench_shard_check.py [--quick]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

CASES = [
    ("llama-3.1-70b", ["--world-size", "64", "--fsdp", "64"]),
    ("llama-3.1-70b", ["--world-size", "64", "--dp", "8", "--tp", "8"]),
    ("llama-3.1-70b", ["--world-size", "60", "--fsdp", "60"]),           # uneven dim-0 shards
    ("llama-3.1-8b", ["--world-size", "32", "--dp", "2", "--tp", "16"]),  # tp > KV heads: duplicated KV heads
    ("llama-2-7b", ["--world-size", "64", "--fsdp", "64"]),
    ("mixtral-8x7b", ["--world-size", "16", "--dp", "4", "--tp", "4"]),   # stacked experts split by TP
    ("qwen2.5-72b", ["--world-size", "64", "--dp", "8", "--tp", "8"]),    # QKV biases
    ("gpt-neox-20b", ["--world-size", "16", "--dp", "4", "--tp", "4"]),   # LayerNorm biases, untied head
    ("gpt2", ["--world-size", "5", "--fsdp", "5"]),                      # tied embeddings, learned positions
    ("gpt2", ["--world-size", "6", "--dp", "3", "--tp", "2"]),           # vocabulary 50257 not divisible by tp
    ("bloom-176b", ["--world-size", "96", "--fsdp", "96"]),
    ("llama-3.1-405b", ["--world-size", "128", "--fsdp", "128"]),
]
QUICK = CASES[:2]


def main() -> int:
    cases = QUICK if "--quick" in sys.argv else CASES
    failed = 0
    print(f"{'model':16} {'layout':34} {'result':9} {'classes':>7} {'executed':>9} {'bytes/rank':>15} {'wall':>7}")
    for model, args in cases:
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "shardlab", "shard-check", model, *args, "--json"],
                           capture_output=True, text=True)
        wall = time.perf_counter() - t
        if r.returncode not in (0, 1):
            print(f"{model:16} {' '.join(args):34} ERROR    {r.stderr.strip().splitlines()[-1]}")
            failed += 1
            continue
        d = json.loads(r.stdout)
        failed += not d["exact"]
        print(f"{model:16} {' '.join(args):34} {'exact' if d['exact'] else 'MISMATCH':9} {len(d['classes']):>7} "
              f"{len(d['executed_ranks']):>9} {d['memory_model_bytes_per_rank']:>15,} {wall:>6.1f}s")
        for m in d["mismatches"][:4]:
            print(f"    {m['tensor']} (rank {m['rank']}): predicted {m['predicted_shape']} = {m['predicted_bytes']:,} B, "
                  f"measured {m['measured_shape']} = {m['measured_bytes']:,} B")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
