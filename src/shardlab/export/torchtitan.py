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
  recompute → activation_checkpoint.mode (op = per-op SAC: selective, selective_ac_option "op"; a recompute fraction
  1/N = selective, option "N")
"""

from __future__ import annotations

import tomllib

from shardlab.errors import ShardlabError
from shardlab.export.job import DEFAULT_GPUS_PER_NODE, Export, Imported, LaunchJob, Refused, Unsupported, header
from shardlab.export.names import model_from_torchtitan, torchtitan_flavor
from shardlab.export.text import FieldError, Said, even_split, section, toml_dump, whole
from shardlab.layout import Layout, wrap_word

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


FLEX_FLAVORS = {("deepseek_v3", "16B"), ("deepseek_v3", "236B"), ("deepseek_v3", "671B")}
"""torchtitan 0.2.2 flavors whose attention is flex attention (attn_type='flex' in their model arguments), which its
context parallelism refuses (DeepSeekV3ModelArgs.update_from_config: 'Context Parallel only supports SDPA')."""


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
    m = job.microbatches
    if lay.pp > 1 and lay.schedule == "1f1b" and lay.vpp == 1 and m < lay.pp:
        # torch.distributed.pipelining.Schedule1F1B: "Number of microbatches must be >= the number of stages"
        raise Refused(f"torch's 1F1B schedule needs at least as many micro-batches as stages ({m} < pp {lay.pp}); raise "
                      f"--global-batch to {lay.pp * lay.micro_batch * lay.dp} or more")
    if lay.pp > 1 and lay.vpp > 1 and m % max(1, m // lay.pp):
        rounds = max(1, m // lay.pp)
        raise Refused(f"torch's interleaved schedules run micro-batches in rounds of pp: {m} micro-batches is not a "
                      f"multiple of its {rounds} rounds; use a multiple of pp {lay.pp} micro-batches (--global-batch)")
    uns = []
    if lay.zero == 1:
        uns.append(Unsupported("zero", 1, "torchtitan shards with FSDP2 only (no optimizer-only ZeRO-1): written as "
                                          "reshard_after_forward never, which also shards gradients (ZeRO-2, less memory)"))
    if job.optimizer != "adamw":
        uns.append(Unsupported("optimizer", job.optimizer, "torchtitan's optimizer builder takes Adam/AdamW; AdamW written"))
    if job.grad_reduce_bytes == 2:
        uns.append(Unsupported("grad_reduce", "bf16", "torchtitan 0.2.2 reduces gradients in fp32 "
                                                      "(training.mixed_precision_reduce takes float32 only)"))
    if job.dropout:
        uns.append(Unsupported("dropout", True, "torchtitan's models have no dropout; the run holds less activation "
                                                "memory and time than the estimate"))
    if job.gpus_per_node != DEFAULT_GPUS_PER_NODE:
        uns.append(Unsupported("gpus_per_node", job.gpus_per_node, "the launch line's torchrun --nproc-per-node sets it, "
                               f"not the TOML (read back as nodes of {DEFAULT_GPUS_PER_NODE})"))
    if lay.tp > 1 and not lay.sequence_parallel:
        uns.append(Unsupported("sequence_parallel", False, "torchtitan 0.2.2 always shards norms over TP (sequence parallel)"))
    dtype, mp = PRECISION[job.precision]
    # HSDP: replicas of a sharded group (torchtitan's data_parallel_replicate_degree × data_parallel_shard_degree)
    dp_rep, dp_shard = (lay.dp, 1) if lay.zero == 0 else (lay.dp_replicate, lay.dp // lay.dp_replicate)
    if lay.zero >= 2 and lay.wrap != 1:
        uns.append(Unsupported("wrap", wrap_word(lay.wrap), "torchtitan wraps every block as its own FSDP unit"))
    local = lay.micro_batch * job.microbatches if lay.pp > 1 else lay.micro_batch
    par = {"data_parallel_replicate_degree": dp_rep, "data_parallel_shard_degree": dp_shard,
           "fsdp_reshard_after_forward": {3: "always", 2: "never", 1: "never"}.get(lay.zero, "default"),
           "tensor_parallel_degree": lay.tp, "context_parallel_degree": lay.cp, "expert_parallel_degree": lay.ep,
           "pipeline_parallel_degree": lay.pp}
    if lay.cp > 1 and tuple(flavor) in FLEX_FLAVORS:
        raise Refused(f"torchtitan 0.2.2 runs context parallelism only with SDPA attention, and its {flavor[0]} {flavor[1]} "
                      "flavor uses flex attention (torchtitan/models/deepseek_v3/__init__.py; model/args.py, "
                      "update_from_config); use --cp 1, or --to megatron")
    if lay.expert_tp != lay.tp and lay.ep == 1:
        raise Refused("torchtitan applies expert_tensor_parallel_degree only with expert parallelism: without it the "
                      "experts are split like the attention; drop --etp or add --ep")
    if lay.expert_tp not in (1, lay.tp):
        raise Refused(f"torchtitan runs the experts split like the attention or whole (expert_tensor_parallel_degree "
                      f"1 or {lay.tp}), not over {lay.expert_tp} ranks; use --etp 1 or --etp {lay.tp}")
    if lay.ep > 1:   # the experts' TP as priced (shardlab's default: the attention's tp; --etp 1: experts whole)
        par["expert_tensor_parallel_degree"] = lay.expert_tp
    if lay.pp > 1:
        par.update({"pipeline_parallel_schedule": SCHEDULES[lay.schedule],
                    "pipeline_parallel_microbatch_size": lay.micro_batch,
                    "module_fqns_per_model_part": _chunk_fqns(spec, lay)})
    # torchtitan's modes: none, full, selective with option "op" (per-op SAC: shardlab's recompute 'op') or "N" (full
    # recomputation of every N-th block: shardlab's --recompute-fraction 1/N)
    ac = {"mode": lay.recompute}
    if lay.recompute in ("op", "selective"):
        ac = {"mode": "selective", "selective_ac_option": "op"}
    if lay.recompute == "selective":
        uns.append(Unsupported("recompute", "selective", "torchtitan has no attention-core-only recomputation; written as "
                                                         "its per-op selective checkpointing (shardlab's --recompute op)"))
        if lay.recompute_modules not in (None, ("core_attn",)):     # beyond Megatron-core's default
            uns.append(Unsupported("recompute_modules", ",".join(lay.recompute_modules), "torchtitan's per-op "
                                   "checkpointing picks the operators itself (no module list)"))
    frac = lay.recompute_fraction
    if lay.recompute == "full" and frac < 1:
        every = round(1 / frac)
        if abs(every * frac - 1) < 1e-9:
            ac = {"mode": "selective", "selective_ac_option": str(every)}
        else:
            uns.append(Unsupported("recompute_fraction", frac, "torchtitan recomputes every N-th block "
                                                               "(selective_ac_option N: a fraction 1/N); written as full "
                                                               "recomputation of every block"))
    sections = {
        "job": {"dump_folder": "./outputs", "description": f"{job.model}: exported by shardlab"},
        "model": {"name": flavor[0], "flavor": flavor[1], "hf_assets_path": f"./assets/hf/{job.model}"},
        "optimizer": {"name": "AdamW"},
        "training": {"local_batch_size": local, "global_batch_size": job.global_batch, "seq_len": job.seq_len,
                     "dtype": dtype, "mixed_precision_param": mp},
        "parallelism": par,
        "activation_checkpoint": ac,
        "compile": {"enable": dict(job.assumptions).get("compile") is True},   # torchtitan's [compile] enable
    }
    comments = header(job, "torchtitan", uns) + [f"checked against {CHECKED}",
                                                "run: torchrun --nproc-per-node N -m torchtitan.train --job.config_file THIS_FILE"]
    return Export("torchtitan", "torchtitan job TOML", f"{job.model}.toml", toml_dump(sections, comments), CHECKED,
                  tuple(uns), f"torchrun --nnodes {job.nodes} --nproc-per-node {job.procs_per_node} -m torchtitan.train "
                              f"--job.config_file {job.model}.toml")


def read(text: str, catalog) -> Imported:
    from shardlab import limits as L

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ShardlabError(f"not a valid torchtitan TOML: {e}") from None
    except ValueError:                    # Python refuses to read an integer of more than 4,300 digits
        raise ShardlabError("not a valid torchtitan TOML: it has a number thousands of digits long") from None
    for sec in ("model", "parallelism", "training", "activation_checkpoint", "compile", "float8", "quantize"):
        section(doc, sec, f"[{sec}]")
    model, par = section(doc, "model"), section(doc, "parallelism")
    train, ac = section(doc, "training"), section(doc, "activation_checkpoint")
    P, T = "parallelism.", "training."

    def num(sec: dict, prefix: str, key: str, default: int, lo: int = 1, hi: int = L.MAX_GPUS, why: str = "") -> int:
        return whole(sec[key], prefix + key, lo, hi, why) if key in sec else default

    f, und, ign = {}, [], []
    name, flavor = model.get("name", "llama3"), model.get("flavor", "debugmodel")
    for k, v in (("name", name), ("flavor", flavor)):
        if not isinstance(v, str):
            raise FieldError(f"model.{k}", "a name (text)", v, wrong_type=True)
    mid = model_from_torchtitan(name, flavor)
    if mid:
        f["model"] = mid
        und.append((f"model {name}/{flavor}", mid))
    else:
        ign.append(f"model {name}/{flavor} (no catalog model; give MODEL)")
    spec = catalog.models.get(mid) if mid else None
    rep = num(par, P, "data_parallel_replicate_degree", 1)
    shard = par.get("data_parallel_shard_degree", -1)
    shard = -1 if shard == -1 and not isinstance(shard, bool) else whole(
        shard, P + "data_parallel_shard_degree", 1, L.MAX_GPUS, "or -1: the GPUs left over")
    for key in ("tp", "pp", "cp", "ep"):
        full = {"tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree", "cp": "context_parallel_degree",
                "ep": "expert_parallel_degree"}[key]
        if key == "pp":       # each stage holds at least one layer: bounded before any per-stage work
            top = spec.num_layers if spec else L.MAX_LAYERS
            f[key] = num(par, P, full, 1, 1, top, f"{spec.name} has {top} layers; each stage holds at least one"
                         if spec else "each pipeline stage holds at least one layer")
        else:
            f[key] = num(par, P, full, 1)
        if full in par:
            und.append((f"parallelism.{full} = {f[key]}", key))
    if f["ep"] > 1:   # 1 (torchtitan's default, config/job_config.py) or the TP degree (its ParallelDims)
        etp = num(par, P, "expert_tensor_parallel_degree", 1, 1, max(f["tp"], 1), f"1 or tensor_parallel_degree {f['tp']}")
        if etp not in (1, f["tp"]):
            raise FieldError(P + "expert_tensor_parallel_degree", f"1 or tensor_parallel_degree ({f['tp']})", etp)
        if etp != f["tp"] and f["ep"] > 1:
            f["etp"] = etp
        und.append((f"parallelism.expert_tensor_parallel_degree = {etp}"
                    + ("" if "expert_tensor_parallel_degree" in par else " (torchtitan's default)"), "etp"))
    if rep * (shard if shard > 0 else 1) * f["tp"] * f["pp"] * f["cp"] > L.MAX_GPUS:
        raise FieldError("the parallelism degrees", f"a product of at most {L.MAX_GPUS:,} GPUs",
                         rep * (shard if shard > 0 else 1) * f["tp"] * f["pp"] * f["cp"])
    if shard == -1:
        f["dp_from_world"] = rep  # dp = world / (tp·pp·cp), the CLI fills the world size
        und.append(("parallelism.data_parallel_shard_degree = -1", "dp = GPUs / (tp·pp·cp)"))
    else:
        f["dp"] = rep * shard
        und.append((f"data_parallel_replicate {rep} × shard {shard}", f"dp {rep * shard}"))
    reshard = par.get("fsdp_reshard_after_forward", "default")
    if reshard not in ("always", "never", "default"):
        raise FieldError(P + "fsdp_reshard_after_forward", "'always', 'never' or 'default'", reshard,
                         wrong_type=not isinstance(reshard, str))
    if shard == 1 and rep >= 1 and not (f["cp"] > 1):
        f["zero"] = 0
    else:
        f["zero"] = {"always": 3, "never": 2}.get(reshard, 3 if f["pp"] == 1 else 2)
    und.append((f"fsdp_reshard_after_forward = {reshard!r}", f"zero {f['zero']}"))
    if rep > 1 and f["zero"] >= 1:     # HSDP: rep replicas of groups FSDP shards over (torchtitan's ParallelDims)
        f["dp_replicate"] = rep
        und.append((f"parallelism.data_parallel_replicate_degree = {rep} beside FSDP", f"dp_replicate {rep} (HSDP)"))
    if f["tp"] > 1:
        f["sequence_parallel"] = True
    pmb = num(par, P, "pipeline_parallel_microbatch_size", 1, 1, L.MAX_BATCH)
    local = num(train, T, "local_batch_size", 8, 1, L.MAX_BATCH)
    f["micro_batch"] = pmb if f["pp"] > 1 else local
    if f["pp"] > 1:
        sched = par.get("pipeline_parallel_schedule", "1F1B")
        f["schedule"] = FROM_SCHEDULE.get(sched.lower()) if isinstance(sched, str) else None
        if f["schedule"] is None:
            raise FieldError(P + "pipeline_parallel_schedule", "a schedule shardlab models (GPipe, 1F1B, "
                             "Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, LoopedBFS)", sched,
                             wrong_type=not isinstance(sched, str))
        und.append((f"pipeline_parallel_schedule = {sched!r}", f["schedule"]))
        parts = par.get("module_fqns_per_model_part")
        if parts:
            field = P + "module_fqns_per_model_part"
            if not isinstance(parts, list) or not all(isinstance(p, list) and all(isinstance(n, str) for n in p)
                                                      for p in parts):
                raise FieldError(field, "a list of lists of module names", parts, wrong_type=True)
            if len(parts) % f["pp"]:
                raise FieldError(field, f"a multiple of {P}pipeline_parallel_degree ({f['pp']}) model parts",
                                 Said(f"{len(parts)} parts"))
            sizes = tuple(sum(1 for n in p if n.startswith("layers.")) for p in parts)
            top = spec.num_layers if spec else L.MAX_LAYERS
            if len(parts) > top or sum(sizes) > top:
                raise FieldError(field, f"at most {top:,} parts and {top:,} layers in all"
                                 + (f" ({spec.name} has {top})" if spec else ""),
                                 Said(f"{len(parts):,} parts of {sum(sizes):,} layers"))
            f["vpp"] = len(parts) // f["pp"]
            if f["vpp"] == 1 and sizes != even_split(sum(sizes), f["pp"]):
                if min(sizes) < 1:
                    ign.append("module_fqns_per_model_part: a part without decoder layers (modelled as an even split)")
                else:
                    f["stage_layers"] = sizes
            und.append(("module_fqns_per_model_part", f"{len(parts)} chunks of {'/'.join(map(str, sizes))} layers"))
        elif f["schedule"] in ("interleaved", "zb-h1"):
            f["vpp"] = 2
            und.append(("looped schedule without module_fqns_per_model_part", "vpp 2 (torchtitan's default)"))
    gb = train.get("global_batch_size", -1)
    gb = -1 if gb == -1 and not isinstance(gb, bool) else whole(gb, T + "global_batch_size", 1, L.MAX_BATCH,
                                                                 "or -1: local batch × data-parallel ranks")
    if gb > 0:
        f["global_batch"] = gb
    elif "dp" in f:
        f["global_batch"] = local * f["dp"]
    if "seq_len" in train:
        f["seq_len"] = num(train, T, "seq_len", 0, 1, L.MAX_SEQ_LEN)
    mode = ac.get("mode", "selective")
    if mode not in ("none", "full", "selective", "memory_budget"):
        raise FieldError("activation_checkpoint.mode", "'none', 'selective' or 'full'", mode,
                         wrong_type=not isinstance(mode, str))
    opt = ac.get("selective_ac_option", "2")
    if not isinstance(opt, (str, int)) or isinstance(opt, bool):
        raise FieldError("activation_checkpoint.selective_ac_option", "'op' or a number of blocks as text ('2')", opt,
                         wrong_type=True)
    opt = str(opt)[:20]
    f["recompute"] = {"none": "none", "full": "full"}.get(mode, "op" if opt == "op" else "full")
    if mode == "selective" and opt != "op":
        _read_every_nth(opt, f, und, ign)
    und.append((f"activation_checkpoint.mode = {mode!r}", f["recompute"]))
    dtype, mp = train.get("dtype", "float32"), train.get("mixed_precision_param", "bfloat16")
    for k, v in (("dtype", dtype), ("mixed_precision_param", mp)):
        if not isinstance(v, str):
            raise FieldError(T + k, "a dtype name such as 'bfloat16' or 'float32'", v, wrong_type=True)
    f["precision"] = "bf16" if dtype == "bfloat16" else ("bf16-mixed" if mp == "bfloat16" else "fp32")
    und.append((f"training.dtype {dtype}, mixed_precision_param {mp}", f["precision"]))
    if section(doc, "compile").get("enable") is True:        # per-block torch.compile (torchtitan's [compile])
        f["compile"] = True
        und.append(("compile.enable = true", "compile (compiled blocks)"))
    for sec in ("float8", "quantize"):
        if section(doc, sec).get("enable"):
            ign.append(f"[{sec}] (not modelled)")
    if model.get("converters"):
        ign.append(f"model.converters {str(model['converters'])[:80]} (float8/mx training not modelled)")
    return Imported("torchtitan", f, tuple(und), tuple(ign), framework="torchtitan")


def _read_every_nth(opt: str, f: dict, und: list, ign: list) -> None:
    """selective_ac_option "N": full checkpointing of every N-th block (torchtitan/distributed/activation_checkpoint.py
    _apply_layer_sac: ``if not ac_freq or count % ac_freq == 0``), i.e. recompute full with a fraction 1/N ("0": every
    block); what render writes for --recompute-fraction 1/N."""
    if not (opt.isascii() and opt.isdigit()):
        ign.append(f"selective_ac_option {opt} (neither 'op' nor a number of blocks: modelled as full)")
        return
    every = int(opt)
    if every > 1:
        f["recompute_fraction"] = 1 / every
    und.append((f"activation_checkpoint.selective_ac_option = {opt!r}",
                f"recompute_fraction {f.get('recompute_fraction', 1.0):g} (one block in {max(every, 1)})"))
