"""Pages for measurements and single answers: ``run train``, ``run infer``, ``bench collectives``,
``calibrate``, ``memory`` and ``estimate --inference``. Known keys get charts; every other key of the
document is shown by the generic renderer, so keys other commands add later (per-rank summaries,
serving metrics) appear without changes here."""

from __future__ import annotations

from shardlab.report.html import svg
from shardlab.report.html.layout_sections import MEMORY_CATS, gib_short
from shardlab.report.html.page import PALETTE, Page, esc, generic, gib, kv_table, num, table
from shardlab.units import fmt_bytes, fmt_time


def _rest(page: Page, doc: dict, shown: set[str], heading: str = "Everything else in the document") -> None:
    rest = {k: v for k, v in doc.items() if k not in shown}
    if rest:
        page.add("more", heading, generic(rest))


SPLIT = (("compute", "#4e79a7", "compute_s"), ("in collectives", "#f28e2b", "collectives_s"),
         ("waiting for other ranks", "#bab0ac", "wait_s"))
"""The parts of a rank's measured step (``observe.summary.rank_time_split``), with their colours."""


def _split_bars(ranks: list, ref: tuple[str, float] | None = None) -> str | None:
    """Each rank's measured step as compute + in collectives + waiting (stacked), against the prediction; None when a
    rank has no split (the caller draws whole steps)."""
    if not ranks or not all(r.get("time_split") for r in ranks):
        return None
    rows = [(f"rank {r['rank']}", [r["time_split"].get(k) or 0.0 for _, _, k in SPLIT]) for r in ranks]
    return svg.stacked_bars(rows, [(n, c) for n, c, _ in SPLIT], fmt_time, capacity=ref[1] if ref else None,
                            cap_label=ref[0] if ref else "", scale=1e-3)


def run_train_page(doc: dict) -> Page:
    lay = doc["layout"]
    page = Page(f"shardlab run train: {doc['strategy']} on {doc['world_size']} ranks ({doc['model']})",
                f"dp {lay['dp']} × tp {lay['tp']} × pp {lay['pp']}{f' (ep {ep})' if (ep := lay.get('ep', 1)) > 1 else ''}, "
                f"ZeRO-{lay['zero']}; measured with torch.distributed "
                f"beside the predictions")
    wl = doc["workload"]
    warned = "".join(f"<p class='bad'>warning: {esc(w)}</p>" for w in doc["launch"].get("warnings", []))
    ck, v = doc.get("checkpoint"), doc.get("vocab")
    extra = ([("weights from checkpoint", esc(f"{ck['path']} ({ck['family']}, {fmt_bytes(ck['checkpoint_bytes'])}); each "
                                              f"rank read only its shards: "
                                              + ", ".join(fmt_bytes(b) for b in ck['bytes_read_per_rank'])))] if ck else [])
    if v and v.get("padding_rows"):
        extra.append(("vocabulary padded for TP", esc(f"{v['vocab_size']:,} -> {v['padded_vocab_size']:,} (logits cut back)")))
    hf = (doc.get("parity") or {}).get("transformers")
    if hf:
        extra.append(("step-0 loss vs transformers", esc(f"{hf['run_loss']:.6f} vs {hf['loss']:.6f} (|err| "
                                                         f"{hf['abs_err']:.1e}): {'OK' if hf['ok'] else 'FAILED'}")))
    page.add("inputs", "What ran", warned + kv_table([(k.replace("_", " "), esc(num(v))) for k, v in wl.items()]
                                                     + extra + [("launch", esc(doc["launch"].get("summary", "")))]))
    st = doc.get("step_time") or {}
    ans = [("step time, measured", fmt_time(st["measured_median_s"]) if st.get("measured_median_s") else "-"),
           ("predicted", fmt_time(st["predicted_s"]) if st.get("predicted_s") else "-"),
           ("error", f"{100 * st['error']:+.0f}%" if st.get("error") is not None else "-"),
           ("model states", "= the memory model" if doc.get("memory_states_exact") else "DIFFER")]
    if doc.get("parity"):
        ans.append(("parity (step 0)", "OK" if doc["parity"].get("ok") else "FAILED"))
    page.answer(ans, "measured on this machine beside shardlab's prediction"
                + ("; the prediction uses a generic CPU core (see below)" if st.get("predicted_catalog_gpu") == "cpu-core"
                   else "; the prediction uses this machine's probe (see below)" if st.get("probe") else ""))
    ranks = doc["ranks"]
    if any(r.get("step_time_s") for r in ranks):
        ref = ("predicted", st["predicted_s"]) if st.get("predicted_s") else None
        chart = _split_bars(ranks, ref) or svg.bars([(f"rank {r['rank']}", r["step_time_s"] or 0.0) for r in ranks],
                                                    fmt_time, ref=ref)
        summary = (f"<p>measured median {fmt_time(st.get('measured_median_s') or 0)}, slowest rank {st.get('slowest_rank')} "
                   f"({fmt_time(st.get('slowest_s') or 0)}), spread {100 * (st.get('spread') or 0):.1f}%; predicted "
                   f"{fmt_time(st.get('predicted_s') or 0)} ({esc(st.get('predicted_from', ''))})"
                   + (f", error {100 * st['error']:+.0f}%" if st.get("error") is not None else "") + "</p>")
        if st.get("predicted_catalog_gpu") == "cpu-core":
            summary += ("<p class='note'>the prediction uses the catalog's generic CPU core (cpu-core), not this machine: "
                        "without <code>--no-probe</code> run train measures this machine (rates and the runtime's host "
                        "time) and predicts from that (docs/calibration.md); CPU runs also share the cores with the "
                        "other ranks</p>")
        elif st.get("probe"):
            pr = st["probe"]
            summary += (f"<p class='note'>the prediction uses this machine's probe, {'measured for this run' if pr.get('fresh') else 'cached'} "
                        f"({esc(str(pr.get('measured_at', '')))}): GEMM, memory-bound and collective rates measured on "
                        "these cores, and the runtime's host time per block fitted to a reference model's step under "
                        "the same strategy (docs/calibration.md)</p>")
        page.add("step-times", "Step time per rank: measured vs predicted", summary + chart)
    from shardlab.runtime.observe.report import slowest_line

    line = slowest_line(doc.get("slowest"), "step") if doc.get("world_size", 1) > 1 else None
    if line:
        page.add("slowest", "The slowest rank", f"<p>{esc(line)}</p>")
    if doc.get("observability"):             # percentiles, the straggler verdict in sentences (as the terminal shows)
        from shardlab.runtime.observe.report import render_observability

        page.add("observability", "Per-rank step-time percentiles and the straggler",
                 f"<pre style='white-space:pre-wrap'>{esc(render_observability(doc['observability']))}</pre>")
    page.add("collectives", "Collectives by op", _collectives(ranks))
    if doc.get("expert_dispatch"):
        page.add("expert-dispatch", "Expert dispatch: measured vs comm plan", _expert_dispatch(doc["expert_dispatch"]))
    cmp = doc.get("memory_comparison") or []
    if cmp:
        cats = [c for c, _ in MEMORY_CATS if c != "other"]
        rows = []
        for m in cmp:
            rows.append((f"rank {m['rank']} predicted", [m["predicted"].get(c, 0) for c in cats]))
            rows.append((f"rank {m['rank']} measured", [m["measured"].get(c, 0) for c in cats]))
        colors = [(c, col) for c, col in MEMORY_CATS if c != "other"]
        chart = svg.stacked_bars(rows, colors, lambda b: f"{b / 2**20:.3g} MiB", label_w=170, scale=2**20)
        trows = [[m["rank"], *(f"{fmt_bytes(m['predicted'].get(c, 0))} / {fmt_bytes(m['measured'].get(c, 0))}" for c in cats),
                  "exact" if m.get("states_exact") else "DIFFERS", f"{100 * (m.get('activations_error') or 0):+.0f}%"]
                 for m in cmp]
        page.add("memory", "Memory per rank: measured vs predicted", chart
                 + table(["rank", *(f"{c} (pred / meas)" for c in cats), "model states", "activations error"], trows)
                 + "".join(f"<p class='note'>{esc(n)}</p>" for n in doc.get("memory_notes", [])))
    if doc.get("losses"):
        page.add("losses", "Loss per step", table(["step", "loss"], [[i, f"{v:.5f}"] for i, v in enumerate(doc["losses"])]))
    _rest(page, doc, {"strategy", "world_size", "model", "layout", "workload", "ranks", "step_time", "memory_comparison",
                      "losses", "launch", "predicted", "measured", "memory_notes", "microbatches", "expert_dispatch",
                      "slowest", "observability"})
    page.add("ranks", "Per-rank measurements", generic(ranks))
    return page


def _expert_dispatch(rows: list[dict]) -> str:
    """The dispatcher's collectives per step on every rank beside `comm plan`'s (``runtime.compare.expert_dispatch``)."""
    def b(x):
        return "-" if x is None else fmt_bytes(x)

    body = [[r["collective"].replace("_", "-").replace("/", " "), f"{r['measured_calls']} / {r['predicted_calls']}",
             f"{b(r['measured_bytes_per_call'])} / {b(r['predicted_bytes_per_call'])}", "yes" if r["match"] else "NO"]
            for r in rows]
    return ("<p>Per step, on every rank. Routing makes each rank's all-to-alls uneven; every token copy crosses once "
            "each way, so their bytes averaged over ranks and calls equal the plan's b·s·k·h (balanced routing).</p>"
            + table(["collective", "calls (measured / plan)", "bytes per call (measured average / plan)", "match"], body))


def _collectives(ranks: list[dict]) -> str:
    """Per op and phase: count, bytes and time on each rank (from each rank's ``collectives``)."""
    rows, totals = [], {}
    for r in ranks:
        for op, phases in (r.get("collectives") or {}).items():
            for phase, v in phases.items():
                rows.append([r["rank"], op, phase, f"{v['count']:,}", fmt_bytes(v["bytes"]), fmt_time(v["time_s"])])
                if r["rank"] == ranks[0]["rank"]:
                    totals[f"{op} {phase}"] = v["time_s"]
    if not rows:
        return "<p>No collectives were recorded.</p>"
    chart = svg.bars(sorted(totals.items(), key=lambda kv: -kv[1]), fmt_time, color=PALETTE[1], label_w=200)
    zero = any(row[3] != "0" and row[5] == fmt_time(0.0) for row in rows)
    note = ("<p class='note'>A time of 0 with calls: the collective was issued asynchronously (DTensor, FSDP2 "
            "prefetch) and its wait is counted where the result is first used, inside compute.</p>" if zero else "")
    return (f"<p>Time in each collective on rank {ranks[0]['rank']}:</p>{chart}"
            + table(["rank", "op", "phase", "calls", "bytes", "time"], rows) + note)


def run_infer_page(doc: dict) -> Page:
    if "points" in doc:
        page = Page(f"shardlab run infer --sweep: {doc['model']}", f"{doc['strategy']}, {doc.get('cpu_cores')} CPU cores")
        rows = [(f"TP {p['tp']}", p["latency_per_token_s"]) for p in doc["points"]]
        page.add("latency", "Latency per token by TP degree", svg.bars(rows, fmt_time) + generic(doc["points"]))
        _rest(page, doc, {"model", "strategy", "points", "cpu_cores"})
        return page
    pp = doc.get("pp", 1)
    page = Page(f"shardlab run infer: {doc['model']} on TP {doc['tp']}{f' x PP {pp}' if pp > 1 else ''}",
                f"{doc['strategy']}; greedy decoding with a paged KV cache")
    for w in (doc.get("launch") or {}).get("warnings", []):
        page.add("warning", "Warning", f"<p class='bad'>warning: {esc(w)}</p>")
    ck = doc.get("checkpoint")
    items = [("tokens", esc(doc["tokens"]))]
    if ck:
        reads = ", ".join(fmt_bytes(b) for b in ck["bytes_read_per_rank"])
        items += [("checkpoint", esc(f"{ck['path']} ({ck['family']}, {'/'.join(ck['dtypes'])}, "
                                     f"{fmt_bytes(ck['checkpoint_bytes'])})")),
                  ("bytes each rank read", esc(f"{reads} = {ck['read_ratio']:.2f}x the file")),
                  ("identical to transformers' generate", esc(num(doc.get("matches_transformers"))))]
    else:
        items += [("text (bytes of an untrained model)", esc(doc["text"])), ("identical to TP 1", esc(num(doc["matches_tp1"])))]
    v = doc.get("vocab")
    if v and v["padding_rows"]:
        items.append(("vocabulary padded for TP", esc(f"{v['vocab_size']:,} -> {v['padded_vocab_size']:,} "
                                                     f"({v['rows_per_rank']:,} rows per rank; logits cut back)")))
    items += [("ranks agree", esc(num(doc["ranks_agree"]))), ("latency per token (slowest rank)", fmt_time(doc["latency_per_token_s"])),
              ("memory", "matches the model exactly" if doc["memory_exact"] else "DIFFERS from the model")]
    page.add("summary", "Result", kv_table(items))
    same = doc.get("matches_transformers") if doc.get("matches_transformers") is not None else doc.get("matches_tp1")
    page.answer([("tokens identical to " + ("transformers" if doc.get("matches_transformers") is not None else "TP 1"),
                  "yes" if same else ("not checked" if same is None else "NO")),
                 ("per token (slowest rank)", fmt_time(doc["latency_per_token_s"])),
                 ("memory", "= the memory model" if doc["memory_exact"] else "DIFFERS")])
    pred = doc["predicted"]
    per_stage = pred.get("weight_bytes_per_stage", [pred["weight_bytes"]])
    kvb = pred.get("kv_blocks")
    kv_pred = [kvb["blocks"] * b for b in kvb["bytes_per_block_per_stage"]] if kvb else [pred["kv_cache_bytes"]] * len(per_stage)
    rows = [[r["rank"], r.get("stage", 0), f"{fmt_bytes(per_stage[r.get('stage', 0)])} / {fmt_bytes(r['weight_bytes'])}",
             f"{fmt_bytes(kv_pred[r.get('stage', 0)])} / {fmt_bytes(r['kv_cache_bytes'])}", fmt_time(r["prefill_s"]),
             fmt_time(r["latency_per_token_s"])] for r in doc["ranks"]]
    page.add("ranks", "Per rank: memory predicted / measured, times measured",
             "<h3>Measured latency per token</h3>"
             + (_split_bars(doc["ranks"]) or svg.bars([(f"rank {r['rank']}", r["latency_per_token_s"]) for r in doc["ranks"]],
                                                      fmt_time))
             + table(["rank", "stage", "weights (predicted / measured)", "KV cache (predicted / measured)",
                      "prefill (measured)", "per token (measured)"], rows)
             + f"<p class='note'>prediction: {esc(pred['source'])}</p>")
    page.add("collectives", "Collectives by op", _collectives(doc["ranks"]))
    _rest(page, doc, {"model", "tp", "pp", "strategy", "tokens", "text", "matches_tp1", "ranks_agree", "ranks", "predicted",
                      "memory_exact", "latency_per_token_s", "checkpoint", "matches_transformers", "vocab",
                      "generated_token_ids"})
    return page


def bench_page(doc: dict) -> Page:
    page = Page(f"shardlab bench collectives: {doc['world_size']} ranks, {doc['backend']} on {doc['device']}",
                f"torch {doc.get('torch_version', '')}; nccl-tests conventions (algbw, busbw)")
    _collective_sections(page, doc)
    _rest(page, doc, {"backend", "device", "world_size", "torch_version", "rows", "fits", "fit_errors", "model"})
    return page


def _collective_sections(page: Page, doc: dict) -> None:
    """busbw by size per op and the α–β fits of a ``bench collectives`` document."""
    ops = list(dict.fromkeys(r["op"] for r in doc["rows"]))
    series = [(f"{op} (measured)", [r["size_bytes"] for r in doc["rows"] if r["op"] == op],
               [r["busbw_gbps"] for r in doc["rows"] if r["op"] == op], PALETTE[i % len(PALETTE)], "markers")
              for i, op in enumerate(ops)]
    for i, op in enumerate(ops):   # the α–β fit, as `bench collectives --plot` draws it: busbw scales as 1 / time
        fit = [r for r in doc["rows"] if r["op"] == op and r.get("fitted_time_s") and r["time_s"]]
        if fit:
            series.append((f"{op} (α–β fit)", [r["size_bytes"] for r in fit],
                           [r["busbw_gbps"] * r["time_s"] / r["fitted_time_s"] for r in fit],
                           PALETTE[i % len(PALETTE)] + "88"))
    # sizes are powers of two (as `bench collectives --plot` labels them): KiB/MiB ticks
    chart = svg.line_chart(series, lambda x: fmt_bytes(x).replace(".00 ", " "), lambda y: f"{y:.3g}", "message size",
                           "busbw (GB/s)", tick_base=8)
    rows = [[r["op"], fmt_bytes(r["size_bytes"]), fmt_time(r["time_s"]), f"{r['algbw_gbps']:.4g}", f"{r['busbw_gbps']:.4g}",
             fmt_time(r["fitted_time_s"]) if r.get("fitted_time_s") else "—"] for r in doc["rows"]]
    page.add("busbw", "Bus bandwidth by message size", chart
             + "<details><summary>every measurement</summary>"
             + table(["op", "size", "time", "algbw GB/s", "busbw GB/s", "α–β fit"], rows) + "</details>")
    fits = [[f["op"], f["world_size"], f"{f['latency_us']:.3g} µs", f"{f['beta_gbps']:.4g} GB/s", f"{100 * f['rel_rms']:.1f}%",
             f["points"]] for f in (doc.get("fits") or {}).values() if isinstance(f, dict) and "beta_gbps" in f]
    page.add("fits", "α–β fits", (table(["op", "ranks", "α", "β", "rms error", "points"], fits) if fits else "")
             + f"<p class='note'>{esc(doc.get('model', ''))}</p>"
             + "".join(f"<p class='note'>{esc(k)}: {esc(v)}</p>" for k, v in (doc.get("fit_errors") or {}).items()))


def calibrate_page(doc: dict) -> Page:
    page = Page("shardlab calibrate: hardware profile", f"written to {doc.get('profile_path', '')}: measured efficiencies "
                                                        f"and links, as a catalog the estimate reads (--profile)")
    if "profile" in doc:
        page.add("profile", "Profile", generic(doc["profile"]))
    mm = doc.get("matmul")
    if mm and mm.get("rows"):
        from shardlab.units import flops_scale

        scale, unit = flops_scale(max(r["tflops"] for r in mm["rows"]))     # as `bench matmul --plot` shows it
        rows = [(f"{r['gemm']} h={r['hidden']} M={r['tokens']}", r["tflops"] * scale) for r in mm["rows"]]
        fit = mm.get("fit") or {}
        peak = mm.get("peak_tflops")
        page.add("matmul", f"Matmul: achieved {unit}", svg.bars(rows, lambda v: f"{v:.3g} {unit}", label_w=220,
                                                               ref=("peak", peak * scale) if peak else None)
                 + (f"<p>fitted efficiency {fit['max_fraction']:.3g}·n/(n+{fit['half_size']:.3g}) of peak, "
                    f"n = min(M, N, K), rms error "
                    f"{100 * fit['rel_rms']:.1f}% over {fit['points']} points</p>" if "max_fraction" in fit else "")
                 + generic({k: v for k, v in mm.items() if k != "rows"}))
    if doc.get("collectives", {}).get("rows"):
        _collective_sections(page, doc["collectives"])
    _rest(page, doc, {"profile", "matmul", "collectives", "profile_path"}, "Measurements and fits")
    return page


def memory_page(doc: dict) -> Page:
    lay = doc["layout"]
    page = Page(f"shardlab memory: {doc['model']['name']}" + (f" on {doc['gpu']}" if doc.get("gpu") else ""),
                f"dp {lay['dp']} × tp {lay['tp']} × pp {lay['pp']} × cp {lay['cp']}, ZeRO-{lay['zero']}, "
                f"{doc['precision']}, {doc['optimizer']}")
    stages = doc["stages"]
    rows = [(f"stage {s['stage']}" if len(stages) > 1 else "every rank", [s.get(c, 0) for c, _ in MEMORY_CATS]) for s in stages]
    chart = svg.stacked_bars(rows, MEMORY_CATS, gib_short, capacity=doc.get("capacity_bytes"), cap_label="GPU memory",
                             scale=2**30, cap_fmt=gib)
    pg = doc["per_gpu"]
    cap = doc.get("capacity_bytes")
    ans = [("per GPU", gib(pg["total"]))]
    if cap:
        ans += [("GPU memory", gib(cap)), ("headroom", f"{gib(cap - pg['total'])} ({100 * (1 - pg['total'] / cap):.1f}%)"),
                ("fits", "yes" if doc.get("fits") else "NO")]
    page.answer(ans, "the worst rank's bytes; the exact per-tensor count below")
    expl = doc.get("explain", {})
    trows = [[k, gib(pg[k]), expl.get(k, "")] for k in ("weights", "gradients", "optimizer", "model_states", "activations",
                                                         "other", "total") if k in pg]
    verdict = ("" if doc.get("fits") is None else
               f"<p class='{'ok' if doc['fits'] else 'bad'}'>{'fits' if doc['fits'] else 'DOES NOT FIT'}: worst rank "
               f"{doc['worst_rank']['rank']} ({esc(doc['worst_rank']['reason'])})</p>")
    page.add("memory", "Memory per rank", verdict + chart + table(["category", "GiB", "where it comes from"], trows))
    if pg.get("other_breakdown"):
        page.add("overheads", "Overheads of the worst rank", table(["overhead", "size"], [[k, fmt_bytes(v)] for k, v in
                                                                                         pg["other_breakdown"].items()]))
    _rest(page, doc, {"per_gpu", "stages", "capacity_bytes", "fits", "worst_rank", "explain", "layout", "precision",
                      "optimizer", "gpu"})
    return page


def inference_page(doc: dict) -> Page:
    page = Page(f"shardlab estimate --inference: {doc['model']} on TP {doc['tp']} × PP {doc['pp']} {doc['gpu']}",
                f"batch {doc['batch']}, prompt {doc['prompt_len']} + output {doc['output_len']} tokens; estimates "
                f"(roofline of compute vs HBM traffic plus TP all-reduces)")
    mem = doc["memory"]
    pg = mem["per_gpu"]
    cats = [(k, PALETTE[i]) for i, k in enumerate(k for k in pg if k != "total")]
    chart = svg.stacked_bars([("per GPU", [pg[k] for k, _ in cats])], cats, gib_short,
                             capacity=mem.get("usable_bytes"), cap_label="usable", scale=2**30,
                             cap_fmt=gib)
    nofit = ("" if mem.get("fits", True) else
             f"<p class='bad'>DOES NOT FIT: {gib(pg['total'])} per GPU against {gib(mem['usable_bytes'])} usable; the "
             f"latencies below are for a layout that cannot run (raise --tp or --pp, or `shardlab plan --inference`)</p>")
    page.add("memory", "Memory per GPU", nofit + chart + kv_table([(k, gib(v)) for k, v in pg.items()]
                                                            + [("capacity", gib(mem["capacity_bytes"])),
                                                               ("usable", gib(mem["usable_bytes"]))]))
    phases = [(ph, doc[ph]) for ph in ("prefill", "decode") if isinstance(doc.get(ph), dict)]
    parts = []
    for ph, d in phases:
        step = d.get("step_s", d.get("step_time_s"))
        arms = ("weights_read_s", "gemm_compute_s")   # the two sides of the linear layers' roofline, not parts
        rows = [(k.removesuffix("_s").removesuffix("_time").replace("_", " "), v) for k, v in d.items()
                if k.endswith("_s") and k not in ("step_s", "step_time_s", *arms) and isinstance(v, (int, float))]
        roof = (f"<p class='note'>linear = max(weights read {fmt_time(d['weights_read_s'])}, GEMM compute "
                f"{fmt_time(d['gemm_compute_s'])}): the parts above add up to the step.</p>"
                if all(isinstance(d.get(a), (int, float)) for a in arms) else "")
        whole = doc.get("prefill_s" if ph == "prefill" else "decode_s_per_token")
        what = "the request's prefill" if ph == "prefill" else "per output token"
        # with pipeline stages the request's figure (the table above) is not one engine step (the bars)
        step_txt = (f"one engine step {fmt_time(step)} (the bars); {what} {fmt_time(whole)} across {doc.get('pp')} "
                    f"pipeline stages" if isinstance(whole, (int, float)) and step and abs(whole - step) > 1e-3 * step
                    else fmt_time(step))
        parts.append(f"<h3>{ph} ({esc(d.get('bound', ''))}-bound): {step_txt}</h3>"
                     + svg.bars(rows, fmt_time) + roof + (f"<pre>{esc(d['formula'])}</pre>" if d.get("formula") else ""))
    head = kv_table([("request latency", fmt_time(doc["request_latency_s"])), ("prefill", fmt_time(doc["prefill_s"])),
                     ("decode per token", fmt_time(doc["decode_s_per_token"])),
                     ("throughput", f"{doc['tokens_per_s']:,.0f} generated tokens/s"), ("largest batch", f"{doc['max_batch']:,}")])
    page.add("latency", "Prefill and decode", head + "".join(parts))
    if doc.get("tp_vs_replicas"):
        page.add("tp-vs-replicas", "TP group or replicas?", generic(doc["tp_vs_replicas"]))
    _rest(page, doc, {"model", "gpu", "tp", "pp", "batch", "prompt_len", "output_len", "memory", "prefill", "decode",
                      "request_latency_s", "prefill_s", "decode_s_per_token", "tokens_per_s", "max_batch", "tp_vs_replicas"})
    return page


def inference_plan_page(doc: dict) -> Page:
    page = Page(f"shardlab plan --inference: {doc['model']} on {doc['gpus']} × {doc['gpu']}",
                f"{doc['batch']} concurrent requests of {doc['prompt_len']} + {doc['output_len']} tokens, objective "
                f"{doc['objective']}; estimates")
    rows = [(f"TP {p['tp']} × PP {p['pp']} × {p['replicas']}", p["tokens_per_s"]) for p in doc["plans"]]
    page.add("plans", "Plans", svg.bars(rows, lambda v: f"{v:,.0f} tok/s", label_w=200) + generic(doc["plans"]))
    _rest(page, doc, {"plans"})
    return page


def generic_page(doc: dict, title: str) -> Page:
    page = Page(title, "every key of the JSON document")
    page.add("document", "Document", generic(doc))
    return page
