"""torchtitan job TOML (torchtitan 0.2.2, ``torchtitan/config/job_config.py``; run with
``torchrun ... -m torchtitan.train --job.config_file FILE``). torchtitan 0.3 replaced TOML files by Python config
registries; 0.2.2 is the last release that reads them.

Mapping (shardlab → torchtitan):
  dp, zero 3 → parallelism.data_parallel_shard_degree = dp, fsdp_reshard_after_forward = "always" (FSDP2)
  dp, zero 2 → same with fsdp_reshard_after_forward = "never" (keeps gathered parameters until backward, the
               ZeRO-2-like mode of ``fully_shard``; zero 1, which FSDP2 lacks, is written so and listed); zero 0 → data_parallel_replicate_degree = dp (DDP)
  tp, cp, pp, ep → tensor_/context_/pipeline_/expert_parallel_degree; schedule → pipeline_parallel_schedule
  pipeline chunks (pp·vpp, shardlab.memory.states.chunk_layers) → module_fqns_per_model_part, exactly
  micro_batch → pipeline_parallel_microbatch_size (pp > 1; local_batch_size = micro_batch × microbatches)
               or local_batch_size (pp = 1; gradient accumulation = global / (local × dp))
  recompute → activation_checkpoint.mode (selective = per-op SAC, selective_ac_option "op")
"""

from __future__ import annotations

import tomllib

from shardlab.errors import ShardlabError
from shardlab.export.job import Export, Imported, LaunchJob, Refused, Unsupported, header
from shardlab.export.names import model_from_torchtitan, torchtitan_flavor
from shardlab.export.text import toml_dump
from shardlab.layout import Layout, split_layers

CHECKED = "torchtitan 0.2.2 (ConfigManager/JobConfig)"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb-h1": "InterleavedZeroBubble"}
FROM_SCHEDULE = {v.lower(): k for k, v in SCHEDULES.items()} | {"zbvzerobubble": "zb-h1", "loopedbfs": "interleaved"}
PRECISION = {"bf16-mixed": ("float32", "bfloat16"), "fp32": ("float32", "float32"), "bf16": ("bfloat16", "bfloat16")}


def _chunk_fqns(spec, layout: Layout) -> list[list[str]]:
    """Module names of each pipeline chunk, in chunk order (torchtitan places chunk c on pipeline rank c mod pp)."""
    from shardlab.memory.states import chunk_layers

    chunks = chunk_layers(spec, layout)
    out = []
    for c, rng in enumerate(chunks):
        names = (["tok_embeddings"] if c == 0 else []) + [f"layers.{i}" for i in rng]
        if c == len(chunks) - 1:
            names += ["norm", "output"]
        out.append(names)
    return out


def render(job: LaunchJob, spec) -> Export:
    lay = job.layout
    flavor = torchtitan_flavor(job.model)
    if flavor is None:
        raise Refused(f"torchtitan 0.2.2 has no model definition for {job.model} (it ships llama3, deepseek_v3, "
                      f"qwen3 and llama4 flavors); export to megatron or deepspeed instead")
    if job.serve is not None:
        raise Refused("torchtitan trains; export an inference plan with --to vllm")
    if lay.zero == 0 and lay.dp > 1 and lay.world_size != lay.dp:
        raise Refused("torchtitan's DDP (zero 0) does not combine with tp, pp or cp ('DDP has not supported > 1D "
                      "parallelism'); use --zero 2 or 3")
    if lay.zero == 0 and lay.cp > 1:
        raise Refused("torchtitan applies FSDP over the context-parallel ranks, so cp > 1 needs --zero 2 or 3")
    if job.precision not in PRECISION:
        raise Refused(f"torchtitan trains in bf16 (mixed or pure) or fp32, not {job.precision}; use --precision bf16-mixed")
    if lay.pp > 1 and lay.schedule == "zb-h1" and lay.vpp < 2:
        raise Refused("torch.distributed.pipelining has no single-chunk ZB-H1 schedule; use --vpp 2 "
                      "(InterleavedZeroBubble) or --schedule 1f1b")
    if lay.pp > 1 and lay.vpp > 1 and lay.schedule in ("gpipe", "1f1b"):
        raise Refused(f"{lay.schedule} runs one stage per pipeline rank; --vpp {lay.vpp} needs --schedule interleaved")
    uns = []
    if lay.zero == 1:
        uns.append(Unsupported("zero", 1, "torchtitan shards with FSDP2 only (no optimizer-only ZeRO-1): written as "
                                          "reshard_after_forward never, which also shards gradients (ZeRO-2, less memory)"))
    if job.optimizer != "adamw":
        uns.append(Unsupported("optimizer", job.optimizer, "torchtitan's optimizer builder takes Adam/AdamW; AdamW written"))
    if lay.tp > 1 and not lay.sequence_parallel:
        uns.append(Unsupported("sequence_parallel", False, "torchtitan 0.2.2 always shards norms over TP (sequence parallel)"))
    dtype, mp = PRECISION[job.precision]
    dp_rep, dp_shard = (lay.dp, 1) if lay.zero == 0 else (1, lay.dp)
    local = lay.micro_batch * job.microbatches if lay.pp > 1 else lay.micro_batch
    par = {"data_parallel_replicate_degree": dp_rep, "data_parallel_shard_degree": dp_shard,
           "fsdp_reshard_after_forward": {3: "always", 2: "never", 1: "never"}.get(lay.zero, "default"),
           "tensor_parallel_degree": lay.tp, "context_parallel_degree": lay.cp, "expert_parallel_degree": lay.ep,
           "pipeline_parallel_degree": lay.pp}
    if lay.ep > 1:
        par["expert_tensor_parallel_degree"] = 1
    if lay.pp > 1:
        par.update({"pipeline_parallel_schedule": SCHEDULES[lay.schedule],
                    "pipeline_parallel_microbatch_size": lay.micro_batch,
                    "module_fqns_per_model_part": _chunk_fqns(spec, lay)})
    ac = {"mode": lay.recompute}
    if lay.recompute == "selective":
        ac["selective_ac_option"] = "op"
    sections = {
        "job": {"dump_folder": "./outputs", "description": f"{job.model}: exported by shardlab"},
        "model": {"name": flavor[0], "flavor": flavor[1], "hf_assets_path": f"./assets/hf/{job.model}"},
        "optimizer": {"name": "AdamW"},
        "training": {"local_batch_size": local, "global_batch_size": job.global_batch, "seq_len": job.seq_len,
                     "dtype": dtype, "mixed_precision_param": mp},
        "parallelism": par,
        "activation_checkpoint": ac,
        "compile": {"enable": False},
    }
    comments = header(job, "torchtitan", uns) + [f"checked against {CHECKED}",
                                                "run: torchrun --nproc-per-node N -m torchtitan.train --job.config_file THIS_FILE"]
    return Export("torchtitan", "torchtitan job TOML", f"{job.model}.toml", toml_dump(sections, comments), CHECKED,
                  tuple(uns), f"torchrun --nnodes {job.nodes} --nproc-per-node {job.procs_per_node} -m torchtitan.train "
                              f"--job.config_file {job.model}.toml")


def read(text: str, catalog) -> Imported:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ShardlabError(f"not a valid torchtitan TOML: {e}") from None
    model, par = doc.get("model", {}), doc.get("parallelism", {})
    train, ac = doc.get("training", {}), doc.get("activation_checkpoint", {})
    f, und, ign = {}, [], []
    mid = model_from_torchtitan(model.get("name", "llama3"), model.get("flavor", "debugmodel"))
    if mid:
        f["model"] = mid
        und.append((f"model {model.get('name')}/{model.get('flavor')}", mid))
    else:
        ign.append(f"model {model.get('name')}/{model.get('flavor')} (no catalog model; give MODEL)")
    rep, shard = int(par.get("data_parallel_replicate_degree", 1)), int(par.get("data_parallel_shard_degree", -1))
    for key in ("tp", "pp", "cp", "ep"):
        full = {"tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree", "cp": "context_parallel_degree",
                "ep": "expert_parallel_degree"}[key]
        f[key] = int(par.get(full, 1))
        if full in par:
            und.append((f"parallelism.{full} = {f[key]}", key))
    if shard == -1:
        f["dp_from_world"] = rep  # dp = world / (tp·pp·cp), the CLI fills the world size
        und.append(("parallelism.data_parallel_shard_degree = -1", "dp = GPUs / (tp·pp·cp)"))
    else:
        f["dp"] = rep * shard
        und.append((f"data_parallel_replicate {rep} × shard {shard}", f"dp {rep * shard}"))
    reshard = par.get("fsdp_reshard_after_forward", "default")
    if shard == 1 and rep >= 1 and not (f["cp"] > 1):
        f["zero"] = 0
    else:
        f["zero"] = {"always": 3, "never": 2}.get(reshard, 3 if f["pp"] == 1 else 2)
        if rep > 1 and shard != 1:
            ign.append(f"HSDP replicate degree {rep} (shardlab shards ZeRO-3 over all of dp)")
    und.append((f"fsdp_reshard_after_forward = {reshard!r}", f"zero {f['zero']}"))
    if f["tp"] > 1:
        f["sequence_parallel"] = True
    pmb = int(par.get("pipeline_parallel_microbatch_size", 1))
    local = int(train.get("local_batch_size", 8))
    f["micro_batch"] = pmb if f["pp"] > 1 else local
    if f["pp"] > 1:
        sched = str(par.get("pipeline_parallel_schedule", "1F1B"))
        f["schedule"] = FROM_SCHEDULE.get(sched.lower())
        if f["schedule"] is None:
            raise ShardlabError(f"pipeline schedule '{sched}' has no shardlab counterpart (gpipe, 1f1b, interleaved, zb-h1)")
        und.append((f"pipeline_parallel_schedule = {sched!r}", f["schedule"]))
        parts = par.get("module_fqns_per_model_part")
        if parts:
            sizes = tuple(sum(1 for n in p if n.startswith("layers.")) for p in parts)
            f["vpp"] = max(1, len(parts) // f["pp"])
            if f["vpp"] == 1 and sizes != split_layers(sum(sizes), f["pp"]):
                f["stage_layers"] = sizes
            und.append(("module_fqns_per_model_part", f"{len(parts)} chunks of {'/'.join(map(str, sizes))} layers"))
        elif f["schedule"] in ("interleaved", "zb-h1"):
            f["vpp"] = 2
            und.append(("looped schedule without module_fqns_per_model_part", "vpp 2 (torchtitan's default)"))
    gb = int(train.get("global_batch_size", -1))
    if gb > 0:
        f["global_batch"] = gb
    elif "dp" in f:
        f["global_batch"] = local * f["dp"]
    if "seq_len" in train:
        f["seq_len"] = int(train["seq_len"])
    mode = ac.get("mode", "selective")
    opt = str(ac.get("selective_ac_option", "2"))
    f["recompute"] = {"none": "none", "full": "full"}.get(mode, "selective" if opt == "op" else "full")
    if mode == "selective" and opt != "op":
        ign.append(f"selective_ac_option {opt} (full recompute of every {opt}th block: modelled as full)")
    und.append((f"activation_checkpoint.mode = {mode!r}", f["recompute"]))
    dtype, mp = train.get("dtype", "float32"), train.get("mixed_precision_param", "bfloat16")
    f["precision"] = "bf16" if dtype == "bfloat16" else ("bf16-mixed" if mp == "bfloat16" else "fp32")
    und.append((f"training.dtype {dtype}, mixed_precision_param {mp}", f["precision"]))
    for sec in ("compile", "float8", "quantize"):
        if doc.get(sec, {}).get("enable") or (sec == "model" and model.get("converters")):
            ign.append(f"[{sec}] (not modelled)")
    if model.get("converters"):
        ign.append(f"model.converters {model['converters']} (float8/mx training not modelled)")
    return Imported("torchtitan", f, tuple(und), tuple(ign), framework="torchtitan")
