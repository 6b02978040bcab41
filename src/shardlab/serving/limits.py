"""Where a replica's load limits bind: KV capacity, the token budget, and latency targets (SLOs).

Sweeps the steady-state model (``serving.steady.fluid``) over the load: concurrency 1 … 4 × the most
sequences the replica holds (closed loop), or arrival rates up to the rate at which it saturates. TTFT and
TPOT grow with the load, so the largest load meeting a target lies between the last point of the sweep that
meets it and the first that does not; bisection finds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.serving.case import ServeCase
from shardlab.serving.steady import arrays, fluid, max_in_flight


@dataclass(frozen=True)
class Limits:
    """The loads at which each limit binds (None: not within the sweep / no target given)."""

    max_in_flight: float
    """Sequences the replica runs at once (KV blocks, max_num_seqs, token budget)."""
    bound: str
    """What sets max_in_flight: kv-cache, max-num-seqs or token-budget."""
    saturation_rate: float
    """Requests/s the replica completes with max_in_flight sequences (arrivals beyond it queue without bound)."""
    ttft_slo_load: float | None
    """Largest concurrency (or arrival rate) whose mean TTFT meets --ttft-slo."""
    tpot_slo_load: float | None
    """Largest concurrency (or arrival rate) whose mean TPOT meets --tpot-slo."""
    unit: str
    """'clients' or 'requests/s'."""

    def to_dict(self) -> dict:
        return {"max_in_flight": self.max_in_flight, "bound": self.bound, "saturation_rate": self.saturation_rate,
                "ttft_slo_load": self.ttft_slo_load, "tpot_slo_load": self.tpot_slo_load, "unit": self.unit}


def _last_ok(one, mode: int, load: np.ndarray, values: np.ndarray, key: str, slo: float | None) -> float | None:
    """The largest load meeting ``slo``: the sweep brackets it, bisection (on the same steady state) pins it to a
    client, or to 0.1% of the rate."""
    if slo is None:
        return None
    ok = values <= slo
    if not ok[0]:
        return 0.0
    if ok.all():
        return float(load[-1])
    first_bad = int(np.argmin(ok))
    lo, hi = float(load[first_bad - 1]), float(load[first_bad])
    for _ in range(40):
        if (hi - lo <= 1) if mode == 1 else (hi - lo <= 1e-3 * hi):
            break
        mid = np.floor((lo + hi) / 2) if mode == 1 else (lo + hi) / 2
        if float(fluid(one, [mode], [mid])[key][0]) <= slo:
            lo = float(mid)
        else:
            hi = float(mid)
    return lo


def limits(case: ServeCase, *, rate: bool, ttft_slo: float | None = None, tpot_slo: float | None = None,
           points: int = 80) -> Limits:
    """Limits of one replica under a closed loop (rate=False) or Poisson arrivals (rate=True)."""
    one = arrays([case])
    bmax = float(max_in_flight(one)[0])
    bound = case.capacity_bound if bmax >= case.capacity else "token-budget"
    # the rate at which the replica saturates: its completion rate with bmax sequences in flight, prompts arriving
    # as the load brings them (a closed loop's even spread, or Poisson arrivals' spread: the overload test of
    # steady._rate_in_flight uses the same cycle, so the sweep below reaches every rate it calls stable)
    sat = float(fluid(one, [2], [1e12])["requests_per_s"][0] if rate else fluid(one, [1], [bmax])["requests_per_s"][0])
    if rate:
        load = sat * np.linspace(0.01, 0.995, points)
        mode = 2
    else:
        load = np.unique(np.round(np.geomspace(1, max(4 * bmax, 2), points)))
        mode = 1
    res = fluid(arrays([case] * len(load)), np.full(len(load), mode), load)
    return Limits(bmax, bound, sat, _last_ok(one, mode, load, res["ttft_s"], "ttft_s", ttft_slo),
                  _last_ok(one, mode, load, res["tpot_s"], "tpot_s", tpot_slo), "requests/s" if rate else "clients")
