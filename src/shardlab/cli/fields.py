"""Fields -> flags: the analytic core names fields in its errors and notes (``errors.field_name``: ``layout.tp``,
``workload.global_batch``); while a command runs, the command line names them by the flag that sets them."""

from __future__ import annotations

FLAGS = {
    "layout.dp": "--dp", "layout.tp": "--tp", "layout.pp": "--pp", "layout.cp": "--cp", "layout.ep": "--ep", "layout.etp": "--etp",
    "layout.zero": "--zero", "layout.vpp": "--vpp", "layout.micro_batch": "--micro-batch",
    "layout.recompute": "--recompute", "layout.recompute_fraction": "--recompute-fraction",
    "layout.recompute_modules": "--recompute-modules", "layout.wrap": "--wrap",
    "layout.dp_replicate": "--dp-replicate", "layout.sequence_parallel": "--sequence-parallel",
    "layout.schedule": "--schedule", "layout.stage_layers": "--stage-layers",
    "workload.seq_len": "--seq-len", "workload.global_batch": "--global-batch", "workload.microbatches": "--microbatches",
    "workload.precision": "--precision", "workload.optimizer": "--optimizer",
    "cluster.gpus": "--gpus", "cluster.gpu": "--gpu", "cluster.gpus_per_node": "--gpus-per-node",
    "framework.name": "--framework", "plan.memory_fraction": "--max-memory-fraction",
    "serve.max_num_seqs": "--batch", "serve.prompt_len": "--prompt-len", "serve.output_len": "--output-len",
    "serve.kv_cache_dtype": "--kv-cache-dtype", "serve.weights": "--weights",
    "serve.group_size": "--group-size", "serve.activations": "--activations",
    "recipe.offload": "--offload", "recipe.offload_device": "--offload-device", "recipe.lora_rank": "--lora-rank", "recipe.quantize_base": "--quantize-base",
    "recipe.lora_targets": "--lora-targets", "recipe.fp8_all_gather": "--fp8-all-gather",
    "recipe.fp8_params": "--fp8-params", "workload.tp_comm_overlap": "--tp-comm-overlap",
    "moe.dispatcher": "--moe-dispatcher", "moe.ep_comm_overlap": "--ep-comm-overlap",
    "moe.expert_imbalance": "--expert-imbalance",
}
"""Every field the core names, and the flag that sets it (tests/test_cli_fields.py checks each flag exists)."""


def flag_of(name: str) -> str:
    """The flag for field ``name``; a name without one stays as it is."""
    return FLAGS.get(name, name)
