"""``shardlab run train``'s human report: losses, where each rank's step went, predicted vs measured memory and
step time, the f/g counter per kind of site, parity and the observability summary."""

from __future__ import annotations


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _colls(c: dict) -> str:
    parts = []
    for op, phases in sorted((c or {}).items()):
        f, b = phases.get("forward", {}).get("count", 0), phases.get("backward", {}).get("count", 0)
        other = sum(v["count"] for ph, v in phases.items() if ph not in ("forward", "backward"))
        t = sum(v["time_s"] or 0 for v in phases.values())
        parts.append(f"{op} {f}/{b}{f'+{other}' if other else ''} ({t * 1e3:.1f} ms)")
    return ", ".join(parts) or "none"


def per_block_summary(sites: dict[str, dict[str, int]], microbatches: int = 1) -> dict[str, dict]:
    """Collapse ``by_site`` into one row per kind (attention, mlp, embedding, head): calls per instance per
    micro-batch for each op/phase, the number of instances, and whether every instance issued the same."""
    kinds: dict[str, list[dict[str, int]]] = {}
    for site, ops in sites.items():
        kinds.setdefault(site.rsplit(".", 1)[-1], []).append(ops)
    out = {}
    for kind, insts in kinds.items():
        keys = sorted({k for d in insts for k in d}, key=lambda k: (k.split("/")[1] != "forward", k))
        per = {k: sorted({d.get(k, 0) for d in insts}) for k in keys}
        out[kind] = {"instances": len(insts), "uniform": all(len(v) == 1 for v in per.values()),
                     "per_instance_per_microbatch": {k: v[0] / microbatches for k, v in per.items() if len(v) == 1}}
    return out


def megatron_breakdown(doc: dict) -> dict | None:
    """Rank 0's f/g counter per kind of site (attention, mlp, embedding, head), per instance per micro-batch."""
    sites = next((r.get("megatron_sites") for r in doc["ranks"] if r.get("megatron_sites")), None)
    return per_block_summary(sites, doc["microbatches"]) if sites else None


def _megatron_lines(doc: dict) -> list[str]:
    b = doc.get("megatron_breakdown")
    if not b:
        return []
    parts = []
    for kind in ("attention", "mlp", "embedding", "head"):
        if kind in b:
            k = b[kind]
            ops = ", ".join(f"{v:g} {op.replace('_', '-')} {ph}" for op_ph, v in k["per_instance_per_microbatch"].items()
                            for op, ph in [op_ph.split("/")])
            parts.append(f"per {kind}: {ops}" + (f" (each of {k['instances']})" if k["instances"] > 1 else "")
                         + ("" if k["uniform"] else " (NOT the same in every block)"))
    return ["Megatron f/g collectives per micro-batch (our operators' counter): " + "; ".join(parts)]


def expert_lines(doc: dict) -> list[str]:
    """The expert dispatcher's collectives per step, measured beside `comm plan`'s."""
    rows = doc.get("expert_dispatch")
    if not rows:
        return []
    from shardlab.units import fmt_bytes

    def b(x):
        return "-" if x is None else fmt_bytes(x)

    parts = [f"{r['collective'].replace('_', '-')}: {r['measured_calls']} calls of {b(r['measured_bytes_per_call'])} "
             f"on average (plan {r['predicted_calls']} of {b(r['predicted_bytes_per_call'])})"
             for r in rows]
    ok = all(r["match"] for r in rows)
    return ["expert dispatch per step, every rank (all-to-all bytes vary with routing; their average is exact): "
            + "; ".join(parts) + (" — as comm plan predicts" if ok else " — DIFFERS from comm plan")]


def step_time_notes(doc: dict) -> list[str]:
    """What the measured-vs-predicted line needs beside it: a timed step that carried instrumentation, and on a
    CPU, that the catalog's generic core is not this machine."""
    st, notes = doc["step_time"], []
    if st.get("instrumented"):
        steps = doc['workload']['steps']
        which = ("step 0, the only one (it carries the memory tracker)" if steps == 1 else
                 "step 1 (it carries the collective recorder, a dispatch mode on every operator)")
        notes.append(f"  measured on an instrumented step: steps count from 0 and the step time is the median of steps 2 "
                     f"and later; with --steps {steps} it is {which}; --steps 3 or more gives clean step times (warm-up "
                     f"and instrumented steps left out, as PyTorch's benchmark Timer warms up before it measures: "
                     f"torch/utils/benchmark/utils/timer.py)")
    cpu = all(r.get("device") == "cpu" for r in doc["ranks"])
    if cpu and st.get("predicted_catalog_gpu") == "cpu-core" and st.get("error") is not None and abs(st["error"]) > 0.5:
        notes.append("  the prediction uses the catalog's generic cpu-core, not this machine, and no host time per "
                     "operator: without --no-probe (and SHARDLAB_PROBE=0) run train measures this machine and the "
                     "runtime's host time once and predicts from that (docs/calibration.md)")
    return notes


def per_rank_time_table(doc: dict) -> list[str]:
    """The measured per-rank table: where each rank's step went (compute, collectives, waiting for the others;
    they add up to the step) beside its throughput, peak memory and collectives, and where the numbers come from."""
    from shardlab.render.table import table
    from shardlab.units import fmt_bytes, fmt_time

    ranks = doc["ranks"]
    split = all(r.get("time_split") for r in ranks)
    rows = []
    for r in ranks:
        sp = r.get("time_split") or {}
        times = [fmt_time(sp[k]) for k in ("compute_s", "collectives_s", "wait_s")] if split else []
        rows.append([r["rank"], "{pp},{dp},{tp}".format(**r["coords"]), *times, fmt_time(r["step_time_s"]),
                     "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:.0f}",
                     fmt_bytes((r.get("peak_bytes") or {}).get("by_category", {}).get("Total", 0)),
                     _colls(r["collectives"])])
    head = ["rank", "pp,dp,tp", *(["compute", "in collectives (transfer)", "waiting"] if split else []), "step",
            "tokens/s", "peak", "collectives per step: fwd/bwd count (time on step 1, waits included)"]
    n = min((r["time_split"]["steps"] for r in ranks), default=0) if split else doc["step_time"].get("timed_steps")
    if split:
        title = (f"measured per rank, mean of {n} timed step(s), step = compute + in collectives + waiting (the ranks' "
                 f"per-step records)")
        notes = ["  compute: the rank's own work (batch, forward, backward, optimizer) minus time blocked in "
                 "collectives; in collectives: the time the least-waiting rank spent in them that step (the "
                 "transfer); waiting: for other ranks, at the step-end barrier and inside collectives; peak: torch "
                 "MemTracker; collectives: counted on step 0 (a pipeline's one-time warm-up and shape exchange left "
                 "out: setup_collectives in --json), timed on step 1 (the dispatch recorder)"]
    else:
        title = "measured per rank (step: median of the rank's timed steps, waiting at the step end not included)"
        notes = ["  peak: torch MemTracker; collectives: counted on step 0 (a pipeline's one-time warm-up and shape "
                 "exchange left out: setup_collectives in --json), timed on step 1 (the dispatch recorder)"]
    return [table(head, rows, title=title), *notes]


MAX_LOSSES_SHOWN = 12
"""Up to this many steps every loss is printed; beyond, first, last, the minimum and every k-th (the JSON has all)."""


def loss_line(losses: list[float], rank) -> str:
    """The losses per step on one line that stays short: all of a short run, a summary of a long one."""
    head = f"loss per step (global batch, seen by rank {rank})"
    if len(losses) <= MAX_LOSSES_SHOWN:
        return f"{head}: " + "  ".join(f"{v:.4f}" for v in losses)
    k = -(-len(losses) // (MAX_LOSSES_SHOWN - 2))
    low = min(range(len(losses)), key=lambda i: losses[i])
    every = "  ".join(f"{i}: {losses[i]:.4f}" for i in range(0, len(losses), k))
    return (f"{head}: step 0 {losses[0]:.4f} -> step {len(losses) - 1} {losses[-1]:.4f}, lowest {losses[low]:.4f} at "
            f"step {low}; every {k}th step: {every} (all {len(losses)} in --json)")


def checkpoint_lines(doc: dict) -> list[str]:
    """Where the weights came from (a checkpoint) and the vocabulary padding TP needed, for run train and run infer."""
    from shardlab.units import fmt_bytes

    out = []
    ck = doc.get("checkpoint")
    if ck:
        line = f"weights from checkpoint {ck['path']} ({ck['family']}, {fmt_bytes(ck['checkpoint_bytes'])}"
        reads = ck.get("bytes_read_per_rank")
        if reads:
            line += (f" {'/'.join(ck['dtypes'])}); each rank read only its slices: "
                     + ", ".join(fmt_bytes(b) for b in reads)
                     + f" = {ck['read_ratio']:.2f}x the file in total")
        else:
            line += "); each rank read only its shards"
        out.append(line)
    v = doc.get("vocab")
    if v and v["padding_rows"]:
        out.append(f"vocabulary {v['vocab_size']:,} padded to {v['padded_vocab_size']:,} for TP (Megatron-LM's rule; "
                   f"{v['rows_per_rank']:,} rows per rank); logits cut back to {v['vocab_size']:,}: no token or loss changes")
    return out


def render_train(doc: dict) -> str:
    """The human report: losses, per-rank measurements, predicted vs measured memory and step time, parity."""
    from shardlab.render.table import table
    from shardlab.units import fmt_bytes, fmt_time

    if doc.get("report_elsewhere"):
        node = doc.get("node") or {}
        return (f"shardlab run train: this node (node rank {node.get('group_rank', '?')}, {node.get('host', '?')}) ran "
                f"rank(s) {', '.join(map(str, doc['ranks_here']))} of {doc['world_size']} ({doc['strategy']}); the "
                f"job's report is {doc['report']}")
    lay, wl = doc["layout"], doc["workload"]
    out = [f"shardlab run train: {doc['strategy']} on {doc['world_size']} ranks (dp {lay['dp']} × tp {lay['tp']} × "
           f"pp {lay['pp']}{', vpp ' + str(lay['vpp']) if lay['vpp'] > 1 else ''}"
           f"{', ep ' + str(lay['ep']) if lay.get('ep', 1) > 1 else ''}), model {doc['model']}, "
           f"{wl['steps']} steps of {wl['global_batch']} × {wl['seq_len']} tokens, fp32 {wl['optimizer']}, "
           f"{doc['microbatches']} micro-batch(es) of {wl['micro_batch']}"]
    out += checkpoint_lines(doc)
    out += _megatron_lines(doc)
    out += expert_lines(doc)
    if doc.get("losses"):
        out.append(loss_line(doc["losses"], doc["loss_rank"]))
    out += ["", *per_rank_time_table(doc)]
    st = doc["step_time"]
    from shardlab.runtime.observe.report import slowest_line

    line = slowest_line(doc.get("slowest"), "step") if doc["world_size"] > 1 else None
    if line:
        out.append(f"{line}; spread of {st.get('spread_of', 'step')} (slowest - fastest) / median = "
                   f"{(st['spread'] or 0) * 100:.1f}%")
    mrows = []
    for r in doc["memory_comparison"]:
        p, m = r["predicted"], r["measured"]
        mrows.append([r["rank"], r["stage"]] + [f"{p[k]:,} / {m[k]:,}" for k in ("weights", "gradients", "optimizer")]
                     + ["yes" if r["states_exact"] else "NO", fmt_bytes(p["activations"]),
                        fmt_bytes(m["activations"]) if m["activations"] is not None else "-", _pct(r["activations_error"])])
    out += ["", table(["rank", "stage", "weights B pred / meas", "grads B pred / meas", "optimizer B pred / meas",
                       "exact", "act pred", "act meas", "act err"], mrows,
                      title="memory per rank: predicted (shardlab.memory, fp32) vs measured (tensor storages after step 0; "
                            "activations: peak of tensors saved for backward)")]
    out.append("model states " + ("match the memory model exactly on every rank" if doc["memory_states_exact"] else
                                  "DIFFER from the memory model:"))
    out += [f"  {n}" for n in doc.get("memory_notes", [])]
    if st["predicted_s"]:
        out.append(f"step time: measured {fmt_time(st['measured_median_s'])} (median over ranks, waits included) vs "
                   f"predicted {fmt_time(st['predicted_s'])} [{st['predicted_from']}]: error {_pct(st['error'])} "
                   "((predicted − measured) / measured)")
    else:
        out.append(f"step time: measured {fmt_time(st['measured_median_s'])}; {st['predicted_from']}")
    out += step_time_notes(doc)
    if "parity" in doc:
        p = doc["parity"]
        out.append(f"parity with one process (step 0): loss {p['run_loss']:.6f} vs {p['reference_loss']:.6f} "
                   f"(|err| {p['loss_abs_err']:.1e}), gradients max |err| {p['grad_max_abs_err']:.1e} over "
                   f"{p['tensors_compared']} tensors (tolerance 1e-5 / 1e-6): {'OK' if p['ok'] else 'FAILED'}")
        hf = p.get("transformers")
        if hf:
            out.append(f"transformers on the same checkpoint and batch (step 0): loss {hf['loss']:.6f} vs the run's "
                       f"{hf['run_loss']:.6f} (|err| {hf['abs_err']:.1e}, tolerance {hf['tolerance']:.0e}): "
                       f"{'OK' if hf['ok'] else 'FAILED'}")
    if doc.get("observability"):
        from shardlab.runtime.observe.report import render_observability

        out += ["", render_observability(doc["observability"])]
    out.append(f"rank JSON: {doc['launch']['run_dir']} (removed when shardlab exits; SHARDLAB_KEEP_RUN_DIR=1 keeps it)")
    return "\n".join(out)
