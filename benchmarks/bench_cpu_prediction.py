"""How close is `shardlab run train`'s predicted step time to the measured one on this CPU machine?

For ddp, fsdp, tp and pp on 2 gloo ranks and the runtime presets tiny (4 blocks of width 64) and small (8 of width 256),
seq 64, global batch 8, AdamW, fp32: `shardlab run train --json` (its prediction comes from this machine's probe,
`runtime.probe`, measured into a fresh cache directory, so every strategy is probed once here), and the prediction
the catalog's generic core gives for the same run (`--no-probe`: cpu-core + loopback). The probe trains a reference
model (4 blocks of width 128) that is neither preset: every prediction below is out of sample.

Prints one row per run, the mean and largest |error| of each prediction, and the count within 25% (issue target:
every run). Measured times move by 10-30% between runs of the same command on a shared 2-core machine: read
--repeat 2 or more before trusting a digit.

Run: .venv/bin/python benchmarks/bench_cpu_prediction.py [--repeat 1] [--out cpu_prediction.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

STRATEGIES = ("ddp", "fsdp", "tp", "pp")
MODELS = ("tiny", "small")


def _run(strategy: str, model: str, cache: str) -> dict:
    env = {**os.environ, "SHARDLAB_CACHE_DIR": cache, "SHARDLAB_PROBE": "1"}
    r = subprocess.run([sys.executable, "-m", "shardlab", "run", "train", "--strategy", strategy, "--nproc-per-node",
                        "2", "--model", model, "--steps", "8", "--json"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"run train {strategy} {model} failed: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def _catalog_prediction(strategy: str, model: str) -> float:
    """What `run train --no-probe` predicts: the estimate on the catalog's cpu-core over loopback."""
    from shardlab.runtime.compare import RunShape, predicted_estimate
    from shardlab.runtime.train import TrainRequest, prepare

    spec, st, mb = prepare(TrainRequest(strategy, 2, model=model))
    est, _ = predicted_estimate(spec, st, RunShape(64, 8, mb, "adamw"), "cpu-core", "loopback")
    return est.step_time_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1, help="measure every run this many times (one probe each)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    print(f"{'strategy':8} {'model':6} {'measured':>9} {'catalog':>9} {'err':>6} {'probe':>9} {'err':>6}  probe host/block-pass")
    for rep in range(a.repeat):
        with tempfile.TemporaryDirectory(prefix="shardlab-bench-probe-") as cache:
            for model in MODELS:
                for s in STRATEGIES:
                    doc = _run(s, model, cache)
                    st = doc["step_time"]
                    meas, pred, cat = st["measured_median_s"], st["predicted_s"], _catalog_prediction(s, model)
                    host = (st.get("probe") or {}).get("layer_host_s")
                    rows.append({"repeat": rep, "strategy": s, "model": model, "measured_s": meas, "probe_s": pred,
                                 "catalog_s": cat, "probe_error": (pred - meas) / meas, "catalog_error": (cat - meas) / meas,
                                 "layer_host_s": host})
                    print(f"{s:8} {model:6} {meas * 1e3:7.1f}ms {cat * 1e3:7.1f}ms {(cat - meas) / meas:+6.0%} "
                          f"{pred * 1e3:7.1f}ms {(pred - meas) / meas:+6.0%}  "
                          + (f"{host * 1e3:.2f} ms" if host is not None else "-"))
    for k in ("catalog", "probe"):
        errs = [abs(r[f"{k}_error"]) for r in rows]
        print(f"{k:8}: mean |error| {sum(errs) / len(errs):.1%}, largest {max(errs):.1%}, within 25%: "
              f"{sum(e <= 0.25 for e in errs)} of {len(errs)}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
