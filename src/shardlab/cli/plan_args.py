"""The flags of `shardlab plan` and `shardlab estimate` beyond the shared layout/cluster/workload ones
(cli.common): the estimate's modelling assumptions, the plan's search, and plan's own wording of the shared
flags in --help. `shardlab report` and `shardlab export` take them too."""

from __future__ import annotations

from shardlab.cli.common import BOUNDED, add_estimate_args, add_output_args, positive_int

PLAN_DEFAULT_MODEL = "llama-3.1-70b"
PLAN_DEFAULT_GPUS = 64

PLAN_EXAMPLES = """examples:
  shardlab plan                                        # Llama-3.1-70B on 8 nodes x 8 H100 (embedded defaults)
  shardlab plan llama-3.1-405b --gpus 1024 --seq-len 8192 --global-batch 2048 --tokens 15e12
  shardlab plan mixtral-8x7b --gpus 32 --gpu a100-80gb --objective cost
  shardlab plan llama-3.1-8b --inference --gpus 8 --batch 32 --prompt-len 2048 --output-len 256
"""
ESTIMATE_EXAMPLES = """examples:
  shardlab estimate llama-3.1-70b --gpus 64 --tp 8 --pp 2 --zero 1 --global-batch 512 --tokens 1e12
  shardlab estimate gpt3-175b --gpus 1024 --gpu a100-80gb --tp 8 --pp 16 --global-batch 1536 --seq-len 2048 --recompute full
  shardlab estimate llama-3.1-8b --inference --tp 2 --batch 16 --prompt-len 1024 --output-len 256
  shardlab estimate llama-3.1-8b --gpus 8 --zero 3 --precision fp8-mixed --seq-len 8192 --global-batch 128
  shardlab estimate llama-3.1-8b --gpus 8 --zero 2 --framework deepspeed --offload optimizer --seq-len 8192 --global-batch 64
  shardlab estimate llama-2-7b --gpus 1 --gpu rtx-4090 --lora-rank 16 --quantize-base nf4 --seq-len 2048 --global-batch 8
"""


def add_fused_loss_args(g) -> None:
    """--fused-loss / --no-fused-loss (default: the framework's), which estimate, plan and memory share."""
    loss = g.add_mutually_exclusive_group()
    loss.add_argument("--fused-loss", dest="fused_loss", action="store_const", const=True, default=None,
                      help="the cross-entropy works in place on the logits (flash-attn's, Megatron's fused loss)")
    loss.add_argument("--no-fused-loss", dest="fused_loss", action="store_const", const=False,
                      help="the loss keeps an fp32 copy and log-softmax of the logits (plain PyTorch)")


def add_moe_dispatch_args(g, imbalance: bool = False) -> None:
    """A MoE training job's token movement (comm/moe_dispatch.py); ``imbalance`` adds --expert-imbalance, which the
    commands that take the serving flags already have."""
    g.add_argument("--moe-dispatcher", choices=("alltoall", "deepep"), default="alltoall",
                   help="MoE token dispatcher in training: alltoall (Megatron-core's, one copy per routed expert) or "
                        "deepep (flex dispatcher with DeepEP: one copy per remote node, forwarded over NVLink)")
    g.add_argument("--ep-comm-overlap", action="store_true",
                   help="MoE training: one micro-batch's dispatch and combine under another's compute (Megatron-core "
                        "--overlap-moe-expert-parallel-comm; needs --ep > 1, no full recomputation, --vpp with --pp)")
    if imbalance:
        g.add_argument("--expert-imbalance", type=BOUNDED["imbalance"], default=None, metavar="F",
                       help="the busiest expert-parallel rank's routed tokens over the mean (default 1: balanced)")


def add_assumption_args(p) -> None:
    g = p.add_argument_group("assumptions")
    g.add_argument("--no-flash-attention", action="store_true", help="attention stores and computes the full s×s scores")
    g.add_argument("--dropout", action="store_true", help="dropout in the blocks (GPT-3-era training)")
    g.add_argument("--no-dp-overlap", action="store_true", help="gradient reduction starts after the backward (no overlap)")
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="TP/SP collectives pipelined with their GEMMs (Megatron-Core --tp-comm-overlap, Transformer "
                        "Engine userbuffers; torchtitan async TP)")
    add_moe_dispatch_args(g)
    from shardlab.cli.common import add_grad_reduce_args

    add_grad_reduce_args(g)
    g.add_argument("--attention-kernel", choices=("flash1", "flash2", "native"), default=None,
                   help="attention kernel (default: the framework's): FlashAttention v1, FlashAttention-2, or the GPU "
                        "generation's own (FlashAttention-3 / cuDNN on Hopper)")
    add_fused_loss_args(g)
    g.add_argument("--overheads", metavar="FILE", help="YAML overriding the memory-overhead defaults")
    g.add_argument("--no-overheads", action="store_true", help="memory: model states and activations only")


def add_inference_args(p) -> None:
    from shardlab.cli.inference_args import add_inference_args as add_serving_args

    add_serving_args(p)


def add_plan_args(p) -> None:
    """Every flag of `shardlab plan` (also taken by `shardlab report`)."""
    add_estimate_args(p, model_default=PLAN_DEFAULT_MODEL)
    p.set_defaults(gpus_default=PLAN_DEFAULT_GPUS)
    g = p.add_argument_group("search")
    g.add_argument("--nodes", type=BOUNDED["gpus"], default=None, help="nodes (GPUs = nodes × GPUs per node)")
    g.add_argument("--objective", choices=("throughput", "cost", "memory", "latency"), default="throughput",
                   help="throughput: fastest step; cost: least GPU-time per token using up to --gpus; memory: least per-GPU "
                        "memory; latency (with --inference): lowest request latency")
    g.add_argument("--top", type=positive_int, default=5, help="plans to list")
    g.add_argument("--max-memory-fraction", type=BOUNDED["share"], default=None, metavar="F",
                   help="keep only layouts whose worst rank needs at most this share of a GPU's memory (default 0.95: "
                        "5%% free for allocator fragmentation beyond the 10%% of activations and buffers the estimate "
                        "counts, GMLake ASPLOS 2024; 1 turns the margin off; 0.9 keeps 10%% free)")
    g.add_argument("--fix", action="append", default=[], metavar="AXIS=VALUE",
                   help="pin an axis: tp, pp, cp, ep, zero, mb (micro_batch), vpp as integers, sp=0|1, hs=0|1 "
                        "(hybrid sharding off/on), rc=none|selective|full, schedule=NAME; e.g. --fix tp=8; repeatable. "
                        "A layout flag written on the line pins its axis the same way (--tp 1 is --fix tp=1)")
    g.add_argument("--explain", action="store_true", help="add a paragraph that says the plan out loud (for learners)")
    add_assumption_args(p)
    add_inference_args(p)
    add_output_args(p)


PLAN_REFUSED = ("dp", "microbatches", "stage_layers", "wrap", "recompute_fraction", "dp_replicate")
"""Estimate's layout flags plan refuses (it derives or searches them); `plan --help` says so."""


def plan_help(p) -> None:
    """The shared estimate flags, described as plan uses them."""
    for a in p._actions:
        if a.dest == "gpus":
            a.help = f"GPUs to plan for (default {PLAN_DEFAULT_GPUS}, or --nodes × GPUs per node)"
        elif a.dest == "global_batch":
            a.help = "sequences per optimizer step (default: 4M tokens per step, e.g. 1024 sequences of 4096)"
        elif a.dest in PLAN_REFUSED:
            a.help = "estimate only: plan derives or searches it (refused here)"
        elif a.dest in ("tp", "pp", "cp", "ep", "zero", "micro_batch", "recompute", "sequence_parallel", "schedule", "vpp"):
            a.help = (a.help or "") + "; written here, it pins the axis (as --fix does)"
