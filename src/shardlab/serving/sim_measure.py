"""What a serving simulation measures, shared by the one-replica simulation (``serving.simulate``) and the
two-pool one (``serving.disagg_sim``): when its requests arrive, which of them count (warm-up and drain left out),
and their latencies' spread and rates (``SimResult``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.limits import MAX_SIM_REQUESTS


@dataclass(frozen=True)
class Spread:
    """Mean and percentiles of one latency over the measured requests, seconds."""

    mean: float
    """Mean over the measured requests."""
    p50: float
    """Median."""
    p99: float
    """99th percentile."""

    def to_dict(self) -> dict:
        return {"mean": self.mean, "p50": self.p50, "p99": self.p99}


@dataclass(frozen=True)
class SimResult:
    """What the simulation measured."""

    requests: int
    """Requests measured (after warm-up, before drain)."""
    ttft_s: Spread
    """Arrival to first token (request overhead included)."""
    tpot_s: Spread
    """Per request: (last token − first token) / (output tokens − 1)."""
    e2e_s: Spread
    """Arrival to last token."""
    output_tokens_per_s: float
    """requests_per_s × output tokens."""
    requests_per_s: float
    mean_running: float
    """Sequences in the replica, time-averaged over the window."""
    cycles: int
    """Micro-batch cycles simulated."""
    preemptions: int
    """Sequences preempted (recomputed) when the KV pool ran out."""
    truncated: bool
    """The cycle bound stopped the run early."""
    steady: bool = True
    """False when a closed loop's measured requests include clients' first ones (too few requests for the
    clients): they met a queue still building, so the latencies are lower and the rate higher than steady."""

    def to_dict(self) -> dict:
        return {"requests": self.requests, "ttft_s": self.ttft_s.to_dict(), "tpot_s": self.tpot_s.to_dict(),
                "e2e_s": self.e2e_s.to_dict(), "output_tokens_per_s": self.output_tokens_per_s,
                "requests_per_s": self.requests_per_s, "mean_running": self.mean_running, "cycles": self.cycles,
                "preemptions": self.preemptions, "truncated": self.truncated, "steady": self.steady}


def _spread(x: np.ndarray) -> Spread:
    return Spread(float(np.mean(x)), float(np.percentile(x, 50)), float(np.percentile(x, 99)))


def arrivals(concurrency: int | None, arrival_rate: float | None, requests: int | None, seed: int,
             lifetime_s: float) -> tuple[np.ndarray, int, int, int]:
    """(arrival times, requests N, warm-up, drain) of a run: a closed loop's first requests (the rest arrive as
    clients finish: inf here), or Poisson arrivals."""
    if concurrency is not None:
        # every client's first request arrives into a ramp (the queue is still building): measure only later ones,
        # so the run holds four requests per client beyond 300 clients (bounded by MAX_SIM_REQUESTS: past 3,333
        # clients first requests are measured anyway, and the result says so: ``steady`` False)
        N = requests or min(MAX_SIM_REQUESTS, max(100, min(5 * concurrency, 1200), 4 * concurrency))
        warm, drain = min(2 * concurrency, N // 3), min(concurrency, N // 3)
        arrive = np.full(N, np.inf)
        arrive[:min(concurrency, N)] = np.arange(min(concurrency, N)) * lifetime_s / concurrency
        return arrive, N, warm, drain
    # 40 s of arrivals, or five request lifetimes when they are longer (the replica is full after one)
    N = requests or int(min(1000, max(100, arrival_rate * max(40.0, 5 * lifetime_s))))
    arrive = np.cumsum(np.random.default_rng(seed).exponential(1.0 / arrival_rate, N))
    # conditioned on the count: N arrivals over N/λ, so a run's realised rate is the one asked for (the first 100 to
    # 300 exponential gaps of seed 0 average 13-18% long, which would load every run of a search less)
    arrive *= N / arrival_rate / arrive[-1]
    # measure neither the requests that find the replica filling up (those of the first lifetime: Little's law
    # has λ·lifetime in flight only after it) nor those that finish while it drains (the last lifetime's);
    # at least a tenth of the run is warm-up, at most a third each
    warm = min(N // 3, max(N // 10, int(np.count_nonzero(arrive < lifetime_s))))
    drain = min(N // 3, int(np.count_nonzero(arrive > arrive[-1] - lifetime_s))) if lifetime_s > 0 else 0
    return arrive, N, warm, drain


def _completion_rate(done_t: np.ndarray, lo: int, hi: int, run: np.ndarray) -> float:
    """Completions per second between the lo-th completion and the last before the final batch drains (or the
    hi-th). A full replica finishes a batch's sequences together, in bursts: the count takes whole bursts (those
    after the first instant, up to and including the last) over the time between the two instants."""
    ends = np.sort(done_t[np.isfinite(done_t)])
    i1, i2 = min(lo, len(ends) - 1), min(hi - 1, len(ends) - 1 - int(np.max(run)))
    if i2 <= i1 or ends[i2] <= ends[i1]:
        return math.inf
    t1, t2 = float(ends[i1]), float(ends[i2])
    return np.count_nonzero((ends > t1) & (ends <= t2)) / (t2 - t1)


def _measure(arrive, first, done_t, O, lo, hi, tt, run, cycles, preempt, truncated, clients, behind=False) -> SimResult:
    """Latencies of requests lo..hi−1 (the request overhead is already in first/done). Rates: a closed loop
    of C clients completes C / mean E2E requests/s (Little's law, Little 1961); under arrivals, the measured
    requests' realised arrival rate, or, when the replica falls ``behind`` (requests still wait for a slot when the
    last one arrives), its completion rate while full."""
    idx = np.arange(lo, hi)
    idx = idx[np.isfinite(done_t[idx])]
    if not len(idx):
        raise ShardlabError("the simulation completed no measured request within its cycle bound; lower the "
                            "load or the lengths")
    ttft = first[idx] - arrive[idx]
    tpot = (done_t[idx] - first[idx]) / max(O - 1, 1)
    e2e = done_t[idx] - arrive[idx]
    t0, t1 = float(arrive[idx].min()), float(arrive[idx].max())
    if t1 <= t0:
        t1 = float(done_t[idx].max())
    span = max(t1 - t0, 1e-12)
    inside = (tt >= t0) & (tt <= t1)
    dts = np.diff(tt)
    mean_run = float(np.sum(run[1:][inside[1:]] * dts[inside[1:]]) / span) if inside.any() else float(run.mean())
    if clients:    # Little's law, or the completion rate when clients outnumber what the replica runs at once
        req_s = clients / float(np.mean(e2e))
        if clients > np.max(run):                # a full replica and a queue: Little's law needs the steady queue
            req_s = min(req_s, _completion_rate(done_t, lo, hi, run))
    elif behind:   # the completion rate while the replica is full (a backlog keeps it full)
        req_s = min((len(idx) - 1) / span, _completion_rate(done_t, lo, hi, run))
    else:          # a stable replica completes what arrives
        req_s = (len(idx) - 1) / span
    return SimResult(len(idx), _spread(ttft), _spread(tpot), _spread(e2e), req_s * O, req_s, mean_run,
                     cycles, preempt, truncated)
