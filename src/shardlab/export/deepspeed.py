"""DeepSpeed config JSON (DeepSpeed 0.19.8, ``deepspeed/runtime/config.py`` DeepSpeedConfig) and its launch line.

Mapping (shardlab → DeepSpeed): zero → zero_optimization.stage; micro_batch → train_micro_batch_size_per_gpu;
microbatches → gradient_accumulation_steps (the pipeline's micro-batches with pp > 1); global batch →
train_batch_size (= micro × accumulation × data-parallel size, which DeepSpeed checks); tp → tensor_parallel.autotp_size
(AutoTP training); ep → expert_parallel.autoep_size (AutoEP); pp → pipeline.stages (the model must be a deepspeed.pipe.PipelineModule); precision → bf16/fp16.
What lives in the model code rather than the config (activation checkpointing, context parallelism) is listed as not expressed.
"""

from __future__ import annotations

import json

from shardlab.errors import ShardlabError
from shardlab.safeio import json_loads
from shardlab.export.job import Export, Imported, LaunchJob, Refused, Unsupported

CHECKED = "DeepSpeed 0.19.8 (DeepSpeedConfig)"


def config(job: LaunchJob) -> tuple[dict, list[Unsupported]]:
    lay = job.layout
    if job.serve is not None:
        raise Refused("this DeepSpeed export is a training config; export an inference plan with --to vllm")
    if lay.pp > 1 and lay.zero >= 2:
        raise Refused(f"DeepSpeed's pipeline engine refuses ZeRO-{lay.zero} ('ZeRO-2 and ZeRO-3 are incompatible with "
                      f"pipeline parallelism', deepspeed/runtime/pipe/engine.py); use --zero 1 or 0 with --pp {lay.pp}")
    uns = []
    if lay.cp > 1:
        uns.append(Unsupported("cp", lay.cp, "DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), "
                                             "not ring attention; set sequence_parallel_size yourself"))
    if lay.recompute != "none":
        uns.append(Unsupported("recompute", lay.recompute, "activation checkpointing is switched on in the model code "
                                                           "(deepspeed.checkpointing or gradient_checkpointing_enable)"))
    if lay.sequence_parallel:
        uns.append(Unsupported("sequence_parallel", True, "Megatron-style sequence parallelism is not a DeepSpeed setting"))
    if lay.pp > 1 and (lay.vpp > 1 or lay.schedule != "1f1b"):
        uns.append(Unsupported("schedule", f"{lay.schedule} vpp {lay.vpp}", "DeepSpeed's pipeline runs 1F1B, one stage per rank"))
        if lay.vpp > 1:
            uns.append(Unsupported("vpp", lay.vpp, "no interleaved (virtual) stages in DeepSpeed's pipeline engine"))
    if lay.stage_layers:
        uns.append(Unsupported("stage_layers", lay.stage_layers, "PipelineModule(partition_method=...) decides the split"))
    if job.precision == "bf16":
        uns.append(Unsupported("precision", "bf16", "DeepSpeed keeps fp32 master weights with bf16 enabled"))
    cfg = {"train_batch_size": job.global_batch, "train_micro_batch_size_per_gpu": lay.micro_batch,
           "gradient_accumulation_steps": job.microbatches, "gradient_clipping": 1.0,
           "zero_optimization": {"stage": lay.zero}}
    if lay.zero >= 1:
        cfg["zero_optimization"].update({"overlap_comm": True, "contiguous_gradients": True})
    if lay.zero in (1, 2):
        cfg["zero_optimization"]["reduce_scatter"] = True
    if job.precision in ("bf16-mixed", "bf16"):
        cfg["bf16"] = {"enabled": True}
    elif job.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if lay.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": lay.tp}
    if lay.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": lay.ep}
    if lay.pp > 1:
        cfg["pipeline"] = {"stages": lay.pp, "partition": "parameters"}
    cfg["steps_per_print"] = 10
    return cfg, uns


def render(job: LaunchJob, spec) -> Export:
    cfg, uns = config(job)
    name = f"{job.model}-ds_config.json"
    launch = (f"deepspeed --num_nodes {job.nodes} --num_gpus {job.procs_per_node} --hostfile hostfile train.py "
              f"--deepspeed --deepspeed_config {name}")
    text = json.dumps(cfg, indent=2) + "\n"
    return Export("deepspeed", "DeepSpeed config JSON", name, text, CHECKED, tuple(uns), launch)


def read(text: str, catalog) -> Imported:
    try:
        cfg = json_loads(text)
    except json.JSONDecodeError as e:
        raise ShardlabError(f"not a valid DeepSpeed JSON: {e.msg} at line {e.lineno}") from None
    except ValueError as e:                      # NaN/Infinity, or a key written twice
        raise ShardlabError(f"not a valid DeepSpeed JSON: {str(e)[:120]}") from None
    if not isinstance(cfg, dict):
        raise ShardlabError("a DeepSpeed config is a JSON object")
    f, und, ign = {}, [], []
    z = cfg.get("zero_optimization", {}) or {}
    f["zero"] = int(z.get("stage", 0))
    und.append((f"zero_optimization.stage {f['zero']}", f"zero {f['zero']}"))
    for k in ("offload_optimizer", "offload_param"):
        if z.get(k) and (z[k].get("device", "none") != "none"):
            ign.append(f"zero_optimization.{k} ({z[k].get('device')}: offload not modelled)")
    mb = cfg.get("train_micro_batch_size_per_gpu")
    gas = cfg.get("gradient_accumulation_steps")
    gb = cfg.get("train_batch_size")
    f["tp"] = int((cfg.get("tensor_parallel") or {}).get("autotp_size", 0) or 1)
    stages = (cfg.get("pipeline") or {}).get("stages", "auto")
    f["pp"] = int(stages) if isinstance(stages, int) else 1
    if isinstance(mb, int):
        f["micro_batch"] = mb
    if isinstance(gb, int):
        f["global_batch"] = gb
    if isinstance(mb, int) and isinstance(gb, int) and isinstance(gas, int):
        f["dp"] = gb // (mb * gas)
        f["gpus"] = f["dp"] * f["tp"] * f["pp"]
        und.append((f"train_batch_size {gb} = micro {mb} × accumulation {gas} × dp", f"dp {f['dp']}"))
    else:
        ign.append("batch sizes incomplete (\"auto\" or missing): dp comes from --gpus")
    ep_cfg = cfg.get("expert_parallel") or {}
    if ep_cfg.get("enabled") and int(ep_cfg.get("autoep_size", 1)) > 1:
        f["ep"] = int(ep_cfg["autoep_size"])
        und.append((f"expert_parallel.autoep_size {f['ep']}", "ep"))
    if f["tp"] > 1:
        und.append((f"tensor_parallel.autotp_size {f['tp']}", "tp"))
    if f["pp"] > 1:
        und.append((f"pipeline.stages {f['pp']}", "pp (1F1B)"))
    f["precision"] = ("bf16-mixed" if (cfg.get("bf16") or {}).get("enabled") else
                      "fp16-mixed" if (cfg.get("fp16") or {}).get("enabled") else "fp32")
    und.append(("bf16/fp16 sections", f["precision"]))
    if cfg.get("sequence_parallel_size", 1) not in (1, None):
        ign.append(f"sequence_parallel_size {cfg['sequence_parallel_size']} (Ulysses: not modelled)")
    known = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
             "bf16", "fp16", "tensor_parallel", "pipeline", "expert_parallel", "sequence_parallel_size"}
    ign += [k for k in cfg if k not in known]
    return Imported("deepspeed", f, tuple(und), tuple(ign), framework="deepspeed")
