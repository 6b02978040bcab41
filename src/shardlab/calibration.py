"""Fitting measured collectives and matmuls into the estimate's hardware model (pure numpy, no torch).

Collectives (α–β model; Hockney 1994, Thakur, Rabenseifner & Gropp 2005 for the ring/pairwise
algorithms): an op on ``n`` ranks moving a total of ``S`` bytes takes

    t(S) = steps(op, n) · α + factor(op, n) · S / β

where ``factor`` is nccl-tests' bus-bandwidth factor (NVIDIA/nccl-tests doc/PERFORMANCE.md: 2(n−1)/n for
all-reduce, (n−1)/n for all-gather, reduce-scatter and all-to-all, 1 for send/recv and broadcast), so β is
the bus bandwidth a collective reaches on large messages — comparable with a link's line rate whatever n
is — and α is the time of one algorithm step (one hop) on a tiny message. ``steps`` counts the steps of
the ring (all-reduce: 2(n−1); all-gather, reduce-scatter: n−1), the pairwise all-to-all (n−1), and one
message for send/recv. These are the terms of ``Link.latency_us`` (α) and ``Link.bytes_per_s`` (β).

Matmuls: the estimate's achieved-FLOP/s curve (``MatmulEfficiency``) eff(n) = max_fraction · n / (n +
half_size), n = the GEMM's smallest dimension min(M, N, K) (see :func:`gemm_size`).

Both fits minimise *relative* residuals (weights 1/measured), so a 1 KB message counts as much as a
256 MB one and a small GEMM as much as a large one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardlab.errors import ShardlabError

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "broadcast")
"""Collectives the fits know (``shardlab bench collectives`` measures all but broadcast by default)."""


def check_op(op: str) -> str:
    """Return ``op`` or raise a one-line error naming the known ones."""
    if op not in OPS:
        from shardlab.errors import did_you_mean

        raise ShardlabError(f"unknown collective '{op}'{did_you_mean(op, OPS)}; use one of {', '.join(OPS)}")
    return op


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor (doc/PERFORMANCE.md): busbw = algbw × factor, algbw = S / t.

    all-reduce 2(n−1)/n; reduce-scatter, all-gather and all-to-all (n−1)/n (S = the total size);
    send-recv and broadcast 1.
    """
    check_op(op)
    if op == "all-reduce":
        return 2 * (n - 1) / n
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n
    return 1.0


def algorithm_steps(op: str, n: int) -> int:
    """Latency (α) steps of the bandwidth-optimal algorithm: ring all-reduce 2(n−1); ring all-gather and
    reduce-scatter n−1; pairwise all-to-all n−1; send-recv 1; pipelined broadcast n−1 (Thakur et al. 2005)."""
    check_op(op)
    if op == "all-reduce":
        return 2 * (n - 1)
    if op == "send-recv":
        return 1
    return n - 1


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
        n = self.world_size
        return algorithm_steps(op, n) * self.alpha_s + busbw_factor(op, n) * size_bytes / self.beta_bytes_per_s


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
    if len(sel) < 2:
        raise ShardlabError(f"need at least two measured sizes to fit α and β{' for ' + op if op else ''}; "
                            f"give a size range such as --sizes 1KB:1MB")
    n = int(sel[0]["world_size"])
    X = np.array([[algorithm_steps(r["op"], n), busbw_factor(r["op"], n) * r["size_bytes"]] for r in sel], float)
    t = np.array([float(r["time_s"]) for r in sel])
    if np.any(t <= 0):
        raise ShardlabError("measured times must be positive; the benchmark produced a zero time")
    alpha, inv_beta = _weighted_nonneg_lstsq(X, t)
    if inv_beta <= 0:
        raise ShardlabError("the measured times do not grow with the message size, so no bandwidth can be "
                            "fitted; widen the size range (e.g. --sizes 1KB:64MB)")
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


def matmul_efficiency(n: float | np.ndarray, max_fraction: float, half_size: float):
    """eff(n) = max_fraction · n / (n + half_size): share of peak FLOP/s a GEMM of size n reaches."""
    return max_fraction * np.asarray(n, float) / (np.asarray(n, float) + half_size)


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

    def predict_flops(self, n: float) -> float:
        return float(matmul_efficiency(n, self.max_fraction, self.half_size)) * self.peak_flops


def fit_efficiency(sizes: Sequence[float], achieved_flops: Sequence[float], peak_flops: float) -> EfficiencyFit:
    """Least-squares fit (relative residuals) of eff(n)·peak to measured FLOP/s.

    For a given half_size h the best max_fraction is closed-form (g = n/(n+h), f = measured/peak):
    m = Σ(g/f) / Σ(g²/f²); h is searched on a log grid from 1e-3·min(n) to 1e3·max(n), then refined.
    """
    n = np.asarray(sizes, float)
    f = np.asarray(achieved_flops, float) / peak_flops
    if len(n) < 2 or np.any(n <= 0) or np.any(f <= 0):
        raise ShardlabError("need at least two GEMMs with positive sizes and times to fit the matmul efficiency")

    def best(h: float) -> tuple[float, float]:
        g = n / (n + h)
        m = float(np.sum(g / f) / np.sum(g * g / (f * f)))
        return float(np.sum((m * g / f - 1.0) ** 2)), m

    lo, hi = math.log(n.min() * 1e-3), math.log(n.max() * 1e3)
    for _ in range(3):
        grid = np.exp(np.linspace(lo, hi, 241))
        errs = [best(h)[0] for h in grid]
        i = int(np.argmin(errs))
        lo, hi = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, len(grid) - 1)])
    h = float(grid[i])
    err, m = best(h)
    return EfficiencyFit(m, h, float(peak_flops), math.sqrt(err / len(n)), len(n))
