"""Published serving measurements, shardlab's predictions of them, and the engine fit (``validate --inference``).

The rows live in ``inference_runs.yaml`` (a ``sources`` block per publication: citation, engine, tag, stated
settings; ``runs`` inheriting them). Each run becomes a ServeCase (``serving.case``) and is predicted by the
steady-state model (``serving.steady``). Errors are (predicted − measured) / measured per metric.

Fit (``fit_engine``): the seven fitted fields of one engine (``serving.engines.FITTED``) minimise the squared
log errors of its target rows (latency and throughput; each target group weighted so that the groups count
equally and together as many as there are measurements), with
a weak Gaussian prior (σ = 2 in logit/log space). Two stages (empirical Bayes): each engine is first fitted alone
with the prior on PRIOR (documented values); then with the prior centred on the other engines' stage-one values
(averaged in that space), so that a parameter no remaining row constrains falls back to what the other engines
show. Solved by Levenberg–Marquardt (Levenberg 1944; Marquardt 1963, SIAM J. Appl.
Math. 11(2)) with forward-difference Jacobians. Leave-one-source-out: refit the engine without one source,
predict that source.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.serving.engines import FITTED, FRACTIONS, EngineProfile, get_engine
from shardlab.serving.step import Kernels

RUNS_FILE = Path(__file__).parent / "inference_runs.yaml"
SETTINGS = ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "scheduler_steps", "chunked_prefill")
"""Engine settings a source or run may state (they replace the engine's defaults)."""
METRICS = {"output_tokens_per_s": "throughput", "requests_per_s": "throughput", "ttft_s": "ttft", "tpot_s": "tpot",
           "e2e_s": "tpot"}
"""Measured metric -> the target it counts for (e2e of a static batch is per-token latency × tokens)."""
_RUN_KEYS = {"id", "source", "model", "gpu", "tp", "pp", "weights", "kv_cache", "activations", "group_size", "isl", "osl",
             "mode", "requests", "qps", "concurrency", "batch", "target", "dataset", "build", "settings", "assumed",
             "ttft_stat", "tpot_stat", "e2e_stat"} | set(METRICS)
_SOURCE_KEYS = {"engine", "tag", "citation", "settings", "assumed"}
TARGETS = ("latency", "throughput", "load", "info")
PRIOR = {"weight_bandwidth_efficiency": 0.7, "kv_bandwidth_efficiency": 0.7, "gemm_efficiency": 0.6, "gemm8_efficiency": 0.6,
         "attention_efficiency": 0.5, "step_overhead_us": 100.0, "seq_overhead_us": 5.0, "layer_overhead_us": 20.0,
         "request_overhead_us": 5000.0}
"""Prior centres: 60-70% model bandwidth utilisation (Databricks, 'LLM Inference Performance Engineering: Best
Practices', 2023); 0.6 of the dense peak for large GEMMs (shardlab's DEFAULT_COMPUTE_EFFICIENCY); 50-73% of peak
for FlashAttention-2 forward (Dao 2023, arXiv 2307.08691 §4.1); overheads of the order engines report (estimates)."""
PRIOR_SIGMA = 2.0


@dataclass(frozen=True)
class InferenceRun:
    """One published measurement with everything it was measured under."""

    id: str
    """source/gpu/model/tp/lengths/mode, unique."""
    source: str
    """Key of the source block."""
    engine: str
    """Serving engine id."""
    config: dict
    """The run's fields (model, gpu, tp, lengths, mode, ...), source settings merged in."""
    measured: dict
    """metric -> value (seconds or per second)."""
    stats: dict
    """metric -> 'mean' or 'median'."""
    settings: dict
    """Engine settings stated by the source or the run."""
    target: str
    """latency, throughput or load."""
    tag: str
    """exact or plot."""
    citation: str
    """Where the number was published."""
    assumed: str
    """What the source does not state and the row assumes."""


def load_inference_runs(path: Path = RUNS_FILE) -> list[InferenceRun]:
    """Every run of the file, strictly checked."""
    from shardlab.catalog import load_yaml

    data = load_yaml(path)
    if not isinstance(data, dict) or set(data) != {"sources", "runs"}:
        raise ShardlabError(f"{path}: expected the sections 'sources' and 'runs'")
    out = []
    for r in data["runs"]:
        unknown = set(r) - _RUN_KEYS
        src = data["sources"].get(r.get("source"))
        if unknown or src is None or set(src) - _SOURCE_KEYS:
            raise ShardlabError(f"{path}: run {r.get('id')}: unknown fields {sorted(unknown)} or source {r.get('source')!r}")
        settings = {**(src.get("settings") or {}), **(r.get("settings") or {})}
        if set(settings) - set(SETTINGS) or r.get("target") not in TARGETS:
            raise ShardlabError(f"{path}: run {r['id']}: settings must be among {SETTINGS}, target among {TARGETS}")
        measured = {m: float(r[m]) for m in METRICS if m in r}
        stats = {m: r.get(m[:-2] + "_stat", "mean") if METRICS[m] != "throughput" else "aggregate" for m in measured}
        out.append(InferenceRun(r["id"], r["source"], src["engine"], dict(r), measured, stats, settings, r["target"],
                                src["tag"], src["citation"], " ".join(x for x in (src.get("assumed"), r.get("assumed")) if x)))
    return out


def run_engine(run: InferenceRun, engine: EngineProfile | None = None) -> EngineProfile:
    """The run's engine profile with the settings its source states."""
    return (engine or get_engine(run.engine)).with_settings(**run.settings)


def run_case(run: InferenceRun, catalog, engine: EngineProfile | None = None):
    """The ServeCase of a run: its model on one TP×PP replica of its GPU, precision, engine and lengths."""
    from shardlab.serving.case import prepare
    from shardlab.serving.precision import make_precision
    from shardlab.specs.hardware import Cluster

    c = run.config
    acc = catalog.accelerator(c["gpu"])
    cluster = Cluster(acc, c["tp"] * c.get("pp", 1), acc.system["gpus_per_node"], catalog.link(acc.system["intra_link"]),
                      catalog.link(acc.system["inter_link"]))
    prec = make_precision(c.get("weights", "bf16"), c.get("group_size"), c.get("kv_cache", "bf16"), c.get("activations"),
                          acc.peak_tflops)
    eng = run_engine(run, engine)
    return prepare(catalog.model(c["model"]), cluster, eng, tp=c["tp"], pp=c.get("pp", 1), precision=prec,
                   prompt_len=c["isl"], output_len=c["osl"], scheduler_steps=eng.scheduler_steps)


def run_mode(run: InferenceRun, capacity: int) -> tuple[int, float]:
    """(steady.MODES index, n): offline runs whose requests all fit at once are one static batch."""
    c = run.config
    if c["mode"] == "batch":
        return 0, float(c["batch"])
    if c["mode"] == "offline":
        return (0, float(c["requests"])) if c["requests"] <= capacity else (1, float(c["requests"]))
    if c["mode"] == "concurrency":
        return 1, float(c["concurrency"])
    return 2, float(c["qps"])


@dataclass
class Prepared:
    """Runs turned into arrays once, so fits re-evaluate only the engine parameters."""

    runs: list[InferenceRun]
    """The runs, in order."""
    arrays: object
    """Their ServeCases as ``steady.Arrays``."""
    mode: np.ndarray
    """``steady.MODES`` index per run."""
    n: np.ndarray
    """Batch, clients or arrival rate per run."""
    steps: np.ndarray
    """Scheduler steps per run (the step overheads are spread over them)."""
    cases: list = field(repr=False, default_factory=list)
    """The ServeCases."""


def prepare_runs(runs: list[InferenceRun], catalog) -> Prepared:
    from shardlab.serving.steady import arrays

    cases = [run_case(r, catalog) for r in runs]
    modes = [run_mode(r, c.capacity) for r, c in zip(runs, cases)]
    return Prepared(runs, arrays(cases), np.array([m for m, _ in modes]), np.array([n for _, n in modes], dtype=float),
                    np.array([c.scheduler_steps for c in cases], dtype=float), cases)


def _kernels(values: dict, steps: np.ndarray) -> tuple[Kernels, np.ndarray]:
    one = np.ones_like(steps)
    k = Kernels(values["weight_bandwidth_efficiency"] * one, values["kv_bandwidth_efficiency"] * one,
                values["gemm_efficiency"] * one, values["gemm8_efficiency"] * one, values["attention_efficiency"] * one,
                values["step_overhead_us"] * 1e-6 / steps, values["seq_overhead_us"] * 1e-6 / steps,
                values["layer_overhead_us"] * 1e-6 * one)
    return k, values["request_overhead_us"] * 1e-6 * one


def predict(prep: Prepared, values: dict | None = None, index: np.ndarray | None = None) -> dict:
    """Predicted metrics (arrays over runs, or over ``index``), with the engines' fitted values or ``values``
    (one engine's FITTED fields, applied to every run given; each field a number, or an array with one value per
    entry of ``index``)."""
    from shardlab.serving.steady import fluid, take

    idx = np.arange(len(prep.runs)) if index is None else index
    a = take(prep.arrays, idx)
    if values is not None:
        k, req = _kernels(values, prep.steps[idx])
        a = replace(a, kernels=k, request_overhead_s=req)
    return fluid(a, prep.mode[idx], prep.n[idx])


def _pairs(prep: Prepared, idx: np.ndarray, targets=("latency", "throughput")) -> list[tuple[int, int, str]]:
    """(position in idx, run index, metric) of the measurements that count for ``targets``."""
    out = []
    for pos, i in enumerate(idx):
        r = prep.runs[i]
        if r.target not in targets:
            continue
        for m in r.measured:
            if r.target in ("load", "info") or (METRICS[m] == "throughput") == (r.target == "throughput"):
                out.append((pos, int(i), m))
    return out


def _to_x(values: dict) -> np.ndarray:
    return np.array([np.log(values[k] / (1 - values[k])) if k in FRACTIONS else np.log(values[k]) for k in FITTED])


def _from_x(x: np.ndarray) -> dict:
    """Inverse of ``_to_x``; ``x`` of shape (fields,) gives floats, (fields, k) gives arrays of k values."""
    conv = {k: 1 / (1 + np.exp(-v)) if k in FRACTIONS else np.exp(v) for k, v in zip(FITTED, x)}
    return {k: float(v) if np.ndim(v) == 0 else v for k, v in conv.items()}


def prior_centre(values: dict, engine: str) -> dict:
    """The prior centre of ``engine``: the other engines' values, averaged in logit/log space (an engine's
    unconstrained parameter falls back to what the other engines show); PRIOR when there are none."""
    xs = [_to_x(v) for e, v in values.items() if e != engine]
    return _from_x(np.mean(xs, axis=0)) if xs else dict(PRIOR)


def fit_engine(prep: Prepared, idx: np.ndarray, start: dict | None = None, iterations: int = 40,
               prior: dict | None = None) -> dict:
    """Fit one engine's FITTED values to the target measurements of runs ``idx`` (module doc), with a prior
    centred on ``prior`` (default PRIOR)."""
    prior = prior or PRIOR
    pairs = _pairs(prep, idx)
    if not pairs:
        return dict(start or prior)
    pos = np.array([p for p, _, _ in pairs])
    meas = np.array([prep.runs[i].measured[m] for _, i, m in pairs])
    met = [m for _, _, m in pairs]
    groups = [METRICS[m] for m in met]
    w = np.array([np.sqrt(len(groups) / (len(set(groups)) * groups.count(g))) for g in groups])
    x0 = _to_x(prior)

    n = len(idx)
    met_ix = {m: np.array([k for k, mm in enumerate(met) if mm == m]) for m in set(met)}

    def resids(X):
        """Residuals of every row of X (candidate parameter vectors) in one vectorised prediction: the model is
        elementwise over cases, so stacking the candidates' copies of the runs gives each the same numbers as a
        call of its own, for one call's interpreter overhead (the Jacobian's columns cost one evaluation)."""
        vals = _from_x(X.T)                                    # field -> (candidates,)
        out = predict(prep, {k: np.repeat(v, n) for k, v in vals.items()}, np.tile(idx, len(X)))
        pred = np.empty((len(X), len(met)))
        for m, ks in met_ix.items():
            pred[:, ks] = out[m].reshape(len(X), n)[:, pos[ks]]
        data = w * np.log(np.clip(pred, 1e-12, 1e12) / meas)
        return np.concatenate([np.where(np.isfinite(data), data, 10.0), (X - x0) / PRIOR_SIGMA], axis=1)

    def resid(x):
        return resids(x[None, :])[0]

    x = _to_x(start or prior)
    r = resid(x)
    lam = 1e-2
    for _ in range(iterations):
        J = ((resids(x + 1e-4 * np.eye(len(x))) - r) / 1e-4).T
        A, g = J.T @ J, J.T @ r
        improved = False
        for _ in range(8):
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-9), -g)
            rn = resid(x + step)
            if rn @ rn < r @ r:
                x, r, lam, improved = x + step, rn, lam / 3, True
                break
            lam *= 4
        if not improved or np.max(np.abs(step)) < 1e-5:
            break
    return _from_x(x)


def engine_values(engine: str) -> dict:
    """The FITTED values an engine profile carries now."""
    e = get_engine(engine)
    return {k: getattr(e, k) for k in FITTED}


def errors(prep: Prepared, preds: dict, idx: np.ndarray, targets=TARGETS) -> list[dict]:
    """One entry per (run, metric): predicted, measured, error (inf predictions give error None)."""
    out = []
    for pos, i, m in _pairs(prep, idx, targets):
        p, meas = float(preds[m][pos]), prep.runs[i].measured[m]
        out.append({"run": prep.runs[i].id, "source": prep.runs[i].source, "engine": prep.runs[i].engine,
                    "target": prep.runs[i].target, "metric": m, "group": METRICS[m], "stat": prep.runs[i].stats[m],
                    "measured": meas, "predicted": p if np.isfinite(p) else None,
                    "error": (p - meas) / meas if np.isfinite(p) else None})
    return out


GOALS = {"tpot": 0.10, "ttft": 0.10, "throughput": 0.15}
"""Mean |error| goals: per-token and first-token latency on latency rows, throughput on max-throughput rows."""


def _summary(errs: list[dict], key: str) -> dict:
    """mean and max |error| of ``key`` errors per (engine, group) and per group, target rows only."""
    out: dict = {"by_engine": {}, "by_group": {}}
    for e in errs:
        if e["target"] not in ("latency", "throughput") or e[key] is None:
            continue
        out["by_engine"].setdefault(e["engine"], {}).setdefault(e["group"], []).append(abs(e[key]))
        out["by_group"].setdefault(e["group"], []).append(abs(e[key]))
    stat = lambda v: {"n": len(v), "mean_abs_error": float(np.mean(v)), "max_abs_error": float(np.max(v))}  # noqa: E731
    return {"by_engine": {k: {g: stat(v) for g, v in d.items()} for k, d in out["by_engine"].items()},
            "by_group": {g: stat(v) for g, v in out["by_group"].items()}}


def validate(catalog, runs: list[InferenceRun] | None = None, loso: bool = True, only_source: str | None = None) -> dict:
    """Predict every run with the engines' values; refit them (two stages: each engine alone on PRIOR, then each
    with its prior centred on the others' stage-one values); and leave-one-source-out: for each source, refit its
    engine on its other sources (same centre) and predict it. Returns rows, summaries, values and refits.
    ``only_source``: hold out that source alone and skip the full refit (``validate --inference --run``)."""
    runs = runs or load_inference_runs()
    prep = prepare_runs(runs, catalog)
    engines = sorted({r.engine for r in runs})
    idx_of = {e: np.array([i for i, r in enumerate(runs) if r.engine == e]) for e in engines}
    values = {e: engine_values(e) for e in engines}
    alone = {e: fit_engine(prep, idx_of[e], values[e]) for e in engines}
    centre = {e: prior_centre(alone, e) for e in engines}
    refit = {} if only_source else {e: fit_engine(prep, idx_of[e], values[e], prior=centre[e]) for e in engines}
    rows = []
    for e in engines:
        rows += errors(prep, predict(prep, values[e], idx_of[e]), idx_of[e])
    by_key = {(r["run"], r["metric"]): r for r in rows}
    for r in rows:
        r["loso_predicted"] = r["loso_error"] = None
    if loso:
        for src in [only_source] if only_source else sorted({r.source for r in runs}):
            eng = next(r.engine for r in runs if r.source == src)
            keep = np.array([i for i in idx_of[eng] if runs[i].source != src])
            held = np.array([i for i in idx_of[eng] if runs[i].source == src])
            vals = fit_engine(prep, keep, values[eng], prior=centre[eng])
            for e in errors(prep, predict(prep, vals, held), held):
                row = by_key[(e["run"], e["metric"])]
                row["loso_predicted"], row["loso_error"] = e["predicted"], e["error"]
    return {"rows": rows, "in_sample": _summary(rows, "error"), "loso": _summary(rows, "loso_error") if loso else None,
            "values": values, "refit": refit, "goals": GOALS, "sources": sorted({r.source for r in runs})}
