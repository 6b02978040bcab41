"""Search: enumerate, score (vectorized), reject what does not fit, rank by the objective, re-check the
best plans with the exact per-tensor memory model."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from shardlab.errors import ShardlabError, field_name
from shardlab.estimate.step import evaluate
from shardlab.estimate.workload import Workload, workload_memory
from shardlab.layout import Layout, layout_from_arrays
from shardlab.memory import Overheads
from shardlab.memory.overheads import MEMORY_MARGIN
from shardlab.planner.space import enumerate_space
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec

OBJECTIVES = ("throughput", "cost", "memory")
SIMPLICITY = 0.003
"""Ranking prefers simpler layouts: each extra parallel axis or memory trick (tp, pp, cp, ep > 1, ZeRO > 0, ZeRO-3,
recomputation, interleaving) must buy 0.3% of step time. Differences that small are far inside the model's
error (docs/validation.md), while every extra axis is a real engineering cost."""
DEFAULT_MEMORY_FRACTION = 1.0 - MEMORY_MARGIN
"""The share of a GPU's memory a plan may use unless told otherwise (source: ``memory.overheads.MEMORY_MARGIN``)."""
NOT_FIT = "does not fit in GPU memory"
NOT_FIT_EXACT = "does not fit in GPU memory (exact per-tensor check of a top plan)"


def over_limit_reason(fraction: float) -> str:
    """The rejection reason for layouts that fit the GPU but not the share of it --max-memory-fraction allows."""
    return f"uses more than {100 * fraction:g}% of GPU memory ({field_name('plan.memory_fraction')} {fraction:g})"


@dataclass
class PlanResult:
    """The answer of ``shardlab plan``."""

    model: ModelSpec
    cluster: Cluster
    workload: Workload
    objective: str
    evaluated: int
    """Configurations scored."""
    total: int
    """Combinations generated (scored + rejected before scoring)."""
    rejected: Counter
    """Counts by reason."""
    search_s: float
    """Wall time of the search."""
    plans: list[dict]
    """Ranked plans (layout + estimate fields)."""
    scores: dict = field(default_factory=dict, repr=False)
    """Raw arrays of every scored candidate (for the worksheet's comparisons)."""
    cands: dict = field(default_factory=dict, repr=False)


def layout_of(c: dict, i: int) -> Layout:
    """The Layout of candidate ``i`` (``layout.layout_from_arrays``: every field the array form holds), with the
    search's selective-recomputation modules (``c['recompute_modules']``, one tuple for every candidate)."""
    lay = layout_from_arrays(c, i)
    mods = c.get("recompute_modules")
    return lay.with_(recompute_modules=mods) if mods and lay.recompute == "selective" else lay


def _spread(worlds: list[int]) -> list[int]:
    """At most ``limits.MAX_COST_WORLDS`` of the ascending ``worlds``: the largest, and the rest nearest to sizes spread
    evenly on a log scale."""
    from shardlab.limits import MAX_COST_WORLDS

    if len(worlds) <= MAX_COST_WORLDS:
        return worlds
    logs = np.log(np.asarray(worlds, dtype=float))
    picked = {len(worlds) - 1}
    for t in np.linspace(logs[0], logs[-1], MAX_COST_WORLDS - 1, endpoint=False):
        picked.add(int(np.argmin(np.abs(logs - t))))
    return [worlds[i] for i in sorted(picked)]


def _concat(parts: list[dict]) -> dict:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def objective_key(objective: str, c: dict, r: dict):
    """What the search ranks, per candidate (before the simplicity factor): step time, GPU-time per step (cost), or
    memory with step time breaking ties."""
    if objective == "cost":
        return c["dp"] * c["tp"] * c["pp"] * c["cp"] * r["step_time_s"]
    if objective == "memory":
        return r["memory_bytes"] + r["step_time_s"] * 1e-6
    return r["step_time_s"]


def plan_training(spec: ModelSpec, cluster: Cluster, wl: Workload, *, objective: str = "throughput", top: int = 5,
                  fixed: dict | None = None, overheads: Overheads = Overheads(), exact_check: int = 3,
                  progress=None, framework=None, memory_fraction: float = DEFAULT_MEMORY_FRACTION,
                  recompute_modules: tuple[str, ...] | None = None) -> PlanResult:
    """Search all layouts of ``cluster.num_gpus`` GPUs (objective 'cost' also tries fewer GPUs).

    ``recompute_modules``: what the candidates' selective recomputation re-runs (``Layout.recompute_modules``).

    ``memory_fraction``: keep only layouts whose worst rank needs at most this share of a GPU's memory (the margin a
    team keeps for what no estimate sees: a longer sample, a framework's extra buffer, a newer library's workspace);
    default 1 − ``memory.overheads.MEMORY_MARGIN`` (0.95).

    ``progress(done, total, label)``, if given, is called after each world size scored and each exact memory check."""
    if objective not in OBJECTIVES:
        raise ShardlabError(f"--objective must be one of {', '.join(OBJECTIVES)}, got '{objective}'")
    t0 = time.perf_counter()
    worlds = [cluster.num_gpus]
    if objective == "cost":  # the cheapest way to train with up to N GPUs: whole nodes, or divisors of one node
        gpn = cluster.gpus_per_node
        from shardlab.layout_checks import divisors

        worlds = _spread([w for w in divisors(cluster.num_gpus) if w % gpn == 0 or gpn % w == 0])
    cand_parts, score_parts, rejected, total = [], [], Counter(), 0
    steps = len(worlds) + exact_check
    for k, w in enumerate(worlds):
        if progress:
            progress(k, steps, f"scoring layouts of {w} GPUs")
        c, rej, n = enumerate_space(spec, w, cluster.gpus_per_node, wl.seq_len, wl.global_batch, fixed, framework)
        rejected.update(rej)
        total += n
        if len(c["dp"]):
            cl = Cluster(cluster.accelerator, w, cluster.gpus_per_node, cluster.intra_link, cluster.inter_link)
            cand_parts.append(c)
            score_parts.append(evaluate(spec, cl, wl, c, overheads, recompute_modules=recompute_modules))
    if not cand_parts:
        raise ShardlabError(f"no valid layout: every one of {total} combinations was rejected "
                            f"({'; '.join(f'{k}: {v}' for k, v in rejected.items())}); "
                            + (f"pin fewer axes (pinned: {_pins(fixed)}) or " if fixed else "")
                            + f"change {field_name('cluster.gpus')}, {field_name('workload.global_batch')} or "
                              f"{field_name('workload.seq_len')}"
                            + (f" (or {field_name('framework.name')})" if any("framework" in k for k in rejected)
                               else ""))
    c, r = _concat(cand_parts), _concat(score_parts)
    c["recompute_modules"] = recompute_modules     # not an array: one setting for every candidate (layout_of)
    evaluated = len(c["dp"])
    fits = r["fits"].copy()
    if (~fits).any():
        rejected[NOT_FIT] += int((~fits).sum())
    limit = memory_fraction * cluster.accelerator.memory_bytes
    if memory_fraction < 1.0:
        over = fits & (r["memory_bytes"] > limit)
        if over.any():
            rejected[over_limit_reason(memory_fraction)] += int(over.sum())
        fits &= ~over
    key = objective_key(objective, c, r)
    # near-ties (e.g. dp·mb traded for cp·mb) go to the simpler layout, then to the one needing less memory
    complexity = ((c["tp"] > 1) * 1 + (c["pp"] > 1) + (c["cp"] > 1) + (c["ep"] > 1) + (c["zero"] > 0) + (c["rc"] > 0)
                  + (c["vpp"] > 1) + (c["zero"] == 3) + (c["rep"] > 1))
    key = np.where(fits, key * (1 + SIMPLICITY * complexity + 1e-12 * r["memory_bytes"] / 2**30), np.inf)
    order = np.argsort(key, kind="stable")
    plans: list[dict] = []
    checked = 0
    for i in order:
        if not np.isfinite(key[i]) or len(plans) >= top:
            break
        if progress and checked < exact_check:
            progress(len(worlds) + checked, steps, "exact memory check of a top plan")
        plan = _plan_dict(spec, cluster, wl, c, r, int(i), overheads, exact=checked < exact_check)
        checked += 1
        if plan.get("fits") is False or plan["memory_bytes"] > limit:
            rejected[NOT_FIT_EXACT if plan.get("fits") is False else over_limit_reason(memory_fraction)] += 1
            fits[i] = False
            continue
        plans.append(plan)
    return PlanResult(spec, cluster, wl, objective, evaluated, total, rejected, time.perf_counter() - t0, plans,
                      scores={**r, "fits": fits, "key": key}, cands=c)


def _plan_dict(spec, cluster, wl, c, r, i, overheads, exact: bool) -> dict:
    lay = layout_of(c, i)
    m = wl.global_batch // (lay.micro_batch * lay.dp)
    d = {"index": i, "gpus": lay.world_size, "layout": {**lay.to_dict(), "microbatches": m},
         **{k: float(r[k][i]) for k in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
                                          "mfu", "hfu")},
         "breakdown": {k: float(r[k][i]) for k in ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
                                                     "pp_p2p_s", "zero3_comm_s", "pp_bubble_s", "dp_comm_s", "optimizer_s",
                                                     "host_overhead_s", "offload_s")},
         "memory_bytes_approx": int(r["memory_bytes"][i])}
    if exact:
        mem = workload_memory(lay, spec, cluster.accelerator, wl, m, overheads)
        d["memory_bytes"] = mem.worst.total
        d["memory_worst_rank"] = {"rank": mem.worst.rank, "reason": mem.worst_reason()}
        d["fits"] = bool(mem.fits)
    else:
        d["memory_bytes"] = d["memory_bytes_approx"]
        d["fits"] = True
    return d


def _pins(fixed: dict) -> str:
    """The pinned axes as --fix writes them (rc=full, schedule=1f1b), not as the search codes them."""
    from shardlab.planner.space import SCHED_NAMES

    names = {"rc": dict(enumerate(("none", "selective", "full"))), "schedule": SCHED_NAMES}
    return ", ".join(f"{k}={names.get(k, {}).get(v, v)}" for k, v in fixed.items())

