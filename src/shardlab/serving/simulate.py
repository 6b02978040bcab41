"""A deterministic discrete-event simulation of one replica's scheduler: the spread of TTFT and TPOT.

The steady-state model (``serving.steady``) gives means; percentiles need the order of events. This
simulation steps the engine one scheduling cycle at a time with the same cycle time
(``steady.cycle_time``) and the engine's rules (``serving.engines``):
- admission at every k-th cycle (k = scheduler steps), first come first served, while the replica holds
  fewer than max_num_seqs × pp sequences and the KV pool has the blocks: the whole sequence's for
  'reserve', the prompt's for 'on-demand', which then takes a block each time a sequence crosses a block
  boundary and, when none is left, preempts the newest sequence (recomputation, vLLM's default;
  Kwon et al. 2023 §4.5);
- a cycle runs the prompts (chunks up to the token budget when chunked) and, with mixed scheduling, every
  decoding sequence; prefill-first cycles run prompts alone while any is pending (Orca-style iteration
  scheduling, Yu et al. 2022);
- requests arrive as a Poisson process (exponential gaps from numpy's PCG64 generator, fixed seed), or from
  a closed loop of C clients each sending its next request when the previous one completes.
Bounded by input size: at most ``requests`` requests (default 5 × clients or 40 s of arrivals, 100-1200)
and ``max_cycles`` cycles. Closed-loop clients start spread over one request's lifetime (as a benchmark's
ramp-up spreads them; started together, fixed-length requests would move in lock-step waves). The first
requests (two waves of clients, or a tenth of the arrivals) and, for a closed loop, the last wave are
warm-up and drain and are not measured. The
engine's request overhead is added to every request's latencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.serving.case import ServeCase
from shardlab.serving.steady import cycle_time, scalars


@dataclass(frozen=True)
class Spread:
    """Mean and percentiles of one latency over the measured requests, seconds."""

    mean: float
    p50: float
    p99: float

    def to_dict(self) -> dict:
        return {"mean": self.mean, "p50": self.p50, "p99": self.p99}


@dataclass(frozen=True)
class SimResult:
    """What the simulation measured."""

    requests: int
    """Requests measured (after warm-up, before drain)."""
    ttft_s: Spread
    tpot_s: Spread
    """Per request: (last token − first token) / (output tokens − 1)."""
    e2e_s: Spread
    output_tokens_per_s: float
    """requests_per_s × output tokens."""
    requests_per_s: float
    mean_running: float
    """Sequences in the replica, time-averaged over the window."""
    cycles: int
    preemptions: int
    truncated: bool
    """The cycle bound stopped the run early."""

    def to_dict(self) -> dict:
        return {"requests": self.requests, "ttft_s": self.ttft_s.to_dict(), "tpot_s": self.tpot_s.to_dict(),
                "e2e_s": self.e2e_s.to_dict(), "output_tokens_per_s": self.output_tokens_per_s,
                "requests_per_s": self.requests_per_s, "mean_running": self.mean_running, "cycles": self.cycles,
                "preemptions": self.preemptions, "truncated": self.truncated}


def _spread(x: np.ndarray) -> Spread:
    return Spread(float(np.mean(x)), float(np.percentile(x, 50)), float(np.percentile(x, 99)))


def simulate(case: ServeCase, *, concurrency: int | None = None, arrival_rate: float | None = None,
             requests: int | None = None, seed: int = 0, max_cycles: int = 60000, lifetime_s: float = 0.0) -> SimResult:
    """Simulate ``case`` under a closed loop of ``concurrency`` clients or Poisson ``arrival_rate`` req/s.
    ``lifetime_s``: the closed loop's clients start spread evenly over this time (one request's expected
    end-to-end latency), so the run starts near steady state instead of in lock-step waves."""
    if (concurrency is None) == (arrival_rate is None):
        raise ShardlabError("simulate needs either a concurrency or an arrival rate")
    S, O, eng = case.prompt_len, case.output_len, case.engine
    if concurrency is not None:
        N = requests or min(1200, max(100, 5 * concurrency))
        warm, drain = min(2 * concurrency, N // 3), min(concurrency, N // 3)
        arrive = np.full(N, np.inf)
        arrive[:min(concurrency, N)] = np.arange(min(concurrency, N)) * lifetime_s / concurrency
    else:
        N = requests or int(min(1000, max(100, 40 * arrival_rate)))
        warm, drain = N // 10, 0
        arrive = np.cumsum(np.random.default_rng(seed).exponential(1.0 / arrival_rate, N))
    window = case.spec.sliding_window if eng.sliding_window_cache and case.spec.sliding_window else None
    blocks_of = lambda tokens: math.ceil((min(tokens, window) if window else tokens) / eng.kv_block_size)  # noqa: E731
    need_at_admit = blocks_of(S + O) if eng.kv_admission == "reserve" else blocks_of(S + 1)
    if need_at_admit > case.blocks.num_blocks:
        raise ShardlabError(f"one request of {S} + {O} tokens needs {need_at_admit} KV blocks; the replica has "
                            f"{case.blocks.num_blocks}: raise --tp/--pp, quantize, or shorten the request")
    a = scalars(case)
    mixed, chunked, k, budget = eng.scheduling == "mixed", eng.chunked_prefill, case.scheduler_steps, case.budget_tokens
    max_seqs = eng.max_num_seqs * case.pp
    pre = np.zeros(N, dtype=np.int64)           # prompt tokens done
    gen = np.zeros(N, dtype=np.int64)           # output tokens emitted
    held = np.zeros(N, dtype=np.int64)          # KV blocks held
    first = np.full(N, np.nan)
    done_t = np.full(N, np.nan)
    free = case.blocks.num_blocks
    running: list[int] = []
    queue: list[int] = []
    nxt = 0                                     # next request index not yet queued
    issued = min(concurrency, N) if concurrency is not None else N
    t, cycles, preempt, completed = 0.0, 0, 0, 0
    trace_t, trace_tok, trace_run = [0.0], [0], [0]
    tokens_out = 0
    while completed < N and cycles < max_cycles:
        while nxt < N and arrive[nxt] <= t:
            queue.append(nxt)
            nxt += 1
        if not running and not queue:
            if nxt >= N or not np.isfinite(arrive[nxt]):
                break
            t = float(arrive[nxt])
            continue
        if cycles % k == 0:
            while queue and len(running) < max_seqs and free >= need_at_admit:
                r = queue.pop(0)
                running.append(r)
                held[r] = need_at_admit
                free -= need_at_admit
        prefilling = [r for r in running if pre[r] < S]
        decoders = np.array([r for r in running if pre[r] >= S], dtype=np.int64)
        if not mixed and prefilling:
            decoders = decoders[:0]
        room = budget - (len(decoders) if mixed else 0)
        chunks = []
        for r in prefilling:
            left = S - pre[r]
            c = min(left, room) if chunked else (left if left <= room else 0)
            if c <= 0:
                break
            chunks.append((r, c))
            room -= c
        if eng.kv_admission == "on-demand" and len(decoders):
            grow = decoders[(S + gen[decoders]) % eng.kv_block_size == 0] if window is None else \
                decoders[((S + gen[decoders]) % eng.kv_block_size == 0) & (S + gen[decoders] < window)]
            while len(grow) > free and running:
                victim = running.pop()               # newest first: recompute it later
                free += held[victim]
                held[victim], pre[victim], gen[victim] = 0, 0, 0
                queue.insert(0, victim)
                preempt += 1
                decoders = decoders[decoders != victim]
                grow = grow[grow != victim]
                chunks = [(r, c) for r, c in chunks if r != victim]
            held[grow] += 1
            free -= len(grow)
        if not len(decoders) and not chunks:
            if running:                              # a prompt that never fits the budget
                raise ShardlabError(f"a {S}-token prompt does not fit the {budget}-token step budget without chunked "
                                    f"prefill; raise --max-num-batched-tokens or add --chunked-prefill")
            t = float(arrive[nxt]) if nxt < N and np.isfinite(arrive[nxt]) else t
            continue
        D = len(decoders)
        ctx = (S + gen[decoders]) if window is None else np.minimum(S + gen[decoders], window)
        P = sum(c for _, c in chunks)
        pairs = sum(c * (pre[r] + c / 2) for r, c in chunks)
        finishing = [r for r, c in chunks if pre[r] + c >= S]
        dt = float(cycle_time(a, D, float(ctx.sum()), P, pairs, D + len(finishing), D + len(chunks)))
        t += dt
        cycles += 1
        for r, c in chunks:
            pre[r] += c
        for r in finishing:
            first[r], gen[r] = t, 1
        gen[decoders] += 1
        tokens_out += D + len(finishing)
        for r in [x for x in list(decoders) + finishing if gen[x] >= O]:
            running.remove(r)
            free += held[r]
            held[r] = 0
            done_t[r] = t
            completed += 1
            if concurrency is not None and issued < N:
                arrive[issued] = t
                issued += 1
        trace_t.append(t)
        trace_tok.append(tokens_out)
        trace_run.append(len(running))
    return _measure(arrive, first + eng.request_overhead_us * 1e-6, done_t + eng.request_overhead_us * 1e-6, O, warm,
                    N - drain, np.array(trace_t), np.array(trace_tok), np.array(trace_run), cycles, preempt,
                    cycles >= max_cycles, concurrency)


def _measure(arrive, first, done_t, O, lo, hi, tt, tok, run, cycles, preempt, truncated, clients) -> SimResult:
    """Latencies of requests lo..hi−1 (the request overhead is already in first/done). Rates: a closed loop
    of C clients completes C / mean E2E requests/s (Little's law, Little 1961); under arrivals, the measured
    requests' realised arrival rate, or the completion rate when the replica falls behind."""
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
    if clients:
        req_s = clients / float(np.mean(e2e))
    else:                                  # a stable replica completes what arrives; an overloaded one its own rate
        done_by = float(done_t[idx].max())
        req_s = min((len(idx) - 1) / span, float(np.count_nonzero((done_t >= t0) & (done_t <= done_by))) / (done_by - t0))
    return SimResult(len(idx), _spread(ttft), _spread(tpot), _spread(e2e), req_s * O, req_s, mean_run,
                     cycles, preempt, truncated)
