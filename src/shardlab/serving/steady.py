"""Continuous batching in steady state: in-flight sequences, TPOT, TTFT and throughput (fluid model).

B sequences in flight, every request of S prompt and O output tokens. In steady state a scheduling cycle
advances every decoding sequence by one token and starts r = B/O new prompts, so D = B·(O−1)/O sequences
decode and (by Little's law, Little 1961, Oper. Res. 9(3)) the replica completes B/(O·cycle) requests/s and
emits B/cycle output tokens/s. The cycle is the time per output token (TPOT) a request sees:
- mixed scheduling (in-flight batching, chunked prefill): one step runs the D decodes and the new prompts
  together (``step.step_time``), within the token budget; prompts arrive whole: under a closed loop a share
  r − ⌊r⌋ of the cycles carries ⌈r⌉ prompts and the rest ⌊r⌋, under Poisson arrivals a cycle carries
  Poisson(r) of them (``prompt_mix``); averaging r·S tokens into every cycle would hide the compute-bound
  cycles: the step time is convex in its tokens;
- prefill-first (vLLM v0, SGLang): a decode step of D sequences, plus, for the n prompts waiting (spread as
  above), ⌈n/cap⌉ prefill steps of up to cap prompts (what the budget holds); with pipeline stages each virtual
  engine schedules its own, so a prefill crosses the stages in turn while the other engines' micro-batches use
  the rest: the cycle is max(a decode micro-batch and a prefill step through every stage, everything on the
  slowest stage).
Pipeline parallelism keeps n = min(pp, B) micro-batches in flight: cycle = max(time through all stages +
sends, n × the slowest stage's time) — more stages add sequences and throughput, not per-token speed.

TTFT = request overhead + wait for the next scheduling point (half a cycle, or half of k cycles with
k-step scheduling, when the engine is busy: under Poisson arrivals the number in service is Poisson with
mean B, so it is busy with probability 1 − e^−B, the M/G/∞ queue, Kleinrock 1975, Queueing Systems Vol. 1) + the prompt's
prefill step(s) + queueing: a closed loop of C > capacity clients waits
(C − B)/throughput (Little); Poisson arrivals at rate λ wait ρ·t₁/(2(1−ρ)) for the prefill server, ρ = λ·t₁,
t₁ = one prompt's prefill time (Pollaczek–Khinchine mean wait of an M/D/1 queue, Kleinrock 1975, Queueing
Systems Vol. 1 §5.7). Under an arrival rate, B solves B = λ·O·cycle(B) (bisection); at or above the
replica's capacity rate the queue grows without bound (overloaded).
Static batches (mode 'batch'): B prompts prefilled together, then O−1 decode steps of B sequences; the first
token also waits for the engine's fixed first-token cost (input preparation, first sampling and output).
Everything works on numpy arrays over cases (validation evaluates all published rows at once). The cycle under each
scheduling rule is ``serving.cycle``'s; this module solves the steady state from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.serving.case import ServeCase
from shardlab.serving.cycle import _through, step_cycle
from shardlab.serving.step import Kernels, StepModel, stack, step_time

MODES = ("batch", "concurrency", "rate")
"""batch: a static batch of n; concurrency: a closed loop of n clients (offline: n = all requests); rate: Poisson λ."""


@dataclass(frozen=True)
class Arrays:
    """The numbers of many ServeCases, as arrays (one entry per case)."""

    whole: StepModel
    """All stages' terms (ServeCase.whole)."""
    slowest: StepModel
    """The largest stage's terms."""
    kernels: Kernels
    """The engine's rates and overheads."""
    request_overhead_s: np.ndarray
    """Per request before its first token."""
    pp: np.ndarray
    """Pipeline stages."""
    budget: np.ndarray
    """Token budget of a step."""
    mixed: np.ndarray
    """1 for mixed scheduling, 0 for prefill-first."""
    chunked: np.ndarray
    """1 when prompts are chunked."""
    steps: np.ndarray
    """Decode steps per scheduling decision."""
    capacity: np.ndarray
    """Sequences the replica holds (KV blocks, max_num_seqs)."""
    S: np.ndarray
    """Prompt tokens a request computes (past its cached prefix; the whole prompt without prefix hits)."""
    L: np.ndarray
    """Mean keys a computed prompt token attends to (S/2 without prefix hits)."""
    O: np.ndarray
    """Output tokens."""
    ctx: np.ndarray
    """Mean cached tokens of a decoding sequence."""
    p2p_fixed_s: np.ndarray
    """Pipeline send per boundary per step: latency part."""
    p2p_s_per_token: np.ndarray
    """... seconds per token of the step."""
    draft: StepModel
    """The speculative draft's step model (the target's own where there is no speculation: never run)."""
    spec_tokens: np.ndarray
    """Draft tokens per sequence per decode cycle, k (0: no speculation)."""
    spec_accept: np.ndarray
    """Tokens a decode cycle produces per sequence: the acceptance length (1 without speculation)."""
    kv_tokens: np.ndarray
    """Tokens of its own (past a cached prefix) the replica's KV blocks hold over all its sequences, counted as a
    sequence grows (a sliding-window engine's eviction folded in: blocks × block size / ``kv_share``)."""
    kv_share: np.ndarray
    """Share of a sequence's tokens its KV cache keeps at full length, held(prompt + O)/(prompt + O) where the engine
    evicts outside a sliding window, else 1 (``ServeCase.kv_held_share``)."""
    prefix: np.ndarray
    """Prompt tokens found in the prefix cache: shared blocks every sequence reads, outside ``kv_tokens``."""
    on_demand: np.ndarray
    """1 where the engine takes KV blocks as sequences grow and preempts when they run out (``ADMISSION``)."""


def arrays(cases: list[ServeCase], kernels: Kernels | None = None, request_overhead_s=None) -> Arrays:
    """Stack ServeCases; ``kernels``/``request_overhead_s`` (arrays over cases) replace the engines' (fitting)."""
    f = lambda get: np.array([get(c) for c in cases], dtype=float)  # noqa: E731
    return Arrays(stack([c.whole for c in cases]), stack([c.slowest for c in cases]),
                  kernels if kernels is not None else stack([c.kernels for c in cases]),
                  request_overhead_s if request_overhead_s is not None else f(lambda c: c.engine.request_overhead_us * 1e-6),
                  f(lambda c: c.pp), f(lambda c: c.budget_tokens), f(lambda c: c.engine.scheduling == "mixed"),
                  f(lambda c: c.engine.chunked_prefill), f(lambda c: c.scheduler_steps), f(lambda c: c.capacity),
                  f(lambda c: c.prefill_tokens), f(lambda c: c.prefill_keys_per_token), f(lambda c: c.output_len),
                  f(lambda c: c.context_tokens),
                  f(lambda c: c.p2p_fixed_s), f(lambda c: c.p2p_s_per_token),
                  stack([c.draft or c.whole for c in cases]),
                  f(lambda c: c.speculation.tokens if c.speculation else 0),
                  f(lambda c: c.speculation.acceptance_length if c.speculation else 1.0),
                  f(lambda c: c.kv_grow_tokens), f(lambda c: c.kv_held_share), f(lambda c: c.prompt_len - c.prefill_tokens),
                  f(lambda c: c.engine.kv_admission == "on-demand"))


def scalars(c: ServeCase) -> Arrays:
    """One ServeCase as an Arrays of plain floats (the simulation steps through it one cycle at a time)."""
    return Arrays(c.whole, c.slowest, c.kernels, c.engine.request_overhead_us * 1e-6, c.pp, c.budget_tokens,
                  float(c.engine.scheduling == "mixed"), float(c.engine.chunked_prefill), c.scheduler_steps, c.capacity,
                  c.prefill_tokens, c.prefill_keys_per_token, c.output_len, c.context_tokens, c.p2p_fixed_s, c.p2p_s_per_token,
                  c.draft or c.whole, float(c.speculation.tokens if c.speculation else 0),
                  float(c.speculation.acceptance_length if c.speculation else 1.0), c.kv_grow_tokens, c.kv_held_share,
                  float(c.prompt_len - c.prefill_tokens), float(c.engine.kv_admission == "on-demand"))


def take(a, idx):
    """The cases ``idx`` of an Arrays (or of any dataclass of arrays)."""
    if hasattr(a, "__dataclass_fields__"):
        return type(a)(**{f: take(getattr(a, f), idx) for f in a.__dataclass_fields__})
    return np.asarray(a)[idx]


def _rate_in_flight(a: Arrays, lam, Bmax, tol: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(B, overloaded) of cases under Poisson arrivals λ: the root of f(B) = B − λ·O·cycle(B) on [0, Bmax],
    by the Illinois variant of regula falsi (Dowell & Jarratt 1971, BIT 11) on the bracket: 16 iterations, or
    fewer once every case's bracket is ``tol`` sequences wide or less (``tol`` > 0)."""
    Oc = cycles_per_request(a)
    f = lambda B: B - lam * Oc * step_cycle(a, B * (Oc - 1) / Oc, B / Oc, poisson=True)["cycle_s"]  # noqa: E731
    lo, hi = np.zeros_like(Bmax), Bmax.copy()
    flo, fhi = f(lo), f(hi)
    over = fhi < 0
    side = np.zeros_like(Bmax)
    for _ in range(16):
        x = np.where(over, hi, (lo * fhi - hi * flo) / np.where(fhi != flo, fhi - flo, 1.0))
        fx = f(x)
        left = fx < 0                                        # root lies right of x: x replaces lo
        lo, flo = np.where(left, x, lo), np.where(left, fx, flo)
        hi, fhi = np.where(left, hi, x), np.where(left, fhi, fx)
        fhi = np.where(left & (side > 0), fhi / 2, fhi)       # Illinois: halve the stale end
        flo = np.where(~left & (side < 0), flo / 2, flo)
        side = np.where(left, 1.0, -1.0)
        if tol > 0 and np.all(over | (hi - lo <= tol)):
            break
    B = np.where(np.abs(flo) < np.abs(fhi), lo, hi)
    return np.where(over, Bmax, B), over


def in_flight_at_rate(a: Arrays, lam: float, tol: float = 0.25) -> float:
    """Sequences one case (``a`` of length 1) keeps in flight under Poisson arrivals λ (``fluid``'s B, to within
    ``tol`` sequences; its capacity when λ overloads it), without the latencies ``fluid`` also prices."""
    Bmax = np.maximum(max_in_flight(a), 1.0)
    B, _ = _rate_in_flight(a, np.full(Bmax.shape, float(lam)), Bmax, tol)
    return float(B[0])


def cycles_per_request(a: Arrays):
    """Cycles a request is in flight: its first token comes from the prefill, the other O − 1 at the tokens a decode
    cycle yields (1, or the speculative acceptance length): 1 + (O − 1) / L, which is O without speculation."""
    return 1.0 + (a.O - 1.0) / a.spec_accept


def _prefill_latency(a: Arrays, D, r, nb, poisson=False) -> np.ndarray:
    """Time from a prompt's first scheduled step to its first token (``poisson``: as in ``cycle.step_cycle``)."""
    k, S = a.kernels, a.S
    nmb = np.clip(np.minimum(a.pp, np.ceil(D + r)), 1, None)
    room = np.where(a.chunked > 0, np.maximum(1.0, a.budget - D / nmb), S)    # first come, first served: the
    # oldest waiting prompt takes all the budget the decodes leave (those ahead of it are the queue term)
    chunks = np.ceil(S / np.minimum(room, S))
    mixed = chunks * (step_cycle(a, D, r, extra_prompt=S / chunks, poisson=poisson)["cycle_s"])
    n_sep = np.where(a.chunked > 0, np.ceil(nb * S / a.budget), 1.0)
    separate = step_time(a.whole, k, 0.0, 0.0, nb * S, nb * S * a.L, nb) + _through(a, nb * S) \
        + (n_sep - 1) * k.step_overhead_s
    return np.where(a.mixed > 0, mixed, separate)


def _one_prompt_s(a: Arrays, D, r, poisson=False) -> np.ndarray:
    """Service time one more prompt adds to the slowest stage (the prefill 'server' of the M/D/1 queue)."""
    k, S = a.kernels, a.S
    with_it = step_cycle(a, D, r, extra_prompt=S, poisson=poisson)["cycle_s"]
    base = step_cycle(a, D, r, poisson=poisson)["cycle_s"]
    separate = step_time(a.slowest, k, 0.0, 0.0, S, S * a.L, 1.0)
    return np.where(a.mixed > 0, np.maximum(with_it - base, 1e-9), separate)


def max_in_flight(a: Arrays) -> np.ndarray:
    """Sequences a replica can run: its capacity, and for mixed steps the token budget:
    B·(S + O − 1)/O tokens per step ≤ budget × micro-batches."""
    budget_seqs = a.budget * a.pp * a.O / (a.S + a.O - 1)
    return np.where(a.mixed > 0, np.minimum(a.capacity, np.floor(budget_seqs)), a.capacity)


def fluid(a: Arrays, mode, n) -> dict:
    """Steady state of every case. mode: array of MODES indices; n: batch, clients or arrival rate (req/s).
    Returns arrays: in_flight, tpot_s, ttft_s (inf when overloaded), e2e_s, requests_per_s,
    output_tokens_per_s, overloaded, queue_s."""
    mode = np.asarray(mode)
    n = np.asarray(n, dtype=float)
    S, O = a.S, a.O
    Bmax = np.maximum(max_in_flight(a), 1.0)
    lam = np.where(mode == 2, n, 0.0)
    B = np.where(mode == 1, np.minimum(n, Bmax), n)
    over = np.zeros(B.shape, dtype=bool)
    rate = np.nonzero(mode == 2)[0]
    if rate.size:
        B[rate], over[rate] = _rate_in_flight(take(a, rate), lam[rate], Bmax[rate])
    # static batch: decode all B, no new prompts; steady modes: D decoding, r prompts per cycle
    Oc = cycles_per_request(a)                    # O, or 1 + (O − 1) / acceptance length with speculation
    D = np.where(mode == 0, B, B * (Oc - 1) / Oc)
    r = np.where(mode == 0, 0.0, B / Oc)
    pois = mode == 2
    cyc = step_cycle(a, D, r, poisson=pois)
    cycle_s = cyc["cycle_s"]
    tpot = cycle_s / a.spec_accept
    nb = np.where(mode == 0, B, cyc["prefill_batch"])
    prefill = _prefill_latency(a, np.where(mode == 0, 0.0, D), np.where(mode == 0, 0.0, r), nb, pois)
    batch_prefill = step_time(a.whole, a.kernels, 0.0, 0.0, B * S, B * S * a.L, B) + _through(a, B * S) \
        + (np.ceil(B * S / a.budget) - 1) * a.kernels.step_overhead_s + a.kernels.first_token_overhead_s
    req_s = np.where(mode == 0, 0.0, B / (Oc * cycle_s))
    t1 = _one_prompt_s(a, D, r, pois)
    rho = np.minimum(lam * t1, 0.999999)
    queue = np.where(mode == 2, rho * t1 / (2 * (1 - rho)), np.where(mode == 1, np.maximum(n - B, 0) / np.maximum(req_s, 1e-12), 0.0))
    busy = np.where(mode == 2, 1 - np.exp(-B), 1.0)        # P(engine busy) under Poisson arrivals (M/G/∞)
    ttft = np.where(mode == 0, batch_prefill, a.request_overhead_s + busy * a.steps * cycle_s / 2 + prefill + queue)
    ttft = np.where(over, np.inf, ttft)
    e2e = np.where(mode == 0, batch_prefill + (O - 1) * tpot, ttft + (O - 1) * tpot)
    makespan = e2e
    from shardlab.serving.outgrown import outgrown, outgrown_batch

    grown = (mode == 0) & outgrown(a, B)
    if np.any(grown):                             # a static batch that outgrows its KV blocks (``outgrown_batch``)
        span, mean_done = outgrown_batch(a, B, batch_prefill)
        makespan = np.where(grown, span, e2e)
        e2e = np.where(grown, mean_done, e2e)
        tpot = np.where(grown, (mean_done - batch_prefill) / np.maximum(O - 1, 1), tpot)
    req_s = np.where(mode == 0, B / makespan, np.where(over, B / (Oc * cycle_s), req_s))
    return {"in_flight": B, "decoding": D, "tpot_s": tpot, "outgrown": grown, "ttft_s": ttft, "e2e_s": e2e, "requests_per_s": req_s,
            "output_tokens_per_s": req_s * O, "overloaded": over, "queue_s": queue, "max_in_flight": Bmax,
            "prefill_s": np.where(mode == 0, batch_prefill, prefill)}
