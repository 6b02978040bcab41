"""Building a LaunchJob: from a ``shardlab plan --json`` document, from a training estimate, or from the fields an
importer read; and the two numbers exports print beside the layout (the KV-cache block count, the price)."""

from __future__ import annotations

from dataclasses import replace

from shardlab import limits as L
from shardlab.errors import ShardlabError
from shardlab.export.job import LaunchJob, Serve, recipe_notes
from shardlab.export.plan_checks import plan_framework, plan_load, plan_number, plan_workload
from shardlab.layout import Layout
from shardlab.layout_checks import validate
from shardlab.specs.hardware import per_node_gbit


def kv_blocks(spec, cluster, tp: int, pp: int, batch: int, prompt_len: int, output_len: int, sv: dict | None = None) -> int:
    """KV-cache blocks per GPU as the serving model allocates them for vLLM (shardlab.memory.inference.kv_blocks:
    gpu_memory_utilization × capacity minus weights, the profiled activation peak and the rest, in blocks of 16), at
    the weights and KV types of ``sv`` (``_serving_settings``; default: the checkpoint's weights, bf16 KV)."""
    from shardlab.estimate.inference import estimate_inference
    from shardlab.serving.precision import checkpoint_precision

    sv = sv or {}
    prec = checkpoint_precision(spec, cluster.accelerator.peak_tflops, sv.get("weights"), sv.get("group_size"),
                                "fp8" if sv.get("kv_cache_dtype") == "fp8" else "bf16")
    est = estimate_inference(spec, cluster, tp=tp, pp=pp, batch=batch, prompt_len=prompt_len, output_len=output_len,
                             precision=prec)
    return int(est.case.blocks.num_blocks)


def price_notes(catalog, gpu: str, spot: bool = False, provider: str | None = None) -> dict:
    """{usd_per_gpu_hour, price_source, spot} from the price catalog, or {} when it has no price for ``gpu``."""
    from shardlab.cost.prices import price_table, resolve_price

    price_table(catalog)          # a broken 'prices:' section in --catalog is an error here too, as in `cost`
    try:
        p = resolve_price(catalog, gpu, provider=provider, spot=spot)
    except ShardlabError:
        return {"spot": True} if spot else {}      # still asked for spot; the cost says no price is known
    return {"usd_per_gpu_hour": p.usd_per_gpu_hour, "price_source": p.source, "spot": spot}


def plan_model(doc: dict, catalog):
    """The ModelSpec of a ``shardlab plan --json`` document: its ``model_ref`` (a file or hf: id) when it has one,
    else its catalog ``model``."""
    if not isinstance(doc, dict) or "model" not in doc:
        raise ShardlabError("--plan FILE must be the output of `shardlab plan --json` (it has no plans)")
    ref = doc.get("model_ref")
    if ref is not None and not isinstance(ref, str):
        raise TypeError("model_ref must be a file path or hf: id")
    return catalog.model(ref or doc["model"])


def _serving_settings(sv, spec=None) -> dict:
    """The serving settings an inference plan was made with (``plan --inference --json``'s ``serving``): weights,
    KV-cache dtype, memory fraction and sequence cap, checked (a tampered file gets one line, not a wrong file)."""
    from shardlab.serving.precision import ACTIVATION_DTYPES, KV_BYTES, WEIGHT_BITS

    sv = {} if sv is None else sv
    if not isinstance(sv, dict):
        raise ShardlabError("--plan FILE: 'serving' must be a mapping; export the plan again with `shardlab plan --json`")
    # a plan file without weights (an old or hand-edited one): the model's checkpoint type, as the plan priced it
    w, kv = sv.get("weights", (spec.checkpoint_weights if spec is not None else "") or "bf16"), sv.get("kv_cache_dtype", "bf16")
    util, cap = sv.get("gpu_memory_utilization", 0.9), sv.get("max_num_seqs")
    if w not in WEIGHT_BITS or kv not in KV_BYTES:
        raise ShardlabError(f"--plan FILE: serving weights {str(w)[:20]!r} / kv_cache_dtype {str(kv)[:20]!r} are not "
                            f"shardlab settings; export the plan again with `shardlab plan --json`")
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        raise ShardlabError("--plan FILE: serving gpu_memory_utilization must be in (0, 1]; export the plan again")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ShardlabError("--plan FILE: serving max_num_seqs must be a positive integer; export the plan again")
    group = sv.get("group_size")
    if group is not None and (isinstance(group, bool) or not isinstance(group, int) or not 0 < group <= 2**20):
        raise ShardlabError("--plan FILE: serving group_size must be a positive whole number; export the plan again")
    acts, own = sv.get("activations"), sv.get("weights_from_checkpoint", "weights" not in sv)
    if acts is not None and acts not in ACTIVATION_DTYPES:
        raise ShardlabError(f"--plan FILE: serving activations {str(acts)[:20]!r} is not one of "
                            f"{', '.join(ACTIVATION_DTYPES)}; export the plan again")
    if not isinstance(own, bool):
        raise ShardlabError("--plan FILE: serving weights_from_checkpoint must be true or false; export the plan again")
    own = own and spec is not None and w == spec.checkpoint_weights
    return {"weights": w, "kv_cache_dtype": "fp8" if kv == "fp8" else "auto", "gpu_memory_utilization": float(util),
            "max_num_seqs": cap, "group_size": group, "activations": acts, "weights_from_checkpoint": own}


def check_job(job: LaunchJob, spec, where: str) -> LaunchJob:
    """A job read from a plan file meets what the flags would have required (a hand-edited file is input too):
    a valid layout for the model, a global batch that splits into whole micro-batches, known precision and
    optimizer, a positive GPUs-per-node; serving: positive replicas and sequences."""
    from shardlab.layout_checks import validate
    from shardlab.memory.precision import OPTIMIZERS, PRECISIONS

    try:
        if not isinstance(job.gpus_per_node, int) or isinstance(job.gpus_per_node, bool) or \
                not 1 <= job.gpus_per_node <= L.MAX_GPUS_PER_NODE:
            raise ShardlabError(f"gpus_per_node must be 1 to {L.MAX_GPUS_PER_NODE}, got {str(job.gpus_per_node)[:20]}")
        if job.serve is not None:
            from shardlab.export import check_fields

            fields = {"tp": job.layout.tp, "pp": job.layout.pp, "replicas": job.serve.replicas,
                      "batch": job.serve.max_num_seqs, "prompt_len": job.serve.prompt_len,
                      "output_len": job.serve.output_len}
            for name, v in fields.items():
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise ShardlabError(f"{name} must be a positive whole number, got {str(v)[:20]}")
            check_fields(fields, None)         # the upper bounds of the matching flags
            validate(job.layout, spec, seq_len=job.seq_len)
            return job
        validate(job.layout, spec, seq_len=job.seq_len)
        if job.precision not in PRECISIONS or job.optimizer not in OPTIMIZERS:
            raise ShardlabError(f"precision {str(job.precision)[:20]!r} / optimizer {str(job.optimizer)[:20]!r} are not "
                                f"shardlab's ({', '.join(PRECISIONS)}; {', '.join(OPTIMIZERS)})")
        per_step = job.layout.micro_batch * job.layout.dp
        if not isinstance(job.global_batch, int) or isinstance(job.global_batch, bool) or job.global_batch % per_step:
            raise ShardlabError(f"global_batch {str(job.global_batch)[:20]} is not a whole number of micro-batch × dp = "
                                f"{per_step} sequences")
    except ShardlabError as e:
        raise ShardlabError(f"{where}: {e}; export the plan again with `shardlab plan --json`") from None
    return job


def job_from_plan(doc: dict, catalog, rank: int | None = None, spec=None) -> LaunchJob:
    """The ``rank``-th plan (1 = the best) of a ``shardlab plan --json`` document; without ``rank``, the plan's
    winner: the best disaggregated layout where a serving plan's ``comparison`` says splitting the phases wins, else
    the first plan. The model is ``spec`` when given, else the document's ``model_ref`` (a file or hf: id) or its
    catalog ``model``."""
    plans = doc.get("plans") if isinstance(doc, dict) else None
    if not plans or "model" not in doc:
        raise ShardlabError("--plan FILE must be the output of `shardlab plan --json` (it has no plans)")
    comp = doc.get("comparison")
    if rank is None and isinstance(comp, dict) and comp.get("winner") == "disaggregated" and doc.get("disaggregated"):
        spec = spec or plan_model(doc, catalog)
        return _disagg_job(doc, doc["disaggregated"][0], spec, catalog)
    rank = rank or 1
    if not 1 <= rank <= len(plans):
        raise ShardlabError(f"--rank {rank}: the plan file lists {len(plans)} plan(s)")
    p = plans[rank - 1]
    spec = spec or plan_model(doc, catalog)
    acc = catalog.accelerator(doc["gpu"])
    gpn = doc.get("gpus_per_node") or acc.system["gpus_per_node"]
    if "layout" not in p:  # inference plan
        lay = Layout(tp=p["tp"], pp=p["pp"])
        # a static-batch plan splits its batch over the replicas; a continuous-batching plan (--serve) names its cap
        plan_number(p.get("replicas"), f"plans[{rank - 1}].replicas", L.MAX_GPUS, integer=True, optional=False)
        per = -(-doc["batch"] // p["replicas"]) if "batch" in doc else p.get("max_num_seqs")
        if "batch" not in doc and (not isinstance(per, int) or isinstance(per, bool) or per < 1):
            raise ShardlabError("--plan FILE: an inference plan needs 'batch' (static) or its plans' 'max_num_seqs' (--serve)")
        cluster = _cluster(catalog, acc.id, p["tp"] * p["pp"], gpn)
        sv = _serving_settings(doc.get("serving"), spec)
        blocks = p.get("kv_blocks") or p.get("kv_blocks_per_gpu") or kv_blocks(spec, cluster, p["tp"], p["pp"], per,
                                                                               doc["prompt_len"], doc["output_len"], sv)
        if sv["weights"] in ("int4", "int8") and spec.checkpoint_weights != sv["weights"]:
            # the launch file serves the 16-bit checkpoint (an int4/int8 one it cannot name, export/vllm.py): predict
            # the blocks of what it runs, as `export --inference` does
            blocks = kv_blocks(spec, cluster, p["tp"], p["pp"], per, doc["prompt_len"], doc["output_len"],
                               {**sv, "weights": "bf16", "group_size": None})
        ep, dpa = p.get("ep", 1), p.get("dp_attention", 1)     # a MoE layout the serving search picked
        for name, v in (("ep", ep), ("dp_attention", dpa)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ShardlabError(f"--plan FILE: {name} must be a positive whole number; export the plan again with "
                                    f"`shardlab plan --json`")
        serve = Serve(max_num_seqs=min(per, sv["max_num_seqs"] or per), prompt_len=doc["prompt_len"],
                      output_len=doc["output_len"], replicas=p["replicas"], kv_blocks=blocks,
                      gpu_memory_utilization=sv["gpu_memory_utilization"], kv_cache_dtype=sv["kv_cache_dtype"],
                      weights=sv["weights"], group_size=sv["group_size"], activations=sv["activations"],
                      weights_from_checkpoint=sv["weights_from_checkpoint"], ep=ep, dp_attention=dpa,
                      load=plan_load(doc, p.get("max_request_rate"), f"plans[{rank - 1}]"))
        prec = "fp16-mixed" if sv["weights"] == "fp16" else "bf16-mixed"
        return LaunchJob(spec.name, lay, doc["prompt_len"] + doc["output_len"], per, prec, gpu=acc.id,
                         gpus_per_node=gpn, framework=_engine(doc), serve=serve,
                         notes={"step_time_s": None, **price_notes(catalog, acc.id)})
    from dataclasses import fields as dc_fields

    lay = {k: v for k, v in p["layout"].items() if k in {f.name for f in dc_fields(Layout)}}   # every field: no loss
    for key in ("stage_layers", "recompute_modules"):
        if lay.get(key):
            lay[key] = tuple(lay[key])
    wl = plan_workload(doc.get("workload"))           # a plan file is input: checked before it reaches a job file
    fw_id, fw_moe = plan_framework(doc.get("framework"), catalog)
    for key in ("step_time_s", "train_days"):       # figures for the file's comments: numbers, if anything
        plan_number(p.get(key), f"plans[{rank - 1}].{key}", L.MAX_FLOAT, allow_zero=key == "train_days")
    notes = {"step_time_s": p.get("step_time_s"), **price_notes(catalog, acc.id),
             **recipe_notes(wl.get("offload"), wl.get("lora_rank"), wl.get("quantize_base"), wl.get("offload_device"),
                            wl.get("lora_targets"))}
    if p.get("train_days"):
        notes["train_hours"] = p["train_days"] * 24
    fw = doc.get("framework")
    red = fw.get("grad_reduce_bytes") if isinstance(fw, dict) else None
    return LaunchJob(spec.name, Layout(**lay), wl["seq_len"], wl["global_batch"], wl["precision"], wl["optimizer"],
                     acc.id, gpn, framework=fw_id, notes=notes,
                     grad_reduce_bytes=red if red in (2, 4) else None,
                     dropout=(doc.get("assumptions") or {}).get("dropout") is True,
                     tp_comm_overlap=isinstance(fw, dict) and fw.get("tp_comm_overlap") is True,
                     fp8_params=wl.get("fp8_params") is True, assumptions=_plan_assumptions(doc),
                     inter_node_gbit=(per_node_gbit(doc.get("inter_link")) or (None, None))[1], **fw_moe)


def _plan_assumptions(doc: dict) -> tuple:
    """``LaunchJob.assumptions`` from a plan's ``assumptions`` (plan --json): flash attention, compile, overlap of the
    gradient reduction, attention kernel and fused loss, where the plan did not take the framework's own."""
    from shardlab.export.job import assumptions_of

    a = doc.get("assumptions") if isinstance(doc.get("assumptions"), dict) else {}
    kernel = a.get("attention_kernel")
    return assumptions_of(flash_attention=a.get("flash_attention") is not False,
                          compile=a.get("compile") if isinstance(a.get("compile"), bool) else None,
                          dp_overlap=a.get("dp_overlap") is not False,
                          attention_kernel=kernel if kernel in ("flash1", "flash2", "native") else None,
                          fused_loss={"yes": True, "no": False}.get(a.get("fused_loss")))


def _disagg_job(doc: dict, p: dict, spec, catalog) -> LaunchJob:
    """The job of a capacity search's disaggregated layout (``plan --inference --serve``'s ``disaggregated``)."""
    from shardlab.export.job import Pools

    acc = catalog.accelerator(doc["gpu"])
    gpn = doc.get("gpus_per_node") or acc.system["gpus_per_node"]
    pre, dec = p["prefill"], p["decode"]
    if (pre.get("ep", 1), pre.get("dp_attention", 1)) != (dec.get("ep", 1), dec.get("dp_attention", 1)) and \
            max(pre.get("dp_attention", 1), dec.get("dp_attention", 1)) > 1:
        raise ShardlabError("--plan FILE: the disaggregated pools mix expert-parallel layouts, which no export writes; "
                            "export the plan again with `shardlab plan --json`")
    for name, v in (("prefill.gpus", pre["gpus"]), ("prefill.tp", pre["tp"]), ("decode.gpus", dec["gpus"]),
                    ("decode.tp", dec["tp"]), ("decode.capacity_per_replica", dec["capacity_per_replica"]),
                    ("decode.ep", dec.get("ep", 1)), ("decode.dp_attention", dec.get("dp_attention", 1)),
                    ("prefill.pp", pre.get("pp", 1)), ("decode.pp", dec.get("pp", 1))):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ShardlabError(f"--plan FILE: disaggregated {name} must be a positive whole number; export the plan "
                                f"again with `shardlab plan --json`")
    sv = _serving_settings(doc.get("serving"), spec)
    # the engine's cap is per scheduler (each attention DP rank's, per pipeline micro-batch: serving.case), the
    # capacity the replica's: the largest cap that keeps the replica within the capacity the search priced (exact
    # where the schedulers divide it, as the attention ranks always do; a sequence or so under it with stages)
    per = max(1, dec["capacity_per_replica"] // (dec.get("pp", 1) * dec.get("dp_attention", 1)))
    cap = min(per, sv["max_num_seqs"] or per)
    blocks = dec.get("kv_blocks_per_gpu")
    serve = Serve(max_num_seqs=cap, prompt_len=doc["prompt_len"], output_len=doc["output_len"], replicas=1,
                  kv_blocks=blocks if isinstance(blocks, int) and not isinstance(blocks, bool) else None,
                  gpu_memory_utilization=sv["gpu_memory_utilization"], kv_cache_dtype=sv["kv_cache_dtype"],
                  weights=sv["weights"], group_size=sv["group_size"], activations=sv["activations"],
                  weights_from_checkpoint=sv["weights_from_checkpoint"], ep=dec.get("ep", 1),
                  dp_attention=dec.get("dp_attention", 1),
                  pools=Pools(pre["gpus"], dec["gpus"], pre["tp"], prefill_pp=pre.get("pp", 1),
                              prefill_gpu=_prefill_kind(pre, acc.id, catalog)),
                  load=plan_load(doc, p.get("max_request_rate"), "disaggregated[0]"))
    return LaunchJob(spec.name, Layout(tp=dec["tp"], pp=dec.get("pp", 1)), doc["prompt_len"] + doc["output_len"], cap,
                     "fp16-mixed" if sv["weights"] == "fp16" else "bf16-mixed", gpu=acc.id, gpus_per_node=gpn,
                     framework=_engine(doc), serve=serve, notes={"step_time_s": None, **price_notes(catalog, acc.id)})


def _engine(doc: dict) -> str:
    """The serving engine (and version) a plan priced (``engine`` of its JSON; vllm where an older plan has none)."""
    from shardlab.serving.engines import builtin_engines

    eng, known = doc.get("engine", "vllm"), builtin_engines()
    if not isinstance(eng, str) or eng not in known:
        raise ShardlabError(f"--plan FILE: engine {str(eng)[:40]!r} is not a serving engine shardlab knows "
                            f"({', '.join(known)}); export the plan again with `shardlab plan --json`")
    return eng


def _prefill_kind(pre: dict, decode_gpu: str, catalog) -> str | None:
    """The prefill pool's GPU kind where it differs from the decode pool's (``plan --prefill-gpu``), else None."""
    kind = pre.get("gpu")
    if kind is None or kind == decode_gpu:
        return None
    if not isinstance(kind, str):
        raise ShardlabError("--plan FILE: disaggregated prefill.gpu must be a GPU id; export the plan again with "
                            "`shardlab plan --json`")
    return catalog.accelerator(kind).id


def _cluster(catalog, gpu: str, gpus: int, gpn: int):
    from shardlab.specs.hardware import Cluster

    acc = catalog.accelerator(gpu)
    return Cluster(accelerator=acc, num_gpus=gpus, gpus_per_node=gpn, intra_link=catalog.link(acc.system["intra_link"]),
                   inter_link=catalog.link(acc.system["inter_link"]))


def job_from_fields(fields: dict, catalog, base: LaunchJob | None = None) -> LaunchJob:
    """A job from importer fields (a round trip's far end), validated against the model: every layout field and the
    optimizer the file gave, as ``estimate --from FILE`` takes them (``cli.from_file.ARG_OF``)."""
    from shardlab.layout import LAYOUT_FIELDS as ALL_LAYOUT_FIELDS
    from shardlab.memory.precision import OPTIMIZERS

    f = dict(fields)
    model = f.get("model") or (base.model if base else None)
    if not model:
        raise ShardlabError("the file names no model shardlab knows: give MODEL")
    spec = catalog.model(model)
    # every Layout field the file gave (the recompute fraction and modules, HSDP's replicas, the wrap unit too)
    lay_kw = {k: tuple(f[k]) if k in ("stage_layers", "recompute_modules") and f[k] is not None else f[k]
              for k in ALL_LAYOUT_FIELDS if k in f}
    serving = "max_num_seqs" in f or "prompt_len" in f
    if serving:
        lay_kw["dp"] = 1  # replicas are Serve.replicas, not data parallelism
    if "dp" not in lay_kw:
        gpus = f.get("gpus")
        mp = lay_kw.get("tp", 1) * lay_kw.get("pp", 1) * lay_kw.get("cp", 1)
        if gpus is None or gpus % mp:
            raise ShardlabError("the file does not say the data-parallel size: add --gpus N")
        lay_kw["dp"] = gpus // mp
    lay = validate(Layout(**lay_kw), spec)
    gb = f.get("global_batch") or lay.micro_batch * lay.dp
    gpu = f.get("gpu") or (base.gpu if base else "h100-sxm")
    optimizer = f.get("optimizer", "adamw")         # a file that names none: the default, as `estimate --from` reads it
    if optimizer not in OPTIMIZERS:
        raise ShardlabError(f"optimizer {str(optimizer)[:20]!r} is not one of {', '.join(OPTIMIZERS)}; fix the file")
    job = LaunchJob(spec.name, lay, f.get("seq_len") or min(spec.max_seq_len, 4096), gb, f.get("precision", "bf16-mixed"),
                    optimizer, gpu=gpu,
                    gpus_per_node=f.get("gpus_per_node") or catalog.accelerator(gpu).system["gpus_per_node"],
                    framework=f.get("framework"), grad_reduce_bytes=f.get("grad_reduce_bytes"),
                    dropout=bool(f.get("dropout", False)), tp_comm_overlap=bool(f.get("tp_comm_overlap", False)),
                    fp8_params=bool(f.get("fp8_params", False)), moe_dispatcher=f.get("moe_dispatcher", "alltoall"),
                    ep_comm_overlap=bool(f.get("ep_comm_overlap", False)),
                    expert_imbalance=float(f.get("expert_imbalance", 1.0)))
    if serving:
        seqs, plen, olen = f.get("max_num_seqs", 256), f.get("prompt_len", 1024), f.get("output_len", 256)
        job = replace(job, seq_len=plen + olen, global_batch=seqs, serve=Serve(max_num_seqs=seqs, prompt_len=plen, output_len=olen, replicas=f.get("replicas", 1),
                                       gpu_memory_utilization=f.get("gpu_memory_utilization", 0.9),
                                       kv_cache_dtype=f.get("kv_cache_dtype", "auto")))
    return job
