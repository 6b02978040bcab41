"""The capacity search over prefill/decode splits: every way to cut a GPU count into a prefill pool and a decode
pool (``pool_sizes``), for every pair of replica layouts, at its highest Poisson request rate whose steady-state
mean TTFT and TPOT meet the SLOs (``serving.disagg``'s model; DistServe, Zhong et al. 2024, OSDI).

``serving.disagg.max_rate_within`` finds that rate for one split by bisection on ``steady_rate``. A search at a
thousand GPUs and more holds tens of thousands of splits (127 pool sizes of whole nodes at 1,024 GPUs, 2,047 at
16,384, each with every pair of layouts), so here the same bisection runs on all the splits of one pair of layouts
at once, on ``serving.disagg.steady_many`` (the steady state's one set of formulas, on arrays of pool sizes and
rates), and a split becomes a ``DisaggCase`` only when a caller asks for it (``Splits.case``). A test holds the two
bisections to the same rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardlab.serving.disagg import DisaggCase, make_disagg, saturation_many, steady_many

BISECTION_STEPS = 50
"""Halvings of the rate bracket (``serving.disagg.max_rate_within`` takes as many)."""


def pool_sizes(gpus: int, per_node: int) -> list[int]:
    """Prefill pool sizes tried: every split of up to two nodes; whole nodes beyond (pools span nodes by node)."""
    if gpus <= 2 * per_node:
        return list(range(1, gpus))
    return [p for p in range(per_node, gpus, per_node)]


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

