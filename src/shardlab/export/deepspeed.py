"""DeepSpeed config JSON (DeepSpeed 0.19.8, ``deepspeed/runtime/config.py`` DeepSpeedConfig) and its launch line.

Mapping (shardlab → DeepSpeed): zero → zero_optimization.stage; micro_batch → train_micro_batch_size_per_gpu;
microbatches → gradient_accumulation_steps (the pipeline's micro-batches with pp > 1); global batch →
train_batch_size (= micro × accumulation × data-parallel size, which DeepSpeed checks); tp → tensor_parallel.autotp_size
(AutoTP training); ep → expert_parallel.autoep_size (AutoEP); pp → pipeline.stages (the model must be a deepspeed.pipe.PipelineModule); precision → bf16/fp16;
optimizer sgd → optimizer.type SGD (adamw: no optimizer section).
What lives in the model code rather than the config (activation checkpointing, context parallelism) is listed as not expressed.
"""

from __future__ import annotations

import json

from shardlab.errors import ShardlabError
from shardlab.safeio import json_loads
from shardlab.layout import wrap_word
from shardlab.export.job import DEFAULT_GPUS_PER_NODE, Export, Imported, LaunchJob, Refused, Unsupported
from shardlab.export.text import FieldError, section, whole

CHECKED = "DeepSpeed 0.19.8 (DeepSpeedConfig)"
DEFAULT_SEQ_LEN = 4096
"""A file without a sequence length reads back as min(model max, this) (cli/common.py --seq-len's default)."""
OPTIMIZER = {"adamw": "AdamW", "sgd": "SGD"}
"""shardlab's optimizer -> the config's optimizer.type: DeepSpeed's own AdamW, or a torch.optim class by name
(deepspeed/runtime/engine.py _configure_basic_optimizer: ``getattr(torch.optim, name)`` for a name not in
DEEPSPEED_OPTIMIZERS). adam-8bit (bitsandbytes) is none of these. Only SGD is written: AdamW is what a config
without an optimizer section reads back as."""
FROM_OPTIMIZER = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd"}
"""optimizer.type (any case) -> shardlab's optimizer: DeepSpeed's Adam decouples weight decay unless adam_w_mode is
false (deepspeed/runtime/config.py ADAM_W_MODE_DEFAULT), the same states as AdamW either way."""


def config(job: LaunchJob, spec=None) -> tuple[dict, list[Unsupported]]:
    lay = job.layout
    if job.serve is not None:
        raise Refused("this DeepSpeed export is a training config; export an inference plan with --to vllm")
    if lay.pp > 1 and lay.zero >= 2:
        raise Refused(f"DeepSpeed's pipeline engine refuses ZeRO-{lay.zero} ('ZeRO-2 and ZeRO-3 are incompatible with "
                      f"pipeline parallelism', deepspeed/runtime/pipe/engine.py); use --zero 1 or 0 with --pp {lay.pp}")
    uns = []
    accumulation = job.microbatches
    if lay.cp > 1:
        # DeepSpeed derives its data-parallel size from the world (world / (tp × pp)) and checks train_batch_size =
        # micro × accumulation × that size: the cp ranks run as data parallelism, with cp times fewer accumulation steps
        if job.microbatches % lay.cp:
            raise Refused(f"DeepSpeed has no context parallelism and {job.microbatches} micro-batches do not split over "
                          f"its {lay.dp * lay.cp} data-parallel ranks; plan with --fix cp=1")
        accumulation = job.microbatches // lay.cp
        uns.append(Unsupported("cp", lay.cp, "DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), "
                                             f"not ring attention: the {lay.cp} × {lay.dp} ranks run as data parallelism "
                                             f"(data-parallel size {lay.dp * lay.cp}, gradient_accumulation_steps "
                                             f"{accumulation}); with sequence_parallel_size {lay.cp} set by hand, "
                                             f"gradient_accumulation_steps goes back to {job.microbatches}"))
    if lay.recompute != "none":
        uns.append(Unsupported("recompute", lay.recompute, "activation checkpointing is switched on in the model code "
                                                           "(deepspeed.checkpointing or gradient_checkpointing_enable)"))
    if lay.recompute == "selective" and lay.recompute_modules not in (None, ("core_attn",)):
        uns.append(Unsupported("recompute_modules", ",".join(lay.recompute_modules), "what is recomputed is chosen in "
                                                                                    "the model code, not the config"))
    uns += _script_settings(job, spec)
    if lay.sequence_parallel:
        uns.append(Unsupported("sequence_parallel", True, "Megatron-style sequence parallelism is not a DeepSpeed setting"))
    if lay.expert_tp != lay.tp:
        uns.append(Unsupported("etp", lay.etp, "DeepSpeed's AutoEP has no expert tensor-parallel size of its own: the "
                                               "experts are split like the rest"))
    if lay.pp > 1 and (lay.vpp > 1 or lay.schedule != "1f1b"):
        uns.append(Unsupported("schedule", f"{lay.schedule} vpp {lay.vpp}", "DeepSpeed's pipeline runs 1F1B, one stage per rank"))
        if lay.vpp > 1:
            uns.append(Unsupported("vpp", lay.vpp, "no interleaved (virtual) stages in DeepSpeed's pipeline engine"))
    if lay.stage_layers:
        uns.append(Unsupported("stage_layers", lay.stage_layers, "PipelineModule(partition_method=...) decides the split"))
    if job.precision == "bf16":
        uns.append(Unsupported("precision", "bf16", "DeepSpeed keeps fp32 master weights with bf16 enabled"))
    if lay.dp_replicate > 1:
        uns.append(Unsupported("dp_replicate", lay.dp_replicate, "written as ZeRO over the whole data-parallel group "
                                                                 "(DeepSpeed's MiCS/hpZ groups are set by hand)"))
    if lay.zero == 3 and lay.wrap != 1:
        uns.append(Unsupported("wrap", wrap_word(lay.wrap), "DeepSpeed ZeRO-3 gathers module by module"))
    cfg = {"train_batch_size": job.global_batch, "train_micro_batch_size_per_gpu": lay.micro_batch,
           "gradient_accumulation_steps": accumulation, "gradient_clipping": 1.0,
           "zero_optimization": {"stage": lay.zero}}
    if lay.zero >= 1:
        cfg["zero_optimization"].update({"overlap_comm": True, "contiguous_gradients": True})
    if lay.zero in (1, 2):
        cfg["zero_optimization"]["reduce_scatter"] = True
    if job.precision in ("bf16-mixed", "bf16"):
        cfg["bf16"] = {"enabled": True}
    if job.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if job.precision == "fp8-mixed":
        cfg["bf16"] = {"enabled": True}
        uns.append(Unsupported("precision", "fp8-mixed", "DeepSpeed's config has no FP8 GEMMs (Transformer Engine layers "
                                                         "in the model script do that): written as bf16"))
    if job.grad_reduce_bytes == 4 and job.precision in ("bf16-mixed", "bf16", "fp16-mixed", "fp8-mixed"):
        cfg["communication_data_type"] = "fp32"      # DeepSpeed reduces in the model's dtype unless told otherwise
    if lay.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": lay.tp}
    if lay.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": lay.ep}
    if lay.pp > 1:
        cfg["pipeline"] = {"stages": lay.pp, "partition": "parameters"}
    if job.optimizer == "sgd":   # AdamW (shardlab's default, what a config without an optimizer reads back as): none
        cfg["optimizer"] = {"type": OPTIMIZER[job.optimizer], "params": {"lr": 3e-4}}
        if lay.zero >= 1:
            # ZeRO refuses an optimizer outside ZERO_SUPPORTED_OPTIMIZERS without this (deepspeed/runtime/engine.py
            # _do_optimizer_sanity_check; deepspeed/runtime/zero/utils.py)
            cfg["zero_allow_untested_optimizer"] = True
    cfg["steps_per_print"] = 10
    return cfg, uns


def _script_settings(job: LaunchJob, spec) -> list[Unsupported]:
    """What a DeepSpeed config has no key for, where the job's value is not what the file reads back as: the
    training script (or the launch line) sets it."""
    out = []
    if spec is None or job.seq_len != min(spec.max_seq_len, DEFAULT_SEQ_LEN):
        out.append(Unsupported("seq_len", job.seq_len, "set by the training script's tokenizer/collator (read back as "
                                                       "shardlab's default, min(model max, 4096))"))
    if job.dropout:
        out.append(Unsupported("dropout", True, "set in the model's config in the training script (attention and "
                                                "hidden dropout 0.1)"))
    if job.optimizer not in OPTIMIZER:
        out.append(Unsupported("optimizer", job.optimizer, "DeepSpeed names DeepSpeed or torch.optim optimizers; 8-bit "
                                                           "Adam (bitsandbytes) is passed in by the training script "
                                                           "(read back as AdamW)"))
    if job.gpus_per_node != DEFAULT_GPUS_PER_NODE:
        out.append(Unsupported("gpus_per_node", job.gpus_per_node, "the launch line's --num_gpus sets it, not the "
                               f"config (read back as nodes of {DEFAULT_GPUS_PER_NODE})"))
    return out


def render(job: LaunchJob, spec) -> Export:
    cfg, uns = config(job, spec)
    name = f"{job.model}-ds_config.json"
    launch = (f"deepspeed --num_nodes {job.nodes} --num_gpus {job.procs_per_node} --hostfile hostfile train.py "
              f"--deepspeed --deepspeed_config {name}")
    text = json.dumps(cfg, indent=2) + "\n"
    return Export("deepspeed", "DeepSpeed config JSON", name, text, CHECKED, tuple(uns), launch)


def read(text: str, catalog) -> Imported:
    from shardlab import limits as L

    try:
        cfg = json_loads(text)
    except json.JSONDecodeError as e:
        raise ShardlabError(f"not a valid DeepSpeed JSON: {e.msg} at line {e.lineno}") from None
    except ValueError as e:                      # NaN/Infinity, a key written twice, or a number thousands of digits long
        if "digits" in str(e):
            raise ShardlabError("not a valid DeepSpeed JSON: it has a number thousands of digits long") from None
        raise ShardlabError(f"not a valid DeepSpeed JSON: {str(e)[:120]}") from None
    if not isinstance(cfg, dict):
        raise ShardlabError("a DeepSpeed config is a JSON object")
    f, und, ign = {}, [], []
    z = section(cfg, "zero_optimization")
    stage = z.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3) or isinstance(stage, float) and not stage.is_integer():
        raise FieldError("zero_optimization.stage", "0, 1, 2 or 3", stage,
                         wrong_type=isinstance(stage, bool) or not isinstance(stage, (int, float)))
    f["zero"] = int(stage)
    und.append((f"zero_optimization.stage {f['zero']}", f"zero {f['zero']}"))
    for k in ("offload_optimizer", "offload_param"):
        off = section(z, k, f"zero_optimization.{k}")
        if off and off.get("device", "none") != "none":
            ign.append(f"zero_optimization.{k} ({str(off.get('device'))[:20]}: offload not modelled)")

    def batch(key: str):
        v = cfg.get(key)
        if v is None or v == "auto":
            return None
        return whole(v, key, 1, L.MAX_BATCH, 'or "auto"')

    mb, gas, gb = (batch(k) for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"))
    tp_cfg, pipe = section(cfg, "tensor_parallel"), section(cfg, "pipeline")
    tp = tp_cfg.get("autotp_size", 0)
    f["tp"] = 1 if tp in (0, None) and not isinstance(tp, bool) else whole(tp, "tensor_parallel.autotp_size", 1, L.MAX_GPUS)
    stages = pipe.get("stages", "auto")
    f["pp"] = 1 if stages == "auto" else whole(stages, "pipeline.stages", 1, L.MAX_LAYERS,
                                                'or "auto"; each stage holds at least one layer')
    if mb is not None:
        f["micro_batch"] = mb
    if gb is not None:
        f["global_batch"] = gb
    if mb is not None and gb is not None and gas is not None:
        if gb % (mb * gas):
            raise FieldError("train_batch_size", f"train_micro_batch_size_per_gpu {mb} × gradient_accumulation_steps "
                             f"{gas} × the data-parallel size (a multiple of {mb * gas}), as DeepSpeed checks", gb)
        f["dp"] = gb // (mb * gas)
        f["gpus"] = f["dp"] * f["tp"] * f["pp"]
        und.append((f"train_batch_size {gb} = micro {mb} × accumulation {gas} × dp", f"dp {f['dp']}"))
    else:
        ign.append("batch sizes incomplete (\"auto\" or missing): dp comes from --gpus")
    ep_cfg = section(cfg, "expert_parallel")
    if ep_cfg.get("enabled") is not None and not isinstance(ep_cfg.get("enabled"), bool):
        raise FieldError("expert_parallel.enabled", "true or false", ep_cfg["enabled"], wrong_type=True)
    if ep_cfg.get("enabled"):
        ep = whole(ep_cfg.get("autoep_size", 1), "expert_parallel.autoep_size", 1, L.MAX_GPUS)
        if ep > 1:
            f["ep"] = ep
            und.append((f"expert_parallel.autoep_size {f['ep']}", "ep"))
    if f["tp"] > 1:
        und.append((f"tensor_parallel.autotp_size {f['tp']}", "tp"))
    if f["pp"] > 1:
        und.append((f"pipeline.stages {f['pp']}", "pp (1F1B)"))
    enabled = {}
    for k in ("bf16", "fp16"):
        on = section(cfg, k).get("enabled", False)
        if not isinstance(on, bool) and on != "auto":
            raise FieldError(f"{k}.enabled", 'true, false or "auto"', on, wrong_type=True)
        enabled[k] = on is True or on == "auto"          # "auto" (the Hugging Face Trainer decides): as before, on
    f["precision"] = "bf16-mixed" if enabled["bf16"] else "fp16-mixed" if enabled["fp16"] else "fp32"
    und.append(("bf16/fp16 sections", f["precision"]))
    comm = cfg.get("communication_data_type")
    if comm is not None:
        if comm not in ("fp32", "fp16", "bf16", "bfp16"):
            raise FieldError("communication_data_type", '"fp32", "fp16" or "bf16"', comm, wrong_type=not isinstance(comm, str))
        f["grad_reduce_bytes"] = 4 if comm == "fp32" else 2
        und.append((f"communication_data_type {comm}", f"gradients reduced in {comm}"))
    _read_optimizer(section(cfg, "optimizer"), f, und, ign)
    if cfg.get("sequence_parallel_size", 1) not in (1, None):
        ign.append(f"sequence_parallel_size {str(cfg['sequence_parallel_size'])[:20]} (Ulysses: not modelled)")
    known = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
             "bf16", "fp16", "tensor_parallel", "pipeline", "expert_parallel", "sequence_parallel_size",
             "communication_data_type", "optimizer", "zero_allow_untested_optimizer"}
    ign += [k[:60] for k in cfg if k not in known]
    return Imported("deepspeed", f, tuple(und), tuple(ign), framework="deepspeed")


def _read_optimizer(opt: dict, f: dict, und: list, ign: list) -> None:
    """optimizer.type (deepspeed/runtime/config.py get_optimizer_name; no optimizer section: the training script
    passes its own, shardlab's default)."""
    if not opt:
        return
    name = opt.get("type")
    if name is None:                  # parameters without a type: DeepSpeed builds no optimizer either
        return
    if not isinstance(name, str):
        raise FieldError("optimizer.type", "an optimizer name such as AdamW or SGD", name, wrong_type=True)
    mine = FROM_OPTIMIZER.get(name.lower())
    if mine is None:
        ign.append(f"optimizer.type {name[:40]} (priced as AdamW)")
        return
    f["optimizer"] = mine
    und.append((f"optimizer.type {name}", f"optimizer {mine}"))
