"""Megatron-LM arguments read back (``shardlab estimate --from``): a script with the ``pretrain_gpt.py`` line that
``export.megatron`` writes (or anyone's), or a file of one flag per line, into the fields of a job. Every flag it
does not model is listed as ignored; every value is range-checked and a bad one is one line naming the flag."""

from __future__ import annotations

from shardlab.errors import ShardlabError
from shardlab.export.job import Imported
from shardlab.export.megatron import block_fraction, gpus_per_node_read, model_flags, parse_layout
from shardlab.export.names import models_with_shape
from shardlab.export.text import FieldError, Said, as_int, even_split, flags_dict, split_command, whole


def read(text: str, catalog) -> Imported:
    from shardlab import limits as L

    words = split_command(text)
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    launcher = flags_dict(words[:script]) if script is not None else {}
    fl = flags_dict(words[script + 1:] if script is not None else words, lists=("recompute-modules",))
    if not fl:
        raise ShardlabError("no Megatron-LM flags found: give a file of --flags (one per line) or a script with the "
                            "pretrain_gpt.py line")
    where = "Megatron-LM arguments"
    f, und, ign = {}, [], []

    def g(n, d=None, lo=1, hi=L.MAX_GPUS, why=""):
        return as_int(fl, n, where, lo, hi, why) if n in fl else d

    layers = g("num-layers", None, 1, L.MAX_LAYERS)          # bounds the pipeline before any per-stage work
    for key, name in (("tp", "tensor-model-parallel-size"), ("pp", "pipeline-model-parallel-size"),
                      ("cp", "context-parallel-size"), ("ep", "expert-model-parallel-size")):
        if key == "pp":
            f[key] = g(name, 1, 1, layers or L.MAX_LAYERS, f"--num-layers is {layers}; each stage holds at least one layer"
                       if layers else "each pipeline stage holds at least one layer")
        else:
            f[key] = g(name, 1)
        if name in fl:
            und.append((f"--{name} {f[key]}", key))

    def digits(*names):   # "$SLURM_NNODES": from the launcher, not a number
        for n in names:
            v = launcher.get(n)
            if isinstance(v, str) and v.isascii() and v.isdigit():
                return whole(v, f"torchrun --{n}", 1, L.MAX_GPUS)
        return None

    if "expert-tensor-parallel-size" in fl:       # the experts' own TP (Megatron-core's default: the TP size)
        etp = g("expert-tensor-parallel-size", 1, 1, f["tp"], f"it divides --tensor-model-parallel-size {f['tp']}")
        if f["tp"] % etp:
            raise ShardlabError(f"--expert-tensor-parallel-size {etp} does not divide --tensor-model-parallel-size "
                                f"{f['tp']}; give a divisor")
        if etp != f["tp"]:
            f["etp"] = etp
        und.append((f"--expert-tensor-parallel-size {etp}", "etp"))

    nodes, nproc = digits("nnodes"), digits("nproc-per-node", "nproc_per_node")
    if nproc:
        world = (nodes or 1) * nproc
        f["gpus"] = world
        und.append((f"torchrun {nodes or 1} node(s) × {nproc}", f"{world} GPUs"))
        _read_gpus_per_node(nodes, nproc, f, und)
    f["sequence_parallel"] = "sequence-parallel" in fl
    gran = fl.get("recompute-granularity")
    f["recompute"] = {"selective": "selective", "full": "full"}.get(gran, "none")
    if gran:
        und.append((f"--recompute-granularity {str(gran)[:40]}", f"recompute {f['recompute']}"))
    mods = fl.get("recompute-modules")
    if gran == "selective" and isinstance(mods, tuple) and mods:
        from shardlab.layout import RECOMPUTE_MODULES

        bad = [m for m in mods if m not in RECOMPUTE_MODULES]
        if bad or len(set(mods)) != len(mods):
            raise ShardlabError(f"{where}: --recompute-modules {' '.join(mods)[:60]} takes distinct names from "
                                f"{', '.join(RECOMPUTE_MODULES)}; fix it")
        f["recompute_modules"] = tuple(mods)
        und.append((f"--recompute-modules {' '.join(mods)}", f"recompute_modules {','.join(mods)}"))
    elif gran == "selective" and mods == ():   # an empty list: selective recomputation of nothing
        f["recompute"] = "none"
        und.append(("--recompute-modules (empty)", "recompute none: selective recomputation of no module"))
    elif mods is not None:
        ign.append("--recompute-modules without --recompute-granularity selective (Megatron-core ignores it)")
    f["micro_batch"] = g("micro-batch-size", 1, 1, L.MAX_BATCH)
    if "global-batch-size" in fl:
        f["global_batch"] = g("global-batch-size", None, 1, L.MAX_BATCH)
    if "seq-length" in fl:
        f["seq_len"] = g("seq-length", None, 1, L.MAX_SEQ_LEN)
    strategy = fl.get("data-parallel-sharding-strategy", "optim_grads_params")
    f["zero"] = (1 if "use-distributed-optimizer" in fl else
                 {"optim_grads": 2, "optim_grads_params": 3, "optim": 1}.get(strategy, 0)
                 if ("use-megatron-fsdp" in fl or "use-torch-fsdp2" in fl) else 0)
    und.append(("optimizer sharding flags", f"zero {f['zero']}"))
    if f["pp"] > 1 and "pipeline-model-parallel-layout" in fl:
        _read_layout(fl["pipeline-model-parallel-layout"], f, layers, und, ign)
    elif f["pp"] > 1:
        top = layers or L.MAX_LAYERS
        per_chunk = g("num-layers-per-virtual-pipeline-stage", None, 1, top)
        vstages = g("num-virtual-stages-per-pipeline-rank", None, 1, top)
        if per_chunk and layers:
            f["vpp"] = layers // (f["pp"] * per_chunk)
            if f["vpp"] < 1:
                raise FieldError("--num-layers-per-virtual-pipeline-stage", f"at most --num-layers {layers} / "
                                 f"--pipeline-model-parallel-size {f['pp']} = {layers // f['pp']}", per_chunk)
        elif vstages:
            f["vpp"] = vstages
        if f.get("vpp", 1) * f["pp"] > top:
            raise FieldError("--num-virtual-stages-per-pipeline-rank", f"at most {top // f['pp']:,} (pipeline "
                             f"chunks of at least one of {top:,} layers)", f["vpp"])
        f["schedule"] = "interleaved" if f.get("vpp", 1) > 1 else "1f1b"
        first = g("decoder-first-pipeline-num-layers", None, 0, top)
        last = g("decoder-last-pipeline-num-layers", None, 0, top)
        if (first or last) and layers and f.get("vpp", 1) == 1:
            first = first or (layers - (last or 0)) // f["pp"]
            mid_n = f["pp"] - 2 if f["pp"] > 2 else 0
            rest = layers - first - (last or 0)
            if mid_n and rest % mid_n == 0 and last:
                sizes = (first,) + (rest // mid_n,) * mid_n + (last,)
            elif f["pp"] == 2:
                sizes = (first, layers - first)
            else:
                sizes = None
            if sizes and min(sizes) < 1:
                raise FieldError("--decoder-first/last-pipeline-num-layers", f"stage sizes that leave every one of the "
                                 f"{f['pp']} stages at least one of the {layers} layers",
                                 Said("/".join(map(str, sizes)) if len(sizes) <= 8 else f"{first} first and {last} last"))
            if sizes and sizes != even_split(layers, f["pp"]):
                f["stage_layers"] = sizes
                und.append(("--decoder-first/last-pipeline-num-layers", f"stage layers {'/'.join(map(str, sizes))}"))
    if gran == "full":                       # after the pipeline: a block's layers are counted per (virtual) stage
        _read_recompute_layers(fl, g, f, layers, und, ign)
    if "optimizer" in fl:
        _read_optimizer(fl["optimizer"], f, und)
    f["precision"] = ("fp8-mixed" if "fp8-format" in fl and "bf16" in fl else "bf16-mixed" if "bf16" in fl
                      else "fp16-mixed" if "fp16" in fl else "fp32")
    und.append(("precision flags", f["precision"]))
    if fl.get("fp8-recipe") not in (None, "tensorwise", "delayed"):
        ign.append(f"--fp8-recipe {str(fl['fp8-recipe'])[:20]} (priced as per-tensor FP8 scaling)")
    if fl.get("moe-token-dispatcher-type") == "flex" and fl.get("moe-flex-dispatcher-backend", "deepep") == "deepep":
        f["moe_dispatcher"] = "deepep"
        und.append(("--moe-token-dispatcher-type flex (DeepEP backend)", "moe_dispatcher deepep"))
    if "overlap-moe-expert-parallel-comm" in fl:
        f["ep_comm_overlap"] = True
        und.append(("--overlap-moe-expert-parallel-comm", "MoE all-to-alls under another micro-batch's compute"))
    if "tp-comm-overlap" in fl:
        f["tp_comm_overlap"] = True
        und.append(("--tp-comm-overlap", "TP communication overlapped with the GEMMs"))
    if "fp8-param-gather" in fl and f["precision"] == "fp8-mixed":
        f["fp8_params"] = True
        und.append(("--fp8-param-gather", "FP8 primary weights"))
    elif "fp8-param-gather" in fl:
        ign.append("--fp8-param-gather without --fp8-format (no FP8 training: no FP8 weights to keep)")
    if "grad-reduce-in-bf16" in fl:
        f["grad_reduce_bytes"] = 2
        und.append(("--grad-reduce-in-bf16", "gradients held and reduced in bf16"))
    elif "accumulate-allreduce-grads-in-fp32" in fl:
        f["grad_reduce_bytes"] = 4
        und.append(("--accumulate-allreduce-grads-in-fp32", "gradients held and reduced in fp32"))
    for name in ("attention-dropout", "hidden-dropout"):
        rate = fl.get(name, "0.1")                  # Megatron-LM's default when the flag is absent
        try:
            rate_f = float(rate)
        except (TypeError, ValueError):
            raise FieldError(f"--{name}", "a probability from 0 to 1", rate) from None
        if not 0.0 <= rate_f <= 1.0:
            raise FieldError(f"--{name}", "a probability from 0 to 1", rate)
        if rate_f:
            f["dropout"] = True
    if f.get("dropout"):
        both = {"attention-dropout", "hidden-dropout"} <= set(fl)
        und.append(("dropout flags" + ("" if both else " (absent: Megatron's 0.1)"), "dropout on"))
    dim = lambda n, d=None, lo=1: g(n, d, lo, L.MAX_MODEL_DIM)
    shape = {"num_layers": layers, "hidden_size": dim("hidden-size"), "num_heads": dim("num-attention-heads"),
             "ffn_hidden_size": dim("ffn-hidden-size"), "num_experts": dim("num-experts", 0, 0), "vocab_size": dim("vocab-size")}
    if "multi-latent-attention" not in fl:
        shape["num_kv_heads"] = dim("num-query-groups") if "group-query-attention" in fl else shape["num_heads"]
    hits = models_with_shape(catalog, shape) if shape["num_layers"] and shape["hidden_size"] else []
    mid = hits[0] if len(hits) == 1 else None
    if mid:
        f["model"] = mid
        und.append(("model shape flags", mid))
    else:
        ign.append(f"model shape flags match {' and '.join(hits) if hits else 'no catalog model'} (give MODEL)")
    known = {"tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
             "expert-model-parallel-size", "expert-tensor-parallel-size", "sequence-parallel", "recompute-granularity", "recompute-method",
             "recompute-num-layers", "recompute-modules", "moe-flex-dispatcher-backend",
             "overlap-moe-expert-parallel-comm", "micro-batch-size", "global-batch-size", "seq-length", "use-distributed-optimizer",
             "use-megatron-fsdp", "data-parallel-sharding-strategy", "bf16", "fp16", "num-layers", "fp8-format", "fp8-recipe",
             "grad-reduce-in-bf16", "accumulate-allreduce-grads-in-fp32", "tp-comm-overlap", "fp8-param-gather",
             "num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
             "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "hidden-size",
             "pipeline-model-parallel-layout",
             "num-attention-heads", "ffn-hidden-size", "num-experts", "vocab-size", "group-query-attention",
             "num-query-groups", "attention-dropout", "hidden-dropout", "moe-token-dispatcher-type", "optimizer"}
    shape_only = {k for k, _ in model_flags(catalog.model(mid))} if mid else set()
    disp = fl.get("moe-token-dispatcher-type")
    if disp is not None and disp != "alltoall" and f.get("moe_dispatcher") != "deepep":
        ign.append(f"--moe-token-dispatcher-type {str(disp)[:20]}"
                   + (f" with --moe-flex-dispatcher-backend {str(fl.get('moe-flex-dispatcher-backend'))[:20]}"
                      if disp == "flex" else "") + " (shardlab prices the alltoall and DeepEP dispatchers)")
    ign += [f"--{k}" for k in fl if k not in known and k not in shape_only]
    return Imported("megatron", f, tuple(und), tuple(ign), framework="megatron-lm")


def _read_gpus_per_node(nodes: int | None, nproc: int, f: dict, und: list) -> None:
    """GPUs per node from torchrun's --nnodes × --nproc-per-node (torch/distributed/run.py), where the line says it
    (``megatron.gpus_per_node_read``: several nodes, or one of more GPUs than the default)."""
    from shardlab.limits import MAX_GPUS_PER_NODE

    per = gpus_per_node_read(nodes, nproc)
    if per is None:
        return
    if per > MAX_GPUS_PER_NODE:
        raise FieldError("torchrun --nproc-per-node", f"at most {MAX_GPUS_PER_NODE:,} GPUs per node", per)
    f["gpus_per_node"] = per
    und.append((f"torchrun --nproc-per-node {per}", "GPUs per node"))


def _read_recompute_layers(fl: dict, g, f: dict, layers: int | None, und: list, ign: list) -> None:
    """--recompute-method / --recompute-num-layers under --recompute-granularity full (megatron/training/arguments.py
    _add_training_args; megatron/core/transformer/transformer_block.py _checkpointed_forward): block N recomputes the
    first N layers of each (virtual) pipeline stage, a fraction N / its layers; uniform N recomputes every layer."""
    from shardlab.limits import MAX_LAYERS

    method = fl.get("recompute-method")
    n = g("recompute-num-layers", 1, 1, MAX_LAYERS)
    if method == "block" and layers and not f.get("stage_layers"):
        chunks = f["pp"] * f.get("vpp", 1)
        frac = block_fraction(n, layers, chunks)
        if frac < 1:
            f["recompute_fraction"] = frac
        und.append((f"--recompute-method block --recompute-num-layers {n}",
                    f"recompute_fraction {frac:g} ({n} of {layers / chunks:g} layers per stage)"))
    elif method != "uniform" or n != 1:
        ign.append("--recompute-method/--recompute-num-layers other than uniform/1 or block N over even stages "
                   "(modelled as every layer)")


def _read_optimizer(value, f: dict, und: list) -> None:
    """--optimizer: Megatron-LM's adam (decoupled weight decay: shardlab's adamw) or sgd (megatron/training/
    arguments.py _add_training_args, choices adam and sgd)."""
    opt = {"adam": "adamw", "sgd": "sgd"}.get(value) if isinstance(value, str) else None
    if opt is None:
        raise FieldError("--optimizer", "adam or sgd", value)
    f["optimizer"] = opt
    und.append((f"--optimizer {value}", f"optimizer {opt}"))


def _read_layout(text: str, f: dict, layers: int | None, und: list, ign: list) -> None:
    """--pipeline-model-parallel-layout into vpp, schedule and stage layers (what shardlab's Layout can hold)."""
    from shardlab.limits import MAX_LAYERS

    chunks = parse_layout(str(text))
    pp = f["pp"]
    top = layers or MAX_LAYERS
    if len(chunks) > top:                   # before any per-stage work: each stage holds at least one layer
        raise ShardlabError(f"--pipeline-model-parallel-layout has {len(chunks):,} stages; at most {top:,} fit "
                            f"{'--num-layers ' + str(layers) if layers else 'any model'} (one layer each)")
    if len(chunks) % pp:
        raise ShardlabError(f"--pipeline-model-parallel-layout has {len(chunks)} stages, not a multiple of "
                            f"--pipeline-model-parallel-size {pp}")
    f["vpp"] = len(chunks) // pp
    f["schedule"] = "interleaved" if f["vpp"] > 1 else "1f1b"
    sizes = tuple(c.count("t") for c in chunks)
    if sum(sizes) > MAX_LAYERS:
        raise ShardlabError(f"--pipeline-model-parallel-layout places {sum(sizes):,} decoder layers, above the limit of "
                            f"{MAX_LAYERS:,}")
    if layers and sum(sizes) != layers:
        raise ShardlabError(f"--pipeline-model-parallel-layout places {sum(sizes)} decoder layers; --num-layers is {layers}")
    if any(n == 0 for n in sizes) or any("m" in c for c in chunks):
        ign.append("--pipeline-model-parallel-layout stages without decoder layers or with MTP layers (modelled as an "
                   "even split)")
    elif sizes != even_split(sum(sizes), len(sizes)):
        if f["vpp"] == 1:
            f["stage_layers"] = sizes
        else:
            ign.append("--pipeline-model-parallel-layout: uneven virtual chunks other than an even split with the "
                       "remainder in the middle (modelled as that split)")
    und.append((f"--pipeline-model-parallel-layout ({len(chunks)} chunks)",
                f"vpp {f['vpp']}, layers per chunk {'/'.join(map(str, sizes))}"))
