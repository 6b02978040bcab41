"""Megatron-LM ``pretrain_gpt.py`` argument list (Megatron-LM core_r0.16.0 flags, ``data/flags.yaml``), written as a
torchrun line in a shell script (``export.megatron_read`` reads such a script, or a file of one flag per line, back).

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
from shardlab.export.job import DEFAULT_GPUS_PER_NODE, Export, LaunchJob, Refused, Unsupported, header
from shardlab.export.text import comment_block, flag_words

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
        out += [("num-experts", m.num_experts), ("moe-router-topk", m.top_k), ("moe-ffn-hidden-size", m.expert_ffn_hidden_size),
                ("moe-grouped-gemm", True)]   # a rank's experts as grouped GEMMs (TEGroupedMLP), as shardlab prices them
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


OPTIMIZER = {"adamw": "adam", "sgd": "sgd", "adam-8bit": "adam"}
"""shardlab's optimizer -> Megatron-LM's --optimizer (adam or sgd, megatron/training/arguments.py
_add_training_args; its adam decouples the weight decay: AdamW); ``megatron_read`` maps adam back to adamw."""


def gpus_per_node_read(nodes: int | None, per_node: int) -> int | None:
    """GPUs per node as a launch line of ``nodes`` × ``per_node`` processes (torchrun --nnodes, --nproc-per-node)
    says it: exactly when it spans several nodes or one of more than the default; None (the default) where one node
    of at most ``DEFAULT_GPUS_PER_NODE`` processes fits nodes of any size."""
    return per_node if (nodes or 1) > 1 or per_node > DEFAULT_GPUS_PER_NODE else None


def block_fraction(recompute_layers: int, layers: int, chunks: int) -> float:
    """The share of layers --recompute-method block --recompute-num-layers N recomputes: the first N layers of each of
    ``chunks`` (virtual) pipeline stages of ``layers`` / ``chunks`` layers (megatron/core/transformer/
    transformer_block.py _checkpointed_forward), capped at all of them."""
    return min(1.0, recompute_layers * chunks / layers)


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
    if (gpus_per_node_read(job.nodes, job.procs_per_node) or DEFAULT_GPUS_PER_NODE) != job.gpus_per_node:
        uns.append(Unsupported("gpus_per_node", job.gpus_per_node, f"one node of {job.procs_per_node} processes "
                               f"(torchrun --nproc-per-node) reads back as nodes of {DEFAULT_GPUS_PER_NODE} GPUs"))
    if spec.moe is not None and lay.tp > 1 and not lay.sequence_parallel:
        raise Refused("Megatron-Core trains MoE layers under tensor parallelism only with sequence parallelism "
                      "(MoELayer.forward raises otherwise); add --sequence-parallel (or plan with it)")
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
    if lay.expert_tp != lay.tp:      # the experts' own TP (Megatron-core's default: the TP size, written only when not)
        out.append(("expert-tensor-parallel-size", lay.expert_tp))
    if spec.moe is not None and (lay.ep > 1 or lay.tp > 1):   # the dispatcher shardlab prices (the default is allgather)
        if job.moe_dispatcher == "deepep" and lay.ep > 1:   # flex dispatcher with DeepEP (transformer_config.py)
            out += [("moe-token-dispatcher-type", "flex"), ("moe-flex-dispatcher-backend", "deepep")]
        else:
            out.append(("moe-token-dispatcher-type", "alltoall"))
    if job.ep_comm_overlap:
        from shardlab.comm.moe_dispatch import overlap_refusal

        why = "a dense model has no expert all-to-all" if spec.moe is None else overlap_refusal(lay, job.precision)
        if why:
            uns.append(Unsupported("ep_comm_overlap", True, f"not written: {why}"))
        else:
            out.append(("overlap-moe-expert-parallel-comm", True))
    if lay.sequence_parallel:
        out.append(("sequence-parallel", True))
    if lay.recompute in ("selective", "op"):
        out.append(("recompute-granularity", "selective"))
        if lay.recompute == "selective" and lay.recompute_modules:
            out.append(("recompute-modules", tuple(lay.recompute_modules)))
        if lay.recompute == "op":
            uns.append(Unsupported("recompute", "op", "Megatron-LM has no per-operator checkpointing: written as its "
                                                      "selective recomputation (the attention core, less memory saved)"))
    elif lay.recompute == "full":
        # --recompute-method block recomputes the first N layers of each (virtual) stage: a fraction N / layers there
        per_chunk = spec.num_layers / (lay.pp * lay.vpp)
        n = round(lay.recompute_fraction * per_chunk)
        if lay.recompute_fraction < 1 and n >= 1 and abs(n - lay.recompute_fraction * per_chunk) < 1e-9 \
                and not lay.stage_layers:      # read back as block_fraction(n, layers, pp·vpp)
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
        if lay.recompute == "selective" and {"moe_act", "layernorm"} & set(lay.recompute_modules or ()):
            # Megatron-core refuses delayed scaling with these (transformer_config.py): per-tensor current scaling
            out.append(("fp8-recipe", "tensorwise"))
            uns.append(Unsupported("fp8_recipe", "delayed", "written as --fp8-recipe tensorwise (per-tensor current "
                                   "scaling): Megatron-core refuses delayed scaling with moe_act or layernorm "
                                   "recomputation; shardlab's memory still counts delayed scaling's amax history"))
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
    out.append(("optimizer", OPTIMIZER.get(job.optimizer, "adam")))
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
