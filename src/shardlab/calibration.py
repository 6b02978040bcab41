"""Fitting measured collectives and matmuls into the estimate's hardware model (pure numpy, no torch).

Collectives (α–β model; Hockney 1994, Thakur, Rabenseifner & Gropp 2005 for the ring/pairwise
algorithms): an op on ``n`` ranks moving a total of ``S`` bytes takes

    t(S) = steps(op, n) · α + factor(op, n) · S / β

with the ring terms of ``shardlab.comm.collectives.ab_terms`` (the estimate's own collective model):
``factor`` equals nccl-tests' bus-bandwidth factor (NVIDIA/nccl-tests doc/PERFORMANCE.md: 2(n−1)/n for
all-reduce, (n−1)/n for all-gather, reduce-scatter and all-to-all, 1 for send/recv and broadcast), so β is
the bus bandwidth a collective reaches on large messages — comparable with a link's line rate whatever n
is — and α is the time of one algorithm step (one hop) on a tiny message; ``steps`` is 2(n−1) for a ring
all-reduce, n−1 for all-gather, reduce-scatter, the pairwise all-to-all and the pipelined broadcast, 1 for
send/recv. These are the terms of ``Link.latency_us`` (α) and ``Link.bytes_per_s`` (β).

Matmuls: the estimate's achieved-FLOP/s curve (``MatmulEfficiency``, ``estimate.hardware.gemm_efficiency``)
eff(n) = max_fraction · n / (n + half_size), n = the GEMM's smallest dimension min(M, N, K) (:func:`gemm_size`).

Both fits weigh every point alike whatever its size — relative residuals for α–β (weights 1/measured), log
residuals for the matmul curve — so a 1 KB message counts as much as a 256 MB one, a small GEMM as much as
a large one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardlab.comm.collectives import ab_terms, alpha_beta_time
from shardlab.errors import ShardlabError
from shardlab.specs.hardware import MatmulEfficiency


def ring_terms(op: str, n: int) -> tuple[float, float]:
    """(steps, factor) of the ring/pairwise algorithm, from ``shardlab.comm.collectives.ab_terms``: the same
    model the estimate prices collectives with, so a fitted α and β drop straight into a ``Link``."""
    steps, coeff = ab_terms(op, n, "ring")
    return float(steps), float(coeff)


@dataclass(frozen=True)
class AlphaBetaFit:
    """α–β fit of measured collective times: t = steps·α + factor·S/β (module docstring)."""

    op: str
    """The collective fitted, or 'joint' for one α and β over several ops."""
    world_size: int
    """Ranks the measurements ran on."""
    alpha_s: float
    """α: seconds per algorithm step (the link's latency_us × 1e-6)."""
    beta_bytes_per_s: float
    """β: bus bandwidth in bytes/s (the link's bandwidth_gbps × efficiency × 1e9)."""
    rel_rms: float
    """Root-mean-square relative residual of the fit over its points (0.1 = 10%)."""
    points: int
    """Measurements fitted."""

    @property
    def latency_us(self) -> float:
        return self.alpha_s * 1e6

    @property
    def beta_gbps(self) -> float:
        return self.beta_bytes_per_s / 1e9

    def predict_s(self, op: str, size_bytes: float) -> float:
        """Time of ``op`` on ``size_bytes`` with the fitted α and β."""
        return float(alpha_beta_time(op, size_bytes, self.world_size, self.alpha_s, self.beta_bytes_per_s, "ring"))


def _weighted_nonneg_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Minimise Σ((X·c − y)/y)² with c ≥ 0 (two unknowns: drop a negative one and refit the other)."""
    w = 1.0 / y
    A, b = X * w[:, None], y * w
    c, *_ = np.linalg.lstsq(A, b, rcond=None)
    if np.all(c >= 0):
        return c
    best = None
    for keep in range(X.shape[1]):
        ck = np.zeros(X.shape[1])
        col = A[:, keep]
        ck[keep] = max(float(col @ b) / float(col @ col), 0.0)
        err = float(np.sum((A @ ck - b) ** 2))
        if best is None or err < best[0]:
            best = (err, ck)
    return best[1]


def fit_alpha_beta(rows: Sequence[dict], op: str | None = None) -> AlphaBetaFit:
    """Fit α and β to benchmark rows (``op``, ``size_bytes``, ``time_s``, ``world_size``).

    ``op`` None fits one α and β to all rows together (the 'joint' link); otherwise only that op's rows.
    """
    sel = [r for r in rows if op is None or r["op"] == op]
    if len({float(r["size_bytes"]) for r in sel}) < 2:     # one size cannot separate latency from bandwidth
        raise ShardlabError(f"need at least two measured sizes to fit α and β{' for ' + op if op else ''}; "
                            f"give a size range such as --sizes 1KB:1MB")
    n = int(sel[0]["world_size"])
    X = np.array([(lambda st, f: [st, f * r["size_bytes"]])(*ring_terms(r["op"], n)) for r in sel], float)
    t = np.array([float(r["time_s"]) for r in sel])
    if np.any(t <= 0):
        raise ShardlabError("measured times must be positive; the benchmark produced a zero time")
    alpha, inv_beta = _weighted_nonneg_lstsq(X, t)
    if inv_beta * X[:, 1].max() <= 1e-6 * t.max():  # the bandwidth term explains nothing of the largest time
        raise ShardlabError("the measured times do not grow with the message size, so no bandwidth can be "
                            "fitted; widen the size range (e.g. --sizes 1KiB:64MiB)")
    pred = X @ np.array([alpha, inv_beta])
    rel = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return AlphaBetaFit(op or "joint", n, float(alpha), float(1.0 / inv_beta), rel, len(sel))


# ---------------------------------------------------------------------------------------------- matmul


def gemm_size(m: int, n: int, k: int) -> int:
    """The size the efficiency curve is a function of: the GEMM's smallest dimension min(M, N, K).

    For an (M×K)·(K×N) product with M = tokens, this is the hidden size (or its tensor-parallel shard:
    the narrow output of a column-parallel or the narrow inner size of a row-parallel linear) when the
    token count is larger, and the token count for short inputs (decode).
    """
    return min(m, n, k)


@dataclass(frozen=True)
class EfficiencyFit:
    """Fitted achieved-matmul curve: achieved FLOP/s = eff(n) · peak_flops."""

    max_fraction: float
    """Share of ``peak_flops`` reached by very large GEMMs."""
    half_size: float
    """GEMM size n (elements) at which half of max_fraction is reached."""
    peak_flops: float
    """The peak the fractions are relative to (FLOP/s)."""
    rel_rms: float
    """Root-mean-square relative residual of achieved FLOP/s (0.1 = 10%)."""
    points: int
    """GEMMs fitted."""

    @property
    def curve(self) -> MatmulEfficiency:
        return MatmulEfficiency(self.max_fraction, self.half_size, "fit")

    def predict_flops(self, n):
        """Achieved FLOP/s at GEMM size ``n`` (the estimate's ``gemm_efficiency`` × peak; array-safe)."""
        from shardlab.rates.hardware import gemm_efficiency

        return gemm_efficiency(n, self.curve) * self.peak_flops


HALF_SIZE_RANGE = 1e3
"""The half size is searched from min(n) / HALF_SIZE_RANGE to max(n) · HALF_SIZE_RANGE."""
MIN_FIT_GEMM = 16
"""The largest GEMM of a fit must have n = min(M, N, K) ≥ this, one matrix-unit tile (NVIDIA tensor cores multiply
16 × 16 fragments: PTX ISA, wmma .m16n16k16; a 512-bit AVX vector holds 16 fp32): smaller products take about the
time of the call itself (dispatch, a kernel launch), whatever their size, so they say nothing of how a matrix unit
fills up."""


def efficiency_fit_problems(sizes: Sequence[float], fit: EfficiencyFit | None = None) -> tuple[list[str], list[str]]:
    """Whether measured GEMM sizes (and the curve fitted to them) determine eff(n) = m · n / (n + h):
    (reasons they do not — a profile from them would be meaningless —, warnings — the curve holds, with a caveat).

    Not determined: every GEMM has one size (n/(n + h) is then one number: any h fits with some m); the largest
    GEMM is below MIN_FIT_GEMM (call overhead, not matmul throughput); or the best h lies at the top of the search
    range (the FLOP/s grow in proportion to n up to the largest GEMM: only m/h is measured, not m and h).
    Warning: the fitted h lies above the largest GEMM, so max_fraction is reached nowhere near the data."""
    n = sorted({float(x) for x in sizes})
    if not n:
        return ["no GEMM was measured"], []
    if len(n) < 2:
        return [f"every GEMM measured has the same size n = {n[0]:g} (n = min(M, N, K)), so the curve n/(n + half_size) "
                f"cannot be fitted"], []
    if n[-1] < MIN_FIT_GEMM:
        return [f"the largest GEMM measured has n = {n[-1]:g} (n = min(M, N, K)): products below n = {MIN_FIT_GEMM} "
                f"take the time of the call itself, not of the matrix unit"], []
    if fit is None:
        return [], []
    if fit.half_size >= 0.99 * n[-1] * HALF_SIZE_RANGE:
        return [f"the measured FLOP/s grow in proportion to n up to the largest GEMM (n = {n[-1]:g}), so the "
                f"maximum efficiency and the half size cannot be told apart"], []
    if fit.half_size > n[-1]:
        return [], [f"the fitted half size {fit.half_size:.4g} is above the largest GEMM measured (n = {n[-1]:g}): the "
                    f"maximum efficiency {fit.max_fraction:.3g} is extrapolated beyond the sizes measured"]
    return [], []


def fit_efficiency(sizes: Sequence[float], achieved_flops: Sequence[float], peak_flops: float) -> EfficiencyFit:
    """Least-squares fit of eff(n)·peak to measured FLOP/s, on log values (symmetric in over- and under-shoot,
    so one GEMM slowed down by a busy machine does not drag the curve down).

    For a given half_size h the best max_fraction is closed-form (g = n/(n+h), f = measured/peak):
    log m = mean(log f − log g); h is searched on a log grid from min(n)/HALF_SIZE_RANGE to
    max(n)·HALF_SIZE_RANGE, then refined. ``rel_rms`` is the root-mean-square of predicted/measured − 1.
    Whether the data determine the curve at all is :func:`efficiency_fit_problems`' question.
    """
    n = np.asarray(sizes, float)
    f = np.asarray(achieved_flops, float) / peak_flops
    if len(n) < 2 or np.any(n <= 0) or np.any(f <= 0):
        raise ShardlabError("need at least two GEMMs with positive sizes and times to fit the matmul efficiency")
    lf = np.log(f)

    def best(h: float) -> tuple[float, float]:
        lg = np.log(n / (n + h))
        lm = float(np.mean(lf - lg))
        return float(np.sum((lm + lg - lf) ** 2)), math.exp(lm)

    lo, hi = math.log(n.min() / HALF_SIZE_RANGE), math.log(n.max() * HALF_SIZE_RANGE)
    for _ in range(3):
        grid = np.exp(np.linspace(lo, hi, 241))
        errs = [best(h)[0] for h in grid]
        i = int(np.argmin(errs))
        lo, hi = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, len(grid) - 1)])
    h = float(grid[i])
    m = best(h)[1]
    rel = float(np.sqrt(np.mean((m * n / (n + h) / f - 1.0) ** 2)))
    return EfficiencyFit(m, h, float(peak_flops), rel, len(n))
