"""The search space of training layouts, as numpy arrays, with a counted reason for every rejection.

Every combination of the option lists below is generated; a candidate is rejected for the first rule
it breaks (the order of REJECT_REASONS), and the rest are scored. Options:
- tp: divisors of the GPU count up to the GPUs per node (TP stays in the NVLink domain: its 4 all-reduces
  per block per micro-batch are on the critical path, Narayanan 2021 §3.2);
- pp: divisors of the GPU count up to the number of layers;
- cp: powers of two dividing the GPU count, up to 32;
- ep: divisors of the expert count (MoE models), 1 otherwise; with tp > 1, the experts split like the attention
  (expert TP = tp, EP inside the data-parallel ranks) or whole (expert TP 1, the expert group carved from the TP and
  data-parallel ranks: ``layout.expert_grid``), where the framework runs it (``Framework.expert_tp``);
- pipeline schedule (pp > 1): gpipe, 1f1b, zb-h1, or interleaved with 2, 4 or 8 virtual stages;
- zero 0-3, micro-batch 1-16 (powers of two), recompute none/selective/full, sequence parallel off/on;
- hybrid sharding off/on (ZeRO over the data-parallel ranks of one node, replicas across nodes).
A framework profile narrows each list to what it runs (its axes, pipeline schedules and ZeRO stages).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from shardlab.errors import ShardlabError, field_name
from shardlab.estimate.step import SCHEDULE_CODES

SCHED_NAMES = {v: k for k, v in SCHEDULE_CODES.items()}
from shardlab.specs.model import ModelSpec

REJECT_REASONS = (
    "tp×pp×cp does not divide the GPU count",
    "tp does not divide the attention heads, KV heads or FFN width",
    "pp×vpp exceeds the number of layers",
    "cp does not divide the sequence or leaves fewer than 256 tokens per rank (or tp its share, under sequence parallel)",
    "ep does not divide the experts or the data-parallel degree (tp·cp·dp with expert TP 1)",
    "global batch is not divisible by micro-batch × dp",
    "interleaved schedule needs the micro-batch count to be a multiple of pp",
    "redundant: sequence parallel without tp, or ZeRO with nothing to shard",
    "hybrid sharding needs ZeRO, more than one node's worth of data parallelism, and a framework that has it",
    "the framework does not combine this ZeRO stage with pipeline parallelism",
    "the framework trains MoE layers under tp only with sequence parallelism",
    "the framework's data parallelism without ZeRO is one-dimensional (no tp, pp or cp beside dp > 1; cp needs ZeRO)",
)


def _divisors(n: int) -> list[int]:
    from shardlab.layout_checks import divisors

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
                    fixed: dict | None = None, framework=None) -> tuple[dict, Counter, int]:
    """All candidates for ``num_gpus`` GPUs. ``fixed`` pins options (e.g. {"tp": 8, "zero": 1}); ``framework`` (a
    Framework profile) limits the options to what it can run (axes, pipeline schedules, ZeRO stages).

    Returns (valid candidates as a dict of arrays, rejection counts by reason, total combinations).
    """
    fixed = fixed or {}
    fw = framework
    can = lambda axis: fw is None or axis in fw.axes
    pick = lambda key, values: [fixed[key]] if key in fixed else values
    divs = _divisors(num_gpus)
    tps = pick("tp", [d for d in divs if d <= gpus_per_node] if can("tp") else [1])
    pps = pick("pp", [d for d in divs if d <= spec.num_layers] if fw is None or fw.schedules else [1])
    cps = pick("cp", [d for d in divs if d & (d - 1) == 0 and d <= 32] if can("cp") else [1])
    eps = pick("ep", _divisors(spec.moe.num_experts) if spec.moe and can("ep") else [1])
    zeros = pick("zero", [z for z in (0, 1, 2, 3) if fw is None or z in fw.zero_stages])
    mbs = pick("mb", [1, 2, 4, 8, 16])
    rcs, sps = pick("rc", [0, 1, 2]), pick("sp", [0, 1] if can("tp") else [0])
    hss = pick("hs", [0, 1])
    # expert TP 1 beside tensor-parallel attention (ets 1), where the model has experts and the framework runs it
    et_ok = bool(spec.moe) and can("ep") and can("tp") and (fw is None or fw.expert_tp != "tp")
    if fixed.get("et") == 1 and not et_ok:
        raise ShardlabError(f"{field_name('layout.etp')} 1: " + (f"{spec.name} has no experts" if not spec.moe else
                                                                  f"{fw.id} splits the experts like the attention")
                            + f"; drop {field_name('layout.etp')}"
                            + ("" if not spec.moe else f" or choose {field_name('framework.name')} megatron-lm or torchtitan"))
    ets = pick("et", [0, 1] if et_ok else [0])
    pipes = [(pp, v, s) for pp in pps for v, s in pipeline_options(pp)
             if ("vpp" not in fixed or v == fixed["vpp"]) and ("sched" not in fixed or s == fixed["sched"])
             and (pp == 1 or fw is None or SCHED_NAMES[s] in fw.schedules)]
    if not pipes:
        raise ShardlabError("no pipeline option is left: the pinned pp/vpp/schedule (--fix) do not combine"
                            + (f" with what {fw.id} runs (schedules: {', '.join(fw.schedules) or 'none'})" if fw else "")
                            + "; pin fewer axes")
    axes = [np.asarray(v, dtype=np.int64) for v in (tps, range(len(pipes)), cps, eps, zeros, mbs, rcs, sps, hss)]
    index = np.indices([len(a) for a in axes]).reshape(len(axes), -1)   # the Cartesian product, as index arrays
    tp, pidx, cp, ep, zero, mb, rc, sp, hs = (a[i] for a, i in zip(axes, index))
    # whole experts only where they differ from split ones and from no expert parallelism at all: tp > 1 and ep > 1
    # (torchtitan ignores expert TP without EP), appended to the product rather than multiplying it
    whole = (tp > 1) & (ep > 1) if 1 in ets else np.zeros(len(tp), dtype=bool)
    keep = np.ones(len(tp), dtype=bool) if 0 in ets else np.zeros(len(tp), dtype=bool)
    if not keep.any() and not whole.any() and len(tp):
        raise ShardlabError(f"{field_name('layout.etp')} 1 runs whole experts beside tensor and expert parallelism "
                            f"(tp > 1, ep > 1); the pinned axes leave neither: drop {field_name('layout.etp')} or a pin")
    tp, pidx, cp, ep, zero, mb, rc, sp, hs = (np.concatenate([a[keep], a[whole]]) for a in (tp, pidx, cp, ep, zero, mb,
                                                                                             rc, sp, hs))
    et = np.concatenate([np.zeros(int(keep.sum()), dtype=np.int64), np.ones(int(whole.sum()), dtype=np.int64)])
    pipes_a = np.array(pipes, dtype=np.int64).reshape(-1, 3)
    pp, vpp, sched = pipes_a[pidx].T
    mp = tp * pp * cp
    dp = np.where(num_gpus % mp == 0, num_gpus // np.maximum(mp, 1), 0)
    # hybrid sharding: shard inside a node (the dp·cp ranks one node holds), replicate across nodes
    per_node = np.maximum(gpus_per_node // np.maximum(tp, 1), 1)
    rep = np.where(hs == 1, np.maximum(dp * cp // np.minimum(per_node, np.maximum(dp * cp, 1)), 1), 1)
    m = np.where(dp > 0, global_batch // np.maximum(mb * dp, 1), 0)
    ok_tp = np.isin(tp, [t for t in set(tps) if tp_ok(spec, t)])
    E = spec.moe.num_experts if spec.moe else 1
    checks = [
        num_gpus % mp == 0,
        ok_tp,
        pp * vpp <= spec.num_layers,
        ((cp == 1) | ((seq_len % cp == 0) & (seq_len // cp >= 256)))     # a short sequence is not split, not refused
        & ((sp == 0) | ((seq_len // np.maximum(cp, 1)) % tp == 0)),       # Megatron SP splits the sequence over tp
        (E % ep == 0) & np.where(et == 1, (tp * cp * np.where(dp > 0, dp, 1)) % ep == 0,
                                 np.where(dp > 0, dp, 1) % ep == 0),
        (dp > 0) & (global_batch % np.maximum(mb * dp, 1) == 0),
        (sched != SCHEDULE_CODES["interleaved"]) | ((m % pp == 0) & (m >= pp)),
        ~((sp == 1) & (tp == 1)) & ~((zero > 0) & (dp * cp == 1)),
        (hs == 0) | ((zero > 0) & (rep > 1) & (dp % np.maximum(rep, 1) == 0) & ((dp // np.maximum(rep, 1)) % ep == 0)
                     & (et == 0) & (fw is None or fw.hybrid_sharding)),
        (pp == 1) | (zero <= (3 if fw is None else fw.pipeline_max_zero)),
        ~((tp > 1) & (sp == 0) & bool(spec.moe is not None and fw is not None and fw.moe_tp_needs_sp)),
        ~((zero == 0) & (((dp > 1) & (mp > 1)) | (cp > 1)) & bool(fw is not None and fw.ddp_one_dimensional)),
    ]
    rejected = Counter()
    alive = np.ones(len(tp), dtype=bool)
    for reason, ok in zip(REJECT_REASONS, checks):
        bad = alive & ~ok
        if bad.any():
            rejected[reason] = int(bad.sum())
        alive &= ok
    cands = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero": zero, "vpp": vpp, "mb": mb, "rc": rc, "sp": sp,
             "sched": sched, "rep": rep, "etp": et}            # etp 1 (experts whole) or 0 (as tp)
    return {k: v[alive] for k, v in cands.items()}, rejected, len(tp)
