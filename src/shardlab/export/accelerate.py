"""Accelerate config YAML for FSDP2 (Accelerate 1.15.0, ``accelerate/commands/config/config_args.py`` ClusterConfig,
read by ``accelerate launch --config_file``).

Mapping (shardlab → Accelerate): zero 3 → distributed_type FSDP, fsdp_version 2, fsdp_reshard_after_forward true
(FULL_SHARD); zero 2 → reshard_after_forward false (SHARD_GRAD_OP); zero 0 → MULTI_GPU (DDP); dp/tp/cp →
parallelism_config dp_shard/tp/cp sizes (Accelerate's ParallelismConfig); recompute full →
fsdp_activation_checkpointing; wrap unit → fsdp_transformer_layer_cls_to_wrap (the model's decoder-layer class).
Batch sizes and sequence length belong to the training script, so they are listed as not expressed.
"""

from __future__ import annotations

import yaml

from shardlab.errors import ShardlabError
from shardlab.safeio import yaml_load
from shardlab.layout import wrap_word
from shardlab.export.job import DEFAULT_GPUS_PER_NODE, Export, Imported, LaunchJob, Refused, Unsupported, header
from shardlab.export.megatron import gpus_per_node_read
from shardlab.export.names import layer_class
from shardlab.export.text import FieldError, comment_block, flag, section, whole

CHECKED = "Accelerate 1.15.0 (load_config_from_file, launch env, FullyShardedDataParallelPlugin, ParallelismConfig)"
MIXED = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "fp32": "no", "bf16": "bf16"}


def config(job: LaunchJob, spec) -> tuple[dict, list[Unsupported]]:
    lay = job.layout
    if job.serve is not None:
        raise Refused("this Accelerate export is a training config; export an inference plan with --to vllm")
    if lay.zero == 0 and (lay.tp > 1 or lay.cp > 1) and lay.dp * lay.pp > 1:
        # accelerate.parallelism_config.ParallelismConfig refuses tp/cp beside replicated data parallelism
        raise Refused("Accelerate combines tensor or context parallelism with FSDP only, not with replicated data "
                      "parallelism (ZeRO-0); use --zero 2 or 3, or --to deepspeed / megatron")
    uns = []
    if lay.zero == 1:
        uns.append(Unsupported("zero", 1, "Accelerate's FSDP has no optimizer-only (ZeRO-1) sharding: written as "
                                          "SHARD_GRAD_OP (ZeRO-2, less memory); --to deepspeed keeps ZeRO-1"))
    for k, v, why in (("pp", lay.pp, "Accelerate has no pipeline parallelism: the job runs without it"),
                      ("ep", lay.ep, "Accelerate has no expert parallelism: FSDP shards the experts with the rest"),

                      ("vpp", lay.vpp, "no pipeline stages in Accelerate")):
        if v > 1:
            uns.append(Unsupported(k, v, why))
    if lay.expert_tp != lay.tp:
        uns.append(Unsupported("etp", lay.etp, "Accelerate has no expert parallelism: the experts are split like the rest"))
    if lay.pp > 1:
        uns.append(Unsupported("dp", lay.dp, f"the {lay.pp} pipeline stages become data-parallel shards: "
                                             f"dp_shard {lay.dp * lay.pp}"))
    if lay.pp > 1 and lay.schedule != "1f1b":
        uns.append(Unsupported("schedule", lay.schedule, "no pipeline in Accelerate"))
    if lay.stage_layers:
        uns.append(Unsupported("stage_layers", list(lay.stage_layers), "no pipeline in Accelerate"))
    if lay.recompute == "selective":
        uns.append(Unsupported("recompute", "selective", "Accelerate checkpoints whole wrapped layers (full) or nothing; "
                                                         "left off"))
        if lay.recompute_modules not in (None, ("core_attn",)):
            uns.append(Unsupported("recompute_modules", ",".join(lay.recompute_modules), "no selective recomputation in "
                                                                                        "Accelerate: left off"))
    if lay.sequence_parallel:
        uns.append(Unsupported("sequence_parallel", True, "Accelerate's TP follows the model's tp_plan (transformers)"))
    uns += [Unsupported("micro_batch", lay.micro_batch, "set by the training script's DataLoader"),
            Unsupported("global_batch", job.global_batch, "set by the training script (batch × gradient_accumulation_steps)"),
            Unsupported("seq_len", job.seq_len, "set by the training script's tokenizer/collator")]
    uns += _script_settings(job)
    if job.precision == "bf16":
        uns.append(Unsupported("precision", "bf16", "Accelerate's mixed_precision keeps fp32 parameters (bf16-mixed)"))
    if job.precision not in MIXED:
        uns.append(Unsupported("precision", job.precision, "Accelerate's fp8 needs a recipe (fp8_config: Transformer "
                                                           "Engine, torchao or MS-AMP) chosen in your setup: written as bf16"))
    if lay.zero >= 1 and lay.wrap != 1:
        uns.append(Unsupported("wrap", wrap_word(lay.wrap), "Accelerate's TRANSFORMER_BASED_WRAP makes every decoder layer "
                                                          "its own FSDP unit"))
    if lay.recompute == "op":
        uns.append(Unsupported("recompute", "op", "Accelerate checkpoints whole wrapped layers (full) or nothing; left off"))
    if lay.recompute == "full" and lay.recompute_fraction < 1:
        uns.append(Unsupported("recompute_fraction", lay.recompute_fraction, "Accelerate checkpoints every wrapped layer: "
                                                                             "written as full recomputation of all"))
    cfg = {"compute_environment": "LOCAL_MACHINE", "debug": False,
           "distributed_type": "MULTI_GPU" if lay.zero == 0 else "FSDP",  # zero 1 → FSDP (listed above)
           "mixed_precision": MIXED.get(job.precision, "bf16"), "downcast_bf16": "no", "machine_rank": 0,
           "main_training_function": "main", "num_machines": job.nodes, "num_processes": job.gpus,
           "rdzv_backend": "static", "same_network": True, "use_cpu": False}
    if lay.zero >= 1:
        cfg["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_reshard_after_forward": lay.zero == 3,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": layer_class(spec.family) or "DecoderLayer",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_offload_params": False,
            "fsdp_cpu_ram_efficient_loading": True, "fsdp_activation_checkpointing": lay.recompute == "full"}
    elif lay.recompute == "full":
        uns.append(Unsupported("recompute", "full", "Accelerate switches activation checkpointing on through FSDP only"))
    if lay.tp > 1 or lay.cp > 1 or lay.zero >= 1:
        rep = lay.dp * lay.pp if lay.zero == 0 else lay.dp_replicate     # HSDP: replicas of the sharded group
        cfg["parallelism_config"] = {"parallelism_config_dp_replicate_size": rep,
                                     "parallelism_config_dp_shard_size": lay.dp * lay.pp // lay.dp_replicate if lay.zero >= 1 else 1,
                                     "parallelism_config_tp_size": lay.tp, "parallelism_config_cp_size": lay.cp}
    return cfg, uns


def _script_settings(job: LaunchJob) -> list[Unsupported]:
    """Settings other than the defaults that an Accelerate config has no key for (ClusterConfig,
    accelerate/commands/config/config_args.py): the training script or the machines set them."""
    out = []
    if job.dropout:
        out.append(Unsupported("dropout", True, "set in the model's config in the training script"))
    if job.optimizer != "adamw":
        out.append(Unsupported("optimizer", job.optimizer, "the training script builds the optimizer"))
    if (gpus_per_node_read(job.nodes, job.procs_per_node) or DEFAULT_GPUS_PER_NODE) != job.gpus_per_node:
        out.append(Unsupported("gpus_per_node", job.gpus_per_node, f"one machine of {job.gpus} processes reads back "
                                                                   f"as nodes of {DEFAULT_GPUS_PER_NODE} GPUs"))
    return out


def render(job: LaunchJob, spec) -> Export:
    cfg, uns = config(job, spec)
    name = f"{job.model}-accelerate.yaml"
    text = comment_block(header(job, "accelerate", uns) + [f"checked against {CHECKED}"]) + yaml.safe_dump(cfg, sort_keys=False)
    launch = (f"accelerate launch --config_file {name} --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR "
              f"--main_process_port 29500 train.py")
    return Export("accelerate", "Accelerate FSDP config YAML", name, text, CHECKED, tuple(uns), launch)


RESHARD = {"FULL_SHARD": True, "HYBRID_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD_ZERO2": False,
           "NO_SHARD": False, "TRUE": True, "FALSE": False}
"""fsdp_reshard_after_forward as Accelerate reads it: a boolean (FSDP2), or an FSDP1 sharding strategy name."""


def read(text: str, catalog) -> Imported:
    from shardlab import limits as L

    try:
        cfg = yaml_load(text)
    except yaml.YAMLError as e:
        raise ShardlabError(f"not a valid Accelerate YAML: {str(e).splitlines()[0]}") from None
    except (ValueError, TypeError, OverflowError):      # a number thousands of digits long, a date that is none
        raise ShardlabError("not a valid Accelerate YAML: it has a value YAML cannot read (a number thousands of "
                            "digits long?)") from None
    if not isinstance(cfg, dict) or "distributed_type" not in cfg:
        raise ShardlabError("not an Accelerate config: it has no distributed_type")
    f, und, ign = {}, [], []
    dt = cfg["distributed_type"]
    if not isinstance(dt, str):
        raise FieldError("distributed_type", "a name such as FSDP, MULTI_GPU or DEEPSPEED", dt, wrong_type=True)
    dt = dt.upper()
    fsdp = section(cfg, "fsdp_config")
    par = section(cfg, "parallelism_config")
    if dt == "FSDP":
        reshard = fsdp.get("fsdp_reshard_after_forward", True)
        if not isinstance(reshard, bool):
            if not isinstance(reshard, str) or reshard.upper() not in RESHARD:
                raise FieldError("fsdp_config.fsdp_reshard_after_forward", "true, false or an FSDP sharding strategy "
                                 "(FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, ...)", reshard, wrong_type=True)
            reshard = RESHARD[reshard.upper()]        # FSDP1 sharding strategies
        strategy = fsdp.get("fsdp_sharding_strategy", "")
        strategy = strategy.upper() if isinstance(strategy, str) else str(strategy)
        f["zero"] = 2 if strategy in ("SHARD_GRAD_OP", "2") or reshard is False else 3
        und.append((f"FSDP, reshard_after_forward {reshard}", f"zero {f['zero']}"))
    elif dt in ("MULTI_GPU", "NO"):
        f["zero"] = 0
        und.append((f"distributed_type {dt}", "zero 0 (DDP)"))
    elif dt == "DEEPSPEED":
        ds = section(cfg, "deepspeed_config")
        stage = ds.get("zero_stage", 0)
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise FieldError("deepspeed_config.zero_stage", "0, 1, 2 or 3", stage,
                             wrong_type=isinstance(stage, bool) or not isinstance(stage, (int, float)))
        f["zero"] = int(stage)
        und.append((f"DEEPSPEED zero_stage {f['zero']}", f"zero {f['zero']}"))
    else:
        raise ShardlabError(f"distributed_type {dt[:40]} is not a GPU training layout shardlab models")
    if cfg.get("num_processes") is not None:
        n = whole(cfg["num_processes"], "num_processes", 1, L.MAX_GPUS)
        f["gpus"] = n
        und.append((f"num_processes {n}", "GPUs"))
        _read_machines(cfg, n, f, und, ign)
    key = "parallelism_config_{}_size"
    P = "parallelism_config."
    size = lambda k: whole(par[key.format(k)], P + key.format(k), 1, L.MAX_GPUS) if par.get(key.format(k)) is not None else 1
    f["tp"], f["cp"] = size("tp"), size("cp")
    rep, shard = size("dp_replicate"), size("dp_shard")
    if par:
        f["dp"] = rep * shard
        und.append((f"parallelism_config dp {rep}×{shard}, tp {f['tp']}, cp {f['cp']}", "dp, tp, cp"))
    elif "gpus" in f:
        f["dp"] = f["gpus"]
    if rep > 1 and f["zero"] >= 1:      # HSDP: rep replicas of the group FSDP shards over (ParallelismConfig)
        f["dp_replicate"] = rep
        und.append((f"parallelism_config_dp_replicate_size {rep} with sharding", f"dp_replicate {rep} (HSDP)"))
    f["recompute"] = "full" if flag(fsdp.get("fsdp_activation_checkpointing", False),
                                    "fsdp_config.fsdp_activation_checkpointing") else "none"
    und.append(("fsdp_activation_checkpointing", f"recompute {f['recompute']}"))
    mp = cfg.get("mixed_precision", "no")
    if not isinstance(mp, str):
        raise FieldError("mixed_precision", "no, fp16, bf16 or fp8", mp, wrong_type=True)
    f["precision"] = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "fp8": "bf16-mixed"}.get(mp, "fp32")
    und.append((f"mixed_precision {mp[:20]}", f["precision"]))
    if mp == "fp8":
        ign.append("mixed_precision fp8 (FP8 training not modelled: estimated as bf16-mixed)")
    if flag(fsdp.get("fsdp_offload_params", False), "fsdp_config.fsdp_offload_params"):
        ign.append("fsdp_offload_params (CPU offload not modelled)")
    if fsdp.get("fsdp_transformer_layer_cls_to_wrap"):
        und.append((f"wrap {str(fsdp['fsdp_transformer_layer_cls_to_wrap'])[:80]}", "one FSDP unit per transformer block"))
    ign.append("model: an Accelerate config names none (give MODEL)")
    return Imported("accelerate", f, tuple(und), tuple(ign), framework="pytorch-fsdp")


def _read_machines(cfg: dict, gpus: int, f: dict, und: list, ign: list) -> None:
    """GPUs per node from num_processes over num_machines (accelerate launch starts num_processes // num_machines
    on each machine, accelerate/utils/launch.py prepare_multi_gpu_env), where that says it
    (``megatron.gpus_per_node_read``)."""
    from shardlab import limits as L

    if cfg.get("num_machines") is None:
        return
    machines = whole(cfg["num_machines"], "num_machines", 1, L.MAX_GPUS)
    if gpus % machines:
        ign.append(f"num_machines {machines} does not divide num_processes {gpus} (GPUs per node not read)")
        return
    per = gpus_per_node_read(machines, gpus // machines)
    if per is not None:
        if per > L.MAX_GPUS_PER_NODE:
            raise FieldError("num_processes / num_machines", f"at most {L.MAX_GPUS_PER_NODE:,} GPUs per node", per)
        f["gpus_per_node"] = per
        und.append((f"num_processes {gpus} over num_machines {machines}", f"{per} GPUs per node"))
