"""Reproduce the A100 matmul-efficiency fit: grid search over (max_fraction, half_size) on the Megatron-LM
runs of the validation set, and leave-one-out cross-validation (fit on all runs but one, predict that one).

Prints the best pair, the in-sample errors and the leave-one-out errors (docs/validation.md).
Usage: python benchmarks/fit_a100_curve.py   (about a minute on 2 cores)
"""

import dataclasses

import numpy as np

from shardlab.catalog import get_catalog
from shardlab.specs.hardware import MatmulEfficiency
from shardlab.validation import load_runs, predict


def main() -> None:
    cat = get_catalog()
    runs = [r for r in load_runs() if not r.informational and r.config.get("gpu", "a100-80gb") == "a100-80gb"]
    base = cat.accelerators["a100-80gb"]
    grid = [(round(mf, 2), hs) for mf in np.arange(0.60, 0.86, 0.02) for hs in (10, 20, 40, 60, 80, 100, 140, 200)]
    err = np.zeros((len(grid), len(runs)))
    for i, (mf, hs) in enumerate(grid):
        cat.accelerators["a100-80gb"] = dataclasses.replace(base, efficiency=MatmulEfficiency(mf, hs))
        for j, r in enumerate(runs):
            est = predict(r, cat)
            err[i, j] = (est.hardware_tflops_per_gpu - r.measured_tflops_per_gpu) / r.measured_tflops_per_gpu
    best = int(np.argmin((err ** 2).mean(axis=1)))
    print(f"{len(runs)} runs; best (max_fraction, half_size) = {grid[best]}: mean |error| "
          f"{100 * np.abs(err[best]).mean():.1f}%, max {100 * np.abs(err[best]).max():.1f}%")
    loo = []
    for j, r in enumerate(runs):
        keep = np.arange(len(runs)) != j
        b = int(np.argmin((err[:, keep] ** 2).mean(axis=1)))
        loo.append(err[b, j])
        print(f"  {r.id:18s} in-sample {100 * err[best, j]:+5.1f}%   left out (fit {grid[b]}): {100 * err[b, j]:+5.1f}%")
    loo = np.abs(loo)
    print(f"leave-one-out: mean |error| {100 * loo.mean():.1f}%, max {100 * loo.max():.1f}%")


if __name__ == "__main__":
    main()
