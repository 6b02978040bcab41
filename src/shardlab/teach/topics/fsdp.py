"""FSDP wrap policies: one block, N blocks or the whole model per unit, priced by the core (memory, inventory, estimate).

A unit is what FSDP gathers whole before use (Zhao et al. 2023 §3.1-3.2). For each policy the topic calls
``training_memory`` (through ``estimate_training``: the gathered-unit buffers ``fsdp_buffers`` and the peak),
``layout_collectives`` (calls per step and bytes per call of the FSDP rows) and ``estimate_training`` (the exposed
ZeRO-3 time and the step): the same functions ``shardlab memory|comm plan|estimate --wrap`` call.
"""

from __future__ import annotations

from shardlab.layout import wrap_word
from shardlab.teach.explanation import Explanation
from shardlab.teach.topics._common import catalog, cluster, gib
from shardlab.units import fmt_bytes, fmt_count


def price_policy(spec, cl, n_blocks: int, *, seq: int, framework, recompute: str = "none") -> dict:
    """Memory, collectives and step time of ZeRO-3 over every GPU with ``n_blocks`` blocks per unit (0: one unit)."""
    from shardlab.comm.inventory import layout_collectives
    from shardlab.estimate import estimate_training
    from shardlab.layout import Layout

    lay = Layout(dp=cl.num_gpus, zero=3, wrap=n_blocks, recompute=recompute)
    est = estimate_training(spec, lay, cl, seq_len=seq, global_batch=cl.num_gpus, framework=framework)
    items = [i for i in layout_collectives(spec, lay, cl, seq_len=seq, microbatches=1, framework=framework) if i.axis == "FSDP"]
    fwd = [i for i in items if i.op == "all-gather" and i.phase == "forward"]   # the block units, then the root unit
    gather = fwd[0]
    w = est.memory.worst
    return {"wrap": wrap_word(n_blocks), "units": sum(i.calls_per_step for i in fwd), "unit_bytes": gather.bytes_per_call,
            "root_bytes": fwd[-1].bytes_per_call if len(fwd) > 1 else 0,
            "calls_per_step": sum(i.calls_per_step for i in items), "comm_s": sum(i.time_per_step_s for i in items),
            "critical": [f"{i.op} {i.phase}" for i in items if i.overlap == "critical"], "link": gather.link_id,
            "fsdp_buffers_bytes": w.other.get("fsdp_buffers", 0), "total_bytes": w.total, "fits": bool(est.fits),
            "zero3_exposed_s": est.breakdown["zero3_comm_s"], "step_time_s": est.step_time_s,
            "sharded_states_bytes": w.model_states}


def fsdp_wrap(v: dict) -> Explanation:
    """The three wrap policies side by side: gathered-memory peak and communication per wrap unit."""
    from shardlab.errors import ShardlabError
    from shardlab.memory.overheads import Overheads
    from shardlab.specs.tensors import model_tensors

    cat = catalog()
    spec, cl, fw = cat.model(v["model"]), cluster(v["gpu"], v["gpus"]), cat.framework(v["framework"])
    n = v["blocks"]
    if n >= spec.num_layers:
        raise ShardlabError(f"blocks={n}: {spec.name} has {spec.num_layers} blocks; choose fewer (or use the whole-model row)")
    seq = min(spec.max_seq_len, v["seq"])
    res = {p["wrap"]: p for p in (price_policy(spec, cl, k, seq=seq, framework=fw, recompute=v["recompute"]) for k in (1, n, 0))}
    b, g, m = res["block"], res[wrap_word(n)], res["model"]
    ov = Overheads()
    ts = model_tensors(spec)
    root_p = sum(t.numel for t in ts if not 0 <= t.layer < spec.num_layers)    # embedding, final norm, head
    block_p = max(sum(t.numel for t in ts if t.layer == i) for i in range(spec.num_layers))
    largest = ("the root unit (embedding, final norm and head: " + fmt_count(root_p) + " parameters, more than "
               + (f"{n} blocks" if root_p > n * block_p else "one block") + ")" if root_p > block_p else
               f"a block of {fmt_count(block_p)} parameters")
    fitting = [p for p in res.values() if p["fits"]]
    fastest = min(fitting, key=lambda p: p["step_time_s"]) if fitting else None
    rows = [[p["wrap"], p["units"], fmt_bytes(p["unit_bytes"]), gib(p["fsdp_buffers_bytes"]), gib(p["total_bytes"]),
             "yes" if p["fits"] else "no", p["calls_per_step"], f"{p['comm_s'] * 1e3:,.1f} ms",
             f"{p['zero3_exposed_s'] * 1e3:,.1f} ms", f"{p['step_time_s']:.3f} s"] for p in res.values()]
    verdict = (f"'{fastest['wrap']}' is the fastest policy that fits ({fastest['step_time_s']:.3f} s per step, "
               f"{gib(fastest['total_bytes'])} per GPU)" if fastest else "no policy fits: shard over more GPUs or recompute")
    cmd = (f"{spec.name} --gpus {v['gpus']} --zero 3 --gpu {cl.accelerator.id} --seq-len {seq} "
           f"--global-batch {v['gpus']} --framework {fw.id}") + (
        f" --recompute {v['recompute']}" if v["recompute"] != "none" else "")
    return Explanation(
        "fsdp-wrap", "FSDP wrap policies: one block, N blocks or the whole model per unit",
        f"FSDP (ZeRO-3) of {spec.name} over {v['gpus']} × {cl.accelerator.id} with {fw.id}: what do the three wrap "
        f"policies (a unit per block, per {n} blocks, the whole model) cost in gathered memory and in communication?",
        dict(v),
        [f"whatever the policy, each GPU stores 1/{v['gpus']} of every weight, gradient and optimizer state: "
         f"{gib(b['sharded_states_bytes'])} of model states",
         f"a unit is gathered whole before its forward and, resharded after it, again before its backward; its gradients "
         f"are reduce-scattered after its backward. Units per step: block {b['units']} (one per block + the root unit, "
         f"which holds the embedding, final norm and head as FSDP's root wrapper does), {n}-blocks {g['units']}, model {m['units']} [comm/inventory.py: layout_collectives]",
         f"bytes per call = a block unit's bf16 weights: {fmt_bytes(b['unit_bytes'])} → {fmt_bytes(g['unit_bytes'])} → "
         f"{fmt_bytes(m['unit_bytes'])} (the root unit is a call of its own: {fmt_bytes(b['root_bytes'])}); "
         f"calls per step {b['calls_per_step']} → {g['calls_per_step']} → "
         f"{m['calls_per_step']}; a unit moves its weights twice (forward and backward gathers) and its gradients once, "
         f"except the one forward ends with, which stays gathered for backward (FSDP keeps the root, torchtitan the "
         f"last block), "
         f"the whole model, gathered once and held, its weights once: {b['comm_s'] * 1e3:,.0f}, {g['comm_s'] * 1e3:,.0f} "
         f"and {m['comm_s'] * 1e3:,.0f} ms of collectives per step on {b['link']}",
         f"gathered-memory peak (fsdp_buffers) = {ov.fsdp_prefetch_units} gathered units (the current one and the "
         f"prefetched next) + {ov.fsdp_reduce_scatter_units} unit of gradients being reduce-scattered, of the largest "
         f"unit, {largest}: {gib(b['fsdp_buffers_bytes'])} → {gib(g['fsdp_buffers_bytes'])}; the whole model is one unit gathered "
         f"once and held through the backward: {gib(m['fsdp_buffers_bytes'])} [memory/buffers.py: stage_overheads]",
         f"peak per GPU: {gib(b['total_bytes'])} → {gib(g['total_bytes'])} → {gib(m['total_bytes'])} of "
         f"{gib(cl.accelerator.memory_bytes)}",
         f"exposed ZeRO-3 time (what prefetching cannot hide under the unit's compute, plus the first gather and the "
         f"last reduce-scatter): {b['zero3_exposed_s'] * 1e3:,.1f} → {g['zero3_exposed_s'] * 1e3:,.1f} → "
         f"{m['zero3_exposed_s'] * 1e3:,.1f} ms; with one unit nothing overlaps: "
         f"{', '.join(m['critical']) or 'none'} on the critical path [comm/pricing.py]",
         f"verdict: {verdict}"],
        f"FSDP keeps only a shard of each unit and gathers the whole unit just before it is used, and the wrap policy "
        f"decides what a unit is. Small units (one block) keep the gathered peak low ({gib(b['fsdp_buffers_bytes'])}) and "
        f"let FSDP fetch the next unit while the current one computes, at the price of {b['calls_per_step']} collectives "
        f"per step. Grouping {n} blocks issues fewer, larger calls "
        + (f"at a higher peak ({gib(g['fsdp_buffers_bytes'])})" if g['fsdp_buffers_bytes'] > b['fsdp_buffers_bytes'] else
           f"at the same peak here (the root unit of embedding and head is larger than {n} blocks)")
        + f": worth it when the calls are latency-bound (small blocks, a slow network). Wrapping the whole model gathers every weight "
        f"at once ({gib(m['fsdp_buffers_bytes'])}), which undoes most of ZeRO-3's saving and leaves nothing to overlap the "
        f"gather with; use it only for a model that fits comfortably. Here {verdict}.",
        {"policies": res, "fastest_fitting": fastest["wrap"] if fastest else None},
        table=(["wrap", "units", "bytes/call", "fsdp_buffers", "peak/GPU", "fits", "calls/step", "comm/step",
                "ZeRO-3 exposed", "step"], rows),
        sources=["fsdp", "zero"], code=["pt-fsdp1-wrap", "pt-fsdp2", "pt-fsdp2-group", "pt-fsdp2-coll", "ds-zero3"],
        commands=[f"memory {cmd} --wrap {wrap_word(n)}", f"comm plan {cmd} --wrap model",
                  f"estimate {cmd} --wrap model"],
        notes=[f"one sequence of {seq} tokens per GPU per step (micro-batch 1), recompute {v['recompute']}; {fw.id}'s mechanisms "
               "(catalog/data/frameworks.yaml); bytes per call are a block unit's (the root unit of embedding, final "
               "norm and head is one call of its own), the peak uses the largest unit (often the embedding or head); the call count takes the embedding and head as one root unit (FSDP1's "
               "root, as shardlab's runtime wraps them), the peak takes each as a unit of its own (as torchtitan wraps "
               "them), the smaller of the two peaks"])
