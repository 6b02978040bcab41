"""A 0.6B-class checkpoint through `run infer`: bytes each TP rank reads, first-token time against transformers on the
same CPU, and the TP 1/2/4 decode speed-up curve.

The checkpoint has Qwen3-0.6B's published shapes (tests/data/hf-families/qwen3-0.6b.json: 28 layers, width 1,024,
16 heads, 8 KV heads, q/k norms, 151,936-token tied vocabulary) and random weights from transformers' own init (seed 0),
saved in bf16 by ``save_pretrained``; no network is needed. Targets (issue: real checkpoints in the runtime):
- loading under TP = N reads each checkpoint byte about once in total (sum over ranks / file size, near 1.0);
- the first token of TP = 2 arrives within 2x of transformers' first token (fp32, both cores: 2 threads there,
  one per rank here), prefill of the same prompt, median of 3.
Prints one table; --json for a document; --plot PNG draws the speed-up curve.
Usage: python benchmarks/bench_checkpoint.py [--tokens 32] [--new 8] [--plot docs/img/tp-checkpoint-speedup.png]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "data" / "hf-families" / "qwen3-0.6b.json"


def build(folder: Path) -> None:
    import torch
    import transformers as T

    T.logging.set_verbosity_error()
    cfg = T.AutoConfig.for_model(**{k: v for k, v in json.loads(CONFIG.read_text()).items()
                                    if k not in ("architectures", "transformers_version")})
    torch.manual_seed(0)
    T.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).save_pretrained(folder)


def transformers_first_token(folder: Path, prompt: list[int], repeats: int = 3) -> tuple[float, int]:
    """Median seconds of transformers' prefill + argmax of the first token (fp32, 2 threads), and that token."""
    import torch

    from shardlab.runtime.checkpoint.reference import load_hf

    torch.set_num_threads(2)
    model = load_hf(folder)
    x = torch.tensor([prompt])
    times, tok = [], None
    with torch.no_grad():
        for _ in range(repeats + 1):              # the first call warms up
            t0 = time.perf_counter()
            tok = int(model(x).logits[0, -1].argmax())
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), tok


def run_infer(folder: Path, tp: int, prompt: list[int], new: int, parity: bool) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, 2 // tp)))
    cmd = [sys.executable, "-m", "shardlab", "run", "infer", "--model", str(folder), "--tp", str(tp), "--strategy", "tp",
           "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(new), "--timeout", "1200", "--json"]
    out = subprocess.run(cmd + (["--check-parity"] if parity else []), capture_output=True, text=True, env=env,
                         timeout=1500)
    if out.returncode:
        raise SystemExit(f"run infer --tp {tp} failed: {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout)


def plot(points: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tps = [p["tp"] for p in points]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    ax.plot(tps, tps, "--", color="grey", label="ideal (speed-up = T)")
    ax.plot(tps, [p["decode_speedup"] for p in points], "o-", lw=2, label="decode: ms/token at T = 1 / at T")
    ax.plot(tps, [p["prefill_speedup"] for p in points], "s-", lw=2, label="first token (prefill)")
    ax.axhline(1.0, color="black", lw=0.8)
    for p in points:
        ax.annotate(f"{p['latency_per_token_s'] * 1e3:.0f} ms/token", (p["tp"], p["decode_speedup"]),
                    textcoords="offset points", xytext=(8, -4), fontsize=8, va="top")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xticks(tps, [str(t) for t in tps])
    ax.set_xlim(min(tps) / 1.3, max(tps) * 2.2)
    ax.set_xlabel("tensor-parallel ranks T (DTensor plan, gloo)")
    ax.set_ylabel("speed-up over T = 1")
    ax.set_title(f"Qwen3-0.6B-shaped checkpoint on {os.cpu_count()} CPU cores (T = 1: 2 threads; T = 2: one per rank;\n"
                 f"T = 4: ranks share the cores). Below 1x: slower; gloo all-reduces dominate a CPU decode", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32, help="prompt tokens")
    ap.add_argument("--new", type=int, default=8, help="tokens generated")
    ap.add_argument("--tp", default="1,2,4", help="TP degrees to run")
    ap.add_argument("--plot", default=None, metavar="PNG")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    prompt = [(17 * i + 3) % 151936 for i in range(a.tokens)]
    with tempfile.TemporaryDirectory(prefix="shardlab-bench-ckpt-") as tmp:
        folder = Path(tmp) / "qwen3-0.6b-shaped"
        t0 = time.perf_counter()
        build(folder)
        build_s = time.perf_counter() - t0
        hf_s, hf_tok = transformers_first_token(folder, prompt)
        runs = {t: run_infer(folder, t, prompt, a.new, parity=t == 2) for t in map(int, a.tp.split(","))}
    base = runs[min(runs)]
    points = []
    for t, d in runs.items():
        ck = d["checkpoint"]
        prefill = max(r["prefill_s"] for r in d["ranks"])
        points.append({"tp": t, "prefill_s": prefill, "latency_per_token_s": d["latency_per_token_s"],
                       "decode_speedup": base["latency_per_token_s"] / d["latency_per_token_s"],
                       "prefill_speedup": max(r["prefill_s"] for r in base["ranks"]) / prefill,
                       "bytes_read_per_rank": ck["bytes_read_per_rank"], "read_ratio": ck["read_ratio"],
                       "first_token_vs_transformers": prefill / hf_s, "first_token": d["tokens"][0],
                       "matches_transformers": d["matches_transformers"], "memory_exact": d["memory_exact"]})
    doc = {"checkpoint_bytes": base["checkpoint"]["checkpoint_bytes"], "build_s": build_s, "prompt_tokens": a.tokens,
           "new_tokens": a.new, "transformers_first_token_s": hf_s, "transformers_first_token": hf_tok,
           "cpu_cores": os.cpu_count(), "points": points,
           "targets": {"read_ratio_tp2_at_most": 1.05, "first_token_tp2_vs_transformers_at_most": 2.0}}
    if a.plot:
        plot(points, a.plot)
    if a.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"checkpoint {doc['checkpoint_bytes'] / 2**30:.2f} GiB bf16 (Qwen3-0.6B shapes, random weights); prompt "
          f"{a.tokens} tokens, {a.new} new; {os.cpu_count()} CPU cores; transformers first token "
          f"{hf_s * 1e3:.0f} ms (fp32, 2 threads)")
    print(f"{'T':>3} {'bytes read per rank (MiB)':>28} {'sum/file':>9} {'first token':>12} {'vs transformers':>16} "
          f"{'ms/token':>9} {'decode x':>9} {'= transformers':>15}")
    for p in points:
        reads = "/".join(f"{b / 2**20:.0f}" for b in p["bytes_read_per_rank"])
        print(f"{p['tp']:>3} {reads:>28} {p['read_ratio']:>9.3f} {p['prefill_s'] * 1e3:>10.0f}ms "
              f"{p['first_token_vs_transformers']:>15.2f}x {p['latency_per_token_s'] * 1e3:>9.1f} "
              f"{p['decode_speedup']:>8.2f}x {str(p['matches_transformers']):>15}")
    two = next((p for p in points if p["tp"] == 2), None)
    if two:
        print(f"targets: TP 2 reads {two['read_ratio']:.3f}x the file (<= 1.05: "
              f"{'met' if two['read_ratio'] <= 1.05 else 'MISSED'}); its first token takes "
              f"{two['first_token_vs_transformers']:.2f}x transformers' (<= 2: "
              f"{'met' if two['first_token_vs_transformers'] <= 2 else 'MISSED'})")
    if a.plot:
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
