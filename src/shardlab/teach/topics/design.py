"""Design topics: the cost sentence, the two design myths refuted with numbers, reading notes and the source map."""

from __future__ import annotations

from shardlab.layout import TOKENS_PER_STEP
from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.registry import Topic
from shardlab.teach.topics._common import RUN_TRAIN_STEPS_NOTE, catalog, cluster, gib, gpu, model, pct


def cost(v: dict) -> Explanation:
    """The sentence written before every paid run: GPUs × price × (hours + set-up) against the budget."""
    from shardlab.cost.estimate import cost_estimate, fmt_usd, sentence
    from shardlab.cost.prices import entries_for, price_table

    cat = catalog()
    acc = cat.accelerator(v["gpu"])
    est = cost_estimate(v["gpus"], v["hours"], v["price"], v["setup"], v["budget"])
    label = acc.name.replace("NVIDIA ", "").replace("GeForce ", "")
    rows = [[e.provider + (" (est.)" if e.estimate else ""), f"${e.on_demand_usd_per_gpu_hour:.2f}",
             fmt_usd(cost_estimate(v["gpus"], v["hours"], e.on_demand_usd_per_gpu_hour, v["setup"]).usd), e.date]
            for e in entries_for(price_table(cat), acc.id)]
    return Explanation(
        "cost", "The cost sentence",
        f"{v['gpus']} × {acc.id} at ${v['price']:g}/GPU-hour for {v['hours']:g} h of work plus {v['setup']:g} h of set-up: "
        f"what does it cost, and does it fit a ${v['budget']:g} budget?",
        dict(v),
        [f"rate: {v['gpus']} × ${v['price']:g} = {fmt_usd(est.usd_per_hour)}/h",
         f"paid hours: {v['hours']:g} h of work + {v['setup']:g} h of set-up (provisioning, image pull, data, warm-up) = "
         f"{est.hours:g} h",
         f"cost: {fmt_usd(est.usd_per_hour)}/h × {est.hours:g} h = {fmt_usd(est.usd)}",
         f"budget {fmt_usd(est.budget_usd)}: " + (f"{fmt_usd(est.spare_usd)} to spare" if est.spare_usd >= 0 else
                                                   f"{fmt_usd(-est.spare_usd)} over: `shardlab guard` would refuse to launch it"),
         f"the same GPUs and hours elsewhere: {len(rows)} catalog prices (table)"],
        sentence(est, label),
        {"usd": est.usd, "usd_per_hour": est.usd_per_hour, "hours": est.hours, "spare_usd": est.spare_usd,
         "within_budget": est.spare_usd >= 0},
        table=(["provider", "$/GPU-h", f"{est.hours:g} h costs", "date"], rows),
        sources=[], code=[],
        commands=[f"cost --gpus {v['gpus']} --gpu {acc.id} --price {v['price']:g} --hours {v['hours']:g} "
                  f"--setup-hours {v['setup']:g} --budget {v['budget']:g}",
                  f"guard --budget-name lab --ceiling {v['budget']:g} --gpus {v['gpus']} --gpu {acc.id} "
                  f"--price {v['price']:g} --hours {v['hours']:g} --setup-hours {v['setup']:g} -- true"],
        notes=["prices are a dated snapshot (catalog/data/prices.yaml); the sentence is the one `shardlab cost` prints"])


def myths(v: dict) -> Explanation:
    """'64 GPUs means DP = 64', 'PP across nodes is free' and the textbook DP×TP8×PP4, each against the planner."""
    from shardlab.estimate import estimate_training
    from shardlab.estimate.training import DEFAULT_FRAMEWORK
    from shardlab.estimate.workload import workload_for, workload_memory
    from shardlab.layout import Layout
    from shardlab.planner.report import _layout_str
    from shardlab.planner.search import plan_training

    spec, cl = catalog().model(v["model"]), cluster(v["gpu"], v["gpus"])
    n, gpn = v["gpus"], cl.gpus_per_node
    seq = min(spec.max_seq_len, 4096)
    gb = max(1, TOKENS_PER_STEP // seq)                 # 4M tokens per step, as `shardlab plan` assumes
    fw = catalog().framework(DEFAULT_FRAMEWORK)        # the framework `shardlab plan` and `estimate` assume by default
    wl = workload_for(fw, seq_len=seq, global_batch=gb)
    dp_mem = workload_memory(Layout(dp=n), spec, cl.accelerator, wl, 1).worst   # the same framework's memory
    plans = plan_training(spec, cl, wl, top=1, framework=fw).plans
    if not plans:
        from shardlab.errors import ShardlabError

        raise ShardlabError(f"no layout of {n} × {cl.accelerator.id} fits {spec.name}; give more GPUs (gpus={4 * n})")
    best = plans[0]
    pp = 4 if n % (gpn * 4) == 0 else 2
    text = estimate_training(spec, Layout(dp=n // (gpn * pp), tp=gpn, pp=pp, zero=1), cl, seq_len=seq, global_batch=gb)
    pp_cost = text.breakdown["pp_bubble_s"] + text.breakdown["pp_p2p_s"]
    dp_t = n // (gpn * pp)
    small = estimate_training(spec, Layout(dp=dp_t, tp=gpn, pp=pp, zero=1), cl, seq_len=seq, global_batch=dp_t * 2 * pp)
    small_share = (small.breakdown["pp_bubble_s"] + small.breakdown["pp_p2p_s"]) / small.step_time_s
    lay = best["layout"]
    return Explanation(
        "design-myths", "Design myths, refuted with numbers",
        f"{spec.name} on {n} × {cl.accelerator.id} ({gpn} per node), {gb} × {seq}-token sequences per step: is 'DP = {n}' "
        f"a plan, is the textbook 'TP {gpn} × PP {pp} × DP' what the numbers pick, and is PP across nodes free?",
        dict(v),
        [f"'{n} GPUs means DP = {n}': every GPU would hold the whole model: {gib(dp_mem.model_states)} of model states "
         f"({wl.framework}: {dp_mem.model_states / max(dp_mem.params, 1):.0f} B per parameter"
         + (": fp32 gradients beside the ZeRO paper's 16" if round(dp_mem.model_states / max(dp_mem.params, 1)) == 18
            else "") + "), "
         f"{gib(dp_mem.total)} in all, against {gib(cl.accelerator.memory_bytes)}: does not fit; the GPU count says "
         f"nothing about the split",
         f"the planner's best: {_layout_str(lay)} with {lay['microbatches']} micro-batches: step {best['step_time_s']:.2f} s, "
         f"{best['tokens_per_s']:,.0f} tokens/s, {best['memory_bytes'] / 2**30:.1f} GiB per GPU",
         f"the textbook TP {gpn} (inside a node) × PP {pp} (across nodes) × DP {n // (gpn * pp)}, ZeRO-1: step "
         f"{text.step_time_s:.2f} s, {text.tokens_per_s:,.0f} tokens/s "
         f"({100 * (text.step_time_s / best['step_time_s'] - 1):+.1f}% step time, mostly TP {gpn}'s per-layer "
         f"collectives: {text.breakdown['tp_comm_s']:.2f} s against {best['breakdown']['tp_comm_s']:.2f} s), "
         f"{text.memory.worst.total / 2**30:.1f} GiB per GPU ({'fits' if text.fits else 'does not fit'})",
         f"'PP across nodes is free': in that layout the bubble costs {text.breakdown['pp_bubble_s']:.2f} s and the "
         f"sends {text.breakdown['pp_p2p_s']:.2f} s, {pct(pp_cost / text.step_time_s)} of the step, with "
         f"{text.microbatches} micro-batches: nearly free only because this batch is huge; with "
         f"{small.microbatches} micro-batches ({dp_t * 2 * pp} sequences per step) they cost {pct(small_share)} of the step"],
        f"A GPU count is not a design. {n} full copies of {spec.name} do not fit at all. The textbook answer, tensor "
        f"parallelism inside each node and a pipeline across nodes, works, but it is not automatically best: for this "
        f"model and batch the search prefers {_layout_str(lay)}, and the textbook layout takes "
        f"{100 * (text.step_time_s / best['step_time_s'] - 1):.1f}% longer per step. And the pipeline is free only with a huge batch: at {small.microbatches} micro-batches its bubble and "
        f"sends take {pct(small_share)} of the step. Each choice buys something and costs something; the numbers say which.",
        {"dp_only_bytes": dp_mem.total, "dp_only_fits": False, "best_layout": lay, "best_step_time_s": best["step_time_s"],
         "textbook_step_time_s": text.step_time_s, "textbook_pp_cost_s": pp_cost,
         "textbook_pp_share": pp_cost / text.step_time_s, "small_batch_pp_share": small_share},
        sources=["narayanan", "zero", "llama3"], code=["meg-ranks"],
        commands=[f"plan {spec.name} --gpus {n} --gpu {cl.accelerator.id}",
                  f"estimate {spec.name} --gpus {n} --tp {gpn} --pp {pp} --zero 1 --global-batch {gb} --gpu {cl.accelerator.id}"],
        notes=["step times from the roofline estimate fitted on published Megatron-LM runs (docs/validation.md)"])


def reading_notes(v: dict) -> Explanation:
    """The papers behind each topic's formulas, grouped by topic (curriculum item 9). Every paper is listed once,
    in the order the topics (in teaching order) first cite it, then those no topic cites with its default numbers."""
    from shardlab.teach.registry import topics
    from shardlab.teach.sources import PAPERS

    def short(k: str) -> str:
        """Authors and year; with the title when another paper has the same (Chen et al. 2016 wrote two)."""
        name = PAPERS[k].citation.split(", \"")[0]
        same = [o for o in PAPERS if PAPERS[o].citation.split(", \"")[0] == name]
        return name if len(same) == 1 else PAPERS[k].citation.split("\", ")[0] + "\""

    rows, cited_by = [], {}                  # cited_by: paper id -> topic ids, keys in order of first citation
    for t in topics().values():
        if t.presets or t.id in ("reading-notes", "source-map"):
            continue
        ex_sources = list(dict.fromkeys(_topic_sources(t.id)))
        for s in ex_sources:
            cited_by.setdefault(s, []).append(t.id)
        rows.append([t.id, "; ".join(short(s) for s in ex_sources) or "-"])
    order = list(cited_by) + [k for k in PAPERS if k not in cited_by]
    lines = [f"{short(k)} → " + (", ".join(cited_by[k]) if k in cited_by else
                                 "no topic with its default numbers (other shardlab commands use it)") for k in order]
    return Explanation(
        "reading-notes", "Reading notes: the papers behind the formulas",
        "Which paper does each formula shardlab uses come from?", dict(v),
        lines,
        "Every number shardlab prints comes from a formula with a source: memory from the ZeRO paper and Korthikanti et "
        "al., tensor parallelism from Megatron-LM, schedules from GPipe, PipeDream and Narayanan et al., collectives from "
        "the α–β model of Hockney and Thakur, precision from the mixed-precision and bfloat16 papers. The derivation maps "
        "each paper to the topics that use it, the table each topic to its papers, and the sources below say what each "
        "paper gives, once each; `shardlab explain TOPIC` shows the formula with your numbers.",
        {"papers": len(PAPERS), "cited": list(cited_by)},
        table=(["topic", "papers"], rows), sources=order, code=[],
        commands=["explain --list", "explain source-map"])


_SOURCES_CACHE: dict[str, list[str]] = {}


def _topic_sources(tid: str) -> list[str]:
    """The sources a topic cites with its default numbers."""
    if tid not in _SOURCES_CACHE:
        from shardlab.teach.registry import explain

        _SOURCES_CACHE[tid] = list(explain(tid).sources)
    return _SOURCES_CACHE[tid]


def source_map(v: dict) -> Explanation:
    """Where each sharded layer lives in Megatron-LM / PyTorch / DeepSpeed, mapped to shardlab (curriculum item 4)."""
    from shardlab.teach.codemap import CODE

    want = v["project"]
    ids = [k for k, c in CODE.items() if want == "all" or c.project.lower().startswith(want.lower())]
    by = {}
    for k in ids:
        by.setdefault(CODE[k].project, []).append(k)
    return Explanation(
        "source-map", "Reading Megatron-LM and PyTorch FSDP with a map",
        f"Where do the layers shardlab models live in {'Megatron-LM, PyTorch and DeepSpeed' if want == 'all' else want}, "
        f"and which shardlab module is their counterpart?",
        dict(v),
        [f"{p}: {len(k)} locations" for p, k in by.items()]
        + ["Megatron-LM: tensor parallelism is two linears (ColumnParallelLinear, RowParallelLinear) and two autograd "
           "functions (f = copy_to_tensor_model_parallel_region, g = reduce_from_tensor_model_parallel_region); start in "
           "megatron/core/tensor_parallel/",
           "PyTorch FSDP2: fully_shard turns a module into a unit; FSDPParamGroup.unshard all-gathers it, post_backward "
           "reduce-scatters its gradients; start in torch/distributed/fsdp/_fully_shard/",
           "shardlab's runtime implements the same layers small enough to read in one sitting: runtime/parallel/"],
        "Read the frameworks with a map: find the class named in the table, then its forward and backward. The shardlab "
        "column points at the same idea in this project, written small, with the collective counted.",
        {"locations": len(ids)}, sources=["megatron", "fsdp", "zero"], code=ids,
        commands=["run train --strategy tp-megatron --nproc-per-node 2 --steps 1"], notes=[RUN_TRAIN_STEPS_NOTE])


TOPICS = [
    Topic("cost", "The cost sentence", "GPUs × price × (hours + set-up) vs the budget, prices by provider", (6, 17),
          (Param("gpus", "int", 2, "GPUs rented"), gpu("rtx-4090"), Param("price", "float", 0.35, "USD per GPU-hour", minimum=0.0001),
           Param("hours", "float", 2.5, "hours of work", minimum=0.0001),
           Param("setup", "float", 0.5, "set-up hours", minimum=0), Param("budget", "float", 3.0, "USD budget", minimum=0)), cost),
    Topic("design-myths", "Design myths", "'64 GPUs means DP=64' and 'PP across nodes is free', with numbers", (39, 16, 3),
          (model("llama-3.1-70b"), Param("gpus", "int", 64, "GPUs (multiple of 16)", minimum=16), gpu("h100-sxm")), myths),
    Topic("reading-notes", "Reading notes", "the papers behind each formula, by topic", (9,), (), reading_notes),
    Topic("source-map", "Source map", "Megatron-LM / PyTorch / DeepSpeed classes mapped to shardlab's layers", (4,),
          (Param("project", "str", "all", "which project", ("all", "megatron", "pytorch", "deepspeed", "peft")),), source_map),
]
