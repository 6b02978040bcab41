"""``vllm serve`` command line for an inference plan (flags of vLLM 0.11.0, ``data/flags.yaml``), with the KV-cache
block count the plan predicts, so the number vLLM logs at start-up ('# GPU blocks: N') can be held against it.

Mapping: tp/pp → --tensor-/--pipeline-parallel-size; replicas → --data-parallel-size; expert parallelism →
--enable-expert-parallel (vLLM's EP size is TP × DP), with data-parallel attention its ranks → --data-parallel-size
(one replica); prompt + output length →
--max-model-len; concurrent sequences per replica → --max-num-seqs; precision → --dtype;
shardlab.estimate.inference's usable-memory fraction → --gpu-memory-utilization.
"""

from __future__ import annotations


from shardlab.errors import ShardlabError
from shardlab.export.flags import require_valid, unread_flags, version
from shardlab.export.job import Export, Imported, LaunchJob, Refused, Unsupported, header
from shardlab.export.names import as_shipped_note, checkpoint_weights, hf_id, read_model
from shardlab.export.text import as_int, comment_block, flag_words, flags_dict, serving_fields, split_command

CHECKED = f"{version('vllm')} flag schema"
DTYPE = {"bf16-mixed": "bfloat16", "bf16": "bfloat16", "fp16-mixed": "float16", "fp32": "float32"}
BLOCK_TOKENS = 16
"""vLLM's default KV-cache block size in tokens (--block-size 16 on CUDA)."""


def arg_list(job: LaunchJob) -> tuple[str, list[tuple[str, object]], list[Unsupported]]:
    if job.serve is None:
        raise Refused("vllm serves models: export an inference plan (shardlab plan --inference ... --export vllm, or "
                      "shardlab export --to vllm MODEL --inference --tp N)")
    repo = hf_id(job.model)
    if repo is None:
        raise Refused(f"{job.model} has no public Hugging Face checkpoint for vLLM to load")
    lay, s = job.layout, job.serve
    uns = []
    pairs = [("tensor-parallel-size", lay.tp), ("pipeline-parallel-size", lay.pp)]
    if s.dp_attention > 1 and s.replicas > 1:
        raise Refused(f"one vllm serve with --enable-expert-parallel and --data-parallel-size is one expert-parallel "
                      f"replica; {s.replicas} replicas need {s.replicas} servers: export one (--gpus "
                      f"{job.gpus // s.replicas})")
    if s.dp_attention > 1:
        pairs.append(("data-parallel-size", s.dp_attention))
    elif s.replicas > 1:
        pairs.append(("data-parallel-size", s.replicas))
    if s.ep > 1:
        pairs.append(("enable-expert-parallel", True))
    pairs += [("max-model-len", s.prompt_len + s.output_len), ("max-num-seqs", s.max_num_seqs),
              ("gpu-memory-utilization", s.gpu_memory_utilization), ("kv-cache-dtype", s.kv_cache_dtype),
              ("dtype", DTYPE[job.precision]), ("block-size", BLOCK_TOKENS)]
    ckpt = checkpoint_weights(job.model)
    if ckpt:                        # a quantized checkpoint: vLLM reads its method from the config, no flag
        if s.weights != ckpt:
            uns.append(Unsupported("weights", s.weights, as_shipped_note("vLLM", repo, ckpt, s.weights)))
    elif s.weights == "fp8":        # vLLM quantizes the bf16 checkpoint's linear weights to FP8 at load time
        pairs.append(("quantization", "fp8"))
    elif s.weights in ("int4", "int8", "fp4"):
        uns.append(Unsupported("weights", s.weights, f"vLLM loads {s.weights} weights from a pre-quantized checkpoint "
                                                     f"({'NVFP4 (ModelOpt)' if s.weights == 'fp4' else 'AWQ/GPTQ, --quantization awq or gptq'}) that shardlab cannot name: "
                                                     f"this file serves {repo} in bf16, and its predicted KV blocks are "
                                                     f"for bf16 weights"))
    if job.gpus > job.gpus_per_node:
        uns.append(Unsupported("nodes", job.nodes, "vLLM spans nodes through a Ray cluster you start first "
                                                   "(ray start --head / --address) before vllm serve"))
    return repo, pairs, uns


def render(job: LaunchJob, spec) -> Export:
    if job.serve is not None and job.serve.pools is not None:
        from shardlab.export import pd_engines

        return pd_engines.render_vllm(job)
    repo, pairs, uns = arg_list(job)
    require_valid("vllm", dict(pairs))
    s = job.serve
    flags = flag_words(pairs)
    lines = header(job, "vllm", uns) + [f"checked against {CHECKED}",
                                        f"requests: {s.prompt_len} prompt + {s.output_len} output tokens"]
    if s.kv_blocks is not None:
        lines.append(f"predicted KV-cache blocks per GPU: {s.kv_blocks} of {BLOCK_TOKENS} tokens "
                     f"({s.kv_blocks * BLOCK_TOKENS:,} tokens); vLLM logs its own count as '# GPU blocks' at start-up")
    text = "#!/usr/bin/env bash\n" + comment_block(lines) + f"vllm serve {repo} \\\n    " + " \\\n    ".join(flags) + "\n"
    return Export("vllm", "vllm serve command", f"{job.model}-vllm.sh", text, CHECKED, tuple(uns), f"bash {job.model}-vllm.sh")


def read(text: str, catalog) -> Imported:
    from shardlab.export import pd_engines

    if pd_engines.is_disaggregated(text):
        return pd_engines.read("vllm", text)
    return read_one(text, catalog)


def read_one(text: str, catalog=None) -> Imported:
    """One server's line (a disaggregated script's instances are read one by one, ``export.pd_engines``)."""
    words = split_command(text)
    if "serve" in words and any(w.endswith("vllm") for w in words[:words.index("serve")]):
        i = words.index("serve")
        repo = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
        fl = flags_dict(words[i + 1:])
    elif any("vllm.entrypoints" in w for w in words):
        fl = flags_dict(words)
        repo = fl.get("model")
    else:
        raise ShardlabError("no `vllm serve MODEL ...` line found")
    where = "vllm serve"
    f, und, ign = read_model(repo, "model")
    from shardlab import limits as L

    def g(n, d, lo=1, hi=L.MAX_GPUS, why=""):
        return as_int(fl, n, where, lo, hi, why) if n in fl else d

    f["tp"] = g("tensor-parallel-size", 1)
    f["pp"] = g("pipeline-parallel-size", 1, 1, L.MAX_LAYERS, "each pipeline stage holds at least one layer")
    dp = g("data-parallel-size", 1)
    if fl.get("enable-expert-parallel") is True:   # vLLM's EP spans TP × DP; DP ranks then share the experts
        f["ep"], f["dp_attention"] = f["tp"] * dp, dp
        und.append(("--enable-expert-parallel" + (f" --data-parallel-size {dp}" if dp > 1 else ""),
                    f"EP {f['ep']}" + (f", {dp} data-parallel attention ranks (--dp-attention)" if dp > 1 else "")))
    else:
        f["replicas"] = dp
        if dp > 1:
            und.append((f"--data-parallel-size {dp}", f"{dp} replicas"))
    und.append((f"--tensor-parallel-size {f['tp']} --pipeline-parallel-size {f['pp']}", "tp, pp"))
    serving_fields(fl, text, where, "max-num-seqs", "max-model-len", "gpu-memory-utilization", f, und, ign)
    dt = str(fl.get("dtype", "auto"))
    f["precision"] = {"float16": "fp16-mixed", "half": "fp16-mixed", "float32": "fp32", "float": "fp32"}.get(dt, "bf16")
    f["precision"] = "bf16-mixed" if f["precision"] == "bf16" else f["precision"]
    und.append((f"--dtype {dt}", f"{f['precision']} weights"))
    f["kv_cache_dtype"] = str(fl.get("kv-cache-dtype", "auto"))
    if str(fl.get("quantization", "")) == "fp8":
        f["weights"] = "fp8"
        und.append(("--quantization fp8", "FP8 weights (--weights fp8)"))
    for k in ("quantization", "max-num-batched-tokens", "enable-chunked-prefill", "swap-space"):
        if k in fl and not (k == "quantization" and f.get("weights") == "fp8"):
            ign.append(f"--{k} (not modelled)")
    if f["kv_cache_dtype"].startswith("fp8"):
        und.append((f"--kv-cache-dtype {f['kv_cache_dtype']}", "FP8 KV cache (--kv-cache-dtype fp8)"))
    elif f["kv_cache_dtype"] != "auto":
        ign.append(f"--kv-cache-dtype {f['kv_cache_dtype']} (KV cache estimated in the model dtype)")
    ign += unread_flags("vllm", fl, VLLM_READ)
    return Imported("vllm", f, tuple(und), tuple(ign), framework="vllm")


VLLM_READ = {"model", "tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size", "enable-expert-parallel",
             "max-num-seqs", "max-model-len", "gpu-memory-utilization", "dtype", "kv-cache-dtype", "quantization",
             "max-num-batched-tokens", "enable-chunked-prefill", "swap-space", "block-size", "port", "host",
             "kv-transfer-config", "served-model-name"}
"""The vllm serve flags ``read_one`` reads, names as not modelled, or that change no estimate (port, host, the
disaggregated connector pd_engines reads, the block size shardlab writes)."""
