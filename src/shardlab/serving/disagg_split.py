"""The capacity search over prefill/decode splits: every way to cut a GPU count into a prefill pool and a decode
pool (``pool_sizes``), for every pair of replica layouts, at its highest Poisson request rate whose steady-state
mean TTFT and TPOT meet the SLOs (``serving.disagg``'s model; DistServe, Zhong et al. 2024, OSDI).

``serving.disagg.max_rate_within`` finds that rate for one split by bisection on ``steady_rate``. A search at a
thousand GPUs and more holds tens of thousands of splits (127 pool sizes of whole nodes at 1,024 GPUs, 2,047 at
16,384, each with every pair of layouts), so here the same bisection runs on all the splits of one pair of layouts
at once, as arrays (``steady_many``: ``steady_rate``'s formulas on arrays of pool sizes and rates), and a split
becomes a ``DisaggCase`` only when a caller asks for it (``Splits.case``). Two things differ from the scalar
functions, both below a part in 10⁹ (a test holds them together): the decode batch's root is found on the grid's
running maximum of B / cycle(B) (``_decode_batch``) rather than by testing B − λ·O·cycle(B) ≥ 0 point by point.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardlab.serving.disagg import DisaggCase, _prefill_times, make_disagg

BISECTION_STEPS = 50
"""Halvings of the rate bracket (``serving.disagg.max_rate_within`` takes as many)."""


def pool_sizes(gpus: int, per_node: int) -> list[int]:
    """Prefill pool sizes tried: every split of up to two nodes; whole nodes beyond (pools span nodes by node)."""
    if gpus <= 2 * per_node:
        return list(range(1, gpus))
    return [p for p in range(per_node, gpus, per_node)]


def _decode_batch(d: DisaggCase, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, over): per entry of c = λ_d·O, the decode batch solving B = c·cycle(B) (``serving.disagg.steady_rate``:
    the first grid point where B ≥ c·cycle(B), linear between it and the point before), and whether none does
    (the replica is full). The first point where B/cycle(B) ≥ c is the first where the running maximum of
    B/cycle(B) reaches c: a binary search per entry instead of a pass over the grid."""
    Bg, cg, _ = d.grid
    ratio = np.maximum.accumulate(Bg / np.maximum(cg, 1e-300))
    over = ratio[-1] < c
    k = np.minimum(np.searchsorted(ratio, c, side="left"), len(Bg) - 1)
    km = np.maximum(k - 1, 0)
    f0, f1 = Bg[km] - c * cg[km], Bg[k] - c * cg[k]
    between = Bg[km] + (Bg[k] - Bg[km]) * (-f0) / np.where(k > 0, f1 - f0, 1.0)
    B = np.where(over, float(d.decode.capacity), np.where(k == 0, 0.0, between))
    return B, over


def saturation_many(d: DisaggCase, n_p: np.ndarray, n_d: np.ndarray, kv_s: np.ndarray) -> np.ndarray:
    """``serving.disagg.saturation_rate`` of splits of ``d``'s pair of replicas (n_p prefill and n_d decode
    replicas, kv_s seconds of KV transfer)."""
    _, s = _prefill_times(d)
    dec = d.decode
    cap = float(dec.capacity)
    decode_rate = n_d * cap / (dec.output_len * float(np.interp(cap, d.grid[0], d.grid[1])))
    link_rate = np.where(kv_s > 0, n_p / np.where(kv_s > 0, kv_s, 1.0), np.inf)
    return np.minimum(np.minimum(n_p / s, decode_rate), link_rate)


def steady_many(d: DisaggCase, n_p, n_d, kv_s, sat, rate) -> dict:
    """``serving.disagg.steady_rate`` on arrays: the splits' steady state at ``rate`` (ttft_s, tpot_s,
    overloaded, prefill_utilization)."""
    dec = d.decode
    O = dec.output_len
    t1, s = _prefill_times(d)
    lam_p, lam_d = rate / n_p, np.minimum(rate, sat) / n_d
    rho = lam_p * s
    B, over_d = _decode_batch(d, lam_d * O)
    cycle = np.interp(np.maximum(B, 1e-9), d.grid[0], d.grid[1])
    overloaded = over_d | (rho >= 1) | (lam_p * kv_s >= 1) | (rate >= sat)
    wait = np.where(rho < 1, rho * t1 / (2 * np.where(rho < 1, 1 - rho, 1.0)), np.inf)
    ttft = np.where(overloaded, np.inf, dec.engine.request_overhead_us * 1e-6 + wait + t1 + kv_s + cycle)
    return {"ttft_s": ttft, "tpot_s": cycle, "overloaded": overloaded, "prefill_utilization": np.minimum(rho, 1.0)}


def max_rates_within(d: DisaggCase, n_p, n_d, kv_s, ttft_slo: float | None, tpot_slo: float | None) -> np.ndarray:
    """``serving.disagg.max_rate_within`` of splits of ``d``'s pair of replicas, by one bisection over all."""
    sat = saturation_many(d, n_p, n_d, kv_s)
    top = sat * (1 - 1e-6)

    def ok(rate):
        r = steady_many(d, n_p, n_d, kv_s, sat, rate)
        good = ~r["overloaded"]
        if ttft_slo is not None:
            good &= r["ttft_s"] <= ttft_slo
        if tpot_slo is not None:
            good &= r["tpot_s"] <= tpot_slo
        return good
    lo, hi = np.zeros_like(top), top.copy()
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        good = ok(mid)
        lo, hi = np.where(good, mid, lo), np.where(good, hi, mid)
    return np.where(~ok(top * 1e-6), 0.0, np.where(ok(top), top, lo))


@dataclass
class Splits:
    """Every split a search tried, one entry per split in each array, in the order tried (pool size, then the
    prefill replica's layout, then the decode replica's)."""

    pairs: list
    """(prefill ServeCase, decode ServeCase) of each pair of layouts tried."""
    pair: np.ndarray
    """Index into ``pairs`` per split."""
    prefill_replicas: np.ndarray
    """Replicas in the prefill pool."""
    decode_replicas: np.ndarray
    """Replicas in the decode pool."""
    kv_transfer_s: np.ndarray
    """Seconds to send a request's KV from the prefill pool to the decode pool."""
    rate: np.ndarray
    """Highest request rate (requests/s) within the SLO means; 0 where none is."""
    ttft_s: np.ndarray
    """Mean TTFT (s) at that rate (at a trickle, 10⁻⁶ requests/s per prefill replica, where the rate is 0)."""
    tpot_s: np.ndarray
    """Mean TPOT (s), likewise."""
    prefill_utilization: np.ndarray
    """Busy share of a prefill replica, likewise."""
    saturation_rate: np.ndarray
    """Requests/s past which a queue grows."""
    _cache: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.pair)

    def case(self, i: int) -> DisaggCase:
        """The ``DisaggCase`` of split ``i``."""
        pre, dec = self.pairs[int(self.pair[i])]
        return make_disagg(pre, dec, int(self.prefill_replicas[i]) * pre.gpus, int(self.decode_replicas[i]) * dec.gpus,
                           self._cache)

    def ranked(self) -> np.ndarray:
        """Split indices, highest rate first; ties in the order tried."""
        return np.lexsort((np.arange(len(self.rate)), -self.rate))


def search_splits(cases: dict, gpus: int, per_node: int, ttft_slo: float | None, tpot_slo: float | None,
                  prefill_cases: dict | None = None) -> Splits:
    """Every split of ``gpus`` into a prefill pool and a decode pool whose replicas are among ``cases`` (a mapping
    to prepared ServeCases: one per TP, and a MoE model's expert-parallel layouts), at its highest rate within the
    SLO means. ``prefill_cases``: the prefill pool's replicas when they differ (another GPU kind), else ``cases``."""
    cache: dict = {}
    sizes = np.array(pool_sizes(gpus, per_node), dtype=np.int64)
    pairs, parts = [], []
    pres = list((cases if prefill_cases is None else prefill_cases).values())
    for i, pre in enumerate(pres):
        for j, dec in enumerate(cases.values()):
            wide = pre.attention_dp > 1 or dec.attention_dp > 1   # EP pools: the same layout in both, as the
            if wide and (pre.ep, pre.attention_dp) != (dec.ep, dec.attention_dp):   # estimate's flags price them
                continue
            if dec.capacity < 1:
                continue
            at = np.flatnonzero((sizes % pre.gpus == 0) & ((gpus - sizes) % dec.gpus == 0))
            if not len(at):
                continue
            d = make_disagg(pre, dec, int(sizes[at[0]]), gpus - int(sizes[at[0]]), cache)
            # one link for every split of the pair: they all fill the same GPUs (serving.disagg.make_disagg)
            n_p = (sizes[at] // pre.gpus).astype(float)
            n_d = ((gpus - sizes[at]) // dec.gpus).astype(float)
            kv_s = np.full(len(at), d.kv_transfer_s)
            rate = max_rates_within(d, n_p, n_d, kv_s, ttft_slo, tpot_slo)
            sat = saturation_many(d, n_p, n_d, kv_s)
            st = steady_many(d, n_p, n_d, kv_s, sat, np.where(rate > 0, rate, 1e-6 * np.maximum(n_p, 1)))
            parts.append((at * len(pres) + i, j, len(pairs), n_p, n_d, kv_s, rate, st, sat))
            pairs.append((pre, dec))
    if not parts:
        empty = np.zeros(0)
        return Splits(pairs, empty.astype(int), empty, empty, empty, empty, empty, empty, empty, empty, cache)
    tried = np.concatenate([p[0] * (len(cases) + 1) + p[1] for p in parts])
    order = np.argsort(tried, kind="stable")
    cat = lambda xs: np.concatenate(xs)[order]  # noqa: E731
    return Splits(pairs, cat([np.full(len(p[3]), p[2]) for p in parts]), cat([p[3] for p in parts]),
                  cat([p[4] for p in parts]), cat([p[5] for p in parts]), cat([p[6] for p in parts]),
                  cat([p[7]["ttft_s"] for p in parts]), cat([p[7]["tpot_s"] for p in parts]),
                  cat([p[7]["prefill_utilization"] for p in parts]), cat([p[8] for p in parts]), cache)


def search(cases: dict, gpus: int, per_node: int, ttft_slo: float | None,
           tpot_slo: float | None, prefill_cases: dict | None = None) -> list[tuple[DisaggCase, float]]:
    """``search_splits`` as a list of (split, its highest rate within the SLO means), most goodput first."""
    s = search_splits(cases, gpus, per_node, ttft_slo, tpot_slo, prefill_cases)
    return [(s.case(i), float(s.rate[i])) for i in s.ranked()]

