"""The design worksheet of a plan: per axis its degree, placement and the reason (measured against the
best alternative the search scored), the communication table, and why the runner-up lost."""

from __future__ import annotations

import numpy as np

from shardlab.rank_grid import group_span_nodes
from shardlab.planner.risk import RiskInputs, axis_risk, collective_risk
from shardlab.planner.search import PlanResult, layout_of, objective_key

AXES = (
    ("tp", "tensor parallel", "splits every weight matrix and its activations by tp; 4 all-reduces per block per micro-batch "
                              "on the critical path (Megatron §3)"),
    ("pp", "pipeline parallel", "splits the layers into stages; costs a bubble of (p−1) stage-times per step and p2p sends"),
    ("dp", "data parallel", "replicates the model; one gradient reduction per step, mostly hidden behind backward"),
    ("cp", "context parallel", "splits the sequence; ring-attention K/V exchange overlapped with attention"),
    ("ep", "expert parallel", "splits the experts; two all-to-alls per MoE block in forward and backward"),
    ("zero", "ZeRO stage", "shards optimizer state (1), gradients (2) and weights (3) over dp·cp; 3 re-gathers weights each micro-batch"),
    ("mb", "micro-batch", "sequences per micro-batch: larger GEMMs, more activation memory"),
    ("sched", "pipeline schedule", "GPipe/1F1B bubble (p−1)/m; interleaving divides it by v at v× more p2p; ZB-H1 about a third"),
    ("rc", "recomputation", "trades recomputed forward FLOPs for activation memory (Korthikanti 2022)"),
    ("sp", "sequence parallel", "splits norm/dropout activations across TP ranks at no extra communication volume"),
)
BREAKDOWN_LABELS = {"compute_s": "compute", "recompute_s": "recomputation", "tp_comm_s": "TP communication",
                    "cp_comm_s": "CP communication", "ep_comm_s": "expert dispatch", "pp_p2p_s": "pipeline sends",
                    "zero3_comm_s": "ZeRO-3 gathers", "pp_bubble_s": "pipeline bubble", "dp_comm_s": "DP communication",
                    "optimizer_s": "optimizer step"}


def _value(c: dict, key: str, i: int) -> str:
    v = int(c[key][i])
    if key == "sched":
        lay = layout_of(c, i)
        return "none" if lay.pp == 1 else (f"interleaved v={lay.vpp}" if lay.schedule == "interleaved" else lay.schedule)
    if key == "rc":
        return ("none", "selective", "full")[v]
    if key == "sp":
        return "on" if v else "off"
    return str(v)


def _placement(res: PlanResult, key: str, i: int) -> str:
    lay, cl = layout_of(res.cands, i), res.cluster
    axis = {"tp": "tp", "pp": "pp", "dp": "dp_shard", "cp": "cp", "ep": "ep"}.get(key)
    if axis is None:
        return "-"
    size = {"tp": lay.tp, "pp": lay.pp, "dp_shard": lay.dp * lay.cp, "cp": lay.cp, "ep": lay.ep}[axis]
    if size == 1:
        return "-"
    nodes = group_span_nodes(lay, axis, cl.gpus_per_node)
    return f"inside a node ({cl.intra_link.id})" if nodes == 1 else f"across {nodes} nodes ({cl.inter_link.id})"


def _biggest_difference(b_alt: dict, b_win: dict) -> str:
    diffs = {k: b_alt[k] - b_win[k] for k in BREAKDOWN_LABELS}
    k = max(diffs, key=lambda x: diffs[x])
    if diffs[k] <= 0:
        return "no slower component"
    return f"{BREAKDOWN_LABELS[k]} +{diffs[k]:.3g} s"


def _breakdown(res: PlanResult, i: int) -> dict:
    return {k: float(res.scores[k][i]) for k in BREAKDOWN_LABELS}


def axis_reasons(res: PlanResult) -> list[dict]:
    """For each axis: the winner's value, placement, and how the best alternative value fared."""
    c, r = res.cands, res.scores
    w = res.plans[0]["index"]
    inp = risk_inputs(res, _collectives(res))
    step_w = r["step_time_s"][w]
    out = []
    for key, name, role in AXES:
        if key in ("cp", "ep") and len(np.unique(c[key])) == 1 and int(c[key][w]) == 1:
            continue
        val = _value(c, key, w)
        other = c[key] != c[key][w] if key != "sched" else (c["sched"] != c["sched"][w]) | (c["vpp"] != c["vpp"][w])
        alt_fit = other & r["fits"]
        if alt_fit.any():
            # the best alternative by what was ranked (step time, GPU-time per token, or memory)
            j = int(np.argmin(np.where(alt_fit, objective_key(res.objective, c, r), np.inf)))
            from shardlab.planner.report import _layout_str

            reason = (f"the best with {name} = {_value(c, key, j)} ({_layout_str(layout_of(c, j).to_dict())}): "
                      + objective_verdict(res.objective, (r["step_time_s"][j], step_w), (_world(c, j), _world(c, w)),
                                          (r["memory_bytes"][j], r["memory_bytes"][w]),
                                          lambda: _biggest_difference(_breakdown(res, j), _breakdown(res, w))))
        elif other.any():
            reason = f"every other {name} value runs out of memory"
        else:
            reason = "the only value the search allowed"
        out.append({"axis": name, "key": key, "value": val, "placement": _placement(res, key, w), "reason": reason, "role": role,
                    "risk": axis_risk(key, inp)})
    return out


def _world(c: dict, i: int) -> int:
    return int(c["dp"][i] * c["tp"][i] * c["pp"][i] * c["cp"][i])


def objective_verdict(objective: str, steps: tuple, gpus: tuple, mems: tuple, slower) -> str:
    """How an alternative compares with the winner under the ranked objective: (alternative, winner) step times,
    GPU counts and memory bytes; ``slower()`` names the component that grew most (throughput only)."""
    simpler = "the ranking asks 0.3% per extra axis (planner.search.SIMPLICITY)"
    if objective == "memory":
        dm = (mems[0] - mems[1]) / 2**30
        return (f"needs {dm:+.2f} GiB per GPU" if dm > 5e-3 else
                f"needs {-dm:.2f} GiB less per GPU but is more complex; {simpler}" if dm < -5e-3 else
                "ties on memory; the simpler layout is kept")
    if objective == "cost":
        c = gpus[0] * steps[0] / (gpus[1] * steps[1]) - 1
        return (f"costs {100 * c:.1f}% more GPU-time per token ({gpus[0]} GPUs × {steps[0]:.3g} s vs {gpus[1]} × "
                f"{steps[1]:.3g} s)" if c >= 5e-4 else
                f"{100 * -c:.2f}% cheaper but more complex; {simpler}" if c < 0 else
                "ties on GPU-time per token; the simpler layout is kept")
    return _verdict((steps[0] - steps[1]) / steps[1], (mems[0] - mems[1]) / 2**30, slower())


def _verdict(d: float, mem_delta_gib: float, slower: str) -> str:
    """How an alternative compares with the winner: step-time delta ``d`` (relative), memory delta, and the
    component that grew most."""
    if d < 0:
        return (f"{100 * -d:.2f}% faster but more complex; the ranking asks 0.3% per extra axis "
                f"(planner.search.SIMPLICITY)")
    if abs(d) < 5e-4:
        return f"ties on step time; the simpler layout is kept ({mem_delta_gib:+.1f} GiB per GPU for the alternative)"
    return f"{100 * d:+.1f}% step time ({slower})"


def runner_up(res: PlanResult) -> dict | None:
    """The second plan and why it lost (the component where it loses most time)."""
    if len(res.plans) < 2:
        return None
    a, b = res.plans[0], res.plans[1]
    d = (b["step_time_s"] - a["step_time_s"]) / a["step_time_s"]
    diff = {k: b["layout"][k] for k in b["layout"] if b["layout"][k] != a["layout"][k]}
    why = objective_verdict(res.objective, (b["step_time_s"], a["step_time_s"]), (b["gpus"], a["gpus"]),
                            (b["memory_bytes"], a["memory_bytes"]),
                            lambda: _biggest_difference(b["breakdown"], a["breakdown"]))
    return {"differs_in": diff, "step_time_delta": d, "why": why}


def _collectives(res: PlanResult) -> list[dict]:
    """The winner's communication inventory as dicts (``comm.inventory.layout_collectives``)."""
    from dataclasses import asdict

    from shardlab.comm.inventory import layout_collectives
    from shardlab.specs.hardware import Cluster

    p = res.plans[0]
    lay = layout_of(res.cands, p["index"])
    cl = Cluster(res.cluster.accelerator, lay.world_size, res.cluster.gpus_per_node, res.cluster.intra_link, res.cluster.inter_link)
    items = layout_collectives(res.model, lay, cl, seq_len=res.workload.seq_len, microbatches=p["layout"]["microbatches"],
                               precision=res.workload.precision, framework=res.workload)
    return [asdict(it) for it in items]


def risk_inputs(res: PlanResult, comm: list[dict]) -> RiskInputs:
    """The winner's numbers for the risk column (planner.risk)."""
    from shardlab.layout import split_layers

    p = res.plans[0]
    lay = p["layout"]
    layers = max(lay["stage_layers"] or split_layers(res.model.num_layers, lay["pp"] * lay["vpp"])) * lay["vpp"]
    cl = res.cluster
    return RiskInputs(layout=lay, step_time_s=p["step_time_s"], breakdown=p["breakdown"], comm=tuple(comm),
                      intra_link=cl.intra_link, inter_link=cl.inter_link, gpus_per_node=cl.gpus_per_node,
                      memory_bytes=p["memory_bytes"], capacity_bytes=cl.accelerator.memory_bytes, stage_layers=layers,
                      seq_len=res.workload.seq_len)


def comm_table(res: PlanResult) -> list[dict]:
    """The winner's communication inventory (collective, frequency, link, time, overlap) with its risk filled
    (``planner.risk.collective_risk``: the cost if exposed, plus the inventory's own warnings)."""
    items = _collectives(res)
    inp = risk_inputs(res, items)
    return [{**it, "risk": collective_risk(it, inp)} for it in items]
