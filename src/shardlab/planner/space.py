"""The search space of training layouts, as numpy arrays, with a counted reason for every rejection.

Every combination of the option lists below is generated; a candidate is rejected for the first rule
it breaks (the order of REJECT_REASONS), and the rest are scored. Options:
- tp: divisors of the GPU count up to the GPUs per node (TP stays in the NVLink domain: its 4 all-reduces
  per block per micro-batch are on the critical path, Narayanan 2021 §3.2);
- pp: divisors of the GPU count up to the number of layers;
- cp: powers of two dividing the GPU count, up to 32;
- ep: divisors of the expert count (MoE models), 1 otherwise;
- pipeline schedule (pp > 1): gpipe, 1f1b, zb-h1, or interleaved with 2, 4 or 8 virtual stages;
- zero 0-3, micro-batch 1-16 (powers of two), recompute none/selective/full, sequence parallel off/on.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from shardlab.estimate.step import SCHEDULE_CODES
from shardlab.specs.model import ModelSpec

REJECT_REASONS = (
    "tp×pp×cp does not divide the GPU count",
    "tp does not divide the attention heads, KV heads or FFN width",
    "pp×vpp exceeds the number of layers",
    "cp does not divide the sequence or leaves fewer than 256 tokens per rank",
    "ep does not divide the experts or the data-parallel degree",
    "global batch is not divisible by micro-batch × dp",
    "interleaved schedule needs the micro-batch count to be a multiple of pp",
    "redundant: sequence parallel without tp, or ZeRO with nothing to shard",
)


def _divisors(n: int) -> list[int]:
    from shardlab.layout import divisors

    return divisors(n)


def pipeline_options(pp: int) -> list[tuple[int, int]]:
    """(vpp, schedule code) pairs for a pipeline degree."""
    if pp == 1:
        return [(1, SCHEDULE_CODES["1f1b"])]
    return [(1, SCHEDULE_CODES[s]) for s in ("1f1b", "gpipe", "zb-h1")] + [(v, SCHEDULE_CODES["interleaved"]) for v in (2, 4, 8)]


def tp_ok(spec: ModelSpec, tp: int) -> bool:
    if spec.num_heads % tp:
        return False
    if spec.mla is None and spec.num_kv_heads % tp and tp % spec.num_kv_heads:
        return False
    ffns = [spec.ffn_hidden_size] if (spec.moe is None or spec.moe.first_dense_layers) else []
    if spec.moe is not None:
        ffns.append(spec.moe.expert_ffn_hidden_size)
    return all(f % tp == 0 for f in ffns)


def enumerate_space(spec: ModelSpec, num_gpus: int, gpus_per_node: int, seq_len: int, global_batch: int,
                    fixed: dict | None = None) -> tuple[dict, Counter, int]:
    """All candidates for ``num_gpus`` GPUs. ``fixed`` pins options (e.g. {"tp": 8, "zero": 1}).

    Returns (valid candidates as a dict of arrays, rejection counts by reason, total combinations).
    """
    fixed = fixed or {}
    pick = lambda key, values: [fixed[key]] if key in fixed else values
    divs = _divisors(num_gpus)
    tps = pick("tp", [d for d in divs if d <= gpus_per_node])
    pps = pick("pp", [d for d in divs if d <= spec.num_layers])
    cps = pick("cp", [d for d in divs if d & (d - 1) == 0 and d <= 32])
    eps = pick("ep", _divisors(spec.moe.num_experts) if spec.moe else [1])
    zeros, mbs = pick("zero", [0, 1, 2, 3]), pick("mb", [1, 2, 4, 8, 16])
    rcs, sps = pick("rc", [0, 1, 2]), pick("sp", [0, 1])
    pipes = [(pp, v, s) for pp in pps for v, s in pipeline_options(pp)
             if ("vpp" not in fixed or v == fixed["vpp"]) and ("sched" not in fixed or s == fixed["sched"])]
    axes = [np.asarray(v, dtype=np.int64) for v in (tps, range(len(pipes)), cps, eps, zeros, mbs, rcs, sps)]
    index = np.indices([len(a) for a in axes]).reshape(len(axes), -1)   # the Cartesian product, as index arrays
    tp, pidx, cp, ep, zero, mb, rc, sp = (a[i] for a, i in zip(axes, index))
    pipes_a = np.array(pipes, dtype=np.int64)
    pp, vpp, sched = pipes_a[pidx].T
    mp = tp * pp * cp
    dp = np.where(num_gpus % mp == 0, num_gpus // np.maximum(mp, 1), 0)
    m = np.where(dp > 0, global_batch // np.maximum(mb * dp, 1), 0)
    ok_tp = np.isin(tp, [t for t in set(tps) if tp_ok(spec, t)])
    E = spec.moe.num_experts if spec.moe else 1
    checks = [
        num_gpus % mp == 0,
        ok_tp,
        pp * vpp <= spec.num_layers,
        (seq_len % cp == 0) & (seq_len // cp >= 256),
        (E % ep == 0) & (np.where(dp > 0, dp, 1) % ep == 0),
        (dp > 0) & (global_batch % np.maximum(mb * dp, 1) == 0),
        (sched != SCHEDULE_CODES["interleaved"]) | ((m % pp == 0) & (m >= pp)),
        ~((sp == 1) & (tp == 1)) & ~((zero > 0) & (dp * cp == 1)),
    ]
    rejected = Counter()
    alive = np.ones(len(tp), dtype=bool)
    for reason, ok in zip(REJECT_REASONS, checks):
        bad = alive & ~ok
        if bad.any():
            rejected[reason] = int(bad.sum())
        alive &= ok
    cands = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero": zero, "vpp": vpp, "mb": mb, "rc": rc, "sp": sp,
             "sched": sched}
    return {k: v[alive] for k, v in cands.items()}, rejected, len(tp)
