"""`shardlab validate --inference`: serving engines against published measurements."""

from __future__ import annotations


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def validate_inference(args):
    import numpy as np

    from shardlab.catalog import get_catalog
    from shardlab.report.table import table
    from shardlab.serving.engines import FITTED, get_engine
    from shardlab.validation.inference import GOALS, load_inference_runs, validate

    from shardlab.cli.inference_cmds import finite

    runs = load_inference_runs()
    d = validate(get_catalog(list(args.catalog)), runs)
    refit = d["refit"]
    names = {"tpot": "per-token latency", "ttft": "first-token latency", "throughput": "throughput"}
    rows = []
    for eng in sorted(d["in_sample"]["by_engine"]):
        for g in ("tpot", "ttft", "throughput"):
            ins = d["in_sample"]["by_engine"][eng].get(g)
            lo = d["loso"]["by_engine"][eng].get(g)
            if ins:
                rows.append([eng, names[g], ins["n"], _pct(ins["mean_abs_error"]), _pct(ins["max_abs_error"]),
                             _pct(lo["mean_abs_error"]), _pct(lo["max_abs_error"]), _pct(GOALS[g])])
    by_src: dict = {}
    for r in d["rows"]:
        if r["target"] in ("latency", "throughput") and r["error"] is not None:
            by_src.setdefault((r["source"], r["group"]), []).append((abs(r["error"]), abs(r["loso_error"] or 0)))
    src_rows = [[s, names[g], len(v), _pct(float(np.mean([a for a, _ in v]))), _pct(float(np.mean([b for _, b in v])))]
                for (s, g), v in sorted(by_src.items())]
    outside = [r for r in d["rows"] if r["target"] in ("load", "info") and r["error"] is not None]
    totals = []
    for g in ("tpot", "ttft", "throughput"):
        ins, lo = d["in_sample"]["by_group"].get(g), d["loso"]["by_group"].get(g)
        if ins:
            verdict = "meets" if max(ins["mean_abs_error"], lo["mean_abs_error"]) <= GOALS[g] else (
                "meets in sample only" if ins["mean_abs_error"] <= GOALS[g] else "MISSES")
            totals.append(f"{names[g]} ({ins['n']} measurements): mean |error| {_pct(ins['mean_abs_error'])} in sample, "
                          f"{_pct(lo['mean_abs_error'])} leave-one-source-out (goal {_pct(GOALS[g])}): {verdict}")
    drift = {e: {k: v for k, v in vals.items() if abs(v / getattr(get_engine(e), k) - 1) > 0.02} for e, vals in refit.items()}
    text = "\n".join([
        table(["engine", "target", "n", "mean |err|", "max", "LOSO mean", "LOSO max", "goal"], rows,
              title=f"serving engines vs {len(runs)} published measurements ({len(d['sources'])} sources; "
                    f"docs/inference.md has every source and assumption)"),
        "", table(["source", "target", "n", "in sample", "leave-one-source-out"], src_rows, title="per source"),
        "", *totals,
        f"outside the targets (moderate load, variable-length offline runs): {len(outside)} measurements, mean |error| "
        f"{_pct(float(np.mean([abs(r['error']) for r in outside])) if outside else None)} (in the --json rows)",
        "leave-one-source-out: the engine's " + ", ".join(FITTED) + " refitted without the source, then the source predicted",
        *([f"a refit moves {e}'s " + ", ".join(f"{k} to {v:.4g}" for k, v in vals.items())
           + " (python benchmarks/fit_engines.py writes them into catalog/data/engines.yaml)"
           for e, vals in drift.items() if vals] or ["engines.yaml holds the values a refit on all rows gives"]),
    ])
    doc = {"summary": {"in_sample": d["in_sample"], "leave_one_source_out": d["loso"], "goals": GOALS},
           "engines": d["values"], "refit": refit, "rows": d["rows"]}
    return finite(doc), text
