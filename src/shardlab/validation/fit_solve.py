"""The fit's solver: bounded Levenberg-Marquardt for many least-squares problems in lockstep (the full fit and the
leave-one-source-out folds), with a restart of the folds from the full fit's solution. Knows nothing of the step
model: ``validation.fit`` gives it prepared runs and an ``Objective`` (measurements, weights, a batched predictor,
the priors' widths)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Objective:
    """What a problem minimises: Σ (wᵢ log(predᵢ / measᵢ))² over its runs + Σ (run_sigma (θ − prior) / σ)² over its
    parameters (a maximum-a-posteriori fit)."""

    measured: np.ndarray
    """Measured metric per prepared run."""
    weights: np.ndarray
    """Weight per prepared run (the square root of validation.fit.family_weights)."""
    predict: Callable
    """(prepared run, parameters, K × P values) -> K predictions."""
    prior_sigma: dict
    """Parameter field -> one standard deviation of its prior."""
    run_sigma: float
    """The log error one prior standard deviation weighs as much as."""


def to_theta(params, u):
    lo = np.array([p.lo for p in params])
    hi = np.array([p.hi for p in params])
    with np.errstate(over="ignore"):            # exp(-u) = inf for u ≪ 0 is the sigmoid's limit, lo: not an error
        return lo + (hi - lo) / (1 + np.exp(-u))


def to_u(params, theta):
    lo = np.array([p.lo for p in params])
    hi = np.array([p.hi for p in params])
    x = np.clip((np.asarray(theta) - lo) / (hi - lo), 1e-6, 1 - 1e-6)
    return np.log(x / (1 - x))


@dataclass
class Problem:
    """One least-squares fit: a subset of the runs and the parameters they inform."""

    members: np.ndarray
    """Indices (into the prepared runs) of the runs fitted."""
    params: list
    held_out: str | None
    u: np.ndarray = None
    cost: float = np.inf
    mu: float = 1e-2
    done: bool = False
    switches: dict = field(default_factory=dict)
    """{'framework.field': 0.0 or 1.0}: the switch values this problem was solved with (validation.fit.SWITCHES)."""
    prepared: list = field(default_factory=list, repr=False)
    """The prepared runs (under those switch values)."""


LINE_SEARCH_DAMPING = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
"""Levenberg-Marquardt damping factors tried at once (one vectorised evaluation) each iteration."""


def solve(problems: list[Problem], prepared: list, objective: Objective, iterations: int, progress=None) -> None:
    """Levenberg-Marquardt for every problem in lockstep: each iteration evaluates, for every run, all problems'
    Jacobian probes and trial steps in one ``objective.predict`` call per run."""
    meas, w_all, predict = objective.measured, objective.weights, objective.predict
    eps = 1e-3

    def preds_for(rows_by_problem: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """{problem: U rows (K × P)} -> {problem: predictions (K × members)}."""
        out = {pi: np.zeros((U.shape[0], len(problems[pi].members))) for pi, U in rows_by_problem.items()}
        col = {pi: {int(r): j for j, r in enumerate(problems[pi].members)} for pi in rows_by_problem}
        for ri, prep in enumerate(prepared):
            blocks = [(pi, U) for pi, U in rows_by_problem.items() if ri in col[pi]]
            if not blocks:
                continue
            names = sorted({p.name for pi, _ in blocks for p in problems[pi].params})
            idx = {n: k for k, n in enumerate(names)}
            T = np.full((sum(U.shape[0] for _, U in blocks), len(names)), np.nan)
            row = 0
            for pi, U in blocks:
                th = np.array([to_theta(problems[pi].params, x) for x in U])
                for j, prm in enumerate(problems[pi].params):
                    T[row:row + U.shape[0], idx[prm.name]] = th[:, j]
                row += U.shape[0]
            plist = [next(p for pi, _ in blocks for p in problems[pi].params if p.name == n) for n in names]
            pred = predict(prep, plist, T)
            row = 0
            for pi, U in blocks:
                out[pi][:, col[pi][ri]] = pred[row:row + U.shape[0]]
                row += U.shape[0]
        return out

    def residuals(pb: Problem, preds: np.ndarray, U: np.ndarray) -> np.ndarray:
        T = np.array([to_theta(pb.params, x) for x in U])
        prior = np.array([p.prior for p in pb.params])
        sigma = np.array([objective.prior_sigma[p.field] for p in pb.params])
        r_runs = w_all[pb.members] * np.log(np.maximum(preds, 1e-30) / meas[pb.members])
        return np.concatenate([r_runs, objective.run_sigma * (T - prior) / sigma], axis=1)

    for pb in problems:
        if pb.u is None:                          # a start not given: the priors
            pb.u = to_u(pb.params, [p.prior for p in pb.params])
    first = preds_for({i: pb.u[None, :] for i, pb in enumerate(problems)})
    for i, pb in enumerate(problems):
        r = residuals(pb, first[i], pb.u[None, :])[0]
        pb.cost = float(r @ r)
    for it in range(iterations):
        live = [i for i, pb in enumerate(problems) if not pb.done]
        if not live:
            break
        if progress:
            progress(it, iterations)
        probes = {i: np.vstack([problems[i].u] + [problems[i].u + eps * np.eye(len(problems[i].params))[j]
                                                   for j in range(len(problems[i].params))]) for i in live}
        P = preds_for(probes)
        trials = {}
        for i in live:
            pb = problems[i]
            R = residuals(pb, P[i], probes[i])
            r0, J = R[0], ((R[1:] - R[0]) / eps).T
            A, g = J.T @ J, J.T @ r0
            steps = [-np.linalg.solve(A + pb.mu * d * np.diag(np.diag(A) + 1e-9), g) for d in LINE_SEARCH_DAMPING]
            trials[i] = np.vstack([pb.u + st for st in steps])
        T = preds_for(trials)
        for i in live:
            pb = problems[i]
            R = residuals(pb, T[i], trials[i])
            costs = np.einsum("ij,ij->i", R, R)
            best = int(np.argmin(costs))
            if costs[best] < pb.cost:
                step = trials[i][best] - pb.u
                pb.u, pb.cost = trials[i][best], float(costs[best])
                pb.mu = max(pb.mu * LINE_SEARCH_DAMPING[best] / 3, 1e-8)
                pb.done = bool(np.max(np.abs(step)) < 1e-4)
            else:
                pb.mu *= 1e3
                pb.done = pb.mu > 1e6


def staged(progress, stage: int, stages: int):
    """``progress`` for one of ``stages`` consecutive solves: (done, total) over all of them."""
    return None if progress is None else (lambda i, n: progress(stage * n + i, stages * n))


def solve_restarted(make_problems, prepared: list, objective: Objective, iterations: int, progress=None,
                    stage: int = 0, stages: int = 2) -> list:
    """Solve ``make_problems()`` from the priors; where there are folds (problems after the first), solve them again
    from the first problem's solution and keep, per fold, the lower of its own two objectives. Each fold's estimate
    is still the minimum of its own objective (its runs and priors only); the second start only keeps Levenberg-
    Marquardt out of a worse local minimum, where parameters trade off once a source is gone (without MT-NLG,
    DeepSpeed's per-block and pipeline-engine host times: a start from the priors stopped at an objective 2.4 times
    the one from the second start)."""
    problems = make_problems()
    solve(problems, prepared, objective, iterations, staged(progress, stage, stages))
    if len(problems) == 1:
        return problems
    start = dict(zip((p.name for p in problems[0].params), to_theta(problems[0].params, problems[0].u)))
    again = make_problems()[1:]
    for pb in again:
        pb.u = to_u(pb.params, [start.get(p.name, p.prior) for p in pb.params])
    solve(again, prepared, objective, iterations, staged(progress, stage + 1, stages))
    return [problems[0]] + [b if b.cost < a.cost else a for a, b in zip(problems[1:], again)]
