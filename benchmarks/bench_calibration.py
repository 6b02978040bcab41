"""Do predictions from a calibrated hardware profile land closer to measured step times than catalog defaults?

1. `shardlab calibrate` on this machine (matmul curve, memory-bound kernels, gloo α–β) -> profile.yaml;
2. `shardlab run train` for a few strategies and models on 2 gloo ranks -> measured median step time;
3. `shardlab.estimate.estimate_training` for the same runs with the catalog's cpu-core + loopback, and with
   the profile's calibrated accelerator (matmul curve, memory-bound rate, operator overhead), link and
   comm_overlap.
Prints one row per run and the mean |log(predicted / measured)| of each; writes everything to --out (JSON).

Run: .venv/bin/python benchmarks/bench_calibration.py [--out calibration.json] [--profile EXISTING.yaml]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

CASES = [("ddp", "small"), ("fsdp", "small"), ("tp", "small"), ("ddp", "tiny"), ("fsdp", "tiny")]


def _cli(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "shardlab", *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"shardlab {' '.join(args)} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def _predict(strategy: str, model: str, profile: str | None) -> float:
    """Step time the estimate predicts for `run train`'s defaults (seq 64, global batch 8, adamw, fp32) on one
    host of 2 ranks: the catalog's cpu-core + loopback, or the profile's accelerator, link and comm_overlap
    (as ``runtime.compare.predicted_step_time`` builds the cluster, plus the profile's overlap switch)."""
    from shardlab.catalog import get_catalog
    from shardlab.estimate import estimate_training
    from shardlab.runtime.train import TrainRequest, prepare
    from shardlab.specs.hardware import Cluster

    spec, st, mb = prepare(TrainRequest(strategy, 2, model=model))
    cat = get_catalog([profile] if profile else [])
    prof = cat.profile if profile else {"gpu": "cpu-core", "intra_link": "loopback"}
    link = cat.link(prof["intra_link"])
    cluster = Cluster(accelerator=cat.accelerator(prof["gpu"]), num_gpus=2, gpus_per_node=2, intra_link=link,
                      inter_link=link)
    est = estimate_training(spec, st.layout(mb), cluster, seq_len=64, global_batch=8, precision="fp32",
                            optimizer="adamw", dp_overlap=prof.get("comm_overlap", True) is not False)
    return est.step_time_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", default=None, help="reuse a profile instead of calibrating")
    a = ap.parse_args()
    profile = a.profile or os.path.join(tempfile.mkdtemp(), "profile.yaml")
    if not a.profile:
        _cli("calibrate", "--out", profile, "--sizes", "1KB:16MB:4")
    rows = []
    print(f"{'strategy':8} {'model':6} {'measured':>9} {'catalog':>9} {'err':>7} {'calibrated':>10} {'err':>7}")
    for strategy, model in CASES:
        run = _cli("run", "train", "--strategy", strategy, "--nproc", "2", "--model", model, "--steps", "6")
        meas = run["step_time"]["measured_median_s"]
        cat, cal = _predict(strategy, model, None), _predict(strategy, model, profile)
        rows.append({"strategy": strategy, "model": model, "measured_s": meas, "catalog_s": cat, "calibrated_s": cal})
        print(f"{strategy:8} {model:6} {meas * 1e3:7.1f}ms {cat * 1e3:7.1f}ms {(cat - meas) / meas:+7.0%} "
              f"{cal * 1e3:8.1f}ms {(cal - meas) / meas:+7.0%}")
    score = {k: sum(abs(math.log(r[k] / r["measured_s"])) for r in rows) / len(rows) for k in ("catalog_s", "calibrated_s")}
    print(f"mean |log(predicted/measured)|: catalog {score['catalog_s']:.3f}, calibrated {score['calibrated_s']:.3f} "
          f"(x{math.exp(score['catalog_s']):.2f} vs x{math.exp(score['calibrated_s']):.2f} typical factor off)")
    with open(profile) as f:
        text = f.read()
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "mean_abs_log_error": score, "profile": text}, f, indent=2)


if __name__ == "__main__":
    main()
