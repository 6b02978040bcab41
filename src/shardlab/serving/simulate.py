"""A deterministic discrete-event simulation of one replica's scheduler: the spread of TTFT and TPOT.

The steady-state model (``serving.steady``) gives means; percentiles need the order of events. This
simulation steps the engine one scheduling cycle at a time with the same cycle time
(``steady.cycle_time``) and the engine's rules (``serving.engines``):
- admission at every k-th cycle (k = scheduler steps; at once when the micro-batch is idle), first come first
  served, into the pipeline
  micro-batch (virtual engine) with the fewest sequences, while it holds fewer than max_num_seqs and the KV
  pool has the blocks: the whole sequence's for
  'reserve', the prompt's for 'on-demand', which then takes a block each time a sequence crosses a block
  boundary and, when none is left, preempts the newest sequence (recomputation, vLLM's default;
  Kwon et al. 2023 §4.5: the sequence keeps the tokens it generated and, readmitted, recomputes its prompt and
  them as one prompt, whose step samples its next token);
- each micro-batch's cycle runs its prompts (chunks up to the token budget when chunked) and, with mixed
  scheduling, its decoding sequences; prefill-first micro-batches run prompts alone while any is pending
  (Orca-style iteration scheduling, Yu et al. 2022); a micro-batch crosses the pp stages in turn, each
  stage taking an equal share of its time through the pipeline (``steady.micro_batch_times``) and serving
  one micro-batch at a time, and its engine schedules the next cycle when it leaves the last stage;
- requests arrive as a Poisson process (exponential gaps from numpy's PCG64 generator, fixed seed, scaled so that
  the N arrivals span N/λ: the run carries the rate asked), or from
  a closed loop of C clients each sending its next request when the previous one completes, after a think
  time drawn from an exponential of one decode cycle's mean (it stands in for the length and network jitter
  that keeps real clients out of the lock-step waves fixed lengths would fall into).
Bounded by input size: at most ``requests`` requests (default 5 × clients or 40 s of arrivals, 100-1200)
and ``max_cycles`` cycles. Closed-loop clients start spread over one request's lifetime (as a benchmark's
ramp-up spreads them). The first
requests (two waves of clients, or a tenth of the arrivals) and, for a closed loop, the last wave are
warm-up and drain and are not measured. The
engine's request overhead is added to every request's latencies.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

import numpy as np

from shardlab.errors import ShardlabError, field_name
from shardlab.limits import MAX_SIM_REQUESTS
from shardlab.memory.inference import held_tokens
from shardlab.serving.case import ServeCase, engine_held_tokens
from shardlab.serving.steady import cycle_time, micro_batch_times, scalars


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


class _Replica:
    """The simulated replica: per-request progress, KV blocks and pp virtual engines (one scheduler per
    pipeline micro-batch, as vLLM's virtual engines; a request joins the one with the fewest sequences)."""

    def __init__(self, case: ServeCase, n: int):
        eng = self.eng = case.engine
        self.case, self.S, self.O = case, case.prompt_len, case.output_len
        self.hit = case.prompt_len - case.prefill_tokens     # prompt tokens found in the prefix cache (shared blocks)
        # an engine that drops tokens leaving a sliding window holds held_tokens() of a sequence (the layers' mean)
        self.window_spec = case.spec if eng.sliding_window_cache and case.spec.sliding_window else None
        own = self.S - self.hit                              # a sequence's own blocks: its suffix and output
        self.need = self.blocks_of(own + self.O) if eng.kv_admission == "reserve" else self.blocks_of(own + 1)
        # on demand, a sequence grows to its whole length: one that outgrows the pool alone would, preempted,
        # wait at the head of the queue for blocks that never free up
        if max(self.need, self.blocks_of(own + self.O)) > case.blocks.num_blocks:
            raise ShardlabError(f"one request of {self.S} + {self.O} tokens needs {self.blocks_of(own + self.O)} KV "
                                f"blocks; the replica has {case.blocks.num_blocks}: raise "
                                f"{field_name('layout.tp')}/{field_name('layout.pp')}, quantize, or shorten the "
                                "request")
        self.a = scalars(case)
        self.pre, self.held, self.ve = (np.zeros(n, dtype=np.int64) for _ in range(3))
        # tokens generated; a speculative decode cycle adds the acceptance length (a mean, fractional) to each
        self.step = float(case.speculation.acceptance_length) if case.speculation else 1.0
        self.gen = np.zeros(n, dtype=np.float64 if self.step != 1.0 else np.int64)
        self.redo = np.zeros_like(self.gen)                  # generated tokens a preempted sequence recomputes
        self.tgt = np.full(n, self.S, dtype=np.int64)        # tokens its prefill covers: S + ⌈redo⌉ (``target``)
        self.free = case.replica_blocks
        self.engines: list[list[int]] = [[] for _ in range(case.pp)]
        self.preemptions = 0

    def blocks_of(self, tokens: int) -> int:
        return math.ceil(engine_held_tokens(self.case.spec, self.eng, tokens) / self.eng.kv_block_size)

    @property
    def running(self) -> int:
        return sum(len(v) for v in self.engines)

    def need_of(self, r: int) -> int:
        """Blocks request ``r`` takes on admission: ``need``, or, preempted before, its prompt and output so far."""
        if not self.redo[r]:
            return self.need
        return self.blocks_of(self.S - self.hit + math.ceil(self.redo[r]) + 1)

    def target(self, r: int) -> int:
        """Tokens request ``r``'s prefill covers: the prompt, and the generated tokens it recomputes."""
        return int(self.tgt[r])

    def admit(self, queue: list[int]) -> None:
        while queue and self.free >= self.need_of(queue[0]):
            ve = min(range(len(self.engines)), key=lambda v: len(self.engines[v]))
            if len(self.engines[ve]) >= self.case.max_num_seqs:
                return
            r = queue.pop(0)
            need = self.need_of(r)
            self.engines[ve].append(r)
            self.ve[r], self.held[r] = ve, need
            self.pre[r] = max(self.pre[r], self.hit)          # the cached prefix needs no prefill
            self.free -= need

    def compose(self, members: list[int]) -> tuple[np.ndarray, list]:
        """(decoders, prompt chunks) of one virtual engine's cycle (engine scheduling rules, module doc)."""
        eng = self.eng
        ids = np.array(members, dtype=np.int64)
        waiting = self.pre[ids] < self.tgt[ids]
        prefilling, decoders = ids[waiting].tolist(), ids[~waiting]
        if eng.scheduling != "mixed" and prefilling:
            decoders = decoders[:0]
        room = self.case.budget_tokens - len(decoders)
        chunks = []
        for r in prefilling:
            left = self.target(r) - self.pre[r]
            # unchunked, a recomputation longer than the budget runs first and alone (it ran whole once)
            c = min(left, room) if eng.chunked_prefill else (left if left <= room or (self.redo[r] and not chunks)
                                                             else 0)
            if c <= 0:
                break
            chunks.append((r, c))
            room -= c
        return decoders, chunks

    def grow(self, decoders: np.ndarray, queue: list[int]) -> set:
        """On-demand blocks for the decoders crossing a block boundary; preempt the newest when none is left."""
        if self.eng.kv_admission != "on-demand" or not len(decoders):
            return set()
        pos = self.S - self.hit + self.gen[decoders]
        if self.step == 1.0 and not self.window_spec:
            grow = decoders[pos % self.eng.kv_block_size == 0]
        else:        # a cycle adds `step` tokens: a block when they cross into one the sequence does not hold yet
            top = np.ceil(held_tokens(self.window_spec, pos + self.step) - 1e-9) if self.window_spec else pos + self.step
            grow = decoders[np.ceil(top / self.eng.kv_block_size) > self.held[decoders]]
        victims = set()
        while len(grow) > self.free:
            ve = max(range(len(self.engines)), key=lambda v: len(self.engines[v]))
            victim = self.engines[ve].pop()              # newest first: recomputed later
            self.free += self.held[victim]
            self.held[victim] = self.pre[victim] = 0
            self.redo[victim] = self.gen[victim]          # kept: recomputed with the prompt when readmitted
            self.tgt[victim] = self.S + math.ceil(self.gen[victim])
            queue.insert(0, victim)
            victims.add(victim)
            self.preemptions += 1
            grow = grow[grow != victim]
        self.held[grow] += 1
        self.free -= len(grow)
        return victims

    def release(self, r: int) -> None:
        self.engines[self.ve[r]].remove(r)
        self.free += self.held[r]
        self.held[r] = 0


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
    # conditioned on the count: N arrivals over N/λ, so a run's realised rate is the one asked for (a few hundred
    # exponential gaps of one seed average up to 15% off their mean, which would load every run of a search less)
    arrive *= N / arrival_rate / arrive[-1]
    # measure neither the requests that find the replica filling up (those of the first lifetime: Little's law
    # has λ·lifetime in flight only after it) nor those that finish while it drains (the last lifetime's);
    # at least a tenth of the run is warm-up, at most a third each
    warm = min(N // 3, max(N // 10, int(np.count_nonzero(arrive < lifetime_s))))
    drain = min(N // 3, int(np.count_nonzero(arrive > arrive[-1] - lifetime_s))) if lifetime_s > 0 else 0
    return arrive, N, warm, drain


def warm_in_flight(case: ServeCase, arrival_rate: float) -> int:
    """Sequences the steady state keeps in flight at ``arrival_rate`` (``steady.fluid``; the replica's capacity when
    that rate overloads it): what a warm-started run begins with."""
    from shardlab.serving.steady import arrays, fluid

    f = fluid(arrays([case]), [2], [arrival_rate])
    return int(round(min(float(f["in_flight"][0]), float(case.capacity))))


def _warm_start(rep: _Replica, first: np.ndarray, ids: range) -> int:
    """Put sequences ``ids`` in the replica as the steady state holds them: prompts done, the k-th of n having
    generated 1 + (k + ½)(O − 1)/n tokens (evenly spread over its decode), with their blocks (all of them for
    'reserve', those of its tokens so far for 'on-demand'), each in the virtual engine with the fewest; as many as
    blocks and max_num_seqs allow. Returns how many went in; they are never measured."""
    n, O = len(ids), rep.O
    for k, r in enumerate(ids):
        gen = 1 + (k + 0.5) * (O - 1) / n
        gen = gen if rep.step != 1.0 else int(gen)
        need = rep.need if rep.eng.kv_admission == "reserve" else rep.blocks_of(rep.S - rep.hit + math.ceil(gen))
        ve = min(range(len(rep.engines)), key=lambda v: len(rep.engines[v]))
        if need > rep.free or len(rep.engines[ve]) >= rep.case.max_num_seqs:
            return k
        rep.engines[ve].append(r)
        rep.ve[r], rep.held[r], rep.pre[r], rep.gen[r] = ve, need, rep.S, gen
        rep.free -= need
        first[r] = 0.0
    return n


def simulate(case: ServeCase, *, concurrency: int | None = None, arrival_rate: float | None = None,
             requests: int | None = None, seed: int = 0, max_cycles: int = 60000, lifetime_s: float = 0.0,
             warm_start: bool = False) -> SimResult:
    """Simulate ``case`` under a closed loop of ``concurrency`` clients or Poisson ``arrival_rate`` req/s.
    ``lifetime_s``: the closed loop's clients start spread evenly over this time (one request's expected
    end-to-end latency), so the run starts near steady state. ``warm_start`` (arrivals only): the replica starts
    with the sequences the steady state keeps in flight at that rate, spread evenly over their decode
    (``warm_in_flight``, ``_warm_start``; not measured), so that a run of a few hundred requests measures a full
    replica, not one still filling up: a tenth of the requests is warm-up, not the first lifetime's."""
    if (concurrency is None) == (arrival_rate is None):
        raise ShardlabError("simulate needs either a concurrency or an arrival rate")
    S, O = case.prompt_len, case.output_len
    arrive, N, warm, drain = arrivals(concurrency, arrival_rate, requests, seed, lifetime_s)
    last_arrival = float(arrive[-1]) if concurrency is None else np.inf
    n0 = warm_in_flight(case, arrival_rate) if warm_start and arrival_rate is not None else 0
    rep = _Replica(case, N + n0)
    think_s = float(cycle_time(rep.a, 1.0, float(S)))      # one decode cycle: jitter that breaks lock-step
    first, done_t = np.full(N + n0, np.nan), np.full(N + n0, np.nan)
    if n0:                                        # the steady state's sequences, after the requests (never measured)
        n0 = _warm_start(rep, first, range(N, N + n0))
        first, done_t = first[:N + n0], done_t[:N + n0]
        warm = N // 10
    queue: list[int] = []
    pending = [(float(arrive[i]), i) for i in range(N) if np.isfinite(arrive[i])]   # (arrival time, request), a heap
    heapq.heapify(pending)
    issued, jitter = len(pending), np.random.default_rng(seed + 1)
    pp = case.pp
    ready = [0.0] * pp                           # when each virtual engine's last micro-batch left the last stage
    stage_free = [0.0] * pp                      # when each stage finishes its current micro-batch
    steps = [0] * pp
    cycles, completed = 0, 0
    trace_t, trace_run = [0.0], [n0]
    waiting_at_end = 0                           # requests arrived but not admitted when the last one arrives
    while completed < N + n0 and cycles < max_cycles:
        v = min(range(pp), key=lambda i: (ready[i], not rep.engines[i]))    # on a tie, an engine with work
        t = ready[v]
        while pending and pending[0][0] <= t:
            queue.append(heapq.heappop(pending)[1])
        if steps[v] % case.scheduler_steps == 0 or not rep.engines[v]:   # an idle engine admits at once
            rep.admit(queue)
        if t >= last_arrival:
            waiting_at_end, last_arrival = len(queue), np.inf
        d, ch = rep.compose(rep.engines[v])
        victims = rep.grow(d, queue)
        if victims:
            d, ch = d[~np.isin(d, list(victims))], [(r, c) for r, c in ch if r not in victims]
        if not len(d) and not ch:                    # this micro-batch is idle until something arrives or finishes
            if rep.engines[v] and not any(rep.engines[i] for i in range(pp) if i != v) and not pending:
                raise ShardlabError(f"a {S}-token prompt does not fit the {case.budget_tokens}-token step budget "
                                    "without "
                                    f"chunked prefill; raise --max-num-batched-tokens or add --chunked-prefill")
            later = [ready[i] for i in range(pp) if i != v and ready[i] > t] + ([pending[0][0]] if pending else [])
            if not later:
                break
            ready[v] = min(later)
            continue
        ctx = (S + rep.gen[d]) if rep.window_spec is None else held_tokens(rep.window_spec, S + rep.gen[d])
        fin = [r for r, c in ch if rep.pre[r] + c >= rep.target(r)]
        through, _ = micro_batch_times(rep.a, len(d), float(ctx.sum()), sum(c for _, c in ch),
                                       sum(c * (rep.pre[r] + c / 2) for r, c in ch), len(d) + len(fin))
        tau, end = float(through) / pp, t            # the micro-batch crosses the stages in turn (equal shares)
        for st in range(pp):
            end = max(end, stage_free[st]) + tau
            stage_free[st] = end
        ready[v], steps[v] = end, steps[v] + 1
        cycles += 1
        for r, c in ch:
            rep.pre[r] += c
        rep.gen[d] += rep.step if rep.step != 1.0 else 1
        for r in fin:                                # a prompt's step samples a token: the first, or the next
            if rep.redo[r]:
                rep.gen[r], rep.redo[r], rep.tgt[r] = rep.gen[r] + 1, 0, S
            else:
                first[r], rep.gen[r] = end, 1
        for r in list(d) + fin:
            if rep.gen[r] >= O:
                rep.release(r)
                done_t[r] = end
                completed += 1
                if concurrency is not None and issued < N:     # the client's next request, after a think time
                    arrive[issued] = end + jitter.exponential(think_s)
                    heapq.heappush(pending, (float(arrive[issued]), issued))
                    issued += 1
        trace_t.append(end)
        trace_run.append(rep.running)
    over = case.engine.request_overhead_us * 1e-6
    order = np.argsort(trace_t, kind="stable")
    # a stable replica admits what arrives at its next scheduling step; one falling behind has a backlog (here: more
    # than a twentieth of the run, at least 10 requests, still waiting for a slot when the last request arrives)
    behind = waiting_at_end > max(10, N // 20)
    res = _measure(arrive, first[:N] + over, done_t[:N] + over, O, warm, N - drain, np.array(trace_t)[order],
                   np.array(trace_run)[order], cycles, rep.preemptions, cycles >= max_cycles, concurrency, behind)
    return replace(res, steady=(concurrency is None or warm >= concurrency) and not res.truncated)


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
