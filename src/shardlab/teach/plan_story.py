"""``shardlab plan --explain``: the plan's numbers turned into a paragraph a learner can say out loud (item 40).

Everything comes from the plan document itself (the winner, the design worksheet, the communication table and
the runner-up); nothing is recomputed here.
"""

from __future__ import annotations

import textwrap


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if abs(x) >= 0.095 else f"{100 * x:.1f}%"


def training_paragraph(doc: dict) -> str:
    """Say the winning training layout out loud: placement first, then the memory, the bottleneck and the risk."""
    best = doc["plans"][0]
    lay, b, step = best["layout"], best["breakdown"], best["step_time_s"]
    ws = {w["key"]: w for w in doc.get("worksheet", [])}
    nodes = -(-doc["gpus"] // doc["gpus_per_node"])
    s = [f"For {doc['model']} on {doc['gpus']} {doc['gpu']} GPUs ({nodes} node{'s' if nodes > 1 else ''} of "
         f"{doc['gpus_per_node']}), I first keep the chattiest traffic on the fastest link."]
    if lay["tp"] > 1:
        sp = bool(lay.get("sequence_parallel"))
        s.append(f"Tensor parallelism of {lay['tp']} stays {ws['tp']['placement'] if 'tp' in ws else 'inside a node'}, "
                 f"because its " + ("all-gathers and reduce-scatters (sequence parallel: the all-reduces split in two, "
                                    "the norms and dropout on 1/t of the tokens)" if sp else "all-reduces")
                 + f" around every attention and MLP block sit on the critical path; they cost "
                 f"{b['tp_comm_s']:.2f} s of the {step:.2f} s step.")
    else:
        s.append("I use no tensor parallelism: the model's layers fit without splitting their matrices, and that saves "
                 "the per-layer all-reduces.")
    if lay["pp"] > 1:
        s.append(f"Pipeline parallelism of {lay['pp']} splits the depth "
                 f"{ws['pp']['placement'] if 'pp' in ws else ''}; with {lay['microbatches']} micro-batches "
                 f"({lay['schedule']}) its bubble costs {b['pp_bubble_s']:.2f} s, {_pct(b['pp_bubble_s'] / step)} of the step.")
    else:
        s.append("I use no pipeline, so there is no bubble to pay for.")
    if lay["cp"] > 1:
        s.append(f"Context parallelism of {lay['cp']} splits each {doc.get('workload', {}).get('seq_len', 0):,}-token sequence "
                 f"{ws['cp']['placement'] if 'cp' in ws else ''}: ring attention passes K/V blocks between the "
                 f"{lay['cp']} ranks ({b.get('cp_comm_s', 0):.2f} s exposed), and each holds 1/{lay['cp']} of the "
                 f"activations.")
    dp = lay["dp"] * lay["cp"]
    zero = {0: "keeps full copies", 1: "shards the optimizer state", 2: "shards optimizer state and gradients",
            3: "shards optimizer state, gradients and weights (the FSDP way)"}[lay["zero"]]
    over = (f"all {dp} data- and context-parallel GPUs ({lay['dp']} × {lay['cp']}: the context-parallel ranks hold "
            f"the same weights, so they shard and reduce with the replicas)" if lay["cp"] > 1 else f"{dp} GPUs")
    s.append(f"Data parallelism of {lay['dp']} makes replicas for throughput, and ZeRO-{lay['zero']} {zero} across "
             f"{over}, which leaves {best['memory_bytes'] / 2**30:.1f} GiB per GPU"
             + (f" on the worst rank ({best['memory_worst_rank']['reason']})" if lay["pp"] > 1 and "memory_worst_rank" in best
                else "") + ".")
    from shardlab.planner.explain import BREAKDOWN_LABELS

    parts = {BREAKDOWN_LABELS.get(k, k): v for k, v in b.items() if v > 0}
    top = max(parts, key=parts.get)
    second = sorted(((v, k) for k, v in parts.items() if k != top), reverse=True)[:1]
    s.append(f"The step takes {step:.2f} s at {_pct(best['mfu'])} MFU; most of it is {top} ({parts[top]:.2f} s)"
             + (f", then {second[0][1]} ({second[0][0]:.2f} s)" if second else "") + ".")
    cap = doc.get("capacity_bytes") or 0
    room = 1 - best["memory_bytes"] / cap if cap else 1.0
    risky = [c for c in doc.get("communication", []) if c.get("risk")]
    if room < 0.05:
        s.append(f"The risk to watch is memory: {best['memory_bytes'] / 2**30:.1f} GiB of {cap / 2**30:.1f} GiB used, "
                 f"{100 * room:.1f}% headroom after the fragmentation allowance, so a longer sequence, a larger "
                 f"micro-batch or a framework's extra buffers would not fit.")
    elif risky:
        r = max(risky, key=lambda c: c["time_per_step_s"])
        s.append(f"The risk to watch is the {r['axis']} {r['op']} in {r['phase']}: {r['risk']}.")
    else:
        crit = [c for c in doc.get("communication", []) if c["overlap"] == "critical"]
        if crit:
            r = max(crit, key=lambda c: c["time_per_step_s"])
            s.append(f"The collective to watch is the {r['axis']} {r['op']} in {r['phase']} over {r['link_id']}, "
                     f"{r['calls_per_step']:,} calls per step on the critical path.")
    ru = doc.get("runner_up")
    if ru:
        diff = ", ".join(f"{k} {v}" for k, v in ru["differs_in"].items())
        s.append(f"The runner-up ({diff}) lost: {ru['why']}.")
    return " ".join(s)


def serve_paragraph(doc: dict) -> str:
    """Say the winning continuous-batching layout out loud (`plan --inference --serve`, under a load or at capacity)."""
    p = doc["plans"][0]
    load = doc.get("load") or {}
    cap = doc.get("capacity")
    if cap:
        head = (f"To serve {doc['model']} on {doc['gpus']} {doc['gpu']} GPUs with the most traffic its SLO allows, I run {p['replicas']} "
                f"replica(s) of TP {p['tp']} × PP {p['pp']}: they take {cap['max_request_rate']:,.2f} requests/s "
                f"({cap['goodput_tokens_per_s_per_gpu']:,.0f} output tokens/s per GPU) before the SLO breaks.")
    else:
        words = (f"{load['concurrency']} concurrent clients" if load.get("concurrency")
                 else f"{load.get('arrival_rate')} requests/s arriving")
        head = (f"To serve {doc['model']} on {doc['gpus']} {doc['gpu']} GPUs with {words} of {doc['prompt_len']} + "
                f"{doc['output_len']} tokens, I run {p['replicas']} replica(s) of TP {p['tp']} × PP {p['pp']} with "
                f"max-num-seqs {p['max_num_seqs']}.")
    s = [head]
    if p.get("ttft_s") is not None and p.get("tpot_s") is not None:
        s.append(f"A request waits {1e3 * p['ttft_s']:.1f} ms for its first token and {1e3 * p['tpot_s']:.1f} ms for each "
                 f"next one.")
    s.append("Continuous batching keeps each replica's KV cache full: more sequences in flight raise throughput until "
             "the time per token breaks the SLO.")
    return " ".join(s)


def inference_paragraph(doc: dict) -> str:
    """Say the winning serving layout out loud."""
    if "batch" not in doc:
        return serve_paragraph(doc)
    p = doc["plans"][0]
    s = [f"To serve {doc['model']} on {doc['gpus']} {doc['gpu']} GPUs with {doc['batch']} concurrent requests of "
         f"{doc['prompt_len']} + {doc['output_len']} tokens, I run {p['replicas']} replica(s) of TP {p['tp']} × PP {p['pp']}.",
         f"Each token takes {1e3 * p['decode_s_per_token']:.2f} ms to decode, a prompt {1e3 * p['prefill_s']:.1f} ms to "
         f"prefill, and a whole request {p['request_latency_s']:.2f} s; together the replicas generate "
         f"{p['tokens_per_s']:,.0f} tokens/s.",
         f"Each GPU uses {p['memory_bytes'] / 2**30:.1f} GiB and could hold {p['max_batch']} such sequences.",
         "Tensor parallelism lowers the time per token until its all-reduces dominate; replicas multiply throughput "
         "once the model fits on fewer GPUs."]
    if len(doc["plans"]) > 1:
        q = doc["plans"][1]
        s.append(f"The next best, {q['replicas']} × TP {q['tp']} × PP {q['pp']}, gives {q['tokens_per_s']:,.0f} tokens/s.")
    return " ".join(s)


def with_explanation(args, doc: dict, text: str) -> tuple[dict, str]:
    """Add the spoken paragraph to a plan's document and text when ``--explain`` was given."""
    if not getattr(args, "explain", False) or not doc.get("plans"):
        return doc, text
    para = inference_paragraph(doc) if "replicas" in doc["plans"][0] else training_paragraph(doc)
    doc["explanation"] = para
    return doc, text + "\n\nsaid out loud:\n" + textwrap.fill(para, 110, initial_indent="  ", subsequent_indent="  ")
