"""Human text for ``shardlab comm``: one collective, a size sweep, a layout's inventory, inference."""

from __future__ import annotations

from shardlab.render.table import kv_lines, table
from shardlab.units import fmt_bytes, fmt_time


def render_cost(cost, link, intra=None) -> str:
    """One priced collective: the numbers, the formula with them, and the regime in words."""
    where = f"{link.id}" + (f" between {cost.nodes} nodes, {intra.id} inside each" if intra is not None and cost.nodes > 1 else "")
    head = f"shardlab comm {cost.op}: {fmt_bytes(cost.size_bytes)} on {cost.ranks} ranks over {where}"
    pairs = [("time", fmt_time(cost.time_s)),
             ("algorithm", cost.algorithm),
             ("algbw", f"{cost.algbw_gbps:.2f} GB/s  (S / time)"),
             ("busbw", f"{cost.busbw_gbps:.2f} GB/s  (algbw × bus factor; compare with the link β = "
                       f"{link.bytes_per_s / 1e9:.4g} GB/s = {link.bandwidth_gbps:g} GB/s × {link.efficiency:g})"),
             ("regime", cost.regime),
             ("crossover", f"{fmt_bytes(cost.crossover_bytes)}  (size where latency and bandwidth terms are equal)")]
    if cost.nodes > 1 and intra is not None:
        pairs.append(("note", f"hierarchical: most bytes stay on {intra.id}, so busbw can exceed the inter-node β"))
    if cost.regime == "latency":
        why = (f"latency-bound: {fmt_time(cost.latency_s)} of α terms vs {fmt_time(cost.bandwidth_s)} moving bytes; "
               "a faster link barely helps, fewer and larger messages (bucketing, fusion) or fewer steps (tree) do")
    elif cost.regime == "bandwidth":
        why = (f"bandwidth-bound: {fmt_time(cost.bandwidth_s)} moving bytes vs {fmt_time(cost.latency_s)} of α terms; "
               "time scales with S / β")
    else:
        why = "one rank: nothing to communicate"
    return "\n".join([head, "", kv_lines(pairs), "", "formula:", *("  " + ln for ln in cost.formula.splitlines()), "", why])


def render_sweep(op: str, ranks: int, series: list[dict], plot: str | None) -> str:
    """Table of time and busbw per size, a column pair per link, and each link's crossover."""
    headers = ["size"]
    for s in series:
        headers += [f"{s['label']} time", f"{s['label']} busbw GB/s"]
    rows = []
    for i, size in enumerate(series[0]["sizes_bytes"]):
        row = [fmt_bytes(size)]
        for s in series:
            mark = "*" if s["regime"][i] == "latency" else ""
            row += [fmt_time(s["time_s"][i]) + mark, f"{s['busbw_gbps'][i]:.2f}"]
        rows.append(row)
    lines = [f"shardlab comm {op} --sweep: {ranks} ranks, sizes 1 B to 1 GiB (* = latency-bound)", "",
             table(headers, rows), ""]
    lines += [f"{s['label']}: crossover at {fmt_bytes(s['crossover_bytes'])}; large-message busbw → β = {s['beta_gbps']:.4g} GB/s"
              for s in series]
    lines.append("busbw = algbw × bus factor (nccl-tests doc/PERFORMANCE.md); α–β model (Thakur et al. 2005)")
    if plot:
        lines.append(f"plot saved to {plot}")
    return "\n".join(lines)


def render_plan(doc: dict) -> str:
    """The communication table of a layout, its totals, and what to watch."""
    lay, cl = doc["layout"], doc["cluster"]
    head = [f"shardlab comm plan: {doc['model']} on {lay['dp'] * lay['tp'] * lay['pp'] * lay['cp']} × {cl['gpu']} "
            f"({cl['gpus_per_node']} per node, {cl['intra_link']} inside, {cl['inter_link']} between nodes)",
            f"layout: dp {lay['dp']} × tp {lay['tp']} × pp {lay['pp']} × cp {lay['cp']}" + (f", ep {lay['ep']}" if lay["ep"] > 1 else "")
            + (f" (experts over etp {lay['etp']})" if lay.get("etp") and lay["etp"] != lay["tp"] else "")
            + f", ZeRO-{lay['zero']}, micro-batch {lay['micro_batch']}, seq {doc['seq_len']}, m = {doc['microbatches']}"
            + (", sequence parallel" if lay["sequence_parallel"] else "") + (f", {lay['schedule']}" if lay["pp"] > 1 else ""),
            "one training step, busiest rank; rank grid tp fastest, then cp, dp, pp (a TP group is consecutive ranks)", ""]
    rows = [[i["axis"], i["op"], i["phase"], fmt_bytes(i["bytes_per_call"]), f"{i['calls_per_step']:,}", i["group_size"],
             f"{i['link_id']}" + (f" ×{i['nodes_spanned']} nodes" if i["nodes_spanned"] > 1 else ""),
             fmt_time(i["time_per_call_s"]), fmt_time(i["time_per_step_s"]), i["overlap"], i["regime"]]
            for i in doc["items"]]
    if not rows:
        return "\n".join(head + ["no collectives: a single GPU communicates nothing"])
    lines = head + [table(["axis", "collective", "phase", "bytes/call", "calls/step", "group", "link", "per call",
                           "per step", "overlap", "regime"], rows, align="llllrrllrll")]
    s = doc["summary"]
    lines += ["", kv_lines([("on the critical path", fmt_time(s["critical_s"]) + "  (compute waits for these)"),
                            ("overlappable", fmt_time(s["overlappable_s"]) + "  (hidden if compute lasts longer)"),
                            ("by axis", ", ".join(f"{k} {fmt_time(v)}" for k, v in s["by_axis_s"].items()))])]
    if doc.get("exposure"):
        eta = doc.get("overlap_efficiency", 0.0)
        erows = [[e["group"], "+".join(e["axes"]), fmt_time(e["total_s"]), fmt_time(e["hidden_s"]), fmt_time(e["exposed_s"]),
                  e["component"], e["rule"]] for e in doc["exposure"]]
        lines += ["", table(["group", "axes", "all calls", "hidden", "exposed", "estimate's part", "overlap rule"], erows,
                            title=f"what the step waits for (the estimate's step model, η = {eta:g}; step "
                                  f"{fmt_time(doc['step_time_s'])}, of it communication {fmt_time(s['exposed_s'])}):",
                            align="llrrrll")]
    risks = [f"{i['axis']} {i['op']} ({i['phase']}): {i['risk']}" for i in doc["items"] if i["risk"]]
    if risks:
        lines += ["", "risks:"] + [f"  {r}" for r in risks]
    lines += ["", "what each is:"] + [f"  {i['axis']} {i['op']} ({i['phase']}): {i['note']}" for i in doc["items"]]
    lines += ["", "sources: Megatron TP (Shoeybi 2019), SP (Korthikanti 2022), PP (Narayanan 2021), DDP (Li 2020), "
              "ZeRO (Rajbhandari 2019), ring attention (Liu 2023), GShard EP (Lepikhin 2020); times: α–β model per call, "
              "priced by the same functions as `shardlab estimate` (gradient buckets as one stream)"]
    return "\n".join(lines)


def render_inference(doc: dict) -> str:
    """Decode against prefill on the chosen link, then the same step on other links, then the lesson."""
    d, p = doc["decode"], doc["prefill"]
    head = (f"shardlab comm inference: {doc['model']} with TP = {doc['tp']} on {doc['gpu']} over {doc['link']}, "
            f"batch {doc['batch']}, prompt {doc['prompt_len']} tokens, decode at context {doc['context_len']}")

    def col(x):
        return [fmt_time(x["compute_time_s"]), fmt_time(x["memory_time_s"]), f"{x['comm_calls']} × {fmt_bytes(x['comm_bytes_per_call'])}",
                fmt_time(x["comm_call_s"]), fmt_time(x["comm_time_s"]), fmt_time(x["step_time_s"]),
                f"{100 * x['comm_fraction']:.1f}%", x["comm_regime"], x["bound"]]
    names = ["compute", "memory (HBM)", "all-reduces", "one all-reduce", "communication", "step",
             "communication share", "all-reduce regime", "compute/memory bound"]
    rows = [[n, a, b] for n, a, b in zip(names, col(d), col(p))]
    lines = [head, "", table(["per step, one rank", "decode", "prefill"], rows, align="lrr"), "",
             "decode:", *("  " + ln for ln in d["formula"].splitlines()),
             "prefill:", *("  " + ln for ln in p["formula"].splitlines()), ""]
    lrows = [[x["link"], fmt_time(x["decode"]["comm_call_s"]), fmt_time(x["decode"]["step_time_s"]),
              f"{100 * x['decode']['comm_fraction']:.1f}%", x["decode"]["comm_regime"],
              fmt_time(x["prefill"]["step_time_s"]), f"{100 * x['prefill']['comm_fraction']:.1f}%",
              x["prefill"]["comm_regime"]] for x in doc["links"]]
    lines += [table(["link", "decode all-reduce", "decode step", "decode comm", "regime", "prefill step", "prefill comm",
                     "regime"], lrows, title="the same steps on other links:", align="lrrrlrrl"), ""]
    lines += doc["verdict"]
    return "\n".join(lines)
