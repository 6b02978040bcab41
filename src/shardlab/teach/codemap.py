"""Where each concept lives in Megatron-LM, PyTorch and DeepSpeed, mapped to shardlab's own layers (curriculum
items 4 and 9: reading the Megatron-LM and FSDP source with a map in hand).

Paths are relative to each project's repository root and were checked against megatron-core 0.16.1,
torch 2.13.0, deepspeed 0.19.8 and peft 0.21.2 (file and class / function names; line numbers drift, names rarely do).
The shardlab column names the module and symbol that implements or models the same thing here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CodeRef:
    """One concept in one upstream project, and shardlab's counterpart."""

    concept: str
    """What the code does, in the curriculum's words."""
    project: str
    """Megatron-LM, PyTorch or DeepSpeed."""
    path: str
    """File in that project's repository."""
    symbol: str
    """Class or function (several separated by ', ')."""
    shardlab: str
    """shardlab's module: symbol that implements (runtime) or models (analytic core) it."""


MEG = "Megatron-LM"
PT = "PyTorch"
DS = "DeepSpeed"
PEFT = "PEFT"
CODE = {
    # ---- tensor parallel --------------------------------------------------------------------------------
    "meg-column": CodeRef("column-parallel linear (split output features)", MEG, "megatron/core/tensor_parallel/layers.py",
                          "ColumnParallelLinear", "runtime/parallel/megatron.py: ColumnParallelLinear"),
    "meg-row": CodeRef("row-parallel linear (split input features, sum partials)", MEG, "megatron/core/tensor_parallel/layers.py",
                       "RowParallelLinear", "runtime/parallel/megatron.py: RowParallelLinear"),
    "meg-f": CodeRef("f: identity forward, all-reduce backward", MEG, "megatron/core/tensor_parallel/mappings.py",
                     "copy_to_tensor_model_parallel_region, _CopyToModelParallelRegion",
                     "runtime/parallel/megatron.py: CopyToTensorParallel"),
    "meg-g": CodeRef("g: all-reduce forward, identity backward", MEG, "megatron/core/tensor_parallel/mappings.py",
                     "reduce_from_tensor_model_parallel_region, _ReduceFromModelParallelRegion",
                     "runtime/parallel/megatron.py: ReduceFromTensorParallel"),
    "meg-vocab": CodeRef("vocabulary-parallel embedding", MEG, "megatron/core/tensor_parallel/layers.py",
                         "VocabParallelEmbedding", "runtime/parallel/megatron.py: VocabParallelEmbedding"),
    "meg-xent": CodeRef("vocabulary-parallel cross-entropy (max, target logit, Σexp all-reduced)", MEG,
                        "megatron/core/tensor_parallel/cross_entropy.py", "vocab_parallel_cross_entropy, _VocabParallelCrossEntropy",
                        "comm/inventory.py: layout_collectives (the three b·s fp32 all-reduces)"),
    "meg-attention": CodeRef("attention: fused QKV column-parallel, output projection row-parallel", MEG,
                             "megatron/core/transformer/attention.py", "SelfAttention (linear_qkv, linear_proj)",
                             "runtime/parallel/megatron.py: apply_megatron_tp; shard/rules.py: shard_rows"),
    "meg-mlp": CodeRef("MLP: fc1 column-parallel, fc2 row-parallel", MEG, "megatron/core/transformer/mlp.py",
                       "MLP (linear_fc1, linear_fc2)", "runtime/parallel/megatron.py: apply_megatron_tp; shard/rules.py: block_collectives"),
    "meg-sp": CodeRef("sequence parallel: all-gather before, reduce-scatter after the TP region", MEG,
                      "megatron/core/tensor_parallel/mappings.py",
                      "gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region",
                      "runtime/parallel/tensor.py: apply_tp(sequence_parallel=True)"),
    "pt-tp": CodeRef("tensor-parallel plans on DTensor", PT, "torch/distributed/tensor/parallel/style.py",
                     "ColwiseParallel, RowwiseParallel, SequenceParallel", "runtime/parallel/tensor.py: _block_plan"),
    "pt-parallelize": CodeRef("apply a TP plan to a module", PT, "torch/distributed/tensor/parallel/api.py",
                              "parallelize_module", "runtime/parallel/tensor.py: apply_tp"),
    # ---- rank layout -------------------------------------------------------------------------------------
    "meg-ranks": CodeRef("rank grid: which ranks form TP, DP, PP groups", MEG, "megatron/core/parallel_state.py",
                         "RankGenerator, initialize_model_parallel", "layout.py: rank_coords, group_ranks, all_groups"),
    "pt-mesh": CodeRef("device mesh of named parallel dimensions", PT, "torch/distributed/device_mesh.py",
                       "init_device_mesh", "runtime/parallel/build.py: setup_rank (pp, dp, tp mesh)"),
    # ---- data parallel, ZeRO, FSDP -------------------------------------------------------------------------
    "pt-ddp": CodeRef("DDP: replicas, gradient buckets all-reduced during backward", PT, "torch/nn/parallel/distributed.py",
                      "DistributedDataParallel (bucket_cap_mb=25, no_sync)", "runtime/parallel/build.py: setup_rank; "
                      "comm/inventory_items.py: DDP_BUCKET_BYTES"),
    "pt-reducer": CodeRef("DDP's bucket reducer (autograd hooks, 1 MiB first bucket, 25 MiB after)", PT,
                          "torch/csrc/distributed/c10d/reducer.hpp", "Reducer, kDefaultFirstBucketBytes, kDefaultBucketBytesCap",
                          "comm/inventory_dp.py: dp_items (DP all-reduce in buckets)"),
    "meg-ddp": CodeRef("Megatron DDP: contiguous grad buffer split into buckets, overlap_grad_reduce", MEG,
                       "megatron/core/distributed/param_and_grad_buffer.py", "_ParamAndGradBuffer, _ParamAndGradBucketGroup",
                       "comm/pricing.py (exposed DP communication)"),
    "meg-distopt": CodeRef("distributed optimizer: ZeRO-1 sharding of fp32 master weights and moments", MEG,
                           "megatron/core/optimizer/distrib_optimizer.py", "DistributedOptimizer",
                           "memory/states.py: state_report (zero=1)"),
    "ds-zero12": CodeRef("ZeRO stages 1 and 2: flat partitions, reduce-scatter of gradients", DS,
                         "deepspeed/runtime/zero/stage_1_and_2.py", "DeepSpeedZeroOptimizer (reduce_ipg_grads, average_tensor)",
                         "memory/states.py: state_report (zero=1, 2: ceil(N/D) per rank)"),
    "ds-zero3": CodeRef("ZeRO stage 3: parameters partitioned and fetched per sub-module", DS,
                        "deepspeed/runtime/zero/stage3.py", "DeepSpeedZeroOptimizer_Stage3",
                        "memory/states.py: fsdp_shard_numel (zero=3)"),
    "pt-fsdp2": CodeRef("FSDP2: per-tensor dim-0 shards; each fully_shard call is one unit", PT,
                        "torch/distributed/fsdp/_fully_shard/_fully_shard.py", "fully_shard, FSDPModule",
                        "runtime/parallel/fsdp.py: apply_fsdp"),
    "pt-fsdp2-group": CodeRef("FSDP2 unit: all-gather before forward/backward, reduce-scatter after backward", PT,
                              "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "FSDPParamGroup (unshard, post_backward)",
                              "comm/inventory_dp.py: dp_items (FSDP rows)"),
    "pt-fsdp2-coll": CodeRef("FSDP2's batched collectives", PT, "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py",
                             "foreach_all_gather, foreach_reduce", "memory/buffers.py: stage_overheads (fsdp_buffers)"),
    "pt-fsdp1-wrap": CodeRef("FSDP1 wrapping policies: which modules become units", PT, "torch/distributed/fsdp/wrap.py",
                             "ModuleWrapPolicy, transformer_auto_wrap_policy, size_based_auto_wrap_policy",
                             "runtime/parallel/fsdp.py: apply_fsdp (one unit per block, then the root)"),
    # ---- pipeline -----------------------------------------------------------------------------------------
    "meg-1f1b": CodeRef("1F1B schedule (warm-up p−i−1 forwards)", MEG, "megatron/core/pipeline_parallel/schedules.py",
                        "forward_backward_pipelining_without_interleaving", "pipeline/schedules.py: one_f_one_b"),
    "meg-interleaved": CodeRef("interleaved 1F1B with virtual stages", MEG, "megatron/core/pipeline_parallel/schedules.py",
                               "forward_backward_pipelining_with_interleaving", "pipeline/schedules.py: interleaved"),
    "meg-p2p": CodeRef("activations sent between stages", MEG, "megatron/core/pipeline_parallel/p2p_communication.py",
                       "send_forward_recv_backward, send_backward_recv_forward", "comm/inventory.py: layout_collectives (PP rows)"),
    "pt-pipe": CodeRef("pipeline schedules in PyTorch", PT, "torch/distributed/pipelining/schedules.py",
                       "ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble",
                       "runtime/parallel/pipeline.py: build_pipeline"),
    "pt-stage": CodeRef("one pipeline stage's module and its sends", PT, "torch/distributed/pipelining/stage.py",
                        "PipelineStage", "runtime/parallel/pipeline.py: make_chunk"),
    "ds-pipe": CodeRef("DeepSpeed's pipeline engine and its 1F1B-style train schedule", DS, "deepspeed/runtime/pipe/schedule.py",
                       "TrainSchedule, InferenceSchedule", "pipeline/simulate.py: simulate"),
    # ---- memory savers -------------------------------------------------------------------------------------
    "pt-checkpoint": CodeRef("activation checkpointing", PT, "torch/utils/checkpoint.py", "checkpoint",
                             "memory/activations.py: layer_input_bytes (full), layer_activation_bytes (selective)"),
    "pt-ckpt-wrapper": CodeRef("apply checkpointing to chosen modules", PT,
                               "torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py",
                               "apply_activation_checkpointing, CheckpointImpl", "rates/compute.py (recompute time)"),
    "meg-recompute": CodeRef("full / selective recomputation", MEG, "megatron/core/transformer/transformer_block.py",
                             "TransformerBlock._checkpointed_forward (recompute_granularity)",
                             "memory/training.py: stage_activation_bytes"),
    "meg-ckpt-fn": CodeRef("Megatron's checkpoint function (keeps the RNG state for dropout)", MEG,
                           "megatron/core/tensor_parallel/random.py", "CheckpointFunction", "memory/activations.py"),
    # ---- fine-tuning ---------------------------------------------------------------------------------------
    "peft-lora": CodeRef("LoRA: wrap the target linears, freeze the base, count trainable parameters", PEFT,
                         "src/peft/tuners/lora/model.py", "LoraModel",
                         "memory/lora.py: adapter_tensors, adapter_param_count"),
    "peft-layer": CodeRef("one adapted linear: lora_A (r × in), lora_B (out × r); Linear4bit over an NF4 base", PEFT,
                          "src/peft/tuners/lora/layer.py, src/peft/tuners/lora/bnb.py", "LoraLayer.update_layer, Linear4bit",
                          "memory/lora.py: nf4_bytes, lora_state_report"),
    # ---- precision -------------------------------------------------------------------------------------------
    "pt-autocast": CodeRef("mixed precision: run matmuls in fp16/bf16", PT, "torch/amp/autocast_mode.py", "autocast",
                           "runtime/precision.py: run_precision"),
    "pt-scaler": CodeRef("dynamic loss scaling", PT, "torch/amp/grad_scaler.py", "GradScaler",
                         "runtime/precision.py: run_precision; numerics.py: loss_scale_for"),
    "meg-scaler": CodeRef("Megatron's dynamic loss scaler", MEG, "megatron/core/optimizer/grad_scaler.py", "DynamicGradScaler",
                          "numerics.py: loss_scale_for"),
    "meg-master": CodeRef("fp32 master weights under fp16/bf16 params", MEG, "megatron/core/optimizer/optimizer.py",
                          "Float16OptimizerWithFloat16Params, MixedPrecisionOptimizer", "memory/precision.py: state_bytes"),
    "ds-scaler": CodeRef("DeepSpeed's dynamic loss scaler", DS, "deepspeed/runtime/fp16/loss_scaler.py", "DynamicLossScaler",
                         "numerics.py: loss_scale_for"),
    # ---- measuring -------------------------------------------------------------------------------------------
    "pt-timer": CodeRef("warm-up runs before the timed ones (some of PyTorch initializes lazily)", PT,
                        "torch/utils/benchmark/utils/timer.py", "Timer.timeit, Timer.blocked_autorange",
                        "runtime/train_worker.py: the step time is the median of steps 2 and later"),
}
"""Every code location a topic may cite, by id."""


def code_refs(ids: list[str]) -> list[dict]:
    """[{id, concept, project, path, symbol, shardlab}] for ``ids``."""
    from shardlab.teach.sources import lookup

    return lookup(CODE, ids, "code reference")
