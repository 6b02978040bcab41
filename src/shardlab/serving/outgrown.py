"""A static batch that outgrows its KV blocks: on-demand blocks, preemption and recomputation, phase by phase.

An offline run queues every request at once; with fixed lengths they grow in step, and under on-demand blocks
(vLLM, SGLang) a batch the engine admits whole can need more than the pool by its last token. ``steady.fluid``
prices static batches; where ``outgrown`` holds it takes the makespan and mean completion from ``outgrown_batch``.
"""

from __future__ import annotations

import numpy as np

from shardlab.serving.steady import Arrays
from shardlab.serving.cycle import _through, cycle_time
from shardlab.serving.step import step_time

_GL_X, _GL_W = (np.polynomial.legendre.leggauss(4)[0] + 1) / 2, np.polynomial.legendre.leggauss(4)[1] / 2
"""Four-point Gauss–Legendre nodes and weights on (0, 1): the outgrown batch's phases are integrals over steps."""
OUTGROWN_MAX = 2.5
"""Most KV pools' worth, B·(S + O)/C, ``outgrown_batch`` prices: its phase 3 (the preempted sequences resumed
together) holds C·max_j(ln((T − j)/L₁) + j(1/L₁ − 1/(T − j))) tokens, which passes C near 2.58 (and would need
preemption again). A batch the engine admits whole under shardlab's capacity (each sequence at S + O/2) stays
below (S + O)/(S + O/2) ≤ 2."""


def outgrown(a: Arrays, B) -> np.ndarray:
    """Static batches whose B sequences fit the KV blocks with their prompts, B·(S + 1) ≤ C, but outgrow them before
    they finish, 1 < B·(S + O)/C ≤ ``OUTGROWN_MAX`` (on-demand admission only, no speculation): what
    ``outgrown_batch`` prices. Not where the engine evicts tokens that leave a sliding window shorter than the
    sequence (``Arrays.kv_share`` < 1): a sequence's blocks then stop growing, or grow more slowly, once it passes
    the window, which the phases (blocks in proportion to length) do not follow; such a batch keeps the static
    price."""
    B = np.asarray(B, dtype=float)
    C = np.maximum(a.kv_tokens, 1.0)
    over = B * (a.S + a.O) / C
    return ((a.on_demand > 0) & (over > 1.0) & (over <= OUTGROWN_MAX) & (B * (a.S + 1) <= C) & (a.spec_tokens == 0)
            & (a.kv_share >= 1.0))


def outgrown_batch(a: Arrays, B, batch_prefill) -> tuple[np.ndarray, np.ndarray]:
    """(makespan, mean completion time) of a static batch that outgrows its KV blocks (``outgrown_phases``)."""
    ph = outgrown_phases(a, B, batch_prefill)
    return ph["makespan_s"], ph["mean_completion_s"]


def outgrown_phases(a: Arrays, B, batch_prefill) -> dict:
    """The phases of a static batch of B sequences that outgrows the replica's C KV tokens (``outgrown``), floats or
    arrays: full_at_tokens (L₁), phase1_s, phase2_s, preempted (sequences), recompute_tokens, recompute_s, phase3_s,
    steps_each (T − L₁, the steps of phases 2 and 3 each), makespan_s, mean_completion_s. Under on-demand blocks
    with recomputation: the engine preempts the newest sequence when a
    growing one finds no free block, keeps the tokens it generated and, once blocks free up, recomputes its prompt
    and those tokens as one prompt before it decodes on (Kwon et al. 2023, "Efficient Memory Management for Large
    Language Model Serving with PagedAttention", SOSP, §4.5; vLLM V1 ``Scheduler._preempt_request`` sets
    num_computed_tokens to 0 and keeps the output). With every sequence of length T = S + O growing in step
    (fixed lengths, all queued at once; the prefill gives each its first token, at length S + 1), in tokens of a
    sequence's own length L (past a cached prefix of H tokens, whose shared blocks are not in C but which every
    sequence reads):
    - phase 1: all B decode from S + 1 to L₁ = C/B, when the blocks are full;
    - phase 2: from L₁ to T the running sequences hold all C tokens, C/L of them at length L (the rest preempted,
      B − C/T in all, at density C/L² in L); C/T finish at T;
    - phase 3: the preempted ones, C·ln(T/L₁) tokens, are recomputed as prompts, then decode: j steps in, the
      C(1/L₁ − 1/(T − j)) preempted below T − j still run, holding C(ln((T − j)/L₁) + j(1/L₁ − 1/(T − j)))
      tokens; one preempted at L finishes T − L steps in, so their mean completion is the share
      (T(1/L₁ − 1/T) − ln(T/L₁)) / ((1/L₁ − 1/T)(T − L₁)) of phase 3.
    Phases 2 and 3 are integrated over their T − L₁ steps by four-point Gauss–Legendre quadrature of the cycle
    time (``cycle_time``); a phase-3 step with fewer than one sequence left, and the recomputation when fewer than
    one is preempted, count as that share of a step (so the price meets the static batch's at B·(S + O) = C). Where the engine evicts outside a sliding window, C counts tokens as they grow and the
    KV read is the held share of them, cached prefix included (``Arrays.kv_share``)."""
    S, T, C, H, w = a.S, a.S + a.O, np.maximum(a.kv_tokens, 1.0), a.prefix, a.kv_share
    B = np.asarray(B, dtype=float)
    L1 = np.clip(C / np.maximum(B, 1.0), S + 1.0, T)
    span = T - L1
    t1 = (L1 - S - 1) * cycle_time(a, B, w * B * ((S + 1 + L1) / 2 + H), seqs=B)
    t2 = t3 = 0.0
    for x, wt in zip(_GL_X, _GL_W):
        L = L1 + span * x
        run2 = C / L
        t2 = t2 + wt * span * cycle_time(a, run2, w * (C + run2 * H), seqs=run2)
        j = span * x
        run3 = np.maximum(C * (1 / L1 - 1 / (T - j)), 1e-9)
        kv3 = C * (np.log((T - j) / L1) + j * (1 / L1 - 1 / (T - j)))
        # a step runs only while a sequence does: below one (the last preempted), its share of a step
        t3 = t3 + wt * span * np.minimum(run3, 1.0) * cycle_time(a, run3, w * (kv3 + run3 * H), seqs=run3)
    preempted = np.maximum(B - C / T, 0.0)
    redo = C * np.log(T / L1)                       # own tokens (prompt suffix + generated) of the preempted
    t_redo = (step_time(a.whole, a.kernels, 0.0, 0.0, redo, w * (C * span / 2 + redo * H), preempted)
              + _through(a, redo) + np.maximum(np.ceil(redo / a.budget) - 1, 0) * a.kernels.step_overhead_s)
    t_redo = t_redo * np.minimum(preempted, 1.0)    # as likely as one sequence is preempted at all
    first = batch_prefill + t1 + t2                 # the C/T sequences never preempted finish here
    makespan = first + t_redo + t3
    inv = np.maximum(1 / L1 - 1 / T, 1e-300)
    late = np.where(span > 0, (T * inv - np.log(T / L1)) / np.where(span > 0, inv * span, 1.0), 0.0)
    done = np.minimum(C / T, B) / np.maximum(B, 1.0)
    return {"full_at_tokens": L1, "phase1_s": t1, "phase2_s": t2, "preempted": preempted, "recompute_tokens": redo,
            "recompute_s": t_redo, "phase3_s": t3, "steps_each": span, "makespan_s": makespan,
            "mean_completion_s": done * first + (1 - done) * (first + t_redo + late * t3)}
