"""``python -m sglang.launch_server`` command line for an inference plan (flags of SGLang 0.5.2, ``data/flags.yaml``).

Mapping (SGLang's ServerArgs): the replica's GPUs → --tp-size (with data-parallel attention SGLang counts every GPU
of the instance in --tp-size and splits it into --dp-size attention groups of tp/dp GPUs); independent replicas →
--dp-size (SGLang's data-parallel controller) without DP attention; expert parallelism → --ep-size (the experts over
the instance's GPUs), --ep-num-redundant-experts; two-batch overlap → --enable-two-batch-overlap; prompt + output →
--context-length; sequences per replica → --max-running-requests (with data-parallel attention the instance's
total: SGLang gives each attention rank 1/dp of it); memory share → --mem-fraction-static; KV dtype →
--kv-cache-dtype fp8_e4m3; FP8 weights → --quantization fp8.
"""

from __future__ import annotations


from shardlab.errors import ShardlabError
from shardlab.export.flags import require_valid, unread_flags, version
from shardlab.export.job import Export, Imported, LaunchJob, Refused, Unsupported, header
from shardlab.export.names import as_shipped_note, checkpoint_weights, hf_id, read_model
from shardlab.export.text import as_int, comment_block, flag_words, flags_dict, serving_fields, split_command

CHECKED = f"{version('sglang')} flag schema"
DTYPE = {"bf16-mixed": "bfloat16", "bf16": "bfloat16", "fp16-mixed": "float16", "fp32": "float32"}


def arg_list(job: LaunchJob) -> tuple[str, list[tuple[str, object]], list[Unsupported]]:
    if job.serve is None:
        raise Refused("sglang serves models: export an inference plan (shardlab export --to sglang MODEL --inference "
                      "--tp N)")
    repo = hf_id(job.model)
    if repo is None:
        raise Refused(f"{job.model} has no public Hugging Face checkpoint for SGLang to load")
    lay, s = job.layout, job.serve
    uns = []
    if lay.pp > 1 and s.dp_attention > 1:
        raise Refused("SGLang runs data-parallel attention without pipeline stages: drop --pp or --dp-attention")
    if s.dp_attention > 1 and s.replicas > 1:
        raise Refused(f"one SGLang instance with --enable-dp-attention is one replica; {s.replicas} replicas need "
                      f"{s.replicas} instances behind sglang_router: export one replica (--gpus {job.gpus // s.replicas})")
    pairs: list[tuple[str, object]] = [("model-path", repo), ("tp-size", lay.tp * s.dp_attention)]
    if lay.pp > 1:
        pairs.append(("pp-size", lay.pp))
    if s.dp_attention > 1:
        pairs += [("dp-size", s.dp_attention), ("enable-dp-attention", True)]
    elif s.replicas > 1:
        pairs.append(("dp-size", s.replicas))
    if s.ep > 1:
        pairs.append(("ep-size", s.ep))
    # under --enable-dp-attention SGLang divides --max-running-requests by --dp-size (sglang/srt/managers/
    # tp_worker.py, 0.5.2): the instance's total is each attention rank's cap × the ranks
    pairs += [("context-length", s.prompt_len + s.output_len),
              ("max-running-requests", s.max_num_seqs * max(1, s.dp_attention)),
              ("mem-fraction-static", s.gpu_memory_utilization), ("dtype", DTYPE[job.precision])]
    if s.kv_cache_dtype.startswith("fp8"):
        pairs.append(("kv-cache-dtype", "fp8_e4m3"))
    ckpt = checkpoint_weights(job.model)
    if ckpt:                        # a quantized checkpoint: SGLang reads its method from the config, no flag
        if s.weights != ckpt:
            uns.append(Unsupported("weights", s.weights, as_shipped_note("SGLang", repo, ckpt, s.weights)))
    elif s.weights == "fp8":
        pairs.append(("quantization", "fp8"))
    elif s.weights in ("int4", "int8", "fp4"):
        uns.append(Unsupported("weights", s.weights, f"SGLang loads {s.weights} weights from a pre-quantized checkpoint "
                                                     f"({'NVFP4 (ModelOpt)' if s.weights == 'fp4' else 'AWQ/GPTQ'}) that shardlab cannot name: this file serves {repo} in "
                                                     f"bf16"))
    if job.gpus > job.gpus_per_node:
        uns.append(Unsupported("nodes", job.nodes, "SGLang spans nodes with one launch_server per node: add --nnodes "
                                                   f"{job.nodes} --node-rank K --dist-init-addr HEAD:PORT on each"))
    return repo, pairs, uns


def render(job: LaunchJob, spec) -> Export:
    if job.serve is not None and job.serve.pools is not None:
        from shardlab.export import pd_engines

        return pd_engines.render_sglang(job)
    repo, pairs, uns = arg_list(job)
    flags = dict(pairs)
    require_valid("sglang", flags)
    s = job.serve
    words = flag_words(pairs)
    lines = header(job, "sglang", uns) + [f"checked against {CHECKED}",
                                          f"requests: {s.prompt_len} prompt + {s.output_len} output tokens"]
    text = ("#!/usr/bin/env bash\n" + comment_block(lines) + "python -m sglang.launch_server \\\n    "
            + " \\\n    ".join(words) + "\n")
    return Export("sglang", "SGLang launch_server command", f"{job.model}-sglang.sh", text, CHECKED, tuple(uns),
                  f"bash {job.model}-sglang.sh")


def read(text: str, catalog) -> Imported:
    from shardlab.export import pd_engines

    if pd_engines.is_disaggregated(text):
        return pd_engines.read("sglang", text)
    return read_one(text, catalog)


def read_one(text: str, catalog=None) -> Imported:
    """One server's line (a disaggregated script's instances are read one by one, ``export.pd_engines``)."""
    words = split_command(text)
    if not any("sglang.launch_server" in w for w in words):
        raise ShardlabError("no `python -m sglang.launch_server ...` line found")
    fl = flags_dict(words[next(i for i, w in enumerate(words) if "sglang.launch_server" in w) + 1:])
    where = "sglang.launch_server"
    repo = fl.get("model-path") or fl.get("model")
    f, und, ign = read_model(repo, "--model-path")
    from shardlab import limits as L

    def g(n, d, lo=1, hi=L.MAX_GPUS, why=""):
        return as_int(fl, n, where, lo, hi, why) if n in fl else d

    gpus = g("tp-size", 1) if "tp-size" in fl else g("tp", 1)
    dp = g("dp-size", 1) if "dp-size" in fl else g("dp", 1)
    dpa = fl.get("enable-dp-attention") is True
    if dpa:
        if gpus % dp:
            raise ShardlabError(f"{where}: --tp-size {gpus} is not a multiple of --dp-size {dp} (SGLang splits the "
                                f"instance's GPUs into dp attention groups); fix the file")
        f["tp"], f["dp_attention"] = gpus // dp, dp
        und.append((f"--tp-size {gpus} --dp-size {dp} --enable-dp-attention",
                    f"{dp} data-parallel attention ranks of TP {gpus // dp}"))
    else:
        f["tp"], f["replicas"] = gpus, dp
        und.append((f"--tp-size {gpus} --dp-size {dp}", f"{dp} replica(s) of TP {gpus}"))
    f["pp"] = g("pp-size", 1, 1, L.MAX_LAYERS, "each pipeline stage holds at least one layer")
    if "ep-size" in fl:
        f["ep"] = g("ep-size", 1)
        und.append((f"--ep-size {f['ep']}", "expert-parallel GPUs (--ep)"))
    serving_fields(fl, text, where, "max-running-requests", "context-length", "mem-fraction-static", f, und, ign)
    if dpa and "max_num_seqs" in f:                 # the instance's total, each attention rank takes its share
        total = f["max_num_seqs"]
        if total < dp:
            raise ShardlabError(f"{where}: --max-running-requests {total} over --dp-size {dp} leaves each attention rank "
                                f"none (SGLang gives each total // dp); raise it to a multiple of {dp}")
        f["max_num_seqs"] = total // dp
        und.append((f"--max-running-requests {total} over --dp-size {dp}",
                    f"{f['max_num_seqs']} sequences per attention rank"
                    + (f" (SGLang rounds down: {total % dp} unused)" if total % dp else "")))
    dt = str(fl.get("dtype", "auto"))
    f["precision"] = {"float16": "fp16-mixed", "half": "fp16-mixed", "float32": "fp32", "float": "fp32"}.get(dt, "bf16-mixed")
    und.append((f"--dtype {dt}", f"{f['precision']} weights"))
    f["kv_cache_dtype"] = str(fl.get("kv-cache-dtype", "auto"))
    if f["kv_cache_dtype"].startswith("fp8"):
        und.append((f"--kv-cache-dtype {f['kv_cache_dtype']}", "FP8 KV cache (--kv-cache-dtype fp8)"))
    if str(fl.get("quantization", "")) == "fp8":
        f["weights"] = "fp8"
        und.append(("--quantization fp8", "FP8 weights (--weights fp8)"))
    for k in ("enable-two-batch-overlap", "ep-num-redundant-experts", "moe-a2a-backend", "chunked-prefill-size",
              "disaggregation-mode", "page-size", "nnodes"):
        if k in fl:
            ign.append(f"--{k} (read as the engine's default; give the shardlab flag)")
    ign += unread_flags("sglang", fl, SGLANG_READ)
    return Imported("sglang", f, tuple(und), tuple(ign), framework="sglang")


SGLANG_READ = {"model-path", "model", "tp-size", "tp", "dp-size", "dp", "enable-dp-attention", "pp-size", "ep-size",
               "max-running-requests", "context-length", "mem-fraction-static", "dtype", "kv-cache-dtype",
               "quantization", "enable-two-batch-overlap", "ep-num-redundant-experts", "moe-a2a-backend",
               "chunked-prefill-size", "disaggregation-mode", "page-size", "nnodes", "port", "host", "node-rank",
               "dist-init-addr", "disaggregation-transfer-backend", "disaggregation-ib-device", "served-model-name",
               "trust-remote-code"}
"""The launch_server flags ``read_one`` reads, names as read at the default, or that change no estimate."""
