"""Human output of ``shardlab plan``: ranked plans, the design worksheet, the communication table."""

from __future__ import annotations

from shardlab.errors import field_name
from shardlab.memory.overheads import MEMORY_MARGIN
from shardlab.render.table import table
from shardlab.units import fmt_bytes, fmt_count, fmt_time


def _layout_str(lay: dict) -> str:
    s = f"dp{lay['dp']} tp{lay['tp']} pp{lay['pp']}"
    if lay["cp"] > 1:
        s += f" cp{lay['cp']}"
    if lay["ep"] > 1:
        s += f" ep{lay['ep']}"
    if lay.get("etp") and lay["etp"] != lay["tp"]:
        s += f" etp{lay['etp']}"
    s += f" z{lay['zero']}" + (f" hsdp{lay['dp_replicate']}" if lay.get("dp_replicate", 1) > 1 else "") + f" mb{lay['micro_batch']}"
    if lay["pp"] > 1:
        s += f" {lay['schedule']}" + (f"-v{lay['vpp']}" if lay["vpp"] > 1 else "")
    if lay["recompute"] != "none":
        s += f" rc-{lay['recompute']}"
    if lay["sequence_parallel"]:
        s += " sp"
    return s


def render_plan(doc: dict) -> str:
    wl = doc["workload"]
    lines = [f"shardlab plan: {doc['model']} on {doc['gpus']} × {doc['gpu']} ({doc['gpus_per_node']} per node, "
             f"{doc['intra_link']} + {doc['inter_link']}), objective {doc['objective']}",
             f"workload: seq {wl['seq_len']}, global batch {wl['global_batch']} ({fmt_count(wl['tokens_per_step'])} "
             "tokens/step), "
             f"{wl['precision']}, {wl['optimizer']}"
             + (f", offload {wl['offload']}" if wl.get("offload", "none") != "none" else "")
             + (f", LoRA r={wl['lora_rank']}" + (" on an NF4 base (QLoRA)" if wl.get("quantize_base") == "nf4" else "")
                if wl.get("lora_rank") else ""),
             f"framework: {doc['framework']['id']} (searches what it runs; {field_name('framework.name')} to "
             "change)" if doc.get("framework") else "",
             f"searched {doc['combinations']:,} combinations, scored {doc['evaluated']:,} in {doc['search_s']:.2f} s; "
             "rejected:"]
    frac = doc.get("memory_fraction", 1.0)
    if frac < 1.0 and doc.get("capacity_bytes"):
        why = (f"default: {100 * (1 - frac):g}% kept free for allocator fragmentation the estimate does not "
               f"count, GMLake ASPLOS 2024; {field_name('plan.memory_fraction')} 1 turns it off"
               if abs(frac - (1 - MEMORY_MARGIN)) < 1e-12 else field_name('plan.memory_fraction'))
        lines.insert(-1, f"memory limit: {100 * frac:g}% of {doc['capacity_bytes'] / 2**30:.1f} GiB = "
                         f"{frac * doc['capacity_bytes'] / 2**30:.1f} GiB per GPU ({why})")
    for reason, n in sorted(doc["rejected"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {n:>9,}  {reason}")
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    if not doc["plans"]:
        lines += ["", "NO LAYOUT FITS: " + no_fit_advice(doc)]
        return "\n".join(lines)
    rows = []
    for k, p in enumerate(doc["plans"], 1):
        extra = f"{p['train_days']:.1f}" if "train_days" in p else ""
        rows.append([k, p["gpus"], _layout_str(p["layout"]), f"{p['step_time_s']:.3f}", f"{p['tokens_per_s']:,.0f}",
                     f"{p['model_tflops_per_gpu']:.0f}", f"{100 * p['mfu']:.1f}%", f"{p['memory_bytes'] / 2**30:.1f}", extra])
    lines += ["", table(["#", "GPUs", "layout", "step s", "tokens/s", "TF/s/GPU", "MFU", "GiB/GPU", "days" if "train_days" in doc["plans"][0] else ""],
                        rows, title="best plans (estimates; model FLOPs per Korthikanti 2022 Eq. 7)")]
    lines += order_note(doc)
    best = doc["plans"][0]
    b = best["breakdown"]
    parts = ", ".join(f"{k[:-2].replace('_', ' ')} {v:.2f}" for k, v in b.items() if v > 1e-6)
    lines += ["", f"winner: {_layout_str(best['layout'])}, {best['layout']['microbatches']} micro-batches; step "
                  f"{best['step_time_s']:.3f} s = {parts}"]
    if "memory_worst_rank" in best:
        lines.append(f"  memory {best['memory_bytes'] / 2**30:.1f} GiB on rank {best['memory_worst_rank']['rank']} "
                     f"({best['memory_worst_rank']['reason']}), exact per-tensor check")
    ws = [[a["axis"], a["value"], a["placement"], a["reason"], a.get("risk", "")] for a in doc["worksheet"]]
    lines += ["", table(["axis", "choice", "placement", "why (the best alternative the search scored)", "risk"], ws, align="lllll",
                        title="design worksheet")]
    ru = doc.get("runner_up")
    if ru:
        diff = ", ".join(f"{k} {v}" for k, v in ru["differs_in"].items())
        lines += ["", f"runner-up ({diff}) lost: {ru['why']}"]
    comm = doc.get("communication") or []
    if comm:
        crows = [[c["axis"], c["op"], c["phase"], fmt_bytes(c["bytes_per_call"]), f"{c['calls_per_step']:,}", c["group_size"],
                  c["link_id"], fmt_time(c["time_per_step_s"]), c["overlap"], c.get("risk", "")] for c in comm]
        lines += ["", table(["axis", "collective", "phase", "bytes/call", "calls/step", "group", "link", "time/step", "overlap", "risk"],
                            crows, title="communication table of the winner (`shardlab comm plan` with its layout "
                                         "shows the formulas)")]
    return "\n".join(lines)


def order_note(doc: dict) -> list[str]:
    """A line when the table is not sorted by the objective alone: near-ties went to the simpler layout."""
    from shardlab.planner.search import SIMPLICITY

    key = {"throughput": lambda p: p["step_time_s"], "memory": lambda p: p["memory_bytes"],
           "cost": lambda p: p["gpus"] * p["step_time_s"]}.get(doc.get("objective", "throughput"))
    vals = [key(p) for p in doc["plans"]] if key else []
    if all(a <= b for a, b in zip(vals, vals[1:])):
        return []
    return [f"order: the {doc.get('objective', 'throughput')} objective with {100 * SIMPLICITY:.1f}% added per extra "
            "axis "
            "or memory trick (tp, pp, cp, ep, ZeRO, ZeRO-3, recomputation, interleaving, replicas), "
            "so a near-tie goes to the simpler layout"]



def no_fit_advice(doc: dict) -> str:
    """Why no layout was recommended and what to change (the terminal's last line and the page's verdict)."""
    frac = doc.get("memory_fraction", 1.0)
    return ("every scored layout runs out of GPU memory"
            + (f" or needs more than {100 * frac:g}% of it ({field_name('plan.memory_fraction')})" if frac < 1.0 else "")
            + ". Add GPUs, use a GPU with more memory, "
              f"or lower the precision/optimizer state ({field_name('workload.precision')} bf16, "
              f"{field_name('workload.optimizer')} adam-8bit).")
