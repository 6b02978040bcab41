"""The text of `plan --inference --serve` at capacity: the layouts table, the Pareto front, the recommendation."""

from __future__ import annotations

from shardlab.cli.serve_cmds import _ms, _with_ms

FRONT_ROWS = 14
"""Pareto points the text table shows (evenly picked, both ends kept); --json lists all."""


def _slo_words(slo) -> str:
    words = ", ".join(f"{n} ≤ {1e3 * v:g} ms" for n, v in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s)) if v)
    stat = ("p50 (the steady state's mean stands for the median)" if slo.percentile == "p50"
            else "p99 (simulated, seed-fixed)")
    return f"{words}, {stat}"


def _plan_label(p: dict) -> str:
    if p.get("ep", 1) > 1:
        from shardlab.serving.moe import plan_label

        return f"{plan_label(p)} × {p['replicas']}, max seqs {p['max_num_seqs']}"
    return f"TP {p['tp']} × PP {p['pp']} × {p['replicas']}, max seqs {p['max_num_seqs']}"


def _replicas_words(lay: dict) -> str:
    """'N replica(s) of LAYOUT, max-num-seqs M' of the capacity's layout."""
    from shardlab.serving.moe import plan_label

    return f"{lay['replicas']} replica(s) of {plan_label(lay)}, max-num-seqs {lay['max_num_seqs']}"


def _thin(points: list, n: int) -> list:
    """At most ``n`` of ``points``, evenly spaced, the first and last kept."""
    if len(points) <= n:
        return points
    return [points[round(k * (len(points) - 1) / (n - 1))] for k in range(n)]


def _cap_cell(p: dict) -> str:
    """A plan's capacity for the table: the rate; '≥ rate' when the p99 search stopped above a rate that met the
    targets; '≤ p50 capacity' when not simulated; '< rate' below a rate that missed them."""
    stat = p["capacity_statistic"]
    if p["max_request_rate"] is not None:
        return ("≥ " if stat.startswith("p99, at least") else "") + _rate(p["max_request_rate"])
    return ("≤ " if stat == "not simulated" else "< ") + _rate(p["max_request_rate_bounds"][1])


def _rate(v) -> str:
    return "—" if v is None else f"{v:,.2f}" if v < 100 else f"{v:,.0f}"


def _capacity_text(doc, args, cluster, sim, slo) -> str:
    from shardlab.cli.serve_capacity import FILLED
    from shardlab.render.table import table

    plans, cap, pareto = doc["plans"], doc["capacity"], doc["pareto"]
    best = plans[0]
    from shardlab.cli.serve_space import _ep_cell

    moe_cols = any(p.get("ep", 1) > 1 for p in plans)
    rows = [[p["tp"], p["pp"], *([_ep_cell(p)] if moe_cols else []), p["replicas"], p["max_num_seqs"],
             _cap_cell(p),
             f"{p['in_flight_per_replica']:.1f}", _ms(p["ttft_s"]), _ms(p["tpot_s"]),
             f"{p['goodput_tokens_per_s_per_gpu']:,.0f}" if p["goodput_tokens_per_s_per_gpu"] is not None else "—",
             (p["binds"] + (" (p50)" if p["binds_statistic"] != slo.percentile else "") if p["meets_slo"] else
              p["capacity_statistic"] if p["meets_slo"] is None else "missed at any load"), f"{p['kv_blocks_per_gpu']:,}",
             f"{p['capacity_per_replica']:,}"] for p in plans]
    lay = cap["layout"]
    head = [f"shardlab plan --inference --serve: {doc['model']} on {doc['gpus']} × {doc['gpu']} ({doc['engine']}, "
            f"{doc['precision']})",
            f"capacity under SLO: {_slo_words(slo)}; Poisson arrivals, prompt {args.prompt_len} + output "
            f"{args.output_len} tokens; ranked by goodput per GPU (output tokens/s per GPU at the most requests/s the "
            f"SLO allows)"]
    if "target" in doc:
        t = doc["target"]
        head.insert(1, f"target: {t['rate']:g} requests/s within the SLO needs {t['gpus']:,} GPUs ("
                       f"{_replicas_words(lay)}): capacity {_rate(t['capacity_request_rate'])} requests/s, headroom "
                       f"{100 * (t['headroom'] or 0):.0f}%"
                       + (f"; {t['next_smaller_count']:,} GPUs serve less" if t.get("next_smaller_count") else ""))
    binds = {"ttft": "the TTFT target binds", "tpot": "the TPOT target binds",
             "saturation": "the replicas are full (the SLO still holds at saturation)"}[cap["binds"]]
    if cap["binds_statistic"] != slo.percentile:
        binds += (" (the p50 capacity, where the p99 search starts, already meets the p99 targets: the mean "
                  "binds)")
    stat = "p99" if slo.percentile == "p99" else "mean"
    if best["meets_slo"]:
        rec = [f"recommended: {_replicas_words(lay)}: up to {_rate(cap['max_request_rate'])} requests/s over all replicas "
               f"({_rate(cap['max_request_rate_per_replica'])} per replica), {cap['output_tokens_per_s']:,.0f} output "
               f"tokens/s = {cap['goodput_tokens_per_s_per_gpu']:,.0f} per GPU; {binds}",
               f"  at that rate: {stat} TTFT {_with_ms(cap['ttft_s'])}, {stat} TPOT {_with_ms(cap['tpot_s'])}, "
               f"{cap['max_concurrency']:,.1f} requests in flight (Little's law), "
               f"{cap['in_flight_per_replica']:,.1f} sequences running per replica"]
        if sim is not None:
            rec.append(f"  simulated ({sim.requests} requests): TTFT p50 {_with_ms(sim.ttft_s.p50)} / p99 "
                       f"{_with_ms(sim.ttft_s.p99)}, TPOT p50 {_with_ms(sim.tpot_s.p50)} / p99 {_with_ms(sim.tpot_s.p99)}")
            filled = cap.get("simulation_filled")
            if slo.percentile == "p99" and filled is not None and filled < FILLED:
                rec.append(f"  that run kept {filled:.0%} of the sequences the steady state runs per replica (a few "
                           f"hundred requests, started with them, did not keep them): its p99 describes a lighter load, so this p99 capacity "
                           f"is an upper bound; `shardlab estimate` on the layout with --slo-percentile p99 sizes its "
                           f"runs to fill it")
    elif best["meets_slo"] is None:
        rec = ["NO layout was shown to meet the p99 targets: the simulations run (their budget spent) found no rate "
               "meeting them; the p50 capacities (≤) bound what each layout could serve: use --slo-percentile p50, "
               "relax the SLO, or narrow the search (--gpus, --max-num-seqs)"]
    else:
        rec = [f"NO layout meets the SLO at any load tried (down to 1/10,000 of saturation); closest: "
               f"{_plan_label(best)}, TTFT {_with_ms(best['ttft_s'])}, TPOT {_with_ms(best['tpot_s'])} at the "
               f"lightest load: relax the SLO, shorten the request, or use faster layouts (more --gpus for TP)"]
    shown = _thin(pareto, FRONT_ROWS)
    front_rows = [[_plan_label(q), _rate(q["request_rate"]), f"{q['concurrency']:,.1f}", _ms(q["ttft_s"]),
                   _ms(q["tpot_s"]), f"{q['tokens_per_s_per_gpu']:,.0f}", f"{q['tokens_per_s_per_user']:,.1f}",
                   "*" if (q["at_capacity"] and all(q[k] == lay[k] for k in lay)) else ""] for q in shown]
    front = (["Pareto front: output tokens/s per GPU against output tokens/s per user (1 / mean TPOT), steady state "
              "at loads from 1/64 of each layout's capacity up to it; * = the recommended layout at its capacity"
              + (f"; {len(shown)} of its {len(pareto)} points (--json lists all)" if len(shown) < len(pareto) else ""),
              table(["layout", "req/s", "in flight", "TTFT ms", "TPOT ms", "tok/s/GPU", "tok/s/user", ""], front_rows)]
             if pareto else ["Pareto front: empty (no layout meets the SLO at any load)"])
    rejected = doc["rejected"]
    from shardlab.cli.disagg_cmds import disagg_text

    return "\n".join([
        *head,
        table(["tp", "pp", *(["EP (attn DP)"] if moe_cols else []), "replicas", "max seqs", "max req/s", "in flight", "TTFT ms", "TPOT ms", "tok/s/GPU", "binds",
               "KV blocks/GPU", "capacity"], rows),
        "", *rec, "", *front, "", *disagg_text(doc, args),
        *(f"note: {n}" for n in doc.get("notes", [])),
        f"evaluated {doc['evaluated']} layouts" + (f"; rejected: {', '.join(f'{k} ({v})' for k, v in rejected.items())}"
                                                   if rejected else ""),
        "capacity: the largest Poisson rate whose " + ("steady-state mean TTFT and TPOT meet the targets (fluid model, "
        "serving.steady)" if slo.percentile == "p50" else "simulated p99 TTFT and TPOT meet the targets (serving."
        "simulate, a few runs per layout that can win)") + "; goodput per GPU after DistServe (arXiv 2401.09670)"])
