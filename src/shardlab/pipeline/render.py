"""The simulated timeline as a text grid for the terminal: one row of pass letters and one row of
micro-batch numbers per pipeline rank (and chunk numbers for the interleaved schedule)."""

from __future__ import annotations

from shardlab.pipeline.simulate import PipelineResult


def text_grid(res: PipelineResult, max_width: int = 150) -> str:
    """Render ``res`` with one column per time quantum (the shortest pass, or coarser to fit ``max_width``).

    A column shows the pass covering its midpoint: F forward, B backward (input gradient for zb-h1),
    W weight gradient, '.' idle; the line below gives the micro-batch number mod 10.
    """
    import numpy as np

    t = res.timeline
    durs = [d for d in (res.durations_s["forward_s"], res.durations_s["backward_s"], res.durations_s["weight_grad_s"]) if d > 0]
    spans = t["end_s"] - t["start_s"]
    q = float(spans[spans > 0].min()) if (spans > 0).any() else min(durs)
    for k in range(1, 9):                       # a quantum that divides every pass (1.5 s and 1 s → 0.5 s)
        x = spans / (q / k)
        if np.allclose(x, np.round(x), atol=1e-9):
            q /= k
            break
    cols = int(np.ceil(res.step_time_s / q - 1e-9))
    coarse = cols > max_width
    if coarse:
        q = res.step_time_s / max_width
        cols = max_width
    mids = (np.arange(cols) + 0.5) * q
    label_w = len(f"stage {res.stages - 1}")
    out = [f"time → one column = {q:.3g} s{' (coarse: a column shows the pass at its midpoint)' if coarse else ''}; "
           f"F forward, B backward{' (input gradient)' if res.schedule == 'zb-h1' else ''}"
           f"{', W weight gradient' if res.schedule == 'zb-h1' else ''}, . idle; digits: micro-batch mod 10"
           + ("; c: model chunk" if res.vpp > 1 else "")]
    for r in range(res.stages):
        sel = t["stage"] == r
        st, en, kd, mb, ch = t["start_s"][sel], t["end_s"][sel], t["kind"][sel], t["microbatch"][sel], t["chunk"][sel]
        idx = np.searchsorted(st, mids, side="right") - 1
        ok = (idx >= 0) & (mids < en[np.clip(idx, 0, None)])
        kinds = np.where(ok, np.array(list("FBW"))[kd[np.clip(idx, 0, None)]], ".")
        digits = np.where(ok, (mb[np.clip(idx, 0, None)] % 10).astype(str), " ")
        out.append(f"{f'stage {r}'.ljust(label_w)} |{''.join(kinds)}|")
        out.append(f"{''.ljust(label_w)} |{''.join(digits)}|")
        if res.vpp > 1:
            chunks = np.where(ok, ch[np.clip(idx, 0, None)].astype(str), " ")
            out.append(f"{'c'.rjust(label_w)} |{''.join(chunks)}|")
    return "\n".join(out)


MAX_JSON_EVENTS = 20000
"""Timelines with more passes than this leave ``events`` out of the JSON document (say so in ``notes``)."""


def pipeline_doc(res: PipelineResult, times: dict, *, base: PipelineResult | None = None, max_bubble: float | None = None,
                 plot: str | None = None) -> dict:
    """The JSON document of ``shardlab pipeline`` (every number; the timeline when it is not huge)."""
    from shardlab.pipeline.closed_form import bubble_fraction_closed_form, closed_form_text

    p, m, v = res.stages, res.microbatches, res.vpp
    doc = {"schedule": res.schedule, "stages": p, "microbatches": m, "vpp": v,
           "bubble_fraction": res.bubble_fraction,
           "bubble_fraction_closed_form": bubble_fraction_closed_form(res.schedule, p, m, v, **times),
           "closed_form": closed_form_text(res.schedule, p, m, v, **times),
           "step_time_s": res.step_time_s, "ideal_time_s": res.ideal_time_s, "busy_s": res.busy_s,
           "peak_in_flight": res.peak_in_flight, "peak_in_flight_stage": res.peak_in_flight_stage,
           "peak_pending_w": res.peak_pending_w, "durations_s": res.durations_s, "notes": list(res.notes), "plot": plot}
    if max_bubble is not None:
        doc["max_bubble"] = max_bubble
        if m > 1 and res.schedule != "interleaved":
            doc["bubble_fraction_with_one_less"] = bubble_fraction_closed_form(res.schedule, p, m - 1, v, **times)
    if base is not None:
        slowest = max(range(p), key=lambda r: res.busy_s[r])
        doc["straggler"] = {"stage": slowest, "uniform_step_time_s": base.step_time_s, "step_time_s": res.step_time_s,
                            "slowdown_of_step": res.step_time_s / base.step_time_s,
                            "slowest_busy_s": res.busy_s[slowest]}
    if len(res.timeline["kind"]) <= MAX_JSON_EVENTS:
        doc["events"] = [{"stage": s, "kind": k, "microbatch": j, "chunk": c, "start_s": a, "end_s": b}
                         for s, k, j, c, a, b in res.events]
    else:
        doc["notes"].append(f"{len(res.timeline['kind'])} passes: events left out of the JSON (more than {MAX_JSON_EVENTS})")
    return doc


def render_pipeline(res: PipelineResult, doc: dict) -> str:
    """Summary, the closed form next to the simulation, per-stage table, straggler and the grid."""
    from shardlab.render.table import kv_lines, table

    p, m, v = res.stages, res.microbatches, res.vpp
    d = res.durations_s
    head = (f"shardlab pipeline: {res.schedule}, p = {p} stage{'s' if p != 1 else ''}, m = {m} micro-batch{'es' if m != 1 else ''}" + (f", v = {v} chunks per rank" if v > 1 else "")
            + f"; per {d['per']}: F {d['forward_s']:g} s, B {d['backward_s']:g} s"
            + (f", W {d['weight_grad_s']:g} s" if d["weight_grad_s"] else "") + (f", p2p {d['p2p_s']:g} s" if d["p2p_s"] else ""))
    lines = [head, ""]
    if "max_bubble" in doc:
        extra = (f"; m = {m - 1} would give {100 * doc['bubble_fraction_with_one_less']:.2f}%"
                 if "bubble_fraction_with_one_less" in doc else "")
        caveat = f"; {doc['max_bubble_caveat']}" if doc.get("max_bubble_caveat") else ""
        lines += [f"fewest micro-batches with bubble ≤ {100 * doc['max_bubble']:g}%: m = {m}{extra}{caveat}", ""]
    pairs = [("step time", f"{res.step_time_s:.6g} s"),
             ("ideal (busiest stage's work)", f"{res.ideal_time_s:.6g} s"),
             ("bubble (simulated)", f"{100 * res.bubble_fraction:.2f}% of the step (idle share averaged over stages)"),
             ("bubble (closed form)", doc["closed_form"])]
    lines.append(kv_lines(pairs))
    agree = abs(doc["bubble_fraction"] - doc["bubble_fraction_closed_form"]) <= 1e-12
    if not agree:
        lines.append("  the simulation differs from the closed form: "
                     + ("a straggler, p2p time or unequal pass times change the schedule's idle time; trust the simulation"))
    rows = [[r, f"{res.busy_s[r]:.4g}", f"{100 * (1 - res.busy_s[r] / res.step_time_s):.1f}%", res.peak_in_flight[r]]
            + ([f"{res.peak_in_flight_stage[r]:g}"] if v > 1 else []) + ([res.peak_pending_w[r]] if res.schedule == "zb-h1" else [])
            for r in range(p)]
    heads = ["stage", "busy s", "idle", "peak in flight" + (" (chunks)" if v > 1 else "")] + (["stage equiv."] if v > 1 else []) \
        + (["W pending (peak)"] if res.schedule == "zb-h1" else [])
    lines += ["", table(heads, rows, title="per stage (peak in flight = micro-batch activations held at once; "
                                          "memory.activations.in_flight)")]
    if "straggler" in doc:
        s = doc["straggler"]
        lines += ["", f"straggler: stage {s['stage']} sets the pace: step {s['step_time_s']:.4g} s vs {s['uniform_step_time_s']:.4g} s "
                      f"with uniform stages ({s['slowdown_of_step']:.2f}×); every other stage waits for it"]
    if doc.get("plot"):
        lines += ["", f"timeline picture saved to {doc['plot']}"]
    if len(res.timeline["kind"]) <= 20000:
        lines += ["", text_grid(res)]
    for n in doc["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def save_timeline(res: PipelineResult, path: str, times: dict, p2p_s: float = 0.0, slow_stage: int | None = None,
                  slowdown: float = 1.0) -> str:
    """Save the Gantt picture of ``res`` titled with the simulated and the closed-form bubble; returns the path."""
    from shardlab.pipeline.closed_form import bubble_fraction_closed_form
    from shardlab.render.plots import pipeline_timeline

    p, m, v = res.stages, res.microbatches, res.vpp
    used = res.durations_s                  # the per-pass times the boxes were drawn with (per chunk when v > 1)
    w = used["weight_grad_s"] or None
    sub = (f"per {used['per']}: F = {used['forward_s']:.4g} s, B = {used['backward_s']:.4g} s" + (f", W = {w:.4g} s" if w else "")
           + (f", p2p = {p2p_s:.4g} s" if p2p_s else "") + (f"; stage {slow_stage} {slowdown:g}× slower" if slow_stage is not None else "")
           + "  (shardlab pipeline)")
    cf = bubble_fraction_closed_form(res.schedule, p, m, v, **times)
    title = (f"{res.schedule}: {p} stages, {m} micro-batches" + (f", v = {v}" if v > 1 else "")
             + f" — bubble {100 * res.bubble_fraction:.1f}% of the step (closed form, uniform stages: {100 * cf:.1f}%)")
    notes = {slow_stage: f"{slowdown:g}× slower"} if slow_stage is not None else None
    return str(pipeline_timeline(res, path, title=title, subtitle=sub, stage_notes=notes))
