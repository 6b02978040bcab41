"""Megatron-LM ``pretrain_gpt.py`` argument list (Megatron-LM core_r0.16.0 flags, ``data/flags.yaml``), written as a
torchrun line in a shell script; read back from such a script or from a file of one flag per line.

Mapping (shardlab → Megatron-LM): tp/pp/cp/ep → --tensor-/--pipeline-model-parallel-size, --context-/
--expert-model-parallel-size (dp is what is left: world / (tp·pp·cp)); vpp → --num-layers-per-virtual-pipeline-stage;
uneven stages → --decoder-first/last-pipeline-num-layers; zero 1 → --use-distributed-optimizer (Megatron's distributed
optimizer shards optimizer states and master weights); zero 2/3 → --use-megatron-fsdp with
--data-parallel-sharding-strategy optim_grads / optim_grads_params; recompute selective → --recompute-granularity
selective (Korthikanti 2022's attention-core recompute, the same mechanism); full → full, uniform, 1 layer.
"""

from __future__ import annotations

import re

from shardlab.errors import ShardlabError
from shardlab.export.flags import require_valid, version
from shardlab.layout import wrap_word
from shardlab.export.job import Export, Imported, LaunchJob, Refused, Unsupported, header
from shardlab.export.names import models_with_shape
from shardlab.export.text import (FieldError, Said, as_int, comment_block, even_split, flag_words, flags_dict,
                                  split_command, whole)

CHECKED = f"{version('megatron')} flag schema; Megatron-Core 0.16.1 TransformerConfig"
ZERO_FSDP = {2: "optim_grads", 3: "optim_grads_params"}


def model_flags(spec) -> list[tuple[str, object]]:
    """Model shape flags (Megatron-LM names) of a catalog model."""
    out = [("num-layers", spec.num_layers), ("hidden-size", spec.hidden_size), ("ffn-hidden-size", spec.ffn_hidden_size),
           ("num-attention-heads", spec.num_heads)]
    if spec.mla is None and spec.num_kv_heads != spec.num_heads:
        out += [("group-query-attention", True), ("num-query-groups", spec.num_kv_heads)]
    if spec.head_dim and spec.head_dim * spec.num_heads != spec.hidden_size:
        out.append(("kv-channels", spec.head_dim))
    out += [("max-position-embeddings", spec.max_seq_len)]
    if spec.mlp == "swiglu":
        out.append(("swiglu", True))
    out.append(("normalization", "RMSNorm" if spec.norm == "rmsnorm" else "LayerNorm"))
    out.append(("position-embedding-type", "rope" if spec.position == "rope" else "learned_absolute"))
    if not (spec.qkv_bias or spec.out_bias or spec.mlp_bias):
        out.append(("disable-bias-linear", True))
    elif spec.qkv_bias and not spec.mlp_bias:
        out += [("disable-bias-linear", True), ("add-qkv-bias", True)]
    if not spec.tied_embeddings:
        out.append(("untie-embeddings-and-output-weights", True))
    if spec.moe:
        m = spec.moe
        out += [("num-experts", m.num_experts), ("moe-router-topk", m.top_k), ("moe-ffn-hidden-size", m.expert_ffn_hidden_size)]
        if m.num_shared_experts:
            out.append(("moe-shared-expert-intermediate-size", m.num_shared_experts * m.expert_ffn_hidden_size))
        if m.first_dense_layers:
            out.append(("moe-layer-freq", f"([0]*{m.first_dense_layers}+[1]*{spec.num_layers - m.first_dense_layers})"))
    if spec.mla:
        a = spec.mla
        out += [("multi-latent-attention", True), ("q-lora-rank", a.q_lora_rank), ("kv-lora-rank", a.kv_lora_rank),
                ("qk-head-dim", a.qk_nope_head_dim), ("qk-pos-emb-head-dim", a.qk_rope_head_dim), ("v-head-dim", a.v_head_dim)]
    out += [("tokenizer-type", "NullTokenizer"), ("vocab-size", spec.vocab_size), ("make-vocab-size-divisible-by", 1)]
    return out


MAX_LAYOUT_CHARS = 1_000_000
"""Bound on an unrolled --pipeline-model-parallel-layout (a real one has a few hundred layers)."""
MAX_LAYOUT_TEXT = 10_000
"""Bound on the layout as written (with '(...)*n' a real one is a few dozen characters; unrolled, a few hundred)."""


def layout_string(sizes) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for chunks of ``sizes`` decoder layers in model order (chunk c
    on pipeline rank c mod p, as Megatron's PipelineParallelLayerLayout reads them): E = embedding, t = a decoder
    layer, L = loss, stages split by '|' (megatron/core/transformer/pipeline_parallel_layer_layout.py)."""
    last = len(sizes) - 1
    return "|".join(("E" if i == 0 else "") + "t" * n + ("L" if i == last else "") for i, n in enumerate(sizes))


def parse_layout(text: str) -> list[str]:
    """The chunks of a --pipeline-model-parallel-layout string, unrolled as Megatron-Core does ('(tt|)*3', 't*4')."""
    bad = ShardlabError(f"--pipeline-model-parallel-layout {text[:60]!r}: Megatron-Core's layout takes E, t, m, L, "
                        f"'|', '(...)*n' and commas, for at most {MAX_LAYOUT_CHARS:,} layers and stages")

    if len(text) > MAX_LAYOUT_TEXT:                 # before any regex runs on it
        raise bad
    s = text.replace(",", "")
    for pattern in (r"\(([^()]+)\)\*(\d+)", r"(.)\*(\d+)"):
        grown = len(s)

        def unroll(m):
            nonlocal grown
            grown += len(m.group(1)) * (int(m.group(2)) - 1) if len(m.group(2)) < 8 else MAX_LAYOUT_CHARS
            if grown > MAX_LAYOUT_CHARS:      # checked before the text is built
                raise bad
            return m.group(1) * int(m.group(2))

        s = re.sub(pattern, unroll, s)
    if set(s) - set("EtLm|"):
        raise bad
    return s.split("|")


def _stage_flags(job: LaunchJob, spec, uns: list) -> list[tuple[str, object]]:
    from shardlab.memory.states import chunk_layers

    lay = job.layout
    if lay.pp == 1:
        return []
    sizes = [len(r) for r in chunk_layers(spec, lay)]
    if len(set(sizes)) == 1:
        return [("num-layers-per-virtual-pipeline-stage", sizes[0])] if lay.vpp > 1 else []
    if lay.vpp == 1 and len(set(sizes[1:-1])) <= 1:
        return [("decoder-first-pipeline-num-layers", sizes[0]), ("decoder-last-pipeline-num-layers", sizes[-1])]
    return [("pipeline-model-parallel-layout", layout_string(sizes))]   # uneven middle stages or virtual chunks


def arg_list(job: LaunchJob, spec) -> tuple[list[tuple[str, object]], list[Unsupported]]:
    """(flag, value) pairs of the pretrain_gpt.py line (value True = a switch), and what could not be expressed."""
    lay = job.layout
    if job.serve is not None:
        raise Refused("Megatron-LM's pretrain_gpt.py trains; export an inference plan with --to vllm")
    uns = []
    if lay.pp > 1 and lay.schedule in ("gpipe", "zb-h1"):
        uns.append(Unsupported("schedule", lay.schedule, "Megatron-LM runs 1F1B (interleaved with virtual stages)"))
    if lay.zero in ZERO_FSDP and lay.pp > 1:
        raise Refused(f"Megatron-FSDP (ZeRO-{lay.zero}) does not combine with pipeline parallelism in Megatron-LM; "
                      f"use --zero 1 (distributed optimizer) with --pp {lay.pp}")
    if job.precision == "bf16":
        uns.append(Unsupported("precision", "bf16", "Megatron-LM keeps fp32 master weights with --bf16 (bf16-mixed)"))
    if job.optimizer == "adam-8bit":
        uns.append(Unsupported("optimizer", "adam-8bit", "Megatron-LM's optimizers are adam and sgd; adam written"))
    if spec.moe is not None and lay.tp > 1 and not lay.sequence_parallel:
        raise Refused("Megatron-Core trains MoE layers under tensor parallelism only with sequence parallelism "
                      "(MoELayer.forward raises otherwise); add --sequence-parallel (or plan with it)")
    if lay.tp > 1 and lay.ep > 1:
        pass  # experts keep TP (expert-tensor-parallel-size defaults to tp), as shardlab splits them
    if lay.dp_replicate > 1:
        uns.append(Unsupported("dp_replicate", lay.dp_replicate, "written as sharding over the whole data-parallel "
                                                                 "group (no hybrid replicas)"))
    if lay.zero == 3 and lay.wrap != 1:
        uns.append(Unsupported("wrap", wrap_word(lay.wrap), "Megatron-FSDP shards module by module"))
    out = [("tensor-model-parallel-size", lay.tp), ("pipeline-model-parallel-size", lay.pp)]
    out += _stage_flags(job, spec, uns)
    if lay.cp > 1:
        out.append(("context-parallel-size", lay.cp))
    if lay.ep > 1:
        out.append(("expert-model-parallel-size", lay.ep))
    if spec.moe is not None and (lay.ep > 1 or lay.tp > 1):   # the dispatcher shardlab prices (the default is allgather)
        out.append(("moe-token-dispatcher-type", "alltoall"))
    if lay.sequence_parallel:
        out.append(("sequence-parallel", True))
    if lay.recompute in ("selective", "op"):
        out.append(("recompute-granularity", "selective"))
        if lay.recompute == "op":
            uns.append(Unsupported("recompute", "op", "Megatron-LM has no per-operator checkpointing: written as its "
                                                      "selective recomputation (the attention core, less memory saved)"))
    elif lay.recompute == "full":
        # --recompute-method block recomputes the first N layers of each (virtual) stage: a fraction N / layers there
        per_chunk = spec.num_layers / (lay.pp * lay.vpp)
        n = round(lay.recompute_fraction * per_chunk)
        if lay.recompute_fraction < 1 and n >= 1 and abs(n - lay.recompute_fraction * per_chunk) < 1e-9 \
                and not lay.stage_layers:
            out += [("recompute-granularity", "full"), ("recompute-method", "block"), ("recompute-num-layers", n)]
        else:
            if lay.recompute_fraction < 1:
                uns.append(Unsupported("recompute_fraction", lay.recompute_fraction,
                                       "not a whole number of layers per stage (--recompute-method block N): written as "
                                       "full recomputation of every layer"))
            out += [("recompute-granularity", "full"), ("recompute-method", "uniform"), ("recompute-num-layers", 1)]
    out += [("micro-batch-size", lay.micro_batch), ("global-batch-size", job.global_batch), ("seq-length", job.seq_len)]
    if lay.zero == 1:
        out.append(("use-distributed-optimizer", True))
    elif lay.zero in ZERO_FSDP:
        out += [("use-megatron-fsdp", True), ("data-parallel-sharding-strategy", ZERO_FSDP[lay.zero])]
    if lay.dp > 1:
        out.append(("overlap-grad-reduce", True))
    # Megatron-LM reduces (and holds) bf16 gradients in fp32 unless --grad-reduce-in-bf16, fp16 ones in fp16 unless
    # --accumulate-allreduce-grads-in-fp32 (megatron/training/arguments.py); FP8 runs on bf16 with --fp8-format
    if job.precision in ("bf16-mixed", "bf16", "fp8-mixed"):
        out.append(("bf16", True))
        if job.grad_reduce_bytes == 2:
            out.append(("grad-reduce-in-bf16", True))
    elif job.precision == "fp16-mixed":
        out.append(("fp16", True))
        if job.grad_reduce_bytes == 4:
            out.append(("accumulate-allreduce-grads-in-fp32", True))
    elif job.grad_reduce_bytes == 2:
        uns.append(Unsupported("grad_reduce", "bf16", "fp32 training reduces fp32 gradients in Megatron-LM"))
    if job.precision == "fp8-mixed":
        out.append(("fp8-format", "hybrid"))     # Transformer Engine: E4M3 forward, E5M2 gradients (shardlab's FP8 recipe)
        if job.fp8_params:
            out.append(("fp8-param-gather", True))   # FP8 primary weights, gathered in FP8 (memory.fp8.Fp8Recipe)
    if job.tp_comm_overlap:
        # Transformer Engine's userbuffers overlap the sequence-parallel all-gather / reduce-scatter with the GEMMs:
        # Megatron-LM asserts --sequence-parallel with --tp-comm-overlap (megatron/training/arguments.py)
        if lay.tp > 1 and lay.sequence_parallel:
            out.append(("tp-comm-overlap", True))
        else:
            uns.append(Unsupported("tp_comm_overlap", True, "Megatron-LM overlaps TP communication only with tensor "
                                                            "and sequence parallelism (--sequence-parallel, TP > 1)"))
    out.append(("optimizer", "sgd" if job.optimizer == "sgd" else "adam"))
    out += model_flags(spec)
    # Megatron-LM's dropout defaults are 0.1 for both (arguments.py, _add_regularization_args): written as the estimate
    # assumed, 0 unless --dropout (GPT-3-era training, rate 0.1), since each dropout stores a mask and adds a kernel
    rate = 0.1 if job.dropout else 0
    out += [("attention-dropout", rate), ("hidden-dropout", rate)]
    out += [("mock-data", True), ("train-iters", 100), ("lr", 3e-4)]
    return out, uns


def render(job: LaunchJob, spec) -> Export:
    pairs, uns = arg_list(job, spec)
    require_valid("megatron", {k: v for k, v in pairs})
    flags = flag_words(pairs)
    launch = (f"torchrun --nnodes {job.nodes} --nproc-per-node {job.procs_per_node} --node-rank \"${{NODE_RANK:-0}}\" "
              f"--master-addr \"${{MASTER_ADDR:-localhost}}\" --master-port 29500")
    text = ("#!/usr/bin/env bash\n" + comment_block(header(job, "megatron", uns) + [
        f"checked against {CHECKED}", "run from a Megatron-LM checkout on every node (NODE_RANK, MASTER_ADDR set)"])
        + "set -euo pipefail\n" + launch + " \\\n    pretrain_gpt.py \\\n    " + " \\\n    ".join(flags) + "\n")
    return Export("megatron", "Megatron-LM pretrain_gpt.py launch script", f"{job.model}-megatron.sh", text, CHECKED,
                  tuple(uns), "bash " + f"{job.model}-megatron.sh")


def read(text: str, catalog) -> Imported:
    from shardlab import limits as L

    words = split_command(text)
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    launcher = flags_dict(words[:script]) if script is not None else {}
    fl = flags_dict(words[script + 1:] if script is not None else words)
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

    nodes, nproc = digits("nnodes"), digits("nproc-per-node", "nproc_per_node")
    if nproc:
        world = (nodes or 1) * nproc
        f["gpus"] = world
        und.append((f"torchrun {nodes or 1} node(s) × {nproc}", f"{world} GPUs"))
    f["sequence_parallel"] = "sequence-parallel" in fl
    gran = fl.get("recompute-granularity")
    f["recompute"] = {"selective": "selective", "full": "full"}.get(gran, "none")
    if gran:
        und.append((f"--recompute-granularity {str(gran)[:40]}", f"recompute {f['recompute']}"))
    if gran == "full" and (fl.get("recompute-method") != "uniform" or g("recompute-num-layers", 1, 1, L.MAX_LAYERS) != 1):
        ign.append("--recompute-method/--recompute-num-layers other than uniform/1 (modelled as every layer)")
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
    f["precision"] = ("fp8-mixed" if "fp8-format" in fl and "bf16" in fl else "bf16-mixed" if "bf16" in fl
                      else "fp16-mixed" if "fp16" in fl else "fp32")
    und.append(("precision flags", f["precision"]))
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
             "expert-model-parallel-size", "sequence-parallel", "recompute-granularity", "recompute-method",
             "recompute-num-layers", "micro-batch-size", "global-batch-size", "seq-length", "use-distributed-optimizer",
             "use-megatron-fsdp", "data-parallel-sharding-strategy", "bf16", "fp16", "num-layers", "fp8-format",
             "grad-reduce-in-bf16", "accumulate-allreduce-grads-in-fp32", "tp-comm-overlap", "fp8-param-gather",
             "num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
             "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "hidden-size",
             "pipeline-model-parallel-layout",
             "num-attention-heads", "ffn-hidden-size", "num-experts", "vocab-size", "group-query-attention",
             "num-query-groups", "attention-dropout", "hidden-dropout", "moe-token-dispatcher-type"}
    shape_only = {k for k, _ in model_flags(catalog.model(mid))} if mid else set()
    disp = fl.get("moe-token-dispatcher-type")
    if disp is not None and disp != "alltoall":
        ign.append(f"--moe-token-dispatcher-type {str(disp)[:20]} (shardlab prices the alltoall dispatcher)")
    ign += [f"--{k}" for k in fl if k not in known and k not in shape_only]
    return Imported("megatron", f, tuple(und), tuple(ign), framework="megatron-lm")


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
