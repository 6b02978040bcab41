"""``trtllm-serve`` command line and its ``--extra_llm_api_options`` YAML for an inference plan (TensorRT-LLM 1.0,
PyTorch backend; the options and keys in ``data/flags.yaml``).

Mapping (tensorrt_llm/commands/serve.py and llmapi/llm_args.py): the replica's GPUs → --tp_size (with data-parallel
attention TensorRT-LLM counts every GPU in --tp_size and sets ``enable_attention_dp``), pipeline stages → --pp_size,
expert parallelism → --ep_size; prompt + output → --max_seq_len; sequences per replica → --max_batch_size and the
CUDA-graph batch; memory share → --kv_cache_free_gpu_memory_fraction (TensorRT-LLM's share of the memory left after
the weights) and ``kv_cache_config.free_gpu_memory_fraction``; FP8 KV cache → ``kv_cache_config.dtype: fp8``. The
script writes the YAML beside it with a here-document, then starts the server.
"""

from __future__ import annotations

import shlex

import yaml

from shardlab.errors import ShardlabError
from shardlab.export.flags import require_valid, schemas, version
from shardlab.export.job import Export, Imported, LaunchJob, Refused, Unsupported, header
from shardlab.export.names import as_shipped_note, checkpoint_weights, hf_id, read_model
from shardlab.export.text import HEREDOC, as_int, comment_block, flags_dict, serving_fields, split_command
from shardlab.safeio import yaml_load

CHECKED = f"{version('tensorrt-llm')} option schema"


def check_options(options: dict) -> list[str]:
    """Problems of an --extra_llm_api_options document against the schema's keys (empty when valid)."""
    spec = schemas()["tensorrt-llm"]["options"]
    bad = []
    for k, v in options.items():
        s = spec.get(k)
        if s is None:
            bad.append(f"{k} is not a {version('tensorrt-llm')} LLM API option shardlab writes")
        elif s["type"] == "bool" and not isinstance(v, bool):
            bad.append(f"{k} must be true or false, got {v!r}")
        elif s["type"] == "dict" and (not isinstance(v, dict) or set(v) - set(s["keys"])):
            bad.append(f"{k} takes the keys {s['keys']}, got {v!r}")
    return bad


def arg_list(job: LaunchJob) -> tuple[str, list[tuple[str, object]], dict, list[Unsupported]]:
    if job.serve is None:
        raise Refused("tensorrt-llm serves models: export an inference plan (shardlab export --to tensorrt-llm MODEL "
                      "--inference --tp N)")
    repo = hf_id(job.model)
    if repo is None:
        raise Refused(f"{job.model} has no public Hugging Face checkpoint for TensorRT-LLM to load")
    lay, s = job.layout, job.serve
    uns = []
    if lay.pp > 1 and s.dp_attention > 1:
        raise Refused("TensorRT-LLM's attention data parallelism runs without pipeline stages: drop --pp or "
                      "--dp-attention")
    pairs: list[tuple[str, object]] = [("backend", "pytorch"), ("tp_size", lay.tp * s.dp_attention),
                                       ("pp_size", lay.pp)]
    if s.ep > 1:
        pairs.append(("ep_size", s.ep))
    pairs += [("max_batch_size", s.max_num_seqs), ("max_seq_len", s.prompt_len + s.output_len),
              ("kv_cache_free_gpu_memory_fraction", s.gpu_memory_utilization)]
    options: dict = {}
    if s.dp_attention > 1:
        options["enable_attention_dp"] = True
        if lay.tp > 1:      # with enable_attention_dp every GPU is an attention rank of its own (TP 1)
            uns.append(Unsupported("attention_tp", lay.tp, f"TensorRT-LLM's attention data parallelism runs every GPU "
                                                          f"as an attention rank of TP 1: written as {lay.tp * s.dp_attention} "
                                                          f"ranks of TP 1, not {s.dp_attention} of TP {lay.tp}"))
    options["kv_cache_config"] = {"free_gpu_memory_fraction": s.gpu_memory_utilization,
                                  **({"dtype": "fp8"} if s.kv_cache_dtype.startswith("fp8") else {})}
    options["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": s.max_num_seqs}
    if s.replicas > 1:
        uns.append(Unsupported("replicas", s.replicas, f"trtllm-serve runs one replica: start {s.replicas} copies of "
                                                       f"this script (one per {job.gpus // s.replicas} GPUs) behind a "
                                                       "load balancer"))
    ckpt = checkpoint_weights(job.model)
    if ckpt and s.weights != ckpt:  # the repository's own quantized weights are what the PyTorch backend loads
        uns.append(Unsupported("weights", s.weights, as_shipped_note("TensorRT-LLM", repo, ckpt, s.weights)))
    elif not ckpt and s.weights != "bf16":
        uns.append(Unsupported("weights", s.weights, f"TensorRT-LLM loads {s.weights} weights from a pre-quantized "
                                                     f"ModelOpt checkpoint (the nvidia/... FP8 and FP4 repositories): "
                                                     f"point the command at one; this file serves {repo}"))
    if job.gpus > job.gpus_per_node:
        uns.append(Unsupported("nodes", job.nodes, "trtllm-serve spans nodes under mpirun or Slurm (srun "
                                                   "--mpi=pmix ... trtllm-llmapi-launch trtllm-serve ...)"))
    return repo, pairs, options, uns


def render(job: LaunchJob, spec) -> Export:
    if job.serve is not None and job.serve.pools is not None:
        from shardlab.export import pd_engines

        return pd_engines.render_trtllm(job)
    repo, pairs, options, uns = arg_list(job)
    require_valid("tensorrt-llm", dict(pairs))
    bad = check_options(options)
    if bad:
        raise ShardlabError(f"tensorrt-llm options: {bad[0]}")
    s = job.serve
    yml = f"{job.model}-extra-llm-api-options.yml"
    pairs.append(("extra_llm_api_options", yml))
    words = [f"--{k} {shlex.quote(str(v))}" for k, v in pairs]
    lines = header(job, "tensorrt-llm", uns) + [f"checked against {CHECKED}",
                                                f"requests: {s.prompt_len} prompt + {s.output_len} output tokens"]
    body = yaml.safe_dump(options, sort_keys=False).rstrip("\n")
    text = ("#!/usr/bin/env bash\n" + comment_block(lines) + f"cat > {yml} <<'EOF'\n{body}\nEOF\n"
            + f"trtllm-serve {repo} \\\n    " + " \\\n    ".join(words) + "\n")
    return Export("tensorrt-llm", "trtllm-serve command and LLM API options", f"{job.model}-trtllm.sh", text, CHECKED,
                  tuple(uns), f"bash {job.model}-trtllm.sh")


def read(text: str, catalog) -> Imported:
    from shardlab.export import pd_engines

    if pd_engines.is_disaggregated(text):
        return pd_engines.read("tensorrt-llm", text)
    return read_one(text, catalog)


def read_one(text: str, catalog=None) -> Imported:
    """One server's line (a disaggregated script's instances are read one by one, ``export.pd_engines``)."""
    words = split_command(HEREDOC.sub("", text))
    if "trtllm-serve" not in words:
        raise ShardlabError("no `trtllm-serve MODEL ...` line found")
    i = words.index("trtllm-serve")
    repo = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
    fl = flags_dict(words[i + 1:])
    where = "trtllm-serve"
    options: dict = {}
    m = HEREDOC.search(text)
    if m:
        try:
            doc = yaml_load(m.group(2))
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as e:
            where_ = getattr(e, "problem_mark", None)
            raise ShardlabError(f"{m.group(1)} in this file is not valid YAML"
                                + (f" (line {where_.line + 1} of the options)" if where_ is not None else "")
                                + "; fix the file") from None
        if not isinstance(doc, dict):
            raise ShardlabError(f"{m.group(1)} in this file is not a YAML mapping of LLM API options; fix the file")
        options = doc
    f, und, ign = read_model(repo, "model")
    from shardlab import limits as L

    def g(n, d, lo=1, hi=L.MAX_GPUS, why=""):
        return as_int(fl, n, where, lo, hi, why) if n in fl else d

    gpus = g("tp_size", 1)
    if options.get("enable_attention_dp") is True:
        f["tp"], f["dp_attention"] = 1, gpus
        und.append((f"--tp_size {gpus} with enable_attention_dp", f"{gpus} data-parallel attention ranks of TP 1"))
    else:
        f["tp"] = gpus
        und.append((f"--tp_size {gpus}", f"TP {gpus}"))
    f["pp"] = g("pp_size", 1, 1, L.MAX_LAYERS, "each pipeline stage holds at least one layer")
    if "ep_size" in fl:
        f["ep"] = g("ep_size", 1)
        und.append((f"--ep_size {f['ep']}", "expert-parallel GPUs (--ep)"))
    serving_fields(fl, text, where, "max_batch_size", "max_seq_len", "kv_cache_free_gpu_memory_fraction", f, und, ign)
    kv = options.get("kv_cache_config") if isinstance(options.get("kv_cache_config"), dict) else {}
    f["kv_cache_dtype"] = "fp8" if str(kv.get("dtype", "auto")).startswith("fp8") else "auto"
    if f["kv_cache_dtype"] == "fp8":
        und.append(("kv_cache_config.dtype fp8", "FP8 KV cache (--kv-cache-dtype fp8)"))
    f["precision"] = "bf16-mixed"
    for k in set(options) - {"enable_attention_dp", "kv_cache_config", "cuda_graph_config"}:
        ign.append(f"{k} (not modelled)")
    return Imported("tensorrt-llm", f, tuple(und), tuple(ign), framework="tensorrt-llm")
