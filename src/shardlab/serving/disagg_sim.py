"""Disaggregated serving simulated request by request: a prefill pool, the KV transfer, a decode pool.

The same two pools as ``serving.disagg`` (its module doc), as discrete events:
- prefill: a free prefill replica takes the oldest waiting prompts, as many as its token budget holds (at least
  one; a prompt longer than the budget takes ceil(S / budget) steps alone), and runs one prefill step
  (``cycle.micro_batch_times``);
- transfer: each prefill replica sends its finished prompts' KV over its own link, one after the other
  (``DisaggCase.kv_transfer_s`` each);
- decode: a request whose KV has arrived joins the decode replica with the fewest sequences that has room
  (``ServeCase.capacity`` sequences per replica: its KV blocks at prompt + the output it grows into; no
  preemption), and each decode replica runs steps of the sequences it holds when the step starts
  (``cycle.cycle_time`` at their summed context). A request's first token ends its first decode step.
Arrivals, warm-up, drain and the measured figures are those of ``serving.simulate`` (Poisson arrivals or a closed
loop of clients).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.memory.inference import held_tokens
from shardlab.serving.disagg import DisaggCase
from shardlab.serving.sim_measure import SimResult, _measure, arrivals
from shardlab.serving.cycle import cycle_time, micro_batch_times

MAX_EVENTS = 400_000
"""Events simulated at most (the run is marked truncated beyond)."""


def simulate_disagg(d: DisaggCase, *, concurrency: int | None = None, arrival_rate: float | None = None,
                    requests: int | None = None, seed: int = 0, lifetime_s: float = 0.0) -> SimResult:
    """Simulate the two pools under a closed loop of ``concurrency`` clients or Poisson ``arrival_rate`` req/s."""
    if (concurrency is None) == (arrival_rate is None):
        raise ShardlabError("simulate needs either a concurrency or an arrival rate")
    pre, dec = d.prefill, d.decode
    S, O = pre.prompt_len, dec.output_len
    Sc = float(pre.prefill_tokens)
    L = float(pre.prefill_keys_per_token)
    arrive, N, warm, drain = arrivals(concurrency, arrival_rate, requests, seed, lifetime_s)
    per_step = max(1, int(pre.budget_tokens // max(Sc, 1.0)))
    chunks = max(1, math.ceil(Sc / pre.budget_tokens))
    step_over = float(d.pre_arrays.kernels.step_overhead_s[0])
    times = {n: micro_batch_times(d.pre_arrays, 0.0, 0.0, n * Sc, n * Sc * L, float(n)) for n in range(1, per_step + 1)}
    batch_s = {n: float(th[0]) + (chunks - 1) * step_over for n, (th, _) in times.items()}
    # pipeline stages: the replica takes its next batch when the slowest stage is free, the batch ends later
    free_s = ({n: float(st[0]) + (chunks - 1) * step_over for n, (_, st) in times.items()} if pre.pp > 1 else batch_s)
    think_s = float(np.ravel(cycle_time(d.dec_arrays, 1.0, float(S)))[0])
    cap = dec.capacity
    Bg, cg, slope = d.grid
    ctx = float(d.dec_arrays.ctx[0])
    window = bool(dec.engine.sliding_window_cache and dec.spec.sliding_window)
    first, done_t = np.full(N, np.nan), np.full(N, np.nan)
    gen = np.zeros(N, dtype=np.int64)
    events: list = [(float(arrive[i]), 0, i, "arrive") for i in range(N) if np.isfinite(arrive[i])]
    heapq.heapify(events)
    tie = N
    issued, jitter = len(events), np.random.default_rng(seed + 1)
    pq: list[int] = []                                 # waiting for a prefill replica
    dq: list[int] = []                                 # KV arrived, waiting for a decode slot
    p_busy = [False] * d.prefill_replicas
    link_free = [0.0] * d.prefill_replicas
    running: list[list[int]] = [[] for _ in range(d.decode_replicas)]
    stepping = [False] * d.decode_replicas
    trace_t, trace_run = [0.0], [0]
    completed = steps = n_events = 0
    last_arrival = float(arrive[-1]) if concurrency is None else math.inf
    waiting_at_end = 0                                 # requests queued when the last one arrives (a backlog)

    def push(t, kind, payload):
        nonlocal tie
        tie += 1
        heapq.heappush(events, (t, tie, payload, kind))

    def start_prefill(t):
        for r in range(d.prefill_replicas):
            if not pq:
                return
            if p_busy[r]:
                continue
            batch = pq[:per_step]
            del pq[:len(batch)]
            p_busy[r] = True
            piped = free_s is not batch_s
            if piped:
                push(t + free_s[len(batch)], "pfree", r)
            push(t + batch_s[len(batch)], "prefilled", (r, batch, not piped))

    def start_decode(t, r):
        nonlocal steps
        members = list(running[r])
        if not members:
            stepping[r] = False
            return
        stepping[r] = True
        n = float(len(members))
        held = S + gen[members]                       # the step at n sequences, linear in their cached tokens
        kd = float(np.sum(held_tokens(dec.spec, held) if window else held))   # a sliding layer holds its window
        dt = float(np.interp(n, Bg, cg) + np.interp(n, Bg, slope) * (kd - n * ctx))
        steps += 1
        push(t + dt, "decoded", (r, members))

    def admit(t):
        while dq:
            room = [r for r in range(d.decode_replicas) if len(running[r]) < cap]
            if not room:
                return
            r = min(room, key=lambda x: len(running[x]))
            running[r].append(dq.pop(0))
            if not stepping[r]:
                start_decode(t, r)

    while events and completed < N and n_events < MAX_EVENTS:
        t, _, payload, kind = heapq.heappop(events)
        n_events += 1
        if t >= last_arrival:
            waiting_at_end, last_arrival = len(pq) + len(dq), math.inf
        if kind == "arrive":
            pq.append(payload)
            start_prefill(t)
        elif kind == "pfree":                          # a pipelined replica's slowest stage took its batch
            p_busy[payload] = False
            start_prefill(t)
        elif kind == "prefilled":
            r, batch, frees = payload
            if frees:                                  # pipelined replicas were freed by "pfree" already
                p_busy[r] = False
            for i in batch:                            # the replica's link sends its prompts' KV one after the other
                link_free[r] = max(link_free[r], t) + d.kv_transfer_s
                push(link_free[r], "kv", i)
            start_prefill(t)
        elif kind == "kv":
            dq.append(payload)
            admit(t)
        else:                                          # a decode step ended
            r, members = payload
            for i in members:
                gen[i] += 1
                if gen[i] == 1:
                    first[i] = t
                if gen[i] >= O:
                    running[r].remove(i)
                    done_t[i] = t
                    completed += 1
                    if concurrency is not None and issued < N:
                        arrive[issued] = t + jitter.exponential(think_s)
                        push(float(arrive[issued]), "arrive", issued)
                        issued += 1
            admit(t)
            start_decode(t, r)
            trace_t.append(t)
            trace_run.append(sum(len(x) for x in running))
    over = dec.engine.request_overhead_us * 1e-6
    order = np.argsort(trace_t, kind="stable")
    behind = waiting_at_end > max(10, N // 20)
    res = _measure(arrive, first + over, done_t + over, O, warm, N - drain, np.array(trace_t)[order],
                   np.array(trace_run)[order], steps, 0, n_events >= MAX_EVENTS, concurrency, behind)
    ends = np.sort(done_t[np.isfinite(done_t)])
    if behind and len(ends) > 2 and ends[-1] > ends[0]:   # a backlog: the pools' completion rate, not the arrivals'
        rate = (len(ends) - 1) / float(ends[-1] - ends[0])
        if not math.isfinite(res.requests_per_s) or res.requests_per_s > rate:
            res = replace(res, requests_per_s=rate, output_tokens_per_s=rate * O)
    return replace(res, steady=(concurrency is None or warm >= concurrency) and not res.truncated)
