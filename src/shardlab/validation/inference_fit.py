"""The serving fit (``validation.inference``'s measurements): the rates of every GPU generation
(``serving.rates.RATE_FIELDS``, shared by all engines on it) and the host costs of every engine version
(``serving.engines.FITTED``), fitted jointly, minimise the squared log errors of the target rows (latency and throughput; each target group weighted so that the groups count equally
and together as many as there are measurements), with a weak Gaussian prior (σ = 2 in logit/log space). Two
stages (empirical Bayes): first with the prior on PRIOR (documented values); then with each generation's prior
centred on the other generations' stage-one values and each engine's on the other engines' (averaged in that
space), so that a parameter no remaining row constrains falls back to what the others show. Solved by
Levenberg–Marquardt (Levenberg 1944; Marquardt 1963, SIAM J. Appl. Math. 11(2)) with forward-difference
Jacobians. Leave-one-source-out: the whole two-stage fit without one source, then that source predicted.
"""

from __future__ import annotations

import numpy as np

from shardlab.serving.engines import FITTED, get_engine
from shardlab.serving.rates import RATE_FIELDS, rates_for
from shardlab.validation.inference import FIELDS, METRICS, SHARES, Params, Prepared, _pairs, predict

PRIOR = {"weight_bandwidth_efficiency": 0.7, "kv_bandwidth_efficiency": 0.7, "gemm16_efficiency": 0.75, "gemm8_efficiency": 0.6,
         "gemm4_efficiency": 0.5, "attention_efficiency": 0.5, "step_overhead_us": 100.0, "seq_overhead_us": 5.0,
         "layer_overhead_us": 20.0, "eager_layer_overhead_us": 20.0, "request_overhead_us": 5000.0,
         "first_token_overhead_us": 2000.0}
"""Prior centres: 60-70% model bandwidth utilisation (Databricks, 'LLM Inference Performance Engineering: Best
Practices', 2023); 70-80% of the dense 16-bit peak for large cuBLAS GEMMs (the training matmul curve's
max_fraction, catalog/data/efficiencies.yaml), less for 8-bit and 4-bit (estimates); 50-73% of peak for
FlashAttention-2 forward (Dao 2023, arXiv 2307.08691 §4.1); overheads of the order engines report (estimates)."""
PRIOR_SIGMA = 2.0


def _x(f: str, v):
    return np.log(v / (1 - v)) if f in SHARES else np.log(v)


def _v(f: str, x):
    return 1 / (1 + np.exp(-x)) if f in SHARES else np.exp(x)


def _centre(values: dict, key: str, fields_: tuple) -> dict:
    """Mean of the other keys' values (logit/log space) per field; PRIOR when there are none."""
    others = [v for k, v in values.items() if k != key]
    if not others:
        return {f: PRIOR[f] for f in fields_}
    return {f: float(_v(f, np.mean([_x(f, o[f]) for o in others]))) for f in fields_}


def prior_centre(params: Params) -> Params:
    """Each generation's prior centre is the other generations' values, each engine's the other engines'
    (empirical Bayes: a parameter no remaining row constrains falls back to what the others show)."""
    return Params({g: _centre(params.rates, g, RATE_FIELDS) for g in params.rates},
                  {e: _centre(params.engines, e, FITTED) for e in params.engines})


def fit(prep: Prepared, idx: np.ndarray, start: Params, prior: Params | None = None, iterations: int = 40) -> Params:
    """Fit the rates of every generation and the overheads of every engine in runs ``idx`` jointly (module doc).
    Each measurement depends on one generation's rates and one engine's overheads, so the Jacobian's columns
    of one field (all generations', or all engines') come from one perturbed evaluation (column grouping,
    Curtis, Powell & Reid 1974, IMA J. Appl. Math. 13(1)): one evaluation per field per iteration, whatever the count."""
    gens = sorted({prep.generations[i] for i in idx})
    engs = sorted({prep.runs[i].engine for i in idx})
    if prior is None:
        prior = Params({g: {f: PRIOR[f] for f in RATE_FIELDS} for g in gens}, {e: {f: PRIOR[f] for f in FITTED} for e in engs})
    prior, start = pin(prep, prior), pin(prep, start)
    pairs = _pairs(prep, idx)
    if not pairs:
        return start
    # parameter vector: (generation, rate field) then (engine, overhead field)
    keys = [("r", g, f) for g in gens for f in RATE_FIELDS] + [("e", e, f) for e in engs for f in FITTED]
    where = {k: j for j, k in enumerate(keys)}
    col = np.array([[where[("r", prep.generations[i], f)] for f in RATE_FIELDS] +
                    [where[("e", prep.runs[i].engine, f)] for f in FITTED] for i in idx])     # run -> param per field
    get = lambda p, k: (p.rates if k[0] == "r" else p.engines)[k[1]][k[2]]  # noqa: E731
    x0 = np.array([_x(k[2], get(prior, k)) for k in keys])
    pos = np.array([p for p, _, _ in pairs])
    meas = np.array([prep.runs[i].measured[m] for _, i, m in pairs])
    met = [m for _, _, m in pairs]
    groups = [METRICS[m] for m in met]
    w = np.array([np.sqrt(len(groups) / (len(set(groups)) * groups.count(g))) for g in groups])
    met_ix = {m: np.array([k for k, mm in enumerate(met) if mm == m]) for m in set(met)}
    n, nf = len(idx), len(FIELDS)

    def data_resids(X):
        """Data residuals for each row of X (parameter vectors), all in one vectorised prediction."""
        vals = {f: np.concatenate([_v(f, x[col[:, j]]) for x in X]) for j, f in enumerate(FIELDS)}
        out = predict(prep, vals, np.tile(idx, len(X)))
        pred = np.empty((len(X), len(met)))
        for m, ks in met_ix.items():
            pred[:, ks] = out[m].reshape(len(X), n)[:, pos[ks]]
        r = w * np.log(np.clip(pred, 1e-12, 1e12) / meas)
        return np.where(np.isfinite(r), r, 10.0)

    def resid(x):
        return np.concatenate([data_resids(x[None, :])[0], (x - x0) / PRIOR_SIGMA])

    run_of = np.array([p for p, _, _ in pairs])                 # residual row -> position of its run in idx
    frozen = np.array([j for j, k in enumerate(keys) if k[0] == "r" and k[2] in prep.pinned.get(k[1], {})], dtype=int)
    h = 1e-4
    x = np.array([_x(k[2], get(start, k)) if (k[1] in (start.rates if k[0] == "r" else start.engines)) else x0[j]
                  for j, k in enumerate(keys)])
    r = resid(x)
    lam = 1e-2
    for _ in range(iterations):
        X = np.repeat(x[None, :], nf, axis=0)
        for j in range(nf):                                       # perturb every parameter of field j at once
            X[j, np.unique(col[:, j])] += h
        D = (data_resids(X) - r[: len(met)]) / h                  # (fields, residuals)
        J = np.zeros((len(met) + len(x), len(x)))
        for j in range(nf):
            J[np.arange(len(met)), col[run_of, j]] = D[j]
        J[: len(met), frozen] = 0.0                               # pinned rates: no data moves them (step 0)
        J[len(met):] = np.eye(len(x)) / PRIOR_SIGMA
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
    rates = {g: {**{f: float(_v(f, x[where[("r", g, f)]])) for f in RATE_FIELDS}, **prep.pinned.get(g, {})}
             for g in gens}                                       # pinned exactly, not through the logit round trip
    engines = {e: {f: float(_v(f, x[where[("e", e, f)]])) for f in FITTED} for e in engs}
    return Params({**start.rates, **rates}, {**start.engines, **engines})


def pin(prep: Prepared, params: Params) -> Params:
    """``params`` with every generation's pinned rates (``Prepared.pinned``) in place of its values."""
    return Params({g: {**v, **prep.pinned.get(g, {})} for g, v in params.rates.items()}, params.engines)


def catalog_params(prep: Prepared) -> Params:
    """The values the catalog carries now (serving_rates.yaml, engines.yaml) for the runs' generations and engines."""
    rates = {g: {f: getattr(rates_for(g), f) for f in RATE_FIELDS} for g in set(prep.generations)}
    engines = {e: {f: getattr(get_engine(e), f) for f in FITTED} for e in {r.engine for r in prep.runs}}
    return Params(rates, engines)


def fit_two_stage(prep: Prepared, idx: np.ndarray, start: Params) -> Params:
    """Stage one on PRIOR, stage two with each prior centred on the other generations'/engines' stage-one values."""
    alone = fit(prep, idx, start)
    return fit(prep, idx, alone, prior=prior_centre(alone))


def unseen_from_others(prep: Prepared, idx: np.ndarray, fitted: Params) -> Params:
    """``fitted`` with every generation and engine that no run of ``idx`` covers replaced by the others' values
    (their mean in logit/log space, the rule of serving_rates.yaml's default entry): a held-out source that is the
    only one on its GPU generation or engine is predicted from what the rest show, never from values fitted on it."""
    gens = {prep.generations[i] for i in idx}
    engs = {prep.runs[i].engine for i in idx}
    rates = {g: (v if g in gens else _centre({k: x for k, x in fitted.rates.items() if k in gens}, g, RATE_FIELDS))
             for g, v in fitted.rates.items()}
    engines = {e: (v if e in engs else _centre({k: x for k, x in fitted.engines.items() if k in engs}, e, FITTED))
               for e, v in fitted.engines.items()}
    return pin(prep, Params(rates, engines))
