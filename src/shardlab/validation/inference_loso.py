"""Scoring the serving model against the published rows (``validate --inference``): the targets per family
(engine version × GPU generation), the summaries in sample and leave-one-source-out, and the folds that refit
without each source (forked workers). The rows, their cases and the predictions are in ``validation.inference``;
the fit in ``validation.inference_fit``."""

from __future__ import annotations

import numpy as np

from shardlab.validation.inference import (InferenceRun, Params, Prepared, errors, fitted,
                                           load_inference_runs, predict, prepare_runs)

GOALS = {"tpot": 0.10, "ttft": 0.12, "throughput": 0.10}
"""Mean |error| goals per family (engine version × GPU generation) with at least FAMILY_MIN measurements,
leave-one-source-out: per-token latency and throughput 10%, first-token latency 12%; no row beyond MAX_ERROR."""
FAMILY_MIN = 5
MAX_ERROR = 0.35


def _summary(errs: list[dict], key: str) -> dict:
    """mean and max |error| of ``key`` errors per family, per engine and per group, target rows only; the
    mixture-of-experts rows (predicted, never fitted: ``validation.inference.moe_run``) count in their own families
    and in 'moe' per group (those with expert parallelism in 'expert_parallel' too), not in by_engine or by_group
    (the fitted model's figures)."""
    acc: dict = {"by_family": {}, "by_engine": {}, "by_group": {}, "moe": {}, "expert_parallel": {}}
    for e in errs:
        if e["target"] not in ("latency", "throughput") or e[key] is None:
            continue
        acc["by_family"].setdefault(e["family"], {}).setdefault(e["group"], []).append(abs(e[key]))
        if " MoE" in e["family"]:
            acc["moe"].setdefault(e["group"], []).append(abs(e[key]))
            if " MoE-EP" in e["family"]:
                acc["expert_parallel"].setdefault(e["group"], []).append(abs(e[key]))
            continue
        acc["by_engine"].setdefault(e["engine"], {}).setdefault(e["group"], []).append(abs(e[key]))
        acc["by_group"].setdefault(e["group"], []).append(abs(e[key]))
    stat = lambda v: {"n": len(v), "mean_abs_error": float(np.mean(v)), "max_abs_error": float(np.max(v))}  # noqa: E731
    return {"by_family": {k: {g: stat(v) for g, v in d.items()} for k, d in acc["by_family"].items()},
            "by_engine": {k: {g: stat(v) for g, v in d.items()} for k, d in acc["by_engine"].items()},
            "by_group": {g: stat(v) for g, v in acc["by_group"].items()},
            "moe": {g: stat(v) for g, v in acc["moe"].items()},
            "expert_parallel": {g: stat(v) for g, v in acc["expert_parallel"].items()}}


def verdict(loso: dict) -> dict:
    """The targets, leave-one-source-out: each family with at least FAMILY_MIN measurements of a group meets its
    goal, and no measurement is beyond MAX_ERROR."""
    misses = [{"family": f, "group": g, "n": s["n"], "mean_abs_error": s["mean_abs_error"], "goal": GOALS[g]}
              for f, d in loso["by_family"].items() for g, s in d.items()
              if s["n"] >= FAMILY_MIN and s["mean_abs_error"] > GOALS[g]]
    worst = max((s["max_abs_error"] for d in loso["by_family"].values() for s in d.values()), default=0.0)
    return {"met": not misses and worst <= MAX_ERROR, "family_misses": misses, "worst_abs_error": worst,
            "max_error": MAX_ERROR, "family_min": FAMILY_MIN}


_FOLD_STATE: dict = {}
"""The prepared runs and starting values the forked fold workers read (set before the pool forks)."""


def _fold(src: str) -> tuple[str, list[dict], dict]:
    """One leave-one-source-out fold: the two-stage fit without ``src``, then ``src``'s errors, and the fold's
    values ({'rates', 'engines'})."""
    from shardlab.validation.inference_fit import fit_two_stage, unseen_from_others

    prep, values = _FOLD_STATE["prep"], _FOLD_STATE["values"]
    everything = np.arange(len(prep.runs))
    keep = np.array([i for i in everything if prep.runs[i].source != src])
    held = np.array([i for i in everything if prep.runs[i].source == src])
    seen = fitted(prep, keep)
    vals = unseen_from_others(prep, seen, fit_two_stage(prep, seen, values))
    return src, errors(prep, predict(prep, vals, held), held), {"rates": vals.rates, "engines": vals.engines}


def _folds(prep: Prepared, values: Params, sources: list[str]):
    """Each source's fold, in order, on every core (forked workers: the folds are independent fits); one at a time
    where there is one core or one source. Yields (source, its rows' errors, the fold's values)."""
    import os

    _FOLD_STATE.update(prep=prep, values=values)
    workers = min(len(sources), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if workers < 2:
        yield from (_fold(s) for s in sources)
        return
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_fold, sources)


def validate(catalog, runs: list[InferenceRun] | None = None, loso: bool = True, only_source: str | None = None,
             progress=None, committed: dict | None = None) -> dict:
    """Predict every run with the catalog's values; refit (two stages, all generations' rates and all engines'
    overheads jointly); and leave-one-source-out: for each source, the same two-stage fit on every other source,
    then the source predicted (a generation or engine only that source covers takes the others' mean). Returns rows, summaries, values and the refit. ``only_source``: hold out that
    source alone and skip the full refit (``validate --inference --run``). ``committed`` (``inference_folds.load``):
    the refit and the folds written by benchmarks/fit_engines.py, used instead of refitting; without it the result
    carries the folds it fitted ('fold_values', 'free_values') for that script to write."""
    from shardlab.validation.inference_fit import catalog_params, fit_two_stage, unseen_from_others

    runs = runs or load_inference_runs()
    prep = prepare_runs(runs, catalog)
    everything = np.arange(len(runs))
    values = catalog_params(prep)
    if committed is not None and (only_source or not loso):
        committed = None                          # one source or no folds: cheap to refit, nothing to reuse
    refit = None if only_source else (committed["refit"] if committed else fit_two_stage(prep, fitted(prep, everything), values))
    sources = [only_source] if only_source else sorted({r.source for r in runs})
    # a source with no fitted row changes no fit: holding it out is the full refit (no fold to run)
    has_fit = {prep.runs[i].source for i in fitted(prep, everything)}
    folded = [s for s in sources if s in has_fit]
    if progress:                                  # folds done of total: the refit, then each source held out
        progress(1, len(folded) + 1, "refit")
    rows = errors(prep, predict(prep, values), everything)
    by_key = {(r["run"], r["metric"]): r for r in rows}
    for r in rows:
        r["loso_predicted"] = r["loso_error"] = None
    fold_values, free_values = {}, None
    from shardlab.validation.inference_folds import covers, runs_key

    if committed is not None and (set(committed["folds"]) != set(folded) or committed["runs"] != runs_key(runs)
                                  or not covers(committed, values)):
        committed = None                          # the file's sources are not these: refit (and say so)
        refit = fit_two_stage(prep, fitted(prep, everything), values)
    if loso:
        free = [s for s in sources if s not in has_fit]
        if free:
            if committed is not None and committed["free"] is not None:
                vals = committed["free"]
            else:
                base = refit if refit is not None else fit_two_stage(prep, fitted(prep, everything), values)
                vals = unseen_from_others(prep, fitted(prep, everything), base)
            free_values = {"rates": vals.rates, "engines": vals.engines}
            for src in free:
                held = np.array([i for i in everything if prep.runs[i].source == src])
                for e in errors(prep, predict(prep, vals, held), held):
                    row = by_key[(e["run"], e["metric"])]
                    row["loso_predicted"], row["loso_error"] = e["predicted"], e["error"]
        if committed is not None:                 # each held-out source predicted with its committed fold
            found_all = ((src, errors(prep, predict(prep, committed["folds"][src], held), held), None)
                         for src in folded for held in [np.array([i for i in everything if prep.runs[i].source == src])])
        else:
            found_all = _folds(prep, values, folded)
        for k, (src, found, fv) in enumerate(found_all, 2):
            if fv is not None:
                fold_values[src] = fv
            for e in found:
                row = by_key[(e["run"], e["metric"])]
                row["loso_predicted"], row["loso_error"] = e["predicted"], e["error"]
            if progress:
                progress(k, len(folded) + 1, f"held out {src}")
    counts: dict = {}
    per_engine: dict = {}
    unfitted = {r.id for r, moe in zip(runs, prep.moe) if moe}
    for r in rows:                                 # the measured values behind each fitted value
        if r["target"] in ("latency", "throughput") and r["run"] not in unfitted:
            counts[r["generation"]] = counts.get(r["generation"], 0) + 1
            per_engine[r["engine"]] = per_engine.get(r["engine"], 0) + 1
    loso_summary = _summary(rows, "loso_error") if loso else None
    return {"rows": rows, "in_sample": _summary(rows, "error"), "loso": loso_summary,
            "verdict": verdict(loso_summary) if loso_summary else None,
            "values": {"rates": values.rates, "engines": values.engines},
            "refit": {"rates": refit.rates, "engines": refit.engines} if refit else None,
            "rows_per_generation": counts, "rows_per_engine": per_engine, "goals": GOALS, "sources": sorted({r.source for r in runs}),
            "folds": ("committed" if committed is not None else "refitted") if loso else None,
            **({"fold_values": fold_values, "free_values": free_values} if loso and committed is None else {})}

