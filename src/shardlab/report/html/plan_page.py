"""The plan and training-estimate pages: inputs, the worksheet with its risk column, the rank map, memory,
the step waterfall, the pipeline timeline, the top plans side by side and the TP block diagram."""

from __future__ import annotations

from shardlab.report.html import layout_sections as ls
from shardlab.report.html import svg
from shardlab.report.html.page import Page, esc, generic, gib, kv_table, num, table
from shardlab.units import fmt_bytes, fmt_count, fmt_time


def layout_text(lay: dict) -> str:
    """'dp32 tp2 pp1 z3 mb1 sp' (same as the terminal's planner.report._layout_str)."""
    from shardlab.planner.report import _layout_str

    return _layout_str(lay)


def _inputs(doc: dict, cluster: dict, extra: list[tuple[str, str]]) -> str:
    wl = doc["workload"]
    pairs = [("model", doc["model"]), ("GPUs", f"{doc['gpus']} × {doc['gpu']}"),
             ("GPUs per node", cluster["gpus_per_node"]), ("links", f"{cluster['intra_link']} inside a node, "
                                                                    f"{cluster['inter_link']} between nodes"),
             ("sequence length", f"{wl['seq_len']:,} tokens"), ("global batch",
                                                                f"{wl['global_batch']:,} sequences ({fmt_count(wl['tokens_per_step'])} tokens per step)"),
             ("precision", wl["precision"]), ("optimizer", wl["optimizer"]), *extra]
    fw = doc.get("framework")
    if isinstance(fw, dict) and fw.get("id"):
        pairs.append(("framework", f"{fw['id']}: {fw.get('kernels', '?')} kernels, {fw.get('attention_kernel', '?')} attention, "
                                   f"host {1e3 * (fw.get('layer_host_s') or 0):.1f} ms per block pass"
                                   + (f" and {1e3 * fw['pipeline_host_s']:.1f} ms per micro-batch, pass and stage of its "
                                      "pipeline engine" if fw.get("pipeline_host_s") and doc.get("layout", {}).get("pp", 1) > 1
                                      else "")
                                   + " (catalog/data/frameworks.yaml has the sources)"))
    assume = doc.get("assumptions") or {}
    pairs += [(k.replace("_", " "), num(v) if not isinstance(v, str) else v) for k, v in assume.items() if v is not None]
    return kv_table([(k, esc(v)) for k, v in pairs])


def _worksheet(doc: dict) -> str:
    rows = [[a["axis"], a["value"], a["placement"], a["reason"], a.get("risk", "")] for a in doc["worksheet"]]
    ws = table(["axis", "choice", "placement", "why (best alternative the search scored)", "risk"], rows, cls="ws")
    ru = doc.get("runner_up")
    ru_text = ""
    if ru:
        diff = ", ".join(f"{k} {v}" for k, v in ru["differs_in"].items())
        ru_text = f"<p>Runner-up ({esc(diff)}) lost: {esc(ru['why'])}</p>"
    return ws + ru_text + comm_table(doc.get("communication") or [])


def comm_table(comm: list[dict]) -> str:
    if not comm:
        return ""
    rows = [[c["axis"], c["op"], c["phase"], fmt_bytes(c["bytes_per_call"]), f"{c['calls_per_step']:,}", c["group_size"],
             c["link_id"], fmt_time(c["time_per_step_s"]), c["overlap"], c.get("risk", "")] for c in comm]
    return ("<h3>Communication of the layout</h3>"
            + table(["axis", "collective", "phase", "bytes/call", "calls/step", "group", "link", "time/step", "overlap", "risk"],
                    rows, cls="comm"))


def _plans(doc: dict) -> str:
    plans = doc["plans"]
    keys = [k for k in dict.fromkeys(k for p in plans for k in p["breakdown"])
            if any(p["breakdown"].get(k, 0.0) > 1e-9 for p in plans)]
    head = ["", *(f"#{i + 1}" for i in range(len(plans)))]
    rows = [["layout", *(layout_text(p["layout"]) for p in plans)],
            ["micro-batches", *(p["layout"]["microbatches"] for p in plans)],
            ["step time", *(f"{p['step_time_s']:.3f} s" for p in plans)],
            ["tokens/s", *(f"{p['tokens_per_s']:,.0f}" for p in plans)],
            ["MFU", *(f"{100 * p['mfu']:.1f}%" for p in plans)],
            ["memory per GPU", *(gib(p["memory_bytes"]) for p in plans)]]
    if all("train_days" in p for p in plans):
        rows += [["days to train", *(f"{p['train_days']:.1f}" for p in plans)],
                 ["GPU-hours", *(f"{p['gpu_hours']:,.0f}" for p in plans)]]
    rows += [[ls.step_label(k), *(ls.step_time(p["breakdown"].get(k, 0.0)) for p in plans)] for k in keys]
    cats = [(ls.step_label(k), ls.STEP_COLORS.get(k) or ls.COMM_COLORS[i % len(ls.COMM_COLORS)]) for i, k in enumerate(keys)]
    labelled = [(f"#{i + 1} {layout_text(p['layout'])}", [p["breakdown"].get(k, 0.0) for k in keys])
                for i, p in enumerate(plans)]
    widest = max(len(label) for label, _ in labelled)     # about 7 px per character at the chart's 12 px font
    bars = svg.stacked_bars(labelled, cats, fmt_time, label_w=max(270, int(7.2 * widest) + 12))
    from shardlab.planner.report import order_note

    note = "".join(f"<p class='note'>{esc(n)}</p>" for n in order_note(doc))
    return table(head, rows, cls="plans") + note + "<h3>Step time of each plan</h3>" + bars


def plan_page(doc: dict) -> Page:
    page = Page(f"shardlab plan: {doc['model']} on {doc['gpus']} × {doc['gpu']}",
                f"objective {doc['objective']}; searched {doc['combinations']:,} layouts, scored {doc['evaluated']:,}; "
                f"estimates (a roofline-style step model, docs/validation.md)")
    cluster = {k: doc[k] for k in ("gpus_per_node", "intra_link", "inter_link")}
    rej = table(["rejected", "layouts"], [[k, f"{v:,}"] for k, v in sorted(doc["rejected"].items(), key=lambda kv: -kv[1])])
    page.add("inputs", "Inputs and assumptions", _inputs(doc, cluster, [("objective", doc["objective"])]) + rej)
    if not doc["plans"]:
        from shardlab.planner.report import no_fit_advice

        page.add("verdict", "No layout fits", f"<p class='bad'>NO LAYOUT FITS: {esc(no_fit_advice(doc))}</p>")
        return page
    best = doc["plans"][0]
    cards = [("layout", layout_text(best["layout"])), ("step time", f"{best['step_time_s']:.3f} s"),
             ("tokens/s", f"{best['tokens_per_s']:,.0f}"), ("MFU", f"{100 * best['mfu']:.1f}%"),
             ("memory per GPU", gib(best["memory_bytes"]))]
    cap = doc.get("capacity_bytes")
    if cap:
        cards.append(("memory headroom", f"{gib(cap - best['memory_bytes'])} ({100 * (1 - best['memory_bytes'] / cap):.1f}%)"))
    if "train_days" in best:
        cards.append(("days to train", f"{best['train_days']:.1f}"))
    page.answer(cards, "the winner of the search; the design worksheet below says why")
    page.add("worksheet", "Design worksheet", _worksheet(doc))
    detail = doc.get("detail")
    if detail:
        ls.rank_map_section(page, detail, doc.get("communication") or [], best["layout"])
        ls.memory_section(page, detail["memory"])
    ls.waterfall_section(page, best["breakdown"], best["step_time_s"])
    if detail:
        ls.pipeline_section(page, detail.get("pipeline"))
    page.add("plans", "Top plans side by side", _plans(doc))
    if detail:
        ls.diagram_section(page, detail.get("tp_diagram"), f"One block of {doc['model']} split over TP = "
                           f"{best['layout']['tp']}: the same Mermaid text `shardlab shard --mermaid` writes.")
    _rest(page, doc, {"model", "gpus", "gpu", "gpus_per_node", "intra_link", "inter_link", "objective", "workload",
                      "evaluated", "combinations", "rejected", "search_s", "plans", "worksheet", "runner_up",
                      "communication", "detail", "capacity_bytes", "assumptions"})
    return page


def estimate_page(doc: dict) -> Page:
    lay = doc["layout"]
    page = Page(f"shardlab estimate: {doc['model']} on {doc['gpus']} × {doc['gpu']}",
                f"{layout_text(lay)}, {lay['microbatches']} micro-batches; estimates (docs/estimate.md)")
    page.add("inputs", "Inputs and assumptions", _inputs(doc, doc["cluster"], [("layout", layout_text(lay))]))
    cards = [("step time", f"{doc['step_time_s']:.3f} s"), ("tokens/s", f"{doc['tokens_per_s']:,.0f}"),
             ("MFU", f"{100 * doc['mfu']:.1f}%"), ("memory per GPU", gib(doc["memory"]["per_gpu"]["total"])),
             ("fits", "yes" if doc["fits"] else "NO")]
    if "train_days" in doc:
        cards.append(("days to train", f"{doc['train_days']:.1f}"))
    nofit = ("" if doc["fits"] else
             f"<p class='bad'>DOES NOT FIT: {gib(doc['memory']['per_gpu']['total'])} per GPU against "
             f"{gib(doc['memory']['capacity_bytes'])}; the times below are for a "
             f"layout that cannot run (`shardlab plan` searches the ones that fit)</p>")
    cap = doc["memory"].get("capacity_bytes")
    if cap:
        cards.append(("memory headroom", gib(cap - doc["memory"]["per_gpu"]["total"])))
    page.answer(cards)
    page.add("summary", "Summary", nofit + "".join(f"<p class='note'>{esc(n)}</p>" for n in doc.get("notes", [])))
    detail = doc.get("detail")
    if detail:
        ls.rank_map_section(page, detail, doc.get("communication") or [], lay)
        ls.memory_section(page, detail["memory"])
    ls.waterfall_section(page, doc["breakdown"], doc["step_time_s"], comm_table=bool(doc.get("communication")))
    if doc.get("communication"):
        page.add("communication", "Communication", comm_table(doc["communication"]))
    if detail:
        ls.pipeline_section(page, detail.get("pipeline"))
        ls.diagram_section(page, detail.get("tp_diagram"), f"One block of {doc['model']} split over TP = {lay['tp']}: "
                                                           f"the same Mermaid text `shardlab shard --mermaid` writes.")
    _rest(page, doc, {"model", "gpus", "gpu", "layout", "cluster", "workload", "step_time_s", "tokens_per_s", "mfu",
                      "breakdown", "memory", "fits", "notes", "detail", "assumptions", "train_days", "communication"})
    return page


def _rest(page: Page, doc: dict, shown: set[str]) -> None:
    """Every key of the document not drawn above, as tables (new keys appear without page changes)."""
    rest = {k: v for k, v in doc.items() if k not in shown}
    if rest:
        page.add("more", "Everything else in the document", generic(rest))
