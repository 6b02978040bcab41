"""Flags for FP8, offload and LoRA/QLoRA (shared by memory, estimate, plan and cost), and the Recipe they make."""

from __future__ import annotations

import argparse

from shardlab.cli.common import BOUNDED


def _targets(text: str) -> tuple[str, ...]:
    from shardlab.memory.lora import TARGETS

    vals = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in vals if t not in TARGETS + ("all-linear",)]
    if bad or not vals:
        raise argparse.ArgumentTypeError(f"unknown target(s) {', '.join(bad) or '(none)'}; use a comma list of "
                                         f"{', '.join(TARGETS)} or all-linear")
    return vals


def add_recipe_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("FP8, offload and LoRA/QLoRA")
    g.add_argument("--offload", choices=("none", "optimizer", "params", "both"), default="none",
                   help="move model states off the GPU: optimizer (ZeRO-Offload, needs --zero >= 1), params or both "
                        "(ZeRO-Infinity / FSDP CPU offload, need --zero 3)")
    g.add_argument("--offload-device", choices=("cpu", "nvme"), default=None, help="where offloaded states live (default cpu)")
    g.add_argument("--lora-rank", type=BOUNDED["dim"], default=None, metavar="R",
                   help="LoRA fine-tuning: frozen base, trainable rank-R adapters")
    g.add_argument("--lora-targets", type=_targets, default=None, metavar="T,T,...",
                   help="adapted layers: q,k,v,o,gate,up,down or all-linear (default)")
    g.add_argument("--quantize-base", choices=("none", "nf4"), default="none",
                   help="nf4: 4-bit NormalFloat base weights with double-quantized scales (QLoRA; needs --lora-rank)")
    g.add_argument("--fp8-amax-history", type=BOUNDED["iters"], default=None, metavar="N",
                   help="fp8-mixed: amax history length per scaled tensor (Transformer Engine default 1024)")
    g.add_argument("--fp8-all-gather", action="store_true",
                   help="fp8-mixed with --zero 3: all-gather weights in FP8 (torchtitan enable_fsdp_float8_all_gather)")
    g.add_argument("--fp8-params", action="store_true",
                   help="fp8-mixed: FP8 GEMM weights kept only in FP8, gathered in FP8 (Megatron-Core "
                        "--fp8-param-gather, Transformer Engine fp8_model_init)")


def recipe_from_args(args):
    """The Recipe of the flags above (defaults when a command does not have them)."""
    from shardlab.errors import ShardlabError, field_name
    from shardlab.memory.fp8 import Fp8Recipe
    from shardlab.memory.lora import LoraSpec
    from shardlab.memory.offload import Offload
    from shardlab.memory.recipe import Recipe

    rank = getattr(args, "lora_rank", None)
    quant = getattr(args, "quantize_base", "none")
    targets = getattr(args, "lora_targets", None)
    device = getattr(args, "offload_device", None)
    history = getattr(args, "fp8_amax_history", None)
    fp8 = getattr(args, "precision", "") == "fp8-mixed"
    if quant != "none" and rank is None:
        raise ShardlabError(f"{field_name('recipe.quantize_base')} {quant} quantizes the frozen base of a LoRA run: add "
                            f"{field_name('recipe.lora_rank')} R (e.g. 16)")
    if targets is not None and rank is None:
        raise ShardlabError(f"{field_name('recipe.lora_targets')} chooses the adapted layers of a LoRA run: add "
                            f"{field_name('recipe.lora_rank')} R (e.g. 16)")
    if device is not None and getattr(args, "offload", "none") == "none":
        raise ShardlabError(f"{field_name('recipe.offload_device')} says where offloaded states go: add "
                            f"{field_name('recipe.offload')} optimizer, params or both")
    params = getattr(args, "fp8_params", False)
    if (history is not None or getattr(args, "fp8_all_gather", False) or params) and not fp8:
        raise ShardlabError("--fp8-amax-history / --fp8-all-gather / --fp8-params describe FP8 training: add "
                            "--precision fp8-mixed")
    lora = None if rank is None else LoraSpec(rank=rank, targets=tuple(targets or ("all-linear",)), quantize_base=quant)
    return Recipe(offload=Offload(getattr(args, "offload", "none"), device or "cpu"), lora=lora,
                  fp8=Fp8Recipe(amax_history_len=history or 1024, all_gather=getattr(args, "fp8_all_gather", False) or params,
                                primary_weights=params))
