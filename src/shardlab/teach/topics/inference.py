"""Inference topics: weights + KV cache per GPU, decode (latency-bound) vs prefill (bandwidth-bound), TP vs replicas,
pipelines in serving (disaggregated prefill/decode: ``topics.disaggregation``)."""

from __future__ import annotations

from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.registry import Topic
from shardlab.teach.topics._common import catalog, cluster, gib, gpu, model, pct, serving_precision
from shardlab.units import fmt_bytes, fmt_time


def kv_cache(v: dict) -> Explanation:
    """Weights and KV cache per rank, whether they fit, and the KV blocks the serving engine allocates (its own count)."""
    from shardlab.estimate.inference import estimate_inference

    spec = catalog().model(v["model"])
    seq = v["seq"]                                    # at most the model's positions (registry._check_model_values)
    prec = serving_precision(spec, catalog().accelerator(v["gpu"]))
    per_tp = {}
    for t in sorted({1, v["tp"]}):
        per_tp[t] = estimate_inference(spec, cluster(v["gpu"], t), tp=t, batch=v["batch"], prompt_len=seq // 2,
                                       output_len=seq - seq // 2, precision=prec)
    est = per_tp[v["tp"]]
    kb, eng, acc = est.case.blocks, est.case.engine, est.case.cluster.accelerator
    kv_tok = est.kv_cache_bytes_per_token
    from shardlab.memory.inference import kv_heads_local
    from shardlab.specs.tensors import param_counts
    from shardlab.units import fmt_count

    kv_heads = kv_heads_local(spec.num_kv_heads, v["tp"])
    if spec.mla is not None:   # MLA caches one compressed latent and the shared RoPE key per token per layer
        kv_line = (f"KV cache per token per GPU (MLA, DeepSeek-V2 arXiv 2405.04434 §2.1: the compressed latent "
                   f"d_c = {spec.mla.kv_lora_rank} and the decoupled RoPE key d_R = {spec.mla.qk_rope_head_dim}, the same "
                   f"on every TP rank): {spec.num_layers} layers × ({spec.mla.kv_lora_rank} + {spec.mla.qk_rope_head_dim}) "
                   f"× 2 B = {kv_tok:,} B [kv_cache_bytes_per_token]")
        heads_note = "of the weights (the MLA latent cache is not split by heads)"
    else:
        kv_line = (f"KV cache per token per GPU: 2 (K and V) × {spec.num_layers} layers × {kv_heads} KV heads × "
                   f"{spec.head_dim_} × 2 B = {kv_tok:,} B [kv_cache_bytes_per_token]")
        heads_note = ("of the weights and of the KV heads" if spec.num_kv_heads >= v["tp"] else
                      f"of the weights; its {spec.num_kv_heads} KV heads are fewer than {v['tp']} ranks, so each rank keeps "
                      f"a copy of one ({spec.num_kv_heads} → 1 per rank)")
    logged = f"'# GPU blocks: {kb.num_blocks}'" if eng.id.startswith("vllm") else f"{kb.num_blocks:,} blocks"
    rows = [[t, gib(e.weights_bytes), f"{e.kv_cache_bytes_per_token:,}", gib(e.kv_cache_bytes), f"{e.case.blocks.num_blocks:,}",
             f"{e.case.blocks.tokens:,}", e.max_batch, "yes" if e.fits else "no"] for t, e in per_tp.items()]
    return Explanation(
        "kv-cache", "Serving memory: weights + KV cache, in the engine's blocks",
        f"Serving {spec.name} in {prec.weights}{' (its checkpoint)' if prec.weights_from_checkpoint else ''} on "
        f"{v['tp']} × {acc.id} with {v['batch']} sequence(s) of {seq} tokens: per-GPU "
        f"weights, KV cache, and the KV blocks the engine ({eng.id}) allocates?",
        dict(v),
        [(f"weights per GPU: this rank's TP shard at 2 B = {est.weights_bytes / 1e9:.2f} GB = {gib(est.weights_bytes)} "
          f"({fmt_count(param_counts(spec).total)} parameters × 2 B before any split; rules of thumb "
          f"round the count, e.g. '7B × 2 B = 14 GB'; 1 GiB = 1.074 GB) [memory/inference.py: weight_bytes_per_rank]")
         if prec.weight_bits == 16 else
         (f"weights per GPU: this rank's TP shard, the blocks' matrices at {prec.weights} ({prec.weight_bits} bits, "
          f"their scales included: the checkpoint as it ships) and embeddings, head and norms at 2 B = "
          f"{est.weights_bytes / 1e9:.2f} GB = {gib(est.weights_bytes)} ({fmt_count(param_counts(spec).total)} "
          f"parameters before any split; 1 GiB = 1.074 GB) [memory/inference.py: weight_bytes_per_rank]"),
         kv_line,
         f"for {v['batch']} × {seq} tokens, in whole blocks of {kb.block_size}: {gib(est.kv_cache_bytes)}",
         f"total with the activation peak and CUDA context ({gib(est.workspace_bytes)}): {gib(est.total_bytes)}: "
         f"{'fits' if est.fits else 'does NOT fit'}",
         f"the engine's rule ({eng.id}, '{eng.kv_memory_rule}'): it reserves gpu_memory_utilization {eng.gpu_memory_utilization:g} × "
         f"{gib(kb.capacity_bytes)} = {gib(kb.reserved_bytes)}, takes out weights {gib(kb.weights_bytes)}, activation peak "
         f"{gib(kb.activation_bytes)} and context {gib(kb.other_bytes)}, and cuts the rest into blocks of {kb.block_size} × "
         f"{kv_tok:,} B = {kb.bytes_per_block:,} B: {kb.num_blocks:,} blocks = {kb.tokens:,} tokens of cache "
         f"[memory/inference.py: kv_blocks]",
         f"as the engine reports it at start-up: {logged}; {est.max_batch} sequences of {seq} tokens fit at once",
         *([f"per rank, TP {v['tp']} holds 1/{v['tp']} {heads_note}: {gib(per_tp[1].weights_bytes)} → "
            f"{gib(est.weights_bytes)} of weights, {per_tp[1].kv_cache_bytes_per_token:,} → {kv_tok:,} B per token; "
            f"blocks {per_tp[1].case.blocks.num_blocks:,} → {kb.num_blocks:,} per GPU"] if v["tp"] > 1 else [])],
        f"Inference memory is the weights plus the KV cache. The weights are fixed: {gib(est.weights_bytes)} per GPU here. "
        f"The cache grows with every token of every sequence: {kv_tok:,} bytes per token, so {v['batch']} sequence(s) of "
        f"{seq} tokens take {gib(est.kv_cache_bytes)}. A serving engine gives what is left of its share of the GPU to the "
        f"cache in {kb.block_size}-token blocks ({kb.num_blocks:,} here, the number it prints at start-up), and that "
        f"number, not the weights, decides how many requests it can hold at once.",
        {"weights_bytes": est.weights_bytes, "kv_bytes_per_token": kv_tok, "kv_cache_bytes": est.kv_cache_bytes,
         "total_bytes": est.total_bytes, "fits": est.fits, "kv_blocks": kb.num_blocks, "block_size": kb.block_size,
         "max_batch": est.max_batch, "engine": eng.id,
         "per_tp": {t: {"weights_bytes": e.weights_bytes, "kv_bytes_per_token": e.kv_cache_bytes_per_token,
                        "kv_blocks": e.case.blocks.num_blocks} for t, e in per_tp.items()}},
        table=(["TP", "weights/GPU", "KV B/token/GPU", "KV of the batch", "KV blocks", "cache tokens", "max batch", "fits"], rows),
        sources=["vllm", "eleuther-math"], code=[],
        commands=[f"estimate {spec.name} --inference --tp {v['tp']} --gpu {acc.id} --batch {v['batch']} "
                  f"--prompt-len {seq // 2} --output-len {seq - seq // 2}"
                  + (f" --activations {prec.activations} --kv-cache-dtype {prec.kv_cache}" if prec.activations == "fp16"
                     else ""),
                  "run infer --tp 2 --max-new-tokens 8"])


def decode_vs_prefill(v: dict) -> Explanation:
    """Decode's TP all-reduces are tiny (latency-bound), prefill's are large (bandwidth-bound): priced on each link."""
    from shardlab.comm.inference import decode_step, prefill_step

    cat = catalog()
    spec, acc = cat.model(v["model"]), cat.accelerator(v["gpu"])
    links = [cat.link(x.strip()) for x in v["links"].split(",") if x.strip()]
    rows, res = [], {}
    for ln in links:
        d = decode_step(spec, tp=v["tp"], batch=v["batch"], context_len=v["prompt"], accelerator=acc, link=ln)
        p = prefill_step(spec, tp=v["tp"], batch=v["batch"], prompt_len=v["prompt"], accelerator=acc, link=ln)
        res[ln.id] = (d, p)
        rows.append([ln.id, fmt_time(d.step_time_s), pct(d.comm_fraction), d.comm_regime, fmt_time(p.step_time_s),
                     pct(p.comm_fraction), p.comm_regime])
    d0, p0 = res[links[0].id]
    worst = max(links, key=lambda ln: res[ln.id][0].comm_fraction)
    dw = res[worst.id][0]
    return Explanation(
        "decode-vs-prefill", ("Decode is latency-bound, prefill bandwidth-bound"
                              if (d0.comm_regime, p0.comm_regime) == ("latency", "bandwidth")
                              else f"Decode ({d0.comm_regime}-bound here) vs prefill ({p0.comm_regime}-bound here)"),
        f"{spec.name} with TP {v['tp']} on {acc.id}: how much of a decode step and of a prefill of {v['prompt']} tokens is "
        f"communication, on each link?",
        dict(v),
        [f"both: 2 all-reduces per layer × {spec.num_layers} layers = {d0.comm_calls} per step",
         f"decode message: b·h·2 B = {fmt_bytes(d0.comm_bytes_per_call)}: "
         + ("below the latency/bandwidth crossover, so each all-reduce costs its α steps (latency-bound)"
            if d0.comm_regime == "latency" else
            f"above the latency/bandwidth crossover on {links[0].id}, so even decode's all-reduces are bandwidth-bound "
            f"(a batch of {v['batch']} makes the message large)"),
         f"prefill message: b·s·h·2 B = {fmt_bytes(p0.comm_bytes_per_call)}: {p0.comm_regime}-bound",
         *[f"{ln.id}: decode {fmt_time(res[ln.id][0].step_time_s)}, comm {pct(res[ln.id][0].comm_fraction)}; prefill "
           f"{fmt_time(res[ln.id][1].step_time_s)}, comm {pct(res[ln.id][1].comm_fraction)}" for ln in links],
         f"on {worst.id}, {pct(dw.comm_fraction)} of every decode step is communication"
         + (" (over 40%: keep TP inside a node)" if dw.comm_fraction > 0.4 else "")],
        (f"Each generated token needs 2 × {spec.num_layers} all-reduces of only {fmt_bytes(d0.comm_bytes_per_call)}: the "
         f"bytes are nothing, the per-message latency is everything, so decode over a slow network spends "
         f"{pct(dw.comm_fraction)} of its time waiting ({worst.id}). " if d0.comm_regime == "latency" else
         f"Each generated token needs 2 × {spec.num_layers} all-reduces; a batch of {v['batch']} makes each carry "
         f"{fmt_bytes(d0.comm_bytes_per_call)}, enough that bandwidth, not latency, sets their cost, and decode over "
         f"{worst.id} spends {pct(dw.comm_fraction)} of its time communicating. ")
        + "Prefill sends the same number of messages but each carries the whole prompt"
        + (", so its cost is bandwidth. " if p0.comm_regime == "bandwidth" else
           f"; a prompt of {v['prompt']} tokens is short enough that latency still sets it. ")
        + "The right interconnect depends on the workload, and for token-by-token decoding with tensor parallelism "
          "only a fast in-node link works.",
        {ln: {"decode_comm_fraction": d.comm_fraction, "decode_regime": d.comm_regime, "prefill_comm_fraction": p.comm_fraction,
              "prefill_regime": p.comm_regime, "decode_step_s": d.step_time_s, "prefill_step_s": p.step_time_s}
         for ln, (d, p) in res.items()},
        table=(["link", "decode step", "decode comm", "decode regime", "prefill", "prefill comm", "prefill regime"], rows),
        sources=["megatron", "databricks-inference", "hockney"], code=["meg-row", "meg-g"],
        commands=[f"comm inference {spec.name} --tp {v['tp']} --link {worst.id} --prompt-len {v['prompt']}"])


def tp_vs_replicas(v: dict) -> Explanation:
    """One TP=t group vs t/(t/2) replicas of TP=t/2 serving the same requests."""
    from shardlab.errors import ShardlabError
    from shardlab.estimate.inference import tp_versus_replicas

    spec, cl = catalog().model(v["model"]), cluster(v["gpu"], v["tp"])
    if v["tp"] < 2:
        raise ShardlabError("tp must be 2 or more to compare with replicas of a smaller TP")
    r = tp_versus_replicas(spec, cl, tp=v["tp"], batch=v["batch"], prompt_len=v["prompt"], output_len=v["output"],
                           precision=serving_precision(spec, cl.accelerator))
    g, rep = r["group"], r["replicas"]
    held = "the whole model" if rep["tp"] == 1 else f"1/{rep['tp']} of the weights"
    return Explanation(
        "tp-vs-replicas", "TP or replicas?",
        f"{v['tp']} × {cl.accelerator.id} serving {v['batch']} concurrent requests of {spec.name}: one TP {v['tp']} group or "
        f"{rep['count']} replicas of TP {rep['tp']}?",
        dict(v),
        [f"TP {g['tp']}: the weights split {g['tp']} ways, each token pays 2·L all-reduces; decode "
         f"{g['decode_s_per_token'] * 1e3:.2f} ms/token, {g['tokens_per_s']:,.0f} tokens/s for the batch",
         f"{rep['count']} × TP {rep['tp']}: each replica holds {held} and {rep['batch_each']} request(s); "
         + (f"decode {rep['decode_s_per_token'] * 1e3:.2f} ms/token, {rep['tokens_per_s']:,.0f} tokens/s in total"
            if rep["fits"] else "it does not fit in memory"),
         f"verdict: {r['verdict']}"],
        f"Tensor parallelism makes each token faster by splitting the weight reads over more GPUs, but it pays "
        f"communication on every layer. Replicas pay none and each reads its own copy of the weights, so when the model "
        f"fits on fewer GPUs and there are enough requests, replicas usually give more total throughput while TP gives "
        f"lower latency per token. Here: {r['verdict']}.",
        r, sources=["megatron", "databricks-inference"], code=[],
        commands=[f"estimate {spec.name} --inference --tp {v['tp']} --batch {v['batch']} --gpu {cl.accelerator.id} "
                  f"--prompt-len {v['prompt']} --output-len {v['output']}",
                  f"plan {spec.name} --inference --gpus {v['tp']} --batch {v['batch']} --gpu {cl.accelerator.id}"])


def _one_request(spec, cl, p: int, prompt: int, output: int) -> dict:
    """One request alone on p stages, as the serving model prices it (``estimate.inference.static_batch`` with one
    sequence in flight): the token crosses the stages in turn, every stage runs an engine step of its own for it
    (the engine's per-step and per-sequence overheads, ``serving.cycle.micro_batch_times``) and p − 1 sends carry
    it across the stage boundaries (the case's send, ``serving.case.prepare``)."""
    from shardlab.estimate.inference import static_batch

    case, r = static_batch(spec, cl, tp=1, pp=p, in_flight=1, prompt_len=prompt, output_len=output,
                           precision=serving_precision(spec, cl.accelerator))
    k = case.kernels
    return {"tpot_s": float(r["tpot_s"]), "e2e_s": float(r["e2e_s"]), "output_tokens_per_s": float(r["output_tokens_per_s"]),
            "send_s": float(case.p2p_fixed_s + case.p2p_s_per_token), "stage_overhead_s": float(k.step_overhead_s + k.seq_overhead_s),
            "engine": case.engine.id, "link": (cl.inter_link if p > cl.gpus_per_node else cl.intra_link).id}


def pp_inference(v: dict) -> Explanation:
    """Pipelined micro-batches: throughput grows with the stages, the time per token does not fall; one request
    starves them and pays every stage's step and send."""
    from shardlab.estimate.inference import estimate_inference
    from shardlab.serving.step import step_parts
    from shardlab.serving.steady import scalars
    from shardlab.serving.cycle import micro_batch_times

    from shardlab.errors import ShardlabError

    spec = catalog().model(v["model"])
    doubling = [p for p in (1, 2, 4, 8, 16, 32) if p <= spec.num_layers]
    if v["pp"] not in doubling:
        raise ShardlabError(f"pp={v['pp']}: the table doubles the stages from 1, so give a power of two up to "
                            f"{doubling[-1]} ({spec.name} has {spec.num_layers} layers), e.g. pp=8")
    stages = [p for p in doubling if p <= v["pp"]]
    res, alone = {}, {}
    for p in stages:
        cl = cluster(v["gpu"], p)
        res[p] = estimate_inference(spec, cl, pp=p, batch=v["batch"], prompt_len=v["prompt"], output_len=v["output"],
                                    precision=serving_precision(spec, cl.accelerator))
        alone[p] = _one_request(spec, cl, p, v["prompt"], v["output"])
    one, top = res[1], res[stages[-1]]
    rows = [[p, e.in_flight, gib(e.weights_bytes), "yes" if e.fits else "no", f"{e.decode_s_per_token * 1e3:.2f} ms",
             f"{e.request_latency_s:.2f} s", f"{e.tokens_per_s:,.0f}", f"{e.tokens_per_s / one.tokens_per_s:.2f}×",
             f"{alone[p]['output_tokens_per_s']:,.0f}"] for p, e in res.items()]
    P = stages[-1]
    a1, aP = alone[1], alone[P]
    # the decode cycle of the full pipeline: max(one micro-batch through every stage + sends, P × the slowest stage)
    b, ctx = v["batch"], top.case.context_tokens
    through, stage = (float(x) for x in micro_batch_times(scalars(top.case), float(b), b * ctx))
    head_s = float(step_parts(top.case.slowest, top.case.kernels, b, b * ctx, 0.0, 0.0, b)["head_s"])
    last = (f"; the slowest stage is the last, which also reads the output head ({fmt_time(head_s)} a step)"
            if P > 1 and top.case.slowest.head_weight_bytes > 0 else "")
    fall = 1 - aP["output_tokens_per_s"] / a1["output_tokens_per_s"]
    return Explanation(
        "pp-inference", "Pipeline parallelism in serving: throughput, not latency",
        f"Serving {spec.name} on 1 to {P} pipeline stages of {top.case.cluster.accelerator.id}, {v['batch']} request(s) per "
        f"micro-batch, {v['prompt']} + {v['output']} tokens: what happens to tokens/s and to the time per token?",
        dict(v),
        [f"p stages keep p micro-batches of {v['batch']} in flight, each stage working on a different one: "
         f"{one.in_flight} → {top.in_flight} sequences [estimate/inference.py: estimate_inference]",
         f"a token still crosses every stage in turn, and every stage runs one engine step per micro-batch: a decode "
         f"cycle is max(one micro-batch through all p stages + p − 1 sends, p × the slowest stage's step) = "
         f"max({fmt_time(through)}, {P} × {fmt_time(stage)}) = {fmt_time(top.decode_s_per_token)} at PP {P}{last}; "
         f"so the time per output token goes {one.decode_s_per_token * 1e3:.2f} → {top.decode_s_per_token * 1e3:.2f} ms "
         f"(it does not fall, it grows) [serving/steady.py: cycle_time]",
         f"throughput: {one.tokens_per_s:,.0f} → {top.tokens_per_s:,.0f} tokens/s "
         f"({top.tokens_per_s / one.tokens_per_s:.2f}× with {P}× the GPUs); each stage also holds 1/p of the weights, "
         f"{gib(one.weights_bytes)} → {gib(top.weights_bytes)}, which leaves room for more KV blocks",
         f"low traffic: with one request in flight only one stage works at a time, the other p − 1 wait, and each stage "
         f"adds its own step overhead ({fmt_time(a1['stage_overhead_s'])}: the {a1['engine']} engine's per-step and "
         f"per-sequence overheads) and each boundary a send"
         + (f" ({fmt_time(aP['send_s'])} on {aP['link']}): per token {fmt_time(a1['tpot_s'])} on 1 stage, "
            f"{fmt_time(aP['tpot_s'])} on {P} = {fmt_time(a1['tpot_s'])} + {P - 1} × ({fmt_time(a1['stage_overhead_s'])} + "
            f"{fmt_time(aP['send_s'])}), so {a1['output_tokens_per_s']:,.0f} tokens/s on 1 stage, "
            f"{aP['output_tokens_per_s']:,.0f} on {P} ({fall:.1%} fewer: PP starves without enough concurrent requests)"
            if P > 1 else f": one stage has neither, {a1['output_tokens_per_s']:,.0f} tokens/s (give pp=2 or more to "
                          f"see PP starve)"),
         f"request latency {one.request_latency_s:.2f} → {top.request_latency_s:.2f} s: the pipeline adds throughput, "
         f"not latency; for lower latency split each layer instead (TP) or use a faster GPU"],
        f"A pipeline splits the model's layers over GPUs. For training it keeps every stage busy with micro-batches; for "
        f"serving it does the same with requests: {P} stages work on {P} batches at once, so throughput grows "
        f"({top.tokens_per_s / one.tokens_per_s:.1f}× here). But every token still passes through all the layers one after "
        f"the other, and each stage runs a step of its own for every micro-batch, so a token takes longer, not shorter "
        f"({one.decode_s_per_token * 1e3:.2f} → {top.decode_s_per_token * 1e3:.2f} ms here). And with a single request the "
        "stages take turns while each adds its own step overhead and a send: "
        + (f"throughput falls from {a1['output_tokens_per_s']:,.0f} to {aP['output_tokens_per_s']:,.0f} tokens/s. "
           if P > 1 else f"on more stages its {a1['output_tokens_per_s']:,.0f} tokens/s would fall. ")
        + "Pipeline parallelism is for fitting a big model and serving many requests, not for answering one faster.",
        {"stages": {p: {"tokens_per_s": e.tokens_per_s, "decode_s_per_token": e.decode_s_per_token,
                        "request_latency_s": e.request_latency_s, "in_flight": e.in_flight, "fits": e.fits,
                        "one_request_tokens_per_s": alone[p]["output_tokens_per_s"],
                        "one_request_s_per_token": alone[p]["tpot_s"], "one_request_latency_s": alone[p]["e2e_s"]}
                    for p, e in res.items()},
         "stage_overhead_s": a1["stage_overhead_s"], "send_s": aP["send_s"]},
        table=(["PP", "in flight", "weights/GPU", "fits", "per token", "request", "tokens/s", "vs PP 1", "1 request tokens/s"],
               rows),
        sources=["gpipe", "narayanan", "vllm"], code=["pt-pipe", "ds-pipe"],
        commands=[f"estimate {spec.name} --inference --pp {P} --batch {v['batch'] * P} --gpu {top.case.cluster.accelerator.id} "
                  f"--prompt-len {v['prompt']} --output-len {v['output']}",
                  f"plan {spec.name} --inference --gpus {P} --batch {v['batch'] * P} --gpu {top.case.cluster.accelerator.id} "
                  f"--prompt-len {v['prompt']} --output-len {v['output']}"],
        notes=["static batches through the serving model (serving/steady.py: fluid); the sends between stages go over "
               "the node's link, or the network's once the stages span nodes",
               "one request: each stage's step priced with the serving model's per-stage terms (serving/step.py: "
               "step_time on stage_models) plus the sends; the engine's overheads are fitted to published vLLM runs "
               "(catalog/data/engines.yaml)"])


TOPICS = [
    Topic("kv-cache", "KV cache and serving memory", "weights + KV per GPU, fits or not, KV blocks of 16 tokens", (14, 33),
          (model("llama-2-7b"), gpu("rtx-4090"), Param("tp", "int", 1, "tensor-parallel GPUs"),
           Param("batch", "int", 1, "concurrent sequences"), Param("seq", "int", 4096, "tokens per sequence")), kv_cache),
    Topic("decode-vs-prefill", "Decode vs prefill", "decode all-reduces are latency-bound, prefill's bandwidth-bound", (34,),
          (model("llama-2-7b"), gpu("h100-sxm"), Param("tp", "int", 2, "tensor-parallel GPUs", minimum=2),
           Param("batch", "int", 1, "sequences"), Param("prompt", "int", 2048, "prompt tokens"),
           Param("links", "str", "nvlink4,pcie4,ethernet-10g", "comma-separated links")), decode_vs_prefill),
    Topic("pp-inference", "PP in serving", "pipelined micro-batches: throughput grows with stages, latency does not fall",
          (36, 37), (model("llama-3.1-8b"), gpu("h100-sxm"), Param("pp", "int", 8, "most pipeline stages (powers of 2 up to it)"),
                     Param("batch", "int", 8, "requests per micro-batch"), Param("prompt", "int", 1024, "prompt tokens"),
                     Param("output", "int", 256, "generated tokens")), pp_inference),
    Topic("tp-vs-replicas", "TP vs replicas", "one TP group or several smaller replicas for the same GPUs", (8, 33),
          (model("llama-3.1-8b"), gpu("h100-sxm"), Param("tp", "int", 2, "GPUs in the TP group", minimum=2),
           Param("batch", "int", 16, "concurrent requests"), Param("prompt", "int", 1024, "prompt tokens"),
           Param("output", "int", 256, "generated tokens")), tp_vs_replicas),
]
