"""One scheduling cycle of a replica: a micro-batch's time through the pipeline stages and on the slowest one, the
cycle of n micro-batches (``cycle_time``), the prompts a cycle brings (``prompt_mix``) and the cycle under each
scheduling rule (``step_cycle``: mixed steps, chunked prefill, prefill-first). ``serving.steady`` solves the steady
state from these cycles; ``serving.simulate``, ``serving.disagg`` and ``serving.outgrown`` step through them.

The engine's step (``serving.step.step_time``) prices one step of one stage; everything here composes steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shardlab.serving.step import step_time

if TYPE_CHECKING:
    from shardlab.serving.steady import Arrays


def _through(a: Arrays, tokens):
    """Pipeline sends of one step through all stage boundaries."""
    return (a.pp - 1) * (a.p2p_fixed_s + tokens * a.p2p_s_per_token)


def _all_true(x) -> bool:
    """np.all, without its cost on a plain bool (the simulation's steps call this thousands of times)."""
    return x if isinstance(x, bool) else bool(np.all(x))


def _any_true(x) -> bool:
    """np.any, without its cost on a plain bool."""
    return x if isinstance(x, bool) else bool(np.any(x))


def micro_batch_times(a: Arrays, D, Kd, P=0.0, pairs=0.0, sampled=None):
    """(through, stage) of one micro-batch: its time through every stage plus the sends between them, and its
    time on the slowest stage (``step.step_time`` on the summed and on the largest stage's terms). Every stage runs
    an engine step of its own for the micro-batch (each pipeline worker prepares its inputs and launches its
    layers), so the pass through all stages pays the engine's per-step and per-sequence overheads once per stage."""
    sampled = D if sampled is None else sampled
    k = a.kernels
    # speculative decoding (serving.speculative): each decoding sequence verifies its k drafted tokens beside its own
    # (k more positions, each attending to the sequence's cached keys: no more KV read, k more pairs per key), and
    # the draft runs k steps over the D sequences (the first also over the step's prompt tokens)
    spec = a.spec_tokens
    extra = spec * D
    through = (step_time(a.whole, k, D, Kd, P, pairs + spec * Kd, sampled + extra, extra) + _through(a, D + P + extra)
               + (a.pp - 1) * (k.step_overhead_s + k.seq_overhead_s * (sampled + extra)))
    # one stage everywhere: the slowest stage is the whole replica (the same terms) and nothing crosses between stages
    stage = through if _all_true(a.pp == 1) else step_time(a.slowest, a.kernels, D, Kd, P, pairs + spec * Kd,
                                                        sampled + extra, extra)
    if not _any_true(spec > 0):                             # no draft to run
        return through, stage
    drafting = np.where((spec > 0) & (np.asarray(D) > 0),
                        step_time(a.draft, k, D, Kd, P, pairs, D)
                        + np.maximum(spec - 1, 0) * step_time(a.draft, k, D, Kd, 0.0, 0.0, D), 0.0)
    return through + drafting, stage + drafting


def light_stage(a: Arrays, D, Kd):
    """The slowest stage's time for a micro-batch of decodes alone (D/n of them, n = min(pp, D)): ``cycle_time``'s
    micro-batches that carry no prompt. None without pipeline stages. A cycle's callers share it across the prompt
    mix (one step model call instead of one per mix entry)."""
    if _all_true(a.pp == 1):
        return None
    nmb = np.clip(np.minimum(a.pp, np.ceil(D)), 1, None)
    return micro_batch_times(a, D / nmb, Kd / nmb, 0.0, 0.0, D / nmb)[1]


def cycle_time(a: Arrays, D, Kd, P=0.0, pairs=0.0, sampled=None, seqs=None, light=None):
    """One scheduling cycle: D decoding sequences holding Kd cached tokens, P prefill tokens with ``pairs``
    causal attention pairs, ``sampled`` logits rows, in n = min(pp, seqs) micro-batches. The decodes split evenly;
    a prompt is one sequence and rides whole in one micro-batch, so the prompt tokens of the seqs − D prompts fill
    m = min(n, ⌈seqs − D⌉) of them (at least one): m heavy micro-batches and n − m with decodes alone. The cycle
    is max(a heavy micro-batch through every stage, the n micro-batches on the slowest stage). ``light``: the
    decode-only micro-batch's stage time when the caller has it (``light_stage`` of the same D, Kd). Floats or
    arrays."""
    sampled = D if sampled is None else sampled
    seqs = sampled if seqs is None else seqs
    nmb = np.clip(np.minimum(a.pp, np.ceil(seqs)), 1, None)
    if _all_true(a.pp == 1):
        through, stage = micro_batch_times(a, D, Kd, P, pairs, sampled)
        return np.maximum(through, stage)
    heavy = np.clip(np.minimum(nmb, np.ceil(np.asarray(seqs) - D - 1e-9)), 1, None)
    through, stage = micro_batch_times(a, D / nmb, Kd / nmb, P / heavy, pairs / heavy, sampled / nmb)
    if not _any_true(np.asarray(P) > 0) or _all_true(heavy >= nmb):
        return np.maximum(through, nmb * stage)
    if light is None:
        light = micro_batch_times(a, D / nmb, Kd / nmb, 0.0, 0.0, D / nmb)[1]
    return np.maximum(through, heavy * stage + (nmb - heavy) * light)


def prompt_mix(r, poisson=False) -> list[tuple[np.ndarray, np.ndarray]]:
    """(share of cycles, prompts in them) pairs averaging r prompts per cycle. Prompts come whole. A closed loop
    admits them as regularly as requests finish: ⌊r⌋ or ⌈r⌉ in a cycle. Poisson arrivals bring Poisson(r) of them
    (the count of a Poisson process in an interval, Kleinrock 1975, Queueing Systems Vol. 1 §2.5): none with
    probability e^−r, one with r·e^−r, and the rest, n ≥ 2, at their conditional mean, exact while a step's time
    is linear in prompts beyond the first (a prompt of a few hundred tokens already makes the step compute-bound).
    The step time is convex in its prompts, so the spread costs time an average would hide."""
    r = np.asarray(r, dtype=float)
    lo = np.floor(r)
    frac = r - lo
    if not np.any(poisson):
        return [(1 - frac, lo), (frac, lo + 1)]
    p0 = np.exp(-r)
    p1 = r * p0
    tail = np.clip(1 - p0 - p1, 0.0, 1.0)
    big = tail > 1e-12
    tail_n = np.where(big, np.maximum((r - p1) / np.where(big, tail, 1.0), 2.0), 2.0)
    z = np.zeros_like(r)
    pois = np.asarray(poisson, dtype=bool)
    pick = lambda x, y: np.where(pois, x, y)  # noqa: E731
    return [(pick(p0, 1 - frac), pick(z, lo)), (pick(p1, frac), pick(z + 1, lo + 1)),
            (pick(np.where(big, tail, 0.0), z), tail_n)]


def step_cycle(a: Arrays, D, r, extra_prompt=0.0, poisson=False) -> dict:
    """Time per scheduling cycle with D decoding sequences and r new prompts per cycle on average, spread as
    ``prompt_mix`` says (``poisson``: per case, prompts arrive as a Poisson stream); ``extra_prompt`` adds one more
    prompt's tokens to the mixed step (the step a measured prompt rides in)."""
    S, ctx = a.S, D * a.ctx
    extra = np.asarray(extra_prompt) > 0
    mix = prompt_mix(r, poisson)
    light = light_stage(a, D, ctx)
    mixed = sum(w * cycle_time(a, D, ctx, n * S + extra_prompt, (n * S + extra_prompt) * a.L, D + n + extra, D + n,
                               light=light) for w, n in mix)
    if np.any(a.chunked > 0):
        mixed = np.where(a.chunked > 0, _chunked_cycle(a, D, ctx, np.asarray(r, dtype=float), extra_prompt, mix, mixed,
                                                       light), mixed)
    decode = cycle_time(a, D, ctx, seqs=D)
    cap = np.maximum(1, np.floor(a.budget / S))       # prompts one prefill step holds
    # the n waiting prompts, in ⌈n/cap⌉ steps every decode waits out; with pipeline stages each virtual engine
    # schedules its own (vLLM V0's virtual engines): a prefill crosses the stages in turn while the other engines'
    # micro-batches use the rest, so the cycle is max(a decode micro-batch and one prefill step through every stage,
    # all the cycle's micro-batches and prefill steps on the slowest stage), as ``cycle_time`` pipelines decodes
    pre_through = pre_stage = steps = 0.0             # a cycle's prefill steps: their time through, on the slowest
    for w, n in mix:
        nb = np.clip(n, 1, cap)
        through, stage = micro_batch_times(a, 0.0, 0.0, nb * S, nb * S * a.L, nb)
        pre_through, pre_stage, steps = (pre_through + w * (n / nb) * through, pre_stage + w * (n / nb) * stage,
                                         steps + w * (n / nb))
    separate = decode + pre_through
    if not _all_true(a.pp == 1):
        nmb = np.clip(np.minimum(a.pp, np.ceil(D)), 1, None)
        d_through, d_stage = micro_batch_times(a, D / nmb, ctx / nmb, 0.0, 0.0, D / nmb)
        piped = np.maximum(d_through + pre_through / np.maximum(steps, 1.0), nmb * d_stage + pre_stage)
        separate = np.where(a.pp > 1, piped, separate)
    nb = np.clip(r, 1, cap)
    return {"cycle_s": np.where(a.mixed > 0, mixed, separate), "prefill_batch": nb, "decode_step_s": decode}


def _chunked_cycle(a: Arrays, D, ctx, r, extra_prompt, mix, whole, light=None):
    """The mixed cycle under chunked prefill. While whole prompts fit beside the decodes they ride whole
    (``whole``, the prompt mix); when they would overflow the token budget, the scheduler fills each step to the
    budget and carries the rest over (vLLM _schedule_chunked_prefill; SGLang chunked_prefill_size): a prompt of S
    tokens takes k = ⌈S / room⌉ steps, room = budget × micro-batches − D, so a share min(1, r·k) of the cycles
    carries r·S / share prompt tokens each (their mean attention pairs S/2 per token: a prompt's chunks sum to
    S²/2) and the rest decode alone. Smoothing the prompt over steps is what cuts TPOT as the budget shrinks."""
    S = a.S
    nmb = np.clip(np.minimum(a.pp, np.ceil(D + r)), 1, None)
    room = np.maximum(1.0, a.budget * nmb - D)
    most = np.maximum.reduce([np.where(np.asarray(w) > 0, n, 0.0) for w, n in mix])   # most prompts a cycle brings
    k = np.ceil(S / np.minimum(room, S))
    share = np.clip(r * k, 1e-12, 1.0)
    tokens = r * S / share
    extra = np.asarray(extra_prompt) > 0
    busy = cycle_time(a, D, ctx, tokens + extra_prompt, (tokens + extra_prompt) * a.L, D + r / share + extra, D + 1,
                      light=light)
    idle = cycle_time(a, D, ctx, extra_prompt, extra_prompt * a.L, D + extra, D, light=light)
    chunked = np.where(r > 0, share * busy + (1 - share) * idle, idle)
    return np.where(most * S + extra_prompt > room, chunked, whole)
