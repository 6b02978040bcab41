"""Export a plan to the configuration files of the frameworks people run, and read those files back.

One module per target, each a pure pair ``render(job, spec) -> Export`` / ``read(text, catalog) -> Imported``
(no torch, no framework imports): torchtitan (job TOML), megatron (pretrain_gpt.py arguments), deepspeed (config
JSON), accelerate (FSDP config YAML), vllm (``vllm serve`` line), sglang (``sglang.launch_server`` line),
tensorrt-llm (``trtllm-serve`` line and its options YAML), slurm (sbatch script), skypilot (task YAML).
The round-trip contract: ``read(render(job).text)`` gives back every job field except those ``render`` listed in
``Export.unsupported``.
"""

from __future__ import annotations

import contextvars
import importlib
import json
import os

import yaml

from shardlab.errors import ShardlabError
from shardlab import safeio
from shardlab.safeio import yaml_load
from shardlab.export.job import Export, Imported, LaunchJob, Refused
from shardlab.export.text import FieldError, FileError

TARGETS = ("torchtitan", "megatron", "deepspeed", "accelerate", "vllm", "sglang", "tensorrt-llm", "slurm", "skypilot",
           "shardlab")
SERVING_TARGETS = ("vllm", "sglang", "tensorrt-llm")
"""Targets that serve (an inference plan's engines)."""
LAUNCHERS = ("slurm", "skypilot")


READERS = {"megatron": "megatron_read"}
"""Targets whose reading-back lives in a module of its own (the writer imports nothing from it)."""


def _module(target: str):
    if target not in TARGETS:
        raise ShardlabError(f"unknown export target '{target}'; choose one of {', '.join(TARGETS)}")
    return importlib.import_module(f"shardlab.export.{target.replace('-', '_')}")


def render(job: LaunchJob, spec, target: str, inner: str | None = None) -> Export:
    """The framework file for ``job`` (``inner``: which framework a launcher target runs)."""
    mod = _module(target)
    if target in LAUNCHERS and job.serve is not None and job.serve.pools is not None:
        raise Refused(f"{target} starts one command on every node; a disaggregated job starts different servers per "
                      f"node: export it with --to vllm, sglang or tensorrt-llm (one script that each node runs with its "
                      f"NODE_RANK), or an aggregated layout (a plan file's --rank 1, or a job file without its [serve] "
                      f"disaggregated line)")
    if job.gpus > job.gpus_per_node and job.gpus % job.gpus_per_node and (job.serve is None or target in LAUNCHERS):
        # launchers start the same number of processes on every node (torchrun --nproc-per-node, deepspeed --num_gpus)
        raise Refused(f"{job.gpus} GPUs do not fill whole nodes of {job.gpus_per_node}: launchers start as many processes "
                      f"on every node; use a multiple of {job.gpus_per_node} GPUs (or --gpus-per-node that divides "
                      f"{job.gpus})")
    if target in LAUNCHERS:
        return mod.render(job, spec, inner)
    if inner is not None:
        raise ShardlabError(f"--launch applies to the launcher targets ({', '.join(LAUNCHERS)}), not {target}")
    return mod.render(job, spec)


def sniff(text: str) -> str:
    """Which target's file ``text`` is."""
    s = text.lstrip()
    from shardlab.export.shardlab import is_job_text

    if is_job_text(text):
        return "shardlab"
    if "#SBATCH" in text:
        return "slurm"
    if s.startswith("{"):
        return "deepspeed"
    if "vllm serve" in text or "vllm.entrypoints" in text:
        if "run:" not in text:
            return "vllm"
    if "sglang.launch_server" in text and "run:" not in text:
        return "sglang"
    if "trtllm-serve" in text and "run:" not in text:
        return "tensorrt-llm"
    try:
        doc = yaml_load(text)
    except yaml.YAMLError as e:
        if isinstance(e, safeio.DuplicateKey):
            raise ShardlabError(f"this file, line {e.problem_mark.line + 1}: {e.problem}; fix the file") from None
        doc = None
    except (ValueError, TypeError, OverflowError) as e:    # a value YAML cannot build (a 5,000-digit number, a bad date)
        if "digits" in str(e):
            raise ShardlabError("this file has a number thousands of digits long; fix the file") from None
        doc = None
    if isinstance(doc, dict):
        if "run" in doc and ("resources" in doc or "num_nodes" in doc):
            return "skypilot"
        if "distributed_type" in doc:
            return "accelerate"
    if "[parallelism]" in text or ("[model]" in text and "[training]" in text):
        return "torchtitan"
    if "pretrain_gpt.py" in text or "--tensor-model-parallel-size" in text or "--num-layers" in text:
        return "megatron"
    raise ShardlabError("cannot tell what this file is: shardlab reads its own job TOML, a torchtitan TOML, a DeepSpeed "
                        "JSON, an Accelerate YAML, Megatron-LM arguments, a vllm serve, sglang.launch_server or "
                        "trtllm-serve line, a Slurm script or a "
                        "SkyPilot YAML")


FIELD_NAMES = {
    "torchtitan": {"tp": "parallelism.tensor_parallel_degree", "pp": "parallelism.pipeline_parallel_degree",
                   "cp": "parallelism.context_parallel_degree", "ep": "parallelism.expert_parallel_degree",
                   "etp": "parallelism.expert_tensor_parallel_degree",
                   "dp": "parallelism.data_parallel_replicate_degree × data_parallel_shard_degree",
                   "dp_from_world": "parallelism.data_parallel_replicate_degree",
                   "zero": "parallelism.fsdp_reshard_after_forward", "vpp": "parallelism.module_fqns_per_model_part",
                   "stage_layers": "parallelism.module_fqns_per_model_part",
                   "micro_batch": "training.local_batch_size (parallelism.pipeline_parallel_microbatch_size with pipeline stages)",
                   "global_batch": "training.global_batch_size", "seq_len": "training.seq_len",
                   "schedule": "parallelism.pipeline_parallel_schedule", "model": "model.name and model.flavor"},
    "megatron": {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
                 "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size",
                 "etp": "--expert-tensor-parallel-size",
                 "vpp": "--num-layers-per-virtual-pipeline-stage (or --pipeline-model-parallel-layout)",
                 "stage_layers": "--decoder-first/last-pipeline-num-layers (or --pipeline-model-parallel-layout)",
                 "micro_batch": "--micro-batch-size", "global_batch": "--global-batch-size", "seq_len": "--seq-length",
                 "gpus": "torchrun --nnodes × --nproc-per-node", "zero": "the optimizer sharding flags",
                 "grad_reduce_bytes": "--grad-reduce-in-bf16 / --accumulate-allreduce-grads-in-fp32",
                 "tp_comm_overlap": "--tp-comm-overlap", "fp8_params": "--fp8-param-gather",
                 "recompute_modules": "--recompute-modules",
                 "moe_dispatcher": "--moe-token-dispatcher-type / --moe-flex-dispatcher-backend",
                 "ep_comm_overlap": "--overlap-moe-expert-parallel-comm",
                 "model": "the model shape flags (--num-layers, --hidden-size, ...)"},
    "deepspeed": {"zero": "zero_optimization.stage", "tp": "tensor_parallel.autotp_size", "pp": "pipeline.stages",
                  "ep": "expert_parallel.autoep_size", "micro_batch": "train_micro_batch_size_per_gpu",
                  "global_batch": "train_batch_size",
                  "dp": "train_batch_size / (train_micro_batch_size_per_gpu × gradient_accumulation_steps)",
                  "gpus": "the data-parallel size × tensor_parallel.autotp_size × pipeline.stages",
                  "grad_reduce_bytes": "communication_data_type"},
    "accelerate": {"gpus": "num_processes", "tp": "parallelism_config.parallelism_config_tp_size",
                   "cp": "parallelism_config.parallelism_config_cp_size",
                   "dp": "parallelism_config.parallelism_config_dp_replicate_size × parallelism_config_dp_shard_size",
                   "zero": "distributed_type and fsdp_config"},
    "vllm": {"tp": "--tensor-parallel-size", "pp": "--pipeline-parallel-size", "replicas": "--data-parallel-size",
             "max_num_seqs": "--max-num-seqs", "prompt_len": "--max-model-len", "output_len": "--max-model-len",
             "gpu_memory_utilization": "--gpu-memory-utilization", "model": "the model vllm serves"},
    "sglang": {"tp": "--tp-size (÷ --dp-size with --enable-dp-attention)", "pp": "--pp-size",
               "replicas": "--dp-size", "dp_attention": "--dp-size with --enable-dp-attention", "ep": "--ep-size",
               "max_num_seqs": "--max-running-requests", "prompt_len": "--context-length",
               "output_len": "--context-length", "gpu_memory_utilization": "--mem-fraction-static",
               "model": "--model-path"},
    "tensorrt-llm": {"tp": "--tp_size", "pp": "--pp_size", "ep": "--ep_size",
                     "dp_attention": "--tp_size with enable_attention_dp", "max_num_seqs": "--max_batch_size",
                     "prompt_len": "--max_seq_len", "output_len": "--max_seq_len",
                     "gpu_memory_utilization": "--kv_cache_free_gpu_memory_fraction", "model": "the model trtllm-serve loads"},
    "slurm": {"gpus": "#SBATCH --nodes × --gpus-per-node", "gpus_per_node": "#SBATCH --gpus-per-node"},
    "skypilot": {"gpus": "num_nodes × resources.accelerators", "gpus_per_node": "resources.accelerators"},
    "shardlab": {"model": "[model] name", "gpus": "[cluster] gpus", "gpus_per_node": "[cluster] gpus_per_node",
                 "gpu": "[cluster] gpu", **{k: f"[layout] {k}" for k in ("dp", "tp", "pp", "cp", "ep", "zero", "vpp",
                                                                       "micro_batch", "stage_layers", "schedule")},
                 "seq_len": "[workload] seq_len", "global_batch": "[workload] global_batch",
                 "max_num_seqs": "[serve] max_num_seqs", "prompt_len": "[serve] prompt_len",
                 "output_len": "[serve] output_len", "replicas": "[serve] replicas",
                 **{k: f"[workload] {k}" for k in ("precision", "optimizer", "lora_rank", "quantize_base", "offload",
                                                   "offload_device", "lora_targets", "tp_comm_overlap",
                                                   "fp8_params", "moe_dispatcher", "ep_comm_overlap", "expert_imbalance")},
                 **{k: f"[layout] {k}" for k in ("etp", "recompute", "recompute_fraction", "recompute_modules", "wrap",
                                                 "dp_replicate", "sequence_parallel")},
                 **{k: f"[serve] {k}" for k in ("weights", "group_size", "activations", "gpu_memory_utilization")},
                 "kv_cache": "[serve] kv_cache_dtype"},
}
"""What each target's file calls the job fields its reader fills: errors about a value read from a file name the
file's own field, never a shardlab flag the user did not give."""

TARGET_OF_FRAMEWORK = {"torchtitan": "torchtitan", "megatron-lm": "megatron", "deepspeed": "deepspeed",
                       "pytorch-fsdp": "accelerate", "vllm": "vllm", "sglang": "sglang", "tensorrt-llm": "tensorrt-llm"}


def field_names(source: str, framework: str | None = None) -> dict:
    """{job field: the file's name for it} for a file read as ``source`` (a launcher: its framework's names too)."""
    inner = TARGET_OF_FRAMEWORK.get(framework or "", source)
    return {**FIELD_NAMES.get(inner, {}), **FIELD_NAMES.get(source, {})}


_READING: contextvars.ContextVar = contextvars.ContextVar("shardlab_export_reading", default=None)
"""The path `read_file` is reading: a launcher script's embedded file is named by it in errors."""


def _located(e: ShardlabError, where: str | None, target: str) -> FileError:
    """A reader's error with the file in front (a FieldError: its field, what it must be and the fix)."""
    if isinstance(e, FieldError):
        what = f"this {target} config has a field of the wrong type: {e}" if e.wrong_type else str(e)
        msg = f"{what}; fix the file"
        return FileError(f"{where}: {msg}" if where else (msg if e.wrong_type else f"this {target} config: {msg}"))
    return FileError(f"{where}: {e}" if where else str(e))


def read_text(text: str, catalog, target: str | None = None, name: str | None = None) -> Imported:
    """Read a framework file's ``text`` (``name``: its path, for messages) as ``target`` (default: sniffed)."""
    from shardlab.limits import MAX_NESTING
    from shardlab.safeio import scan_yaml, scan_yaml_tokens

    if scan_yaml(text)[0] > MAX_NESTING:     # checked before any parser (sniff's included) recurses into it
        raise ShardlabError(f"this file nests too deeply to read (config files nest a few levels; shardlab's limit is "
                            f"{MAX_NESTING}); is it the right file?")
    try:
        target = target or sniff(text)
    except ShardlabError as e:
        raise FileError(f"{name}: {e}" if name else str(e)) from None
    outer = _READING.get()
    where = name or (f"{outer} (its {target} part)" if outer else None)
    if target in ("accelerate", "skypilot"):      # YAML: the exact token scan (a quote in a plain scalar misleads the quick one)
        depth, alias = scan_yaml_tokens(text)
        if depth > MAX_NESTING or alias is not None:
            raise ShardlabError(f"this {target} YAML " + (f"nests more than {MAX_NESTING} levels deep"
                                                          if depth > MAX_NESTING else f"uses an anchor or alias (line {alias})")
                                + "; write the values out")
    try:
        imported = (importlib.import_module(f"shardlab.export.{READERS[target]}") if target in READERS
                    else _module(target)).read(text, catalog)
        check_fields(imported.fields, None, field_names(target, imported.framework))
    except FileError:
        raise
    except ShardlabError as e:
        raise _located(e, where, target) from None
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError,
            RecursionError):
        # a field of a type or value no check above foresaw: one line, never a traceback nor Python's own words
        raise FileError(f"{where + ': ' if where else ''}this {target} config has a field of the wrong type or value "
                        f"(text where a number or a section belongs, or a number out of range); fix the file") from None
    return imported


def check_fields(fields: dict, where: str | None, names: dict | None = None) -> None:
    """The numbers a file gave, held to the same bounds as the flags they stand for (a file is input too), and to
    each other (degrees whose product is the GPU count, pipeline chunks of at least one layer). ``names``: what the
    file calls each field (``field_names``); ``where``: the file, put in front of the message (None: the caller
    does, the error being a FieldError)."""
    from shardlab import limits as L
    from shardlab.numbers import check_number

    names = names or {}

    def fail(key: str, must: str, got):
        err = FieldError(names.get(key, key), must, got)
        if where is None:
            raise err
        raise ShardlabError(f"{where}: {err}; fix the file")

    bounds = {"gpus": (1, L.MAX_GPUS), "gpus_per_node": (1, L.MAX_GPUS_PER_NODE), "seq_len": (1, L.MAX_SEQ_LEN),
              "global_batch": (1, L.MAX_BATCH), "micro_batch": (1, L.MAX_BATCH), "batch": (1, L.MAX_BATCH),
              "prompt_len": (1, L.MAX_SEQ_LEN), "output_len": (1, L.MAX_SEQ_LEN), "max_num_seqs": (1, L.MAX_BATCH),
              "max_num_batched_tokens": (1, L.MAX_SEQ_LEN), "zero": (0, 3), "pp": (1, L.MAX_LAYERS),
              "vpp": (1, L.MAX_LAYERS), "dp_from_world": (1, L.MAX_GPUS), "etp": (0, L.MAX_GPUS)}   # etp 0: as tp
    for key, value in fields.items():
        if key == "stage_layers" and value is not None:
            if not isinstance(value, (list, tuple)) or len(value) > L.MAX_LAYERS or not all(
                    isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= L.MAX_LAYERS for n in value):
                fail(key, f"one count of 1 to {L.MAX_LAYERS:,} layers per pipeline stage", value)
            continue
        if key == "gpu_memory_utilization":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1 or value < 1e-6:
                fail(key, "a number in (0, 1], e.g. 0.9", value)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key == "zero" and value not in (0, 1, 2, 3):
            fail(key, "0, 1, 2 or 3", value)
        lo, hi = bounds.get(key, (1, L.MAX_GPUS if isinstance(value, int) else L.MAX_FLOAT))
        what = names.get(key, key)
        check_number(value, f"{where}: {what}" if where else what, integer=isinstance(value, int), minimum=0.0,
                     allow_min=lo == 0 or not isinstance(value, int), maximum=hi,
                     reason="each pipeline chunk holds at least one layer" if key in ("pp", "vpp")
                     else "the bound of the matching flag")
    deg = {k: fields.get(k, 1) for k in ("dp", "tp", "pp", "cp", "vpp")}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in deg.values()):
        return
    if deg["pp"] * deg["vpp"] > L.MAX_LAYERS:
        fail("pp", f"at most {L.MAX_LAYERS:,} pipeline chunks in all (each holds at least one layer), not "
                   f"{deg['pp']:,} × {deg['vpp']:,} virtual stages", deg["pp"])
    world = deg["dp"] * deg["tp"] * deg["pp"] * deg["cp"]
    if world > L.MAX_GPUS:
        fail("dp", f"such that dp × tp × pp × cp stays within {L.MAX_GPUS:,} GPUs (it is {world:,})", deg["dp"])
    stages = fields.get("stage_layers")
    if stages is not None and deg["vpp"] == 1 and len(stages) != deg["pp"]:
        fail("stage_layers", f"one layer count per pipeline stage ({deg['pp']:,} stages), not {len(stages):,}", list(stages))
    gpus = fields.get("gpus")
    if "dp" in fields and isinstance(gpus, int) and world != gpus:
        parts = " × ".join(names.get(k, k) for k in ("dp", "tp", "pp", "cp") if k == "dp" or fields.get(k, 1) != 1)
        fail("gpus", f"the product of the parallel degrees, {parts} = {world:,}", gpus)


def check_against_model(fields: dict, spec, where: str, names: dict) -> None:
    """The degrees a file gave against the model they will run (``spec``): pipeline chunks of at least one layer,
    stage sizes that add up to the model's layers, TP that divides the heads and FFN, EP over a mixture of experts.
    The message names the file's field (the command's own check would name a flag the user never gave)."""
    def fail(key: str, problem: str, fix: str):
        raise ShardlabError(f"{where}: {names.get(key, key)} {problem}; {fix}")

    layers = spec.num_layers
    pp, vpp = fields.get("pp", 1), fields.get("vpp", 1)
    if isinstance(pp, int) and isinstance(vpp, int) and pp * vpp > layers:
        what = f"{pp:,}" + (f" × {vpp:,} virtual stages" if vpp > 1 else "")
        fail("pp", f"{what} exceeds {spec.name}'s {layers} layers (each pipeline chunk holds at least one)",
             f"use at most {layers // max(1, vpp)} pipeline stages")
    stages = fields.get("stage_layers")
    if stages and sum(stages) != layers:
        fail("stage_layers", f"place {sum(stages):,} layers but {spec.name} has {layers}",
             "give stage sizes that add up to the model's layers")
    tp = fields.get("tp", 1)
    if isinstance(tp, int) and tp > 1:
        dims = [("attention heads", spec.num_heads)]
        if spec.mla is None and spec.num_kv_heads % tp and tp % spec.num_kv_heads:
            fail("tp", f"{tp} and {spec.name}'s {spec.num_kv_heads} KV heads: one must divide the other",
                 "use a divisor of the KV heads")
        if spec.moe is None or spec.moe.first_dense_layers:
            dims.append(("FFN width", spec.ffn_hidden_size))
        if spec.moe is not None:
            dims.append(("expert FFN width", spec.moe.expert_ffn_hidden_size))
        for what, n in dims:
            if n % tp:
                fail("tp", f"{tp} does not divide {spec.name}'s {what} {n}", f"use a divisor of {n}")
    ep = fields.get("ep", 1)
    if isinstance(ep, int) and ep > 1:
        if spec.moe is None:
            fail("ep", f"{ep} needs a mixture-of-experts model; {spec.name} is dense", "use 1")
        if spec.moe.num_experts % ep:
            fail("ep", f"{ep} does not divide {spec.name}'s {spec.moe.num_experts} experts",
                 f"use a divisor of {spec.moe.num_experts}")


def check_batch(fields: dict, where: str, names: dict) -> None:
    """The file's global batch against its micro-batch × data-parallel size, naming the file's own fields (the
    command's check would name --global-batch, a flag the user never gave)."""
    gb, mb, dp = fields.get("global_batch"), fields.get("micro_batch", 1), fields.get("dp")
    gpus = fields.get("gpus")
    mp = fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1)
    if dp is None and isinstance(gpus, int) and isinstance(mp, int) and mp and gpus % mp == 0:
        dp = gpus // mp
    if not all(isinstance(x, int) and x > 0 for x in (gb, mb, dp)) or gb % (mb * dp) == 0:
        return
    n = mb * dp
    raise ShardlabError(f"{where}: {names.get('global_batch', 'global batch')} {gb:,} is not divisible by micro-batch "
                        f"{mb:,} × data-parallel size {dp:,} = {n:,}; make it a multiple of {n:,} (e.g. "
                        f"{max(n, gb // n * n):,})")


def read_file(path: str, catalog) -> Imported:
    from shardlab.safeio import check_name, read_text as safe_read

    if not os.path.lexists(check_name(path, "--from")):
        raise ShardlabError(f"--from {path}: no such file")
    text = safe_read(path, "--from")
    token = _READING.set(path)
    try:
        return read_text(text, catalog, name=path)
    finally:
        _READING.reset(token)


def to_json(exp: Export, path: str | None, job: LaunchJob) -> dict:
    d = exp.to_dict()
    d["file"] = path
    d["job"] = {"model": job.model, "gpus": job.gpus, "gpu": job.gpu, "nodes": job.nodes,
                "layout": job.layout.to_dict(), "global_batch": job.global_batch, "seq_len": job.seq_len,
                "precision": job.precision}
    if path is None:
        d["text"] = exp.text
    return json.loads(json.dumps(d))
