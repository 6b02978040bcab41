"""`shardlab estimate|plan --inference --serve`: continuous batching under a closed loop or Poisson arrivals."""

from __future__ import annotations

import math

from shardlab.cli.serve_space import _candidates, _ep_cell, layout_pins, moe_kw
from shardlab.serving.moe import ep_caveat, plan_label


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def _ms(s: float | None) -> str:
    return "overloaded" if s is None or not math.isfinite(s) else f"{1e3 * s:,.1f}"


def _with_ms(s: float | None) -> str:
    """Milliseconds with the unit, or 'overloaded' alone."""
    text = _ms(s)
    return text if text == "overloaded" else f"{text} ms"


def moe_doc(case) -> dict:
    """A serving JSON's MoE layout: ep, dp_attention (attention ranks), expert_imbalance, two_batch_overlap."""
    moe = case.spec.moe
    return {"ep": case.ep, "dp_attention": case.attention_dp, "expert_imbalance": case.expert_imbalance,
            "two_batch_overlap": bool(float(case.whole.a2a_overlap)), "redundant_experts": case.redundant_experts,
            "experts": moe.num_experts if moe else 0, "top_k": moe.top_k if moe else 0,
            "gpus_per_node": case.cluster.gpus_per_node}


def _load(args) -> tuple[int, float, str]:
    """(steady.MODES index, load, words) of the --concurrency / --arrival-rate flags."""
    if args.concurrency is not None:
        return 1, float(args.concurrency), f"closed loop of {args.concurrency} clients"
    return 2, float(args.arrival_rate), f"Poisson arrivals at {args.arrival_rate:g} requests/s"


def _memory_lines(case) -> list[tuple[str, str]]:
    b, e = case.blocks, case.engine
    rule = (f"{e.gpu_memory_utilization:g} × {_gib(b.capacity_bytes)} − weights − activations − other" if e.kv_memory_rule == "total"
            else f"{e.gpu_memory_utilization:g} × ({_gib(b.capacity_bytes)} − weights − activations − other)")
    held = "prompt + whole output (reserved)" if e.kv_admission == "reserve" else "prompt + half the output (on demand)"
    return [("weights per GPU", f"{_gib(b.weights_bytes)} ({case.precision.label}; exact per rank)"),
            ("activation peak", f"{_gib(b.activation_bytes)} (a {case.step_budget_per_rank}-token step, {e.max_num_seqs} sampled rows: estimate)"),
            ("other", f"{_gib(b.other_bytes)} (CUDA context, workspaces, NCCL: estimates)"),
            ("KV blocks", f"{b.num_blocks:,} × {b.block_size} tokens × {b.bytes_per_block // b.block_size:,} B/token = "
                          f"{_gib(b.kv_bytes)}  [{rule}]"),
            ("capacity", f"{case.capacity:,} sequences of {case.blocks_per_seq} blocks each ({held}); bound: {case.capacity_bound}")]


def speculation_line(sp) -> str:
    """One line saying how speculative decoding is priced."""
    return (f"speculative decoding: {sp.draft} drafts {sp.tokens} tokens per step, {sp.acceptance_length:.2f} tokens "
            f"per verification step ({sp.source}); TPOT = (verification of k + 1 positions + k draft steps) / that")


def slo_verdict(args, res: dict, sim) -> dict:
    """{ttft_s, tpot_s, met, statistic}: the targets against the steady state's means, or, where a saved plan's targets
    bind its p99 (``cli.from_file``: ``args.verdict_percentile``), against the simulation's p99s."""
    p99 = getattr(args, "verdict_percentile", None) == "p99" and sim is not None
    d = sim.to_dict() if p99 else {}
    ttft = d["ttft_s"]["p99"] if p99 else res["ttft_s"]
    tpot = d["tpot_s"]["p99"] if p99 else res["tpot_s"]
    return {"ttft_s": args.ttft_slo, "tpot_s": args.tpot_slo, "statistic": "p99" if p99 else "mean",
            "met": bool((args.ttft_slo is None or (ttft is not None and ttft <= args.ttft_slo))
                        and (args.tpot_slo is None or (tpot is not None and tpot <= args.tpot_slo)))}


def slo_words(slo: dict) -> str:
    """' (p99, simulated)' where the verdict is the simulation's p99s."""
    return " (p99, simulated)" if slo.get("statistic") == "p99" else ""


def estimate_serve(args, spec, cluster, prec, engine):
    from shardlab.errors import ShardlabError
    from shardlab.render.table import kv_lines, table
    from shardlab.serving.case import prepare
    from shardlab.serving.limits import limits
    from shardlab.serving.simulate import simulate
    from shardlab.serving.steady import arrays, fluid

    from shardlab.cli.inference_cmds import file_replicas, finite

    from shardlab.catalog import get_catalog
    from shardlab.cli.inference_args import case_kw

    case = prepare(spec, cluster, engine, tp=args.tp, pp=args.pp, precision=prec, prompt_len=args.prompt_len,
                   output_len=args.output_len, prefix_hit_rate=args.prefix_hit_rate,
                   **case_kw(args, spec, get_catalog(args.catalog)))
    if case.capacity < 1:
        raise ShardlabError(f"{spec.name} on {case.layout_label} {cluster.accelerator.id} leaves room for "
                            f"{case.blocks.num_blocks} KV blocks, not one {args.prompt_len + args.output_len}-token sequence: "
                            f"raise --tp/--pp, quantize (--weights), or shorten the request")
    cap_slo = None
    if getattr(args, "slo_percentile", None) and args.concurrency is None and args.arrival_rate is None:
        from shardlab.cli.serve_capacity import layout_capacity     # MLPerf Server's measure: the rate at the caps

        cap_slo = layout_capacity(case, args.ttft_slo, args.tpot_slo, args.slo_percentile, seed=args.seed)
        args.arrival_rate = cap_slo["max_request_rate"]
    at_capacity = args.concurrency is None and args.arrival_rate is None
    if at_capacity:                               # no load given: as many clients as the replica runs at once
        args.concurrency = case.capacity
    mode, load, words = _load(args)
    if at_capacity:
        words += " (no load given: the replica's capacity)"
    if cap_slo:
        words += f" (the layout's capacity under the {cap_slo['statistic']} SLO)"
    res = {k: float(v[0]) for k, v in fluid(arrays([case]), [mode], [load]).items()}
    sim_failed = None
    searched = cap_slo.pop("sim", None) if cap_slo else None
    try:
        if searched is not None:                  # the p99 search's own run at this rate: its accepted p99
            raise _Searched
        sim = simulate(case, concurrency=args.concurrency, arrival_rate=args.arrival_rate, requests=args.requests,
                       seed=args.seed, lifetime_s=res["e2e_s"] if math.isfinite(res["e2e_s"]) else 0.0)
    except _Searched:
        sim = searched
    except ShardlabError as e:                    # a load far beyond the replica's slots: the cycle bound ends it first
        if "completed no measured request" not in str(e):
            raise
        sim, sim_failed = None, ("the simulation finished no measured request within its cycle bound (the load is far "
                                 "beyond the sequences the replica runs at once): the steady-state column stands alone; "
                                 "give fewer --requests or a lighter load for percentiles")
    lim = limits(case, rate=mode == 2, ttft_slo=args.ttft_slo, tpot_slo=args.tpot_slo)
    slo = slo_verdict(args, res, sim)
    doc = {"model": spec.name, "gpu": cluster.accelerator.id, "tp": args.tp, "pp": args.pp, "gpus": case.gpus,
           **moe_doc(case), "engine": engine.id, "engine_version": engine.version,
           "precision": prec.label, "prompt_len": args.prompt_len, "output_len": args.output_len,
           "load": {"concurrency": args.concurrency, "arrival_rate": args.arrival_rate},
           "kv_blocks": case.blocks.to_dict(), "capacity": {"sequences": case.capacity, "bound": case.capacity_bound,
                                                           "blocks_per_sequence": case.blocks_per_seq},
           "steady_state": res, "simulation": sim.to_dict() if sim else None, "limits": lim.to_dict(), "slo": slo,
           "speculation": case.speculation.to_dict() if case.speculation else None}
    cap_lines = []
    if cap_slo:
        from shardlab.cli.serve_capacity import capacity_lines

        p99 = cap_slo["statistic"] == "p99"       # the latencies at capacity, in the statistic (None: no run)
        doc["capacity_under_slo"] = {**cap_slo, "max_concurrency": res["in_flight"],
                                     "goodput_tokens_per_s_per_gpu": cap_slo["max_request_rate"] * args.output_len / case.gpus,
                                     "ttft_s": (sim.ttft_s.p99 if sim else None) if p99 else res["ttft_s"],
                                     "tpot_s": (sim.tpot_s.p99 if sim else None) if p99 else res["tpot_s"]}
        cap_lines = ["", *capacity_lines(cap_slo, res, case.gpus, args.output_len)]
    S = sim or _NO_SIM
    sm = (lambda x: _ms(x)) if sim else (lambda x: "–")  # noqa: E731
    rows = [["TTFT (ms)", _ms(res["ttft_s"]), sm(S.ttft_s.mean), sm(S.ttft_s.p50), sm(S.ttft_s.p99)],
            ["TPOT (ms)", _ms(res["tpot_s"]), sm(S.tpot_s.mean), sm(S.tpot_s.p50), sm(S.tpot_s.p99)],
            ["request latency (ms)", _ms(res["e2e_s"]), sm(S.e2e_s.mean), sm(S.e2e_s.p50), sm(S.e2e_s.p99)],
            ["output tokens/s", f"{res['output_tokens_per_s']:,.0f}", f"{S.output_tokens_per_s:,.0f}" if sim else "–", "", ""],
            ["requests/s", f"{res['requests_per_s']:,.2f}", f"{S.requests_per_s:,.2f}" if sim else "–", "", ""],
            ["sequences in flight", f"{res['in_flight']:,.1f}", f"{S.mean_running:,.1f}" if sim else "–", "", ""]]
    notes = sim_notes(sim, args.concurrency) if sim else [sim_failed]
    preempt_note = None
    if sim and sim.preemptions:
        preempt_note = (f"preemption: the engine admits a sequence once its prompt's blocks are free and gives it blocks "
                        f"as it grows, so the KV pool runs out and the newest sequence is recomputed: {sim.preemptions:,} "
                        f"preemptions over the simulation. The steady state runs only the {case.capacity:,} sequences "
                        f"the pool holds at {case.blocks_per_seq} blocks each and counts no recomputation: read the "
                        f"simulated column (or add blocks: --gpu-memory-utilization, --kv-cache-dtype fp8, more --tp)")
        notes.append(preempt_note)
    if case.attention_dp > 1:
        notes.append(ep_caveat())
    lighter = None
    if getattr(args, "file_clients", None) and mode == 1:   # the replicas with a client fewer (file_load.apply_load)
        lo = args.file_clients[0] // args.file_clients[1]
        st = {k: float(v[0]) for k, v in fluid(arrays([case]), [1], [lo]).items()} if lo else None
        lighter = (st["output_tokens_per_s"], st["requests_per_s"]) if st else (0.0, 0.0)
    rep = file_replicas(args, doc, case.gpus, res["output_tokens_per_s"], res["requests_per_s"], lighter)
    if rep:
        notes.append(rep)
    if notes:
        doc["notes"] = notes
    unit = lim.unit
    binds = [f"the replica runs at most {lim.max_in_flight:,.0f} sequences at once (bound: {lim.bound}); it saturates at "
             f"{lim.saturation_rate:,.2f} requests/s"]
    for name, val, slo_v in (("TTFT", lim.ttft_slo_load, args.ttft_slo), ("TPOT", lim.tpot_slo_load, args.tpot_slo)):
        if slo_v is not None:
            # the limit's bisection stops within 0.1%: said to three figures, as the capacity it brackets
            binds.append(f"mean {name} ≤ {1e3 * slo_v:g} ms holds up to about {val:,.3g} {unit}" if val else
                         f"mean {name} ≤ {1e3 * slo_v:g} ms is not met even at the lightest load")
    text = "\n".join([
        f"shardlab estimate --inference --serve: {spec.name} on {case.layout_label} {cluster.accelerator.id}, "
        f"{engine.id} ({engine.name}, version {engine.version})",
        f"workload: {words}, prompt {args.prompt_len} + output {args.output_len} tokens", "",
        *([speculation_line(case.speculation), ""] if case.speculation else []),
        kv_lines(_memory_lines(case)), "",
        table(["", "mean (steady state)", "mean (simulated)", "p50", "p99"], rows,
              title=(f"latency and throughput (simulation: {sim.requests} requests measured, {sim.cycles:,} cycles, "
                     f"{sim.preemptions} preemptions, seed {args.seed})" if sim else
                     "latency and throughput (steady state; the simulation finished no measured request)")),
        "", *binds,
        *([f"SLO {'met' if slo['met'] else 'MISSED'} at this load{slo_words(slo)}"] if (args.ttft_slo or args.tpot_slo)
          and not cap_slo
          else []),
        *cap_lines,
        *(["overloaded: arrivals exceed what the replica completes; the queue (and TTFT) grows without bound"]
          if res["overloaded"] else []),
        *notes,
        "", "steady state: continuous batching (serving.steady, Little's law, M/D/1 prefill queue); percentiles: a "
            "deterministic simulation of the same scheduler (serving.simulate); kernel rates per GPU generation and "
            "host costs per engine version, fitted to published measurements (`shardlab validate --inference`)"])
    return finite(doc), text


class _Searched(Exception):
    """The capacity search already simulated the report's rate (``serve_capacity.layout_capacity``)."""


class _Missing:
    """Stands for a simulation that measured nothing: every figure None (printed as a dash)."""

    def __getattr__(self, name):
        return self if name in ("ttft_s", "tpot_s", "e2e_s") else None


_NO_SIM = _Missing()


def plan_serve(args, spec, cluster, gpus, prec, engine):
    import numpy as np

    from shardlab.errors import ShardlabError
    from shardlab.render.table import table
    from shardlab.serving.case import prepare
    from shardlab.serving.simulate import simulate
    from shardlab.serving.steady import arrays, fluid

    from shardlab.cli.inference_cmds import finite, raise_common_error, reject
    from shardlab.cli.inference_args import serving_settings

    if args.concurrency is None and args.arrival_rate is None:       # no load: the capacity under the SLO
        from shardlab.cli.capacity_cmds import plan_capacity

        return plan_capacity(args, spec, cluster, gpus, prec, engine)
    mode, load, words = _load(args)
    from shardlab.catalog import get_catalog
    from shardlab.cli.inference_args import case_kw

    spec_kw = case_kw(args, spec, get_catalog(args.catalog))
    cases, meta, rejected, errors = [], [], {}, {}
    for tp, pp, cap, ep, dpa in _candidates(spec, cluster, gpus, engine, spec_kw.get("redundant_experts") or 0,
                                            layout_pins(args)):
        try:
            c = prepare(spec, cluster, engine.with_settings(max_num_seqs=cap), tp=tp, pp=pp, precision=prec,
                        prompt_len=args.prompt_len, output_len=args.output_len, prefix_hit_rate=args.prefix_hit_rate,
                        **moe_kw(spec_kw, ep, dpa))
        except ShardlabError as e:
            reject(rejected, errors, e)
            continue
        if c.capacity < 1:
            rejected["no room for one sequence's KV cache"] = rejected.get("no room for one sequence's KV cache", 0) + 1
            continue
        cases.append(c)
        meta.append((tp, pp, gpus // (tp * pp * dpa), cap, ep, dpa))
    if not cases:
        raise_common_error(errors, rejected, "no room")
        raise ShardlabError(f"no TP×PP layout of {gpus} × {cluster.accelerator.id} holds {spec.name} with a "
                            f"{args.prompt_len + args.output_len}-token request; add GPUs or quantize (--weights)")
    reps = np.array([m[2] for m in meta], dtype=float)
    res = fluid(arrays(cases), np.full(len(cases), mode), load / reps)
    plans = []
    for i, (c, (tp, pp, r, cap, ep, dpa)) in enumerate(zip(cases, meta)):
        ttft, tpot = float(res["ttft_s"][i]), float(res["tpot_s"][i])
        ok = not res["overloaded"][i] and (args.ttft_slo is None or ttft <= args.ttft_slo) \
            and (args.tpot_slo is None or tpot <= args.tpot_slo)
        plans.append({"tp": tp, "pp": pp, "replicas": r, "max_num_seqs": cap, "ep": ep, "dp_attention": dpa,
                      "replica_layout": c.layout_label, "in_flight_per_replica": float(res["in_flight"][i]),
                      "ttft_s": ttft, "tpot_s": tpot, "e2e_s": float(res["e2e_s"][i]),
                      "output_tokens_per_s": float(res["output_tokens_per_s"][i]) * r,
                      "requests_per_s": float(res["requests_per_s"][i]) * r, "meets_slo": bool(ok),
                      "overloaded": bool(res["overloaded"][i]), "slo_ratio": _slo_ratio(args, ttft, tpot, res["overloaded"][i]),
                      "kv_blocks_per_gpu": c.blocks.num_blocks, "kv_block_size": c.blocks.block_size,
                      "kv_bytes_per_gpu": c.blocks.kv_bytes, "capacity_per_replica": c.capacity,
                      "weights_bytes_per_gpu": c.blocks.weights_bytes, "_case": c})
    seen, unique = set(), []
    for p in sorted(plans, key=lambda p: -p["max_num_seqs"]):      # a cap that does not bind repeats the default
        sig = (p["tp"], p["pp"], p["ep"], p["dp_attention"], round(p["ttft_s"], 6), round(p["tpot_s"], 6))
        if sig not in seen:
            seen.add(sig)
            unique.append(p)
    plans = unique
    latency = args.objective == "latency"
    # meeting the SLO first; among layouts that miss it, the nearest miss (the largest measured/target ratio); equal
    # throughputs (every layout delivers an arrival rate it keeps up with) rank by request latency, then per-token
    # speed: rounded to 6 digits, floating-point noise does not decide
    thr = lambda p: float(f"{p['output_tokens_per_s']:.6g}")   # noqa: E731
    key = (lambda p: (not p["meets_slo"], 0.0 if p["meets_slo"] else p["slo_ratio"],
                      p["e2e_s"] if latency else -thr(p), -thr(p) if latency else p["e2e_s"], p["tpot_s"],
                      p["tp"] * p["pp"] * p["dp_attention"]))
    plans.sort(key=key)
    best = plans[0]
    sim = simulate(best["_case"], concurrency=None if mode == 2 else max(1, round(load / best["replicas"])),
                   arrival_rate=load / best["replicas"] if mode == 2 else None, requests=args.requests, seed=args.seed,
                   lifetime_s=best["e2e_s"] if math.isfinite(best["e2e_s"]) else 0.0)
    for p in plans:
        p.pop("_case")
    top = plans[: args.top]
    doc = {"model": spec.name, "gpus": gpus, "gpu": cluster.accelerator.id, "engine": engine.id, "engine_version": engine.version, "precision": prec.label,
           "serving": serving_settings(prec, engine, args.max_num_seqs),
           "objective": "latency" if latency else "throughput", "prompt_len": args.prompt_len, "output_len": args.output_len,
           "load": {"concurrency": args.concurrency, "arrival_rate": args.arrival_rate},
           "slo": {"ttft_s": args.ttft_slo, "tpot_s": args.tpot_slo}, "evaluated": len(plans) + sum(rejected.values()),
           "rejected": rejected, "plans": top, "best_simulated": sim.to_dict(),
           **({"notes": [ep_caveat()]} if best["dp_attention"] > 1 else {})}
    moe_cols = any(p["ep"] > 1 for p in top)             # MoE layouts searched: the EP and attention ranks shown
    rows = [[p["tp"], p["pp"], *([_ep_cell(p)] if moe_cols else []), p["replicas"], p["max_num_seqs"],
             f"{p['in_flight_per_replica']:.1f}", _ms(p["ttft_s"]),
             _ms(p["tpot_s"]), f"{p['output_tokens_per_s']:,.0f}", f"{p['kv_blocks_per_gpu']:,}", f"{p['capacity_per_replica']:,}",
             "yes" if p["meets_slo"] else "no"] for p in top]
    slo_words = ", ".join(f"{n} ≤ {1e3 * v:g} ms" for n, v in (("TTFT", args.ttft_slo), ("TPOT", args.tpot_slo)) if v) or "none"
    text = "\n".join([
        f"shardlab plan --inference --serve: {spec.name} on {gpus} × {cluster.accelerator.id} ({engine.id}, {prec.label})",
        f"workload: {words} over all replicas, prompt {args.prompt_len} + output {args.output_len} tokens; SLO: {slo_words}; "
        f"objective: {'lowest request latency' if latency else 'most output tokens/s'} under the SLO",
        table(["tp", "pp", *(["EP (attn DP)"] if moe_cols else []), "replicas", "max seqs", "in flight", "TTFT ms",
               "TPOT ms", "tokens/s", "KV blocks/GPU", "capacity", "SLO"], rows),
        "",
        f"recommended: {best['replicas']} replica(s) of {plan_label(best)}, max-num-seqs {best['max_num_seqs']}: "
        f"TTFT {_with_ms(best['ttft_s'])}, TPOT {_with_ms(best['tpot_s'])}, {best['output_tokens_per_s']:,.0f} output tokens/s "
        f"({best['requests_per_s']:,.2f} requests/s)" + _miss(best),
        f"  each GPU allocates {best['kv_blocks_per_gpu']:,} KV blocks of {best['kv_block_size']} tokens "
        f"({_gib(best['kv_bytes_per_gpu'])}) beside {_gib(best['weights_bytes_per_gpu'])} of weights: "
        f"{best['capacity_per_replica']:,} sequences per replica",
        f"  simulated ({sim.requests} requests): TTFT p50 {_with_ms(sim.ttft_s.p50)} / p99 {_with_ms(sim.ttft_s.p99)}, "
        f"TPOT p50 {_with_ms(sim.tpot_s.p50)} / p99 {_with_ms(sim.tpot_s.p99)}",
        *(f"  note: {n}" for n in sim_notes(sim, None if mode == 2 else max(1, round(load / best["replicas"])))),
        *([f"  note: {ep_caveat()}"] if best["dp_attention"] > 1 else []),
        f"evaluated {doc['evaluated']} layouts" + (f"; rejected: {', '.join(f'{k} ({v})' for k, v in rejected.items())}" if rejected else ""),
        "pipeline stages add sequences in flight (throughput), not per-token speed; replicas split the load."])
    return finite(doc), text


def _slo_ratio(args, ttft: float, tpot: float, overloaded) -> float:
    """How far a layout is from the SLO: the largest measured/target ratio (1 = on target); overloaded = inf."""
    if overloaded:
        return math.inf
    return max([1.0] + [v / t for v, t in ((ttft, args.ttft_slo), (tpot, args.tpot_slo)) if t])


def _miss(best: dict) -> str:
    """What the recommendation line adds when the best layout does not meet the targets."""
    if best["meets_slo"]:
        return ""
    if best["overloaded"]:
        return (" — every layout is overloaded at this load (requests arrive faster than it serves them, so TTFT "
                "grows without bound); this one serves the most: add GPUs or lower the load")
    return f" — NO layout meets the SLO; this one comes closest ({best['slo_ratio']:.2f}× the tightest target)"


def sim_notes(sim, clients: int | None) -> list[str]:
    """What the simulated column cannot be trusted for: a run cut at its cycle bound, or too few requests."""
    from shardlab.limits import MAX_SIM_REQUESTS

    if sim.truncated:
        return [f"the simulation stopped at its {sim.cycles:,}-cycle bound before every request finished: its column "
                "covers part of the run; read the steady-state column (or give fewer --requests, or shorter outputs)"]
    if sim.steady or not clients:
        return []
    return [f"the simulation measured some clients' first requests ({clients:,} clients, {sim.requests:,} requests "
            f"measured): they met a queue still building, so its latencies read low and its rate high; "
            + (f"raise --requests to at least {3 * clients:,} for the steady state" if 3 * clients <= MAX_SIM_REQUESTS
               else f"read the steady-state column (the simulation holds at most {MAX_SIM_REQUESTS:,} requests)")]
