"""Pages for serving under load: ``estimate --inference --serve`` (one layout: steady state, simulated
percentiles, KV-cache blocks, where the load limit binds) and ``plan --inference --serve`` (the layouts searched,
the best one simulated). Drawn from the JSON document; keys not shown here appear in the generic section."""

from __future__ import annotations

from shardlab.report.html import svg
from shardlab.report.html.layout_sections import gib_short
from shardlab.report.html.page import PALETTE, Page, esc, generic, gib, kv_table, num, table
from shardlab.units import fmt_bytes, fmt_time


def _load_text(load: dict) -> str:
    if load.get("concurrency") is not None:
        return f"{load['concurrency']:,} requests in flight (closed loop)"
    if load.get("arrival_rate") is not None:
        return f"{num(load['arrival_rate'])} requests/s arriving (Poisson)"
    return "no load given"


def _ms(v) -> str:
    return "—" if v is None else fmt_time(v)


def _target(slo_s, load, unit: str) -> str:
    if slo_s is None:
        return "none given (--ttft-slo / --tpot-slo)"
    return f"{_ms(slo_s)}: met up to {num(load)} {esc(unit)}" if load is not None else f"{_ms(slo_s)}: not met at any load"


def _percentiles(sim: dict | None, replicas: int = 1) -> str:
    """The simulation's mean / p50 / p99 of TTFT, TPOT and end-to-end latency, as a table and bars. The simulation
    runs one replica: with ``replicas`` > 1 its throughput is said to be one replica's."""
    if not sim:
        return "<p>No simulation in this document.</p>"
    rows, panels = [], []
    for key, name, short in (("ttft_s", "time to first token", "TTFT"), ("tpot_s", "time per output token", "TPOT"),
                             ("e2e_s", "end to end", "")):
        d = sim.get(key) or {}
        rows.append([name, _ms(d.get("mean")), _ms(d.get("p50")), _ms(d.get("p99"))])
        bars = [(f"{short} {q}", d[q]) for q in ("p50", "p99") if isinstance(d.get(q), (int, float))]
        if short and bars:      # one panel per latency: TTFT's seconds would flatten TPOT's milliseconds on one axis
            panels.append(f"<h3>{name}: p50 and p99</h3>" + svg.bars(bars, fmt_time, label_w=170))
    note = (f"<p class='note'>{sim.get('requests', 0):,} simulated requests, {sim.get('cycles', 0):,} scheduling cycles, "
            f"{sim.get('preemptions', 0):,} preemptions{'; truncated at its cycle bound' if sim.get('truncated') else ''}; "
            f"{num(sim.get('output_tokens_per_s', 0))} output tokens/s"
            + (f" for one replica (× {replicas} replicas = {num(replicas * sim.get('output_tokens_per_s', 0))})"
               if replicas > 1 else "") + ".</p>")
    return table(["latency", "mean", "p50", "p99"], rows) + "".join(panels) + note


def serve_estimate_page(doc: dict) -> Page:
    from shardlab.serving.moe import plan_label

    page = Page(f"shardlab estimate --inference --serve: {doc['model']} on {plan_label(doc)} {doc['gpu']}",
                f"{esc(doc['engine'])}, {doc['prompt_len']} + {doc['output_len']} tokens per request, "
                f"{_load_text(doc.get('load') or {})}; {esc(doc.get('precision', ''))}; estimates")
    ss, cu = doc.get("steady_state") or {}, doc.get("capacity_under_slo")
    if cu:                                   # --slo-percentile: the layout's capacity under the targets leads
        stat = esc(cu.get("statistic", ""))
        page.answer([("capacity under the targets", f"{num(cu.get('max_request_rate'))} requests/s"),
                     ("goodput", f"{num(cu.get('goodput_tokens_per_s_per_gpu'))} tokens/s per GPU"),
                     (f"{stat} TTFT there", _ms(cu.get("ttft_s"))), (f"{stat} TPOT there", _ms(cu.get("tpot_s")))],
                    f"the largest Poisson rate whose {stat} latencies meet the targets (MLPerf Inference Server's "
                    f"measure); the rest of the page is priced at that rate")
    else:
        page.answer([("time to first token", _ms(ss.get("ttft_s"))), ("time per output token", _ms(ss.get("tpot_s"))),
                     ("output tokens/s", num(ss.get("output_tokens_per_s"))), ("in flight", num(ss.get("in_flight")))],
                    "the steady state (continuous batching); percentiles from the simulation below")
    if cu:
        targets = "; ".join(f"{name} ≤ {_ms(cu[key])}" for key, name in (("ttft_slo_s", "TTFT"), ("tpot_slo_s", "TPOT"))
                            if cu.get(key) is not None)
        filled = cu.get("filled")
        page.add("capacity", "Capacity under the targets", kv_table([
            ("targets", f"{esc(targets)} ({stat})"),
            ("most requests/s meeting them", f"{num(cu.get('max_request_rate'))}"
                                             + ("" if cu.get("settled", True) else
                                                f" (the search stopped at its budget: below {num(cu.get('bracket_upper_rate'))})")),
            ("what binds just above it", esc(cu.get("binds", ""))),
            ("in flight there (Little's law)", num(cu.get("max_concurrency"))),
            ("goodput", f"{num(cu.get('goodput_tokens_per_s_per_gpu'))} output tokens/s per GPU"),
            ("p50 capacity (steady-state means)", f"{num(cu.get('p50_rate'))} requests/s; saturation "
                                                  f"{num(cu.get('saturation_rate'))}"),
            ("how it was found", esc(cu.get("method", ""))),
            *([("the accepted run's fill", f"{filled:.0%} of the steady state's sequences in flight"
                + ("" if filled >= 0.9 else " <span class='bad'>(a lighter load: an upper bound)</span>"))]
              if isinstance(filled, (int, float)) else [])]))
    over = bool(ss.get("overloaded"))
    unbounded = "<span class='bad'>unbounded</span>"
    banner = ("<p class='bad'>Overloaded: arrivals exceed what the replica completes; the queue (and the time to "
              "first token) grows without bound. Lower the load or add replicas.</p>" if over else "")
    page.add("steady-state", "Steady state (continuous batching)", banner + kv_table([
        ("time to first token", unbounded if over else _ms(ss.get("ttft_s"))),
        ("time per output token", _ms(ss.get("tpot_s"))),
        ("end to end", unbounded if over else _ms(ss.get("e2e_s"))),
        ("output tokens/s", num(ss.get("output_tokens_per_s"))),
        ("requests/s", num(ss.get("requests_per_s"))), ("in flight", num(ss.get("in_flight"))),
        ("queueing", unbounded if over else _ms(ss.get("queue_s"))), ("overloaded", "yes" if over else "no")]))
    page.add("simulation", "Simulated percentiles", _percentiles(doc.get("simulation")))
    if doc.get("ep", 1) > 1 and doc.get("experts"):
        from shardlab.report.html.experts import experts_svg

        page.add("experts", "Experts per GPU", experts_svg(doc, doc["tp"], doc.get("gpus_per_node") or 8))
    kv = doc.get("kv_blocks") or {}
    if kv.get("capacity_bytes"):
        cats = [(name, PALETTE[i]) for i, name in enumerate(("weights", "activations", "other", "KV cache", "held back"))]
        parts = [kv.get("weights_bytes", 0), kv.get("activation_bytes", 0), kv.get("other_bytes", 0),
                 kv.get("kv_bytes", 0), max(kv["capacity_bytes"] - kv.get("reserved_bytes", kv["capacity_bytes"]), 0)]
        chart = svg.stacked_bars([("per GPU", parts)], cats, gib_short, capacity=kv["capacity_bytes"], scale=2**30,
                                 cap_fmt=gib)
        page.add("kv-cache", "KV-cache blocks", chart + kv_table([
            ("blocks", f"{kv.get('num_blocks', 0):,} of {kv.get('block_size', 0)} tokens ({fmt_bytes(kv.get('bytes_per_block', 0))} "
                       f"each)"), ("the engine's share", f"{gib(kv.get('reserved_bytes', 0))} (the rest is held back: "
                                                         f"gpu-memory-utilization)"), ("tokens cached", f"{kv.get('tokens', 0):,}"), ("KV cache", gib(kv.get("kv_bytes", 0))),
            ("capacity", gib(kv["capacity_bytes"]))]))
    lim, cap, slo = doc.get("limits") or {}, doc.get("capacity") or {}, doc.get("slo") or {}
    page.add("limits", "Where the load limit binds", kv_table([
        ("sequences a replica holds", f"{num(cap.get('sequences'))} (bound: {esc(cap.get('bound', ''))})"),
        ("saturation", f"{num(lim.get('saturation_rate'))} requests/s (bound: {esc(lim.get('bound', ''))})"),
        ("TTFT target", _target(slo.get("ttft_s"), lim.get("ttft_slo_load"), lim.get("unit", ""))),
        ("TPOT target", _target(slo.get("tpot_s"), lim.get("tpot_slo_load"), lim.get("unit", ""))),
        ("targets met", ("yes" if slo.get("met") else "<span class='bad'>no</span>")
         if slo.get("ttft_s") is not None or slo.get("tpot_s") is not None else "no targets given (--ttft-slo, --tpot-slo)")]))
    rest = {k: v for k, v in doc.items() if k not in {"steady_state", "simulation", "kv_blocks", "limits", "capacity", "slo",
                                                       "capacity_under_slo"}}
    page.add("more", "Everything else in the document", generic(rest))
    return page


def serve_plan_page(doc: dict) -> Page:
    if "capacity" in doc:                    # no load given: the capacity under the targets (its own page)
        from shardlab.report.html.capacity_page import capacity_plan_page

        return capacity_plan_page(doc)
    slo = doc.get("slo") or {}
    targets = "; ".join(f"{name} ≤ {_ms(slo[key])}" for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"))
                        if slo.get(key) is not None) or "no latency targets"
    page = Page(f"shardlab plan --inference --serve: {doc['model']} on {doc['gpus']} × {doc['gpu']}",
                f"{esc(doc['engine'])}, {doc['prompt_len']} + {doc['output_len']} tokens per request, "
                f"{_load_text(doc.get('load') or {})}, {esc(targets)}, objective {esc(doc['objective'])}; estimates")
    plans = doc.get("plans") or []
    from shardlab.report.html.capacity_page import _replicas

    rows = [[_replicas(p),
             f"{p['max_num_seqs']:,}", num(p.get("capacity_per_replica")), num(p["in_flight_per_replica"]),
             _ms(p["ttft_s"]), _ms(p["tpot_s"]), num(p["output_tokens_per_s"]), f"{p['kv_blocks_per_gpu']:,}",
             "yes" if p.get("meets_slo") else "no"] for p in plans]
    chart = svg.bars([(r[0], p["output_tokens_per_s"]) for r, p in zip(rows, plans)], lambda v: f"{v:,.0f} tok/s",
                     label_w=200) if plans else "<p>No layout serves this load.</p>"
    page.add("plans", "Layouts, best first", chart + table(
        ["layout", "max seqs", "sequences a replica holds", "in flight", "TTFT", "TPOT", "output tokens/s", "KV blocks/GPU",
         "meets targets"], rows))
    best = (doc.get("plans") or [{}])[0]
    page.add("simulation", "The best layout, simulated", _percentiles(doc.get("best_simulated"), best.get("replicas", 1)))
    rest = {k: v for k, v in doc.items() if k not in {"plans", "best_simulated"}}
    page.add("more", "Everything else in the document", generic(rest))
    return page
