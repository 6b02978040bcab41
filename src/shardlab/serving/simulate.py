"""A deterministic discrete-event simulation of one replica's scheduler: the spread of TTFT and TPOT.

The steady-state model (``serving.steady``) gives means; percentiles need the order of events. This
simulation steps the engine one scheduling cycle at a time with the same cycle time
(``cycle.cycle_time``) and the engine's rules (``serving.engines``):
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
  stage taking an equal share of its time through the pipeline (``cycle.micro_batch_times``) and serving
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
from dataclasses import replace

import numpy as np

from shardlab.errors import ShardlabError, field_name
from shardlab.memory.inference import held_tokens
from shardlab.serving.case import ServeCase, engine_held_tokens
from shardlab.serving.sim_measure import SimResult, _measure, arrivals
from shardlab.serving.steady import scalars
from shardlab.serving.cycle import cycle_time, micro_batch_times


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


def warm_in_flight(case: ServeCase, arrival_rate: float) -> int:
    """Sequences the steady state keeps in flight at ``arrival_rate`` (``steady.fluid``'s, solved alone to within a
    quarter of a sequence: ``steady.in_flight_at_rate``; the replica's capacity when that rate overloads it): what
    a warm-started run begins with."""
    from shardlab.serving.steady import arrays, in_flight_at_rate

    return int(round(min(in_flight_at_rate(arrays([case]), arrival_rate), float(case.capacity))))


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
