"""The detail of one training layout that pictures need, as plain data: which rank sits where and holds what
(the rank map), per-stage memory by category, the simulated pipeline step, and the TP block diagram.

Everything comes from the core's own functions (``rank_grid.rank_coords``/``group_ranks``, ``memory``,
``pipeline.simulate``, ``shard.block_mermaid``); ``shardlab plan`` and ``shardlab estimate`` put it in their
JSON document under ``detail``, and the HTML report draws it without computing any number itself.
"""

from __future__ import annotations

from shardlab.layout import Layout
from shardlab.rank_grid import all_groups, rank_coords
from shardlab.memory import MemoryReport
from shardlab.memory.states import stage_tensors
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec

MAX_TIMELINE_PASSES = 2400
"""Above this many passes the page draws each stage's merged busy intervals instead of every pass."""
RANK_COLUMNS = ("node", "gpu", "pp", "dp", "cp", "tp", "ep", "tp_group", "dp_group", "pp_group", "cp_group", "ep_group")
"""Columns of ``rank_map.ranks`` (one row per global rank; *_group indexes ``rank_map.groups[axis]``)."""


def _ranges(ids) -> str:
    """'0-9, 40-49' from sorted integers."""
    ids = sorted(ids)
    if not ids:
        return "none"
    out, start, prev = [], ids[0], ids[0]
    for x in ids[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


def _group_text(g: list[int]) -> str:
    """'ranks 0-7' or 'ranks 0, 8, … 56 (8 ranks, stride 8)'."""
    if len(g) == 1:
        return f"rank {g[0]}"
    stride = g[1] - g[0]
    if stride == 1 and g[-1] - g[0] == len(g) - 1:
        return f"ranks {g[0]}-{g[-1]}"
    if all(b - a == stride for a, b in zip(g, g[1:])):
        shown = ", ".join(str(r) for r in g) if len(g) <= 4 else ", ".join(str(r) for r in g[:3]) + f", … {g[-1]}"
        return f"ranks {shown} ({len(g)} ranks, stride {stride})"
    return "ranks " + ", ".join(str(r) for r in g[:4]) + (f", … {g[-1]} ({len(g)} ranks)" if len(g) > 4 else "")


def rank_map(spec: ModelSpec, layout: Layout, cluster: Cluster, *, zero_shards: int) -> dict:
    """Every rank's node, GPU, grid coordinates and groups, and what each stage / TP rank holds."""
    axes = [a for a in ("tp", "dp", "pp", "cp", "ep") if getattr(layout, a) > 1]
    groups, index = {}, {}
    for a in ("tp", "dp", "pp", "cp", "ep"):
        gs = all_groups(layout, a) if a in axes else [[r] for r in range(layout.world_size)]
        groups[a] = [_group_text(g) for g in gs] if a in axes else []
        for k, g in enumerate(gs):
            for r in g:
                index[(a, r)] = k if a in axes else 0
    gpn = cluster.gpus_per_node
    rows = []
    for r in range(layout.world_size):
        c = rank_coords(r, layout)
        rows.append([r // gpn, r % gpn, c["pp"], c["dp"], c["cp"], c["tp"], c["ep"],
                     *(index[(a, r)] for a in ("tp", "dp", "pp", "cp", "ep"))])
    stages = []
    for st in stage_tensors(spec, layout):
        extra = (["token embedding"] if st.holds_embedding else []) + (["final norm, output head, loss"] if st.holds_head else [])
        stages.append({"stage": st.stage, "layers": _ranges(st.layers), "num_layers": len(st.layers), "extra": extra})
    t = layout.tp
    tp_text = (f"1/{t} of every weight matrix: column-parallel Q, K, V, gate, up (output columns), row-parallel "
               f"out-projection and down (input rows); {spec.num_heads // t} of {spec.num_heads} heads" if t > 1
               else "whole weight matrices (no tensor parallelism)")
    if layout.ep > 1 and spec.moe is not None:
        tp_text += f"; {spec.moe.num_experts // layout.ep} of {spec.moe.num_experts} experts per EP rank"
    if spec.moe is not None and layout.expert_tp != t:
        tp_text += (f"; the routed experts split over {layout.expert_tp} ranks, not {t}" if layout.expert_tp > 1
                    else "; the routed experts whole on every rank (expert TP 1)")
    zero = layout.zero
    z_text = {0: "model states replicated over data parallel",
              1: f"optimizer states split 1/{zero_shards} over dp·cp",
              2: f"gradients and optimizer states split 1/{zero_shards} over dp·cp",
              3: f"weights, gradients and optimizer states split 1/{zero_shards} over dp·cp (gathered per layer)"}[zero]
    return {"nodes": -(-layout.world_size // gpn), "gpus_per_node": gpn, "world_size": layout.world_size,
            "columns": list(RANK_COLUMNS), "ranks": rows, "groups": groups,
            "stages": stages, "tp_shard": tp_text, "zero_shard": z_text,
            "axis_order": "tp fastest, then cp, dp, pp (Megatron-LM order; shardlab.rank_grid.rank_coords)"}


def memory_stages(mem: MemoryReport) -> dict:
    """Per pipeline stage the peak bytes by category (every TP/CP/DP rank of a stage holds the same) and capacity."""
    rows = []
    for s in mem.stages:
        rows.append({"stage": s.stage, "rank": s.rank, "weights": s.weights, "gradients": s.gradients,
                     "optimizer": s.optimizer, "activations": s.activations, "other": s.other_total,
                     "other_breakdown": dict(s.other), "total": s.total, "in_flight": s.in_flight})
    return {"capacity_bytes": mem.capacity_bytes, "stages": rows, "worst_stage": mem.worst.stage,
            "worst_reason": mem.worst_reason(), "units": "bytes"}


def pipeline_detail(layout: Layout, microbatches: int, compute_s: float, p2p_s: float = 0.0) -> dict | None:
    """The simulated step of the layout's schedule, passes timed from the step model's compute: one micro-batch's
    forward through the slowest stage = compute_s / (3m), backward twice that (Narayanan et al. 2021 §3.3)."""
    if layout.pp == 1 or compute_s <= 0:
        return None
    from shardlab.pipeline.render import pipeline_doc
    from shardlab.pipeline.simulate import simulate

    m = microbatches
    times = {"forward_s": compute_s / (3 * m), "backward_s": 2 * compute_s / (3 * m)}
    from shardlab.limits import MAX_PIPELINE_PASSES
    from shardlab.pipeline.simulate import passes

    n = passes(layout.schedule, layout.pp, m, layout.vpp)
    if n > MAX_PIPELINE_PASSES:          # a step too long to simulate quickly: the closed form alone
        from shardlab.pipeline.closed_form import bubble_fraction_closed_form, closed_form_text

        return {"schedule": layout.schedule, "stages": layout.pp, "microbatches": m, "vpp": layout.vpp,
                "simulated": False,
                "bubble_fraction_closed_form": bubble_fraction_closed_form(layout.schedule, layout.pp, m, layout.vpp, **times),
                "closed_form": closed_form_text(layout.schedule, layout.pp, m, layout.vpp, **times),
                "notes": [f"{n:,} passes, over the {MAX_PIPELINE_PASSES:,} shardlab simulates: the bubble is the closed "
                          f"form's (uniform stages)"]}
    res = simulate(layout.schedule, layout.pp, m, layout.vpp, p2p_s=p2p_s, **times)
    doc = pipeline_doc(res, times)
    t = res.timeline
    if len(t["kind"]) > MAX_TIMELINE_PASSES:
        doc.pop("events", None)
        busy: list[list[list[float]]] = [[] for _ in range(layout.pp)]
        import numpy as np

        gap = 1e-3 * res.step_time_s   # gaps under 0.1% of the step are below a pixel
        for i in np.lexsort((t["start_s"], t["stage"])).tolist():
            s, a, b = int(t["stage"][i]), float(t["start_s"][i]), float(t["end_s"][i])
            if busy[s] and a - busy[s][-1][1] <= gap:
                busy[s][-1][1] = b
            else:
                busy[s].append([a, b])
        doc["busy_intervals_s"] = busy
        doc["notes"] = [n for n in doc["notes"] if "left out" not in n] + [
            f"{len(t['kind'])} passes: the picture shows each stage's busy intervals (passes merged across gaps under "
            f"0.1% of the step)"]
    doc["timing"] = "passes timed from the step model's compute: F = compute/(3m), B = 2F per micro-batch per stage"
    return doc


def layout_detail(spec: ModelSpec, layout: Layout, cluster: Cluster, mem: MemoryReport, *, seq_len: int,
                  microbatches: int, breakdown: dict, precision: str) -> dict:
    """Rank map, per-stage memory, pipeline timeline and the TP block diagram of ``layout``; None above
    ``limits.MAX_RANK_MAP`` GPUs (the rank map lists every rank)."""
    from shardlab.limits import MAX_RANK_MAP
    from shardlab.memory.precision import state_bytes
    from shardlab.shard import block_mermaid

    if layout.world_size > MAX_RANK_MAP:
        return None

    sb = state_bytes(precision, "adamw")
    return {
        "rank_map": rank_map(spec, layout, cluster, zero_shards=layout.dp_shard),
        "memory": memory_stages(mem),
        "pipeline": pipeline_detail(layout, microbatches, breakdown.get("compute_s", 0.0),
                                    breakdown.get("pp_p2p_s", 0.0) / max(1, 2 * microbatches * layout.vpp)),
        # a TP group works on its context-parallel rank's s/cp tokens (what comm plan prices)
        "tp_diagram": block_mermaid(spec, layout.tp, seq_len=seq_len // layout.cp, micro_batch=layout.micro_batch,
                                    sequence_parallel=layout.sequence_parallel, elem_bytes=sb.weights, ep=layout.ep,
                                    etp=layout.etp),
    }
