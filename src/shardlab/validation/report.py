"""Accuracy by family (framework × GPU generation): in-sample and leave-one-source-out errors, against the targets."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

TARGET_MEAN = 0.07
"""Leave-one-source-out mean |error| each family with at least TARGET_MIN_RUNS runs must meet."""
TARGET_MAX = 0.20
"""No in-target run may miss by more than this out of sample."""
TARGET_MIN_RUNS = 5


def load_folds(path=None) -> dict:
    """{source: FittedParams} from crossval.yaml (written by benchmarks/fit_step_model.py)."""
    from shardlab.catalog import load_yaml
    from shardlab.validation import CROSSVAL_FILE
    from shardlab.validation.fit import FittedParams

    data = load_yaml(path or CROSSVAL_FILE) or {}
    return {src: FittedParams({k: float(v) for k, v in f["values"].items()}, int(f.get("runs", 0)), held_out=src)
            for src, f in (data.get("folds") or {}).items()}


def loso_comparisons(runs, catalog, folds: dict | None = None) -> list:
    """Each in-target run predicted with the efficiencies refitted without its source (informational runs: the full fit)."""
    from shardlab.validation import compare

    folds = load_folds() if folds is None else folds
    out = []
    by_source = defaultdict(list)
    for r in runs:
        by_source[r.source if not r.informational and r.source in folds else None].append(r)
    for src, rs in by_source.items():
        out += compare(rs, catalog, params=folds.get(src) if src else None)
    order = {r.id: i for i, r in enumerate(runs)}
    return sorted(out, key=lambda c: order[c.run.id])


@dataclass
class FamilyAccuracy:
    """Errors of one family's in-target runs."""

    family: str
    runs: int
    sources: int
    in_sample_mean: float
    in_sample_max: float
    loso_mean: float | None
    loso_max: float | None

    @property
    def target_applies(self) -> bool:
        return self.runs >= TARGET_MIN_RUNS

    @property
    def meets_target(self) -> bool | None:
        if not self.target_applies or self.loso_mean is None:
            return None
        return self.loso_mean <= TARGET_MEAN and self.loso_max <= TARGET_MAX

    def to_dict(self) -> dict:
        return {"family": self.family, "runs": self.runs, "sources": self.sources,
                "in_sample_mean_abs_error": self.in_sample_mean, "in_sample_max_abs_error": self.in_sample_max,
                "loso_mean_abs_error": self.loso_mean, "loso_max_abs_error": self.loso_max,
                "target_applies": self.target_applies, "meets_target": self.meets_target}


def family_accuracy(in_sample: list, loso: list | None) -> list[FamilyAccuracy]:
    loso_by_id = {c.run.id: c for c in loso or []}
    fams = defaultdict(list)
    for c in in_sample:
        if not c.run.informational:
            fams[c.family].append(c)
    out = []
    for fam, cs in sorted(fams.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ins = [abs(c.error) for c in cs]
        lo = [abs(loso_by_id[c.run.id].error) for c in cs if c.run.id in loso_by_id]
        out.append(FamilyAccuracy(fam, len(cs), len({c.run.source for c in cs}), sum(ins) / len(ins), max(ins),
                                  sum(lo) / len(lo) if lo else None, max(lo) if lo else None))
    return out


def family_table(in_sample: list, loso: list | None) -> str:
    from shardlab.render.table import table

    rows = []
    for f in family_accuracy(in_sample, loso):
        pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"
        verdict = {True: "meets", False: "MISSES", None: "n/a (< 5 runs)" if not f.target_applies else "-"}[f.meets_target]
        rows.append([f.family, str(f.runs), str(f.sources), pct(f.in_sample_mean), pct(f.in_sample_max),
                     pct(f.loso_mean), pct(f.loso_max), verdict])
    return table(["family", "runs", "sources", "in-sample mean", "max", "leave-one-source-out mean", "max",
                  f"target (mean ≤ {TARGET_MEAN:.0%}, max ≤ {TARGET_MAX:.0%})"], rows,
                 title="accuracy by family: |predicted − measured| / measured (throughput)")
