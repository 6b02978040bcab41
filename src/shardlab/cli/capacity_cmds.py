"""`plan --inference --serve` with SLOs and no load: each layout's capacity (the most requests/s within the SLOs),
goodput per GPU, the Pareto front, and `--target-rate`'s fewest GPUs (``serving.capacity``; docs/capacity.md)."""

from __future__ import annotations

import math

from shardlab.cli.capacity_text import _capacity_text, _slo_words
from shardlab.cli.serve_space import _candidates, layout_pins, moe_kw


def _key(m) -> tuple:
    """A layout's identity without its max-num-seqs: (tp, pp, ep, attention ranks)."""
    return (m[0], m[1], m[4], m[5])


def _gpr(m) -> int:
    """GPUs of one replica of a layout: tp × pp × attention ranks."""
    return m[0] * m[1] * m[5]


# ---- capacity under SLOs: `plan --inference --serve --ttft-slo S [--tpot-slo S]` with no load ---------------------
class _Pool:
    """The layouts of one model, GPU, engine, precision and request shape, prepared once by (tp, pp, max-num-seqs)
    with their p50 (steady-state) and simulated capacities: the target search reuses them across GPU counts."""

    def __init__(self, args, spec, cluster, prec, engine, slo):
        self.args, self.spec, self.cluster, self.prec, self.engine, self.slo = args, spec, cluster, prec, engine, slo
        from shardlab.catalog import get_catalog
        from shardlab.cli.inference_args import case_kw

        self.spec_kw = case_kw(args, spec, get_catalog(args.catalog))
        """Speculative decoding settings every layout is prepared with (``prepare``'s keywords)."""
        self.cases: list = []
        self.by_key: dict = {}
        self.fluid: dict[int, tuple[float, float, str, dict]] = {}
        """case → (rate per replica, saturation rate per replica, binds, steady state at the capacity)."""
        self.sims: dict = {}
        """case → SimCapacity (p99)."""

    def layouts(self, gpus: int, default_cap: bool = False):
        """(case indices, (tp, pp, replicas, max-num-seqs) each, rejected counts, errors) of ``gpus`` GPUs
        (``default_cap``: only the engine's own max-num-seqs)."""
        from shardlab.errors import ShardlabError
        from shardlab.serving.case import prepare

        from shardlab.cli.inference_cmds import reject

        idx, meta, rejected, errors = [], [], {}, {}
        no_room = "no room for one sequence's KV cache"
        for tp, pp, cap, ep, dpa in _candidates(self.spec, self.cluster, gpus, self.engine,
                                                self.spec_kw.get("redundant_experts") or 0, layout_pins(self.args)):
            if default_cap and cap != self.engine.for_gpu(self.cluster.accelerator).max_num_seqs:
                continue
            key = (tp, pp, cap, ep, dpa)
            if key not in self.by_key:
                try:
                    c = prepare(self.spec, self.cluster, self.engine.with_settings(max_num_seqs=cap), tp=tp, pp=pp,
                                precision=self.prec, prompt_len=self.args.prompt_len, output_len=self.args.output_len,
                                prefix_hit_rate=self.args.prefix_hit_rate, **moe_kw(self.spec_kw, ep, dpa))
                except ShardlabError as e:
                    self.by_key[key] = e
                else:
                    self.by_key[key] = len(self.cases) if c.capacity >= 1 else no_room
                    if c.capacity >= 1:
                        self.cases.append(c)
            v = self.by_key[key]
            if isinstance(v, Exception):
                reject(rejected, errors, v)
            elif v == no_room:
                rejected[no_room] = rejected.get(no_room, 0) + 1
            else:
                idx.append(v)
                meta.append((tp, pp, gpus // (tp * pp * dpa), cap, ep, dpa))
        return idx, meta, rejected, errors

    def fluid_caps(self, idx) -> None:
        """Compute the p50 capacities of the cases ``idx`` not yet known, all at once."""
        from shardlab.serving.capacity import fluid_capacity
        from shardlab.serving.steady import arrays

        new = sorted({i for i in idx if i not in self.fluid})
        if not new:
            return
        fc = fluid_capacity(arrays([self.cases[i] for i in new]), self.slo)
        for j, i in enumerate(new):
            self.fluid[i] = (float(fc.request_rate_per_replica[j]), float(fc.saturation_rate_per_replica[j]),
                             str(fc.binds[j]), {k: float(v[j]) for k, v in fc.at_capacity.items()})

    def capacity_arrays(self, idx):
        """The ``FluidCapacity`` of cases ``idx`` (in that order)."""
        import numpy as np

        from shardlab.serving.capacity import FluidCapacity

        self.fluid_caps(idx)
        rows = [self.fluid[i] for i in idx]
        at = {k: np.array([r[3][k] for r in rows]) for k in rows[0][3]} if rows else {}
        return FluidCapacity(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
                             np.array([r[2] for r in rows]), at)

    def refine(self, idx, gpus_per_replica, must=()):
        """Simulated (p99) capacities of the cases ``idx`` that can still win (``sim_capacity.refine``), cached;
        returns ({position in idx: SimCapacity}, stopped at the layout limit)."""
        from shardlab.serving.sim_capacity import SIM_REQUESTS, refine

        known = {j: self.sims[i] for j, i in enumerate(idx) if i in self.sims}
        out, cut = refine([self.cases[i] for i in idx], self.capacity_arrays(idx), gpus_per_replica, self.slo,
                          seed=self.args.seed, requests=self.args.requests or SIM_REQUESTS, must=tuple(must),
                          known=known)
        for j, r in out.items():
            self.sims[idx[j]] = r
        return out, cut


def _capacity_at(pool, gpus: int):
    """Every layout of ``gpus`` GPUs at its capacity under the SLO: plans (best first), the Pareto front, notes."""
    import numpy as np

    from shardlab.errors import ShardlabError
    from shardlab.serving.capacity import pareto_front, sweep
    from shardlab.serving.steady import arrays, fluid

    from shardlab.cli.inference_cmds import raise_common_error

    args, slo = pool.args, pool.slo
    idx, meta, rejected, errors = pool.layouts(gpus)
    if not idx:
        raise_common_error(errors, rejected, "no room")
        raise ShardlabError(f"no TP×PP layout of {gpus} × {pool.cluster.accelerator.id} holds {pool.spec.name} with a "
                            f"{args.prompt_len + args.output_len}-token request; add GPUs or quantize (--weights)")
    pool.fluid_caps(idx)
    # a max-num-seqs cap that does not bind repeats a larger one's capacity (within 0.1%): keep the largest
    kept: dict = {}
    keep = []
    for j in sorted(range(len(idx)), key=lambda j: -meta[j][3]):
        rate, _, _, at = pool.fluid[idx[j]]
        same = kept.setdefault(_key(meta[j]), [])
        if not any(abs(rate - r) <= 1e-3 * max(r, 1e-12) and abs(at["tpot_s"] - t) <= 1e-3 * t for r, t in same):
            same.append((rate, at["tpot_s"]))
            keep.append(j)
    keep.sort()
    idx, meta = [idx[j] for j in keep], [meta[j] for j in keep]
    gpr = np.array([_gpr(m) for m in meta], dtype=float)
    cap = pool.capacity_arrays(idx)
    a = arrays([pool.cases[i] for i in idx])
    notes = []
    rate = cap.request_rate_per_replica.copy()
    sims = {}
    if slo.percentile == "p99":
        # the layouts on the p50 front, one max-num-seqs per TP × PP (the one with the most capacity there): their
        # p99 capacities draw the p99 front; the others' curves are near-copies or lie below
        sw50 = sweep(a, rate, gpr)
        pick: dict = {}
        for k in (pareto_front(*_xy(sw50), rel_tol=FRONT_TOL) if len(sw50.case) else []):
            j = int(sw50.case[k])
            old = pick.get(_key(meta[j]))
            if old is None or rate[j] > rate[old]:
                pick[_key(meta[j])] = j
        sims, cut = pool.refine(idx, gpr, must=sorted(pick.values()))
        rate = np.array([sims[j].request_rate_per_replica if j in sims else 0.0 for j in range(len(idx))])
        # a rate known to meet the p99 targets draws the front; only a settled one ranks
        notes.append("p99: each simulated layout's capacity is the largest rate, up to its p50 capacity, whose simulated "
                     "p99 TTFT and TPOT meet the targets; the Pareto front holds the simulated layouts only"
                     + ("; the search stopped at its budget of simulations" if cut else ""))
    # the front: one curve per TP × PP, that of its max-num-seqs with the most capacity (a smaller cap only stops the
    # same curve sooner: below its saturation the sequences in flight, so the latencies, do not depend on it)
    lead: dict = {}
    for j in range(len(idx)):
        k = lead.get(_key(meta[j]))
        if k is None or (rate[j], meta[j][3]) > (rate[k], meta[k][3]):
            lead[_key(meta[j])] = j
    sw = sweep(a, np.where(np.isin(np.arange(len(idx)), list(lead.values())), rate, 0.0), gpr)
    front = pareto_front(*_xy(sw), rel_tol=FRONT_TOL) if len(sw.case) else np.zeros(0, dtype=int)
    lightest = cap.saturation_rate_per_replica * (1 - 1e-6) * 1e-4
    unsimulated = np.array([slo.percentile == "p99" and (j not in sims or (not sims[j].settled and rate[j] <= 0))
                            for j in range(len(idx))], dtype=bool)
    upper = np.array([min(cap.request_rate_per_replica[j], sims[j].missed_rate_per_replica) if j in sims
                      else cap.request_rate_per_replica[j] for j in range(len(idx))])
    shown_rate = np.where(unsimulated, upper, rate)          # unsettled: what bounds the capacity from above
    res = fluid(a, np.full(len(idx), 2), np.where(shown_rate > 0, shown_rate, lightest))
    O = float(args.output_len)
    plans = [_capacity_plan(pool.cases[i], m, j, i, rate[j], upper[j], cap, sims.get(j), bool(unsimulated[j]), res,
                            slo, O)
             for j, (i, m) in enumerate(zip(idx, meta))]
    # meeting the SLO at some load, most goodput per GPU first (then faster per user, fewer GPUs per replica); then the
    # layouts not simulated (by their p50 bound); then those meeting it at no load, nearest miss first
    plans.sort(key=lambda p: (0 if p["meets_slo"] else 1 if p["meets_slo"] is None else 2,
                              -(p["goodput_tokens_per_s_per_gpu"] or 0), p.get("slo_ratio", 0.0),
                              -(p["max_request_rate_mean"] / p["gpus_per_replica"]), p["tpot_s"], p["gpus_per_replica"]))
    by_j = {p["_j"]: p for p in plans}
    pareto = []
    for k in front:
        p = by_j[int(sw.case[k])]
        pareto.append({"tp": p["tp"], "pp": p["pp"], "ep": p["ep"], "dp_attention": p["dp_attention"],
                       "replicas": p["replicas"], "max_num_seqs": p["max_num_seqs"],
                       "request_rate": float(sw.request_rate_per_replica[k]) * p["replicas"],
                       "concurrency": float(sw.request_rate_per_replica[k] * sw.e2e_s[k]) * p["replicas"],
                       "in_flight_per_replica": float(sw.in_flight_per_replica[k]),
                       "ttft_s": float(sw.ttft_s[k]), "tpot_s": float(sw.tpot_s[k]),
                       "tokens_per_s_per_gpu": float(sw.tokens_per_s_per_gpu[k]),
                       "tokens_per_s_per_user": float(sw.tokens_per_s_per_user[k]),
                       "at_capacity": bool(abs(sw.request_rate_per_replica[k] - rate[int(sw.case[k])])
                                           <= 1e-9 * rate[int(sw.case[k])])})
    return {"plans": plans, "pareto": pareto, "sims": {idx[j]: s for j, s in sims.items()}, "notes": notes,
            "rejected": rejected, "evaluated": len(meta) + sum(rejected.values())}


def _capacity_plan(c, meta, j: int, i: int, rate: float, upper: float, cap, sc, unsimulated: bool, res: dict, slo,
                   O: float) -> dict:
    """One layout's plan entry at its capacity: the keys of a loaded plan's entries (evaluated at the capacity) and
    the capacity's (``j``: its place in ``cap`` and ``res``, ``i``: its case in the pool). ``unsimulated``: its p99
    capacity is not settled; it lies in [``rate``, ``upper``)."""
    tp, pp, r, mns, ep, dpa = meta
    gpr = tp * pp * dpa
    stat_rate = None if unsimulated else float(rate)
    if sc is not None and sc.request_rate_per_replica > 0:   # simulated: the target the next rate tried missed
        binds, stat = (sc.binds, "p99") if sc.binds else (str(cap.binds[j]), "p50")
    else:
        binds, stat = str(cap.binds[j]), "p50"
    if binds == "saturation":                             # full replicas: whatever the statistic
        stat = slo.percentile
    p = {"tp": tp, "pp": pp, "replicas": r, "max_num_seqs": mns, "ep": ep, "dp_attention": dpa,
         "gpus_per_replica": gpr, "replica_layout": c.layout_label,
         "max_request_rate": None if stat_rate is None else stat_rate * r,
         "max_request_rate_per_replica": stat_rate,
         "max_request_rate_mean": float(cap.request_rate_per_replica[j]) * r,
         **({"max_request_rate_bounds": [float(rate) * r, float(upper) * r]} if unsimulated else {}),
         "saturation_rate": float(cap.saturation_rate_per_replica[j]) * r,
         "goodput_tokens_per_s_per_gpu": None if stat_rate is None else stat_rate * O / gpr,
         "binds": binds, "binds_statistic": stat,
         "capacity_statistic": ("mean" if slo.percentile == "p50" else
                                "not simulated" if sc is None else
                                "p99" if sc.settled else
                                "p99, at least (search stopped)" if not unsimulated else "p99, below the bound"),
         "in_flight_per_replica": float(res["in_flight"][j]), "ttft_s": float(res["ttft_s"][j]),
         "tpot_s": float(res["tpot_s"][j]), "e2e_s": float(res["e2e_s"][j]),
         "output_tokens_per_s": float(res["output_tokens_per_s"][j]) * r,
         "requests_per_s": float(res["requests_per_s"][j]) * r,
         "meets_slo": None if unsimulated else bool(stat_rate > 0),
         "kv_blocks_per_gpu": c.blocks.num_blocks, "kv_block_size": c.blocks.block_size,
         "kv_bytes_per_gpu": c.blocks.kv_bytes, "capacity_per_replica": c.capacity,
         "weights_bytes_per_gpu": c.blocks.weights_bytes, "_case": i, "_j": j}
    if sc is not None and sc.sim is not None:
        p["ttft_p99_s"], p["tpot_p99_s"] = sc.sim.ttft_s.p99, sc.sim.tpot_s.p99
    if p["meets_slo"] is False:
        rt, rp = slo.ratios(res["ttft_s"][j], res["tpot_s"][j])
        p["slo_ratio"] = float(max(rt, rp))
    return p


def _xy(sw):
    return sw.tokens_per_s_per_gpu, sw.tokens_per_s_per_user


def _target_search(pool, rate: float, bound: int) -> tuple[int, int]:
    """(fewest GPUs, the count tried before it or 0) whose best layout serves ``rate`` requests/s within the SLO,
    trying ``capacity.gpu_counts(bound)`` in ascending chunks (each chunk's p50 capacities computed at once), then
    the whole nodes between the last count short of it and the first that serves it (``capacity.fewest_between``:
    beyond ``GPU_COUNT_CAP`` the counts tried double); a ShardlabError naming the fix when no count can. Layouts run the engine's default max-num-seqs here: a lower cap
    only lowers the saturation rate under Poisson arrivals (the sequences in flight at a rate do not depend on it;
    the activation memory it frees is a few hundred MiB of KV blocks); the plan at the count found lists every cap."""
    import numpy as np

    from shardlab.errors import ShardlabError
    from shardlab.serving.capacity import fewest_between, gpu_counts

    counts = gpu_counts(bound, pool.cluster.gpus_per_node)
    best, sim_layouts, prev, any_layout = (0.0, 0), 0, 0, False
    edges = [0, 8, 64, 512, math.inf]
    chunks = [c for c in ([g for g in counts if lo < g <= hi] for lo, hi in zip(edges, edges[1:])) if c]
    for chunk in chunks:
        laid = {g: pool.layouts(g, default_cap=True)[:2] for g in chunk}
        any_layout = any_layout or any(laid[g][0] for g in chunk)
        pool.fluid_caps([i for g in chunk for i in laid[g][0]])
        for g in chunk:
            idx, meta = laid[g]
            if not idx:
                prev = g
                continue
            reps = np.array([m[2] for m in meta], dtype=float)
            total = np.array([pool.fluid[i][0] for i in idx]) * reps
            j = int(np.argmax(total))
            if total[j] > best[0]:
                best = (float(total[j]), g)
            if total[j] >= rate and pool.slo.percentile == "p99":
                gpr = np.array([_gpr(m) for m in meta], dtype=float)
                before = len(pool.sims)
                sims, _ = pool.refine(idx, gpr)
                sim_layouts += len(pool.sims) - before
                p99 = np.array([sims[k].request_rate_per_replica if k in sims else 0.0 for k in range(len(idx))]) * reps
                if p99.max() >= rate:
                    return fewest_between(rate, prev, g, pool.cluster.gpus_per_node, gpr, p99 / reps)
                if sim_layouts >= 12:
                    raise ShardlabError(f"the p99 search simulated {sim_layouts} layouts up to {g} GPUs without one "
                                        f"serving {rate:g} requests/s within the SLO; give --gpus to bound it, relax "
                                        f"the SLO, or use --slo-percentile p50")
            elif total[j] >= rate:
                gpr = np.array([_gpr(m) for m in meta], dtype=float)
                return fewest_between(rate, prev, g, pool.cluster.gpus_per_node, gpr, total / reps)
            prev = g
    if not any_layout:
        _capacity_at(pool, bound)                        # raises the reason no layout holds the model
    most = (f"the most is {best[0]:,.4g} requests/s on {best[1]:,} GPUs" if best[0] > 0 else
            "no layout meets it at any load")
    raise ShardlabError(f"no GPU count up to {bound:,} serves {rate:g} requests/s within {_slo_words(pool.slo)} "
                        f"({most}): raise --gpus, relax the SLO, or quantize (--weights fp8)")


def plan_capacity(args, spec, cluster, gpus, prec, engine):
    """`plan --inference --serve` with SLOs and no load: each layout's capacity under the SLO, ranked by goodput per
    GPU, the Pareto front, and with --target-rate the fewest GPUs for a rate."""
    from shardlab.serving.capacity import GPU_COUNT_CAP, Slo
    from shardlab.serving.sim_capacity import sim_requests
    from shardlab.serving.simulate import simulate

    from shardlab.cli.inference_cmds import finite
    from shardlab.cli.inference_args import serving_settings

    slo = Slo(args.ttft_slo, args.tpot_slo, args.slo_percentile or "p50")
    pool = _Pool(args, spec, cluster, prec, engine, slo)
    target = None
    if args.target_rate is not None:
        bound = args.gpus or (args.nodes * cluster.gpus_per_node if args.nodes else GPU_COUNT_CAP)
        gpus, below = _target_search(pool, args.target_rate, bound)
        target = {"rate": args.target_rate, "gpus": gpus, "bound": bound, "next_smaller_count": below or None}
    ev = _capacity_at(pool, gpus)
    plans, pareto = ev["plans"], ev["pareto"]
    best = plans[0]
    case = pool.cases[best["_case"]]
    sim = None
    if best["meets_slo"]:
        sc = ev["sims"].get(best["_case"])
        if sc is not None and sc.sim is not None:
            sim = sc.sim
        else:
            life = best["e2e_s"] if math.isfinite(best["e2e_s"]) else 0.0
            lam = best["max_request_rate_per_replica"]
            # simulate's own default (40 s of arrivals or five lifetimes, 100-1,000), fewer when the replica runs
            # few sequences at once (a run's cycles ≈ requests × output tokens / sequences in flight)
            n = args.requests or min(int(min(1000, max(100, lam * max(40.0, 5 * life)))),
                                     sim_requests(lam, life, args.output_len, most=1000))
            sim = simulate(case, arrival_rate=lam, requests=n, seed=args.seed, lifetime_s=life, warm_start=True)
    stat_ttft = sim.ttft_s.p99 if (sim and slo.percentile == "p99") else best["ttft_s"]
    stat_tpot = sim.tpot_s.p99 if (sim and slo.percentile == "p99") else best["tpot_s"]
    capacity = {"layout": {k: best[k] for k in ("tp", "pp", "ep", "dp_attention", "replicas", "max_num_seqs")},
                "max_request_rate": best["max_request_rate"] if best["meets_slo"] else 0.0,
                "max_request_rate_per_replica": best["max_request_rate_per_replica"] if best["meets_slo"] else 0.0,
                "max_concurrency": (best["max_request_rate"] * best["e2e_s"]) if best["meets_slo"] else 0.0,
                "in_flight_per_replica": best["in_flight_per_replica"] if best["meets_slo"] else 0.0,
                "goodput_tokens_per_s_per_gpu": best["goodput_tokens_per_s_per_gpu"] or 0.0,
                "output_tokens_per_s": (best["max_request_rate"] or 0.0) * args.output_len,
                "binds": best["binds"], "binds_statistic": best["binds_statistic"], "statistic": slo.percentile,
                "ttft_s": stat_ttft, "tpot_s": stat_tpot, "saturation_rate": best["saturation_rate"]}
    if sim is not None and best["meets_slo"] and best["in_flight_per_replica"] > 0:
        # how full the simulated run kept the replica: it starts with the steady state's sequences, but near the
        # capacity the batch drifts below them, so a few hundred requests may describe a lighter load (docs/capacity.md)
        capacity["simulation_filled"] = sim.mean_running / best["in_flight_per_replica"]
    if target is not None:
        rate_best = capacity["max_request_rate"]
        target.update({"layout": capacity["layout"], "replicas": best["replicas"], "capacity_request_rate": rate_best,
                       "headroom": rate_best / args.target_rate - 1 if rate_best else None})
    for p in plans:
        p.pop("_case")
        p.pop("_j")
    top = plans[: args.top]
    doc = {"model": spec.name, "gpus": gpus, "gpu": cluster.accelerator.id, "engine": engine.id, "engine_version": engine.version, "precision": prec.label,
           "serving": serving_settings(prec, engine, args.max_num_seqs),
           "objective": "goodput per GPU", "prompt_len": args.prompt_len, "output_len": args.output_len,
           "load": {"concurrency": None, "arrival_rate": None},
           "slo": {"ttft_s": args.ttft_slo, "tpot_s": args.tpot_slo, "percentile": slo.percentile},
           "evaluated": ev["evaluated"], "rejected": ev["rejected"], "plans": top,
           "best_simulated": sim.to_dict() if sim else None, "capacity": capacity, "pareto": pareto}
    if target is not None:
        doc["target"] = target
    elif layout_pins(args):                        # a pinned TP/PP names an aggregated replica: no split to search
        doc.setdefault("notes", []).append("--tp/--pp pin the aggregated replicas: the disaggregated splits are not "
                                           "searched (`shardlab estimate --inference --serve --disaggregated P:D "
                                           "--prefill-tp T` prices one)")
    else:                                          # disaggregated prefill/decode layouts of the same GPUs, side by side
        from shardlab.cli.disagg_cmds import disagg_section

        doc.update(disagg_section(args, spec, cluster, gpus, prec, engine, slo, capacity))
    if best.get("dp_attention", 1) > 1 or any(p["decode"].get("dp_attention", 1) > 1
                                               for p in (doc.get("disaggregated") or [])[:1]):
        from shardlab.serving.moe import ep_caveat

        ev["notes"].append(ep_caveat())
    if ev["notes"]:
        doc["notes"] = ev["notes"]
    return finite(doc), _capacity_text(doc, args, cluster, sim, slo)


FRONT_TOL = 0.01
"""A Pareto point within 1% of a faster one's tokens/s per user (and with less per GPU) is left out: a near-copy."""
