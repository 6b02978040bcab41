"""What is being trained, independent of the layout (``Workload``), built from a framework profile and the
user's explicit choices, and the one memory report that estimate, plan and memory share for it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlab.comm.moe_dispatch import MoeDispatch
from shardlab.memory.overheads import Overheads
from shardlab.memory.recipe import DEFAULT as DEFAULT_RECIPE, Recipe
from shardlab.specs.model import ModelSpec


@dataclass(frozen=True)
class Workload:
    """What is being trained, independent of the layout."""

    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    precision: str = "bf16-mixed"
    """fp32, bf16-mixed, fp16-mixed or bf16."""
    optimizer: str = "adamw"
    """adamw, sgd or adam-8bit."""
    flash_attention: bool = True
    """Fused attention kernel: no s×s scores stored, causal blocks skipped."""
    dropout: bool = False
    """Dropout in the blocks (GPT-3-era training)."""
    dp_overlap: bool = True
    """Data-parallel communication overlaps compute: gradient reduction under the last backward (PyTorch
    DDP/FSDP, Megatron --overlap-grad-reduce) and ZeRO-3 gathers under the previous block (prefetch)."""
    tp_comm_overlap: bool = False
    """TP/SP collectives split into chunks pipelined with the GEMMs that consume or produce them (Megatron-Core
    ``--tp-comm-overlap`` with Transformer Engine's userbuffers; torchtitan's async TP): ``comm.pricing.tp_overlapped_s``."""
    grad_reduce_bytes: int = 0
    """Bytes per gradient element on the wire (0: the gradient dtype; Megatron-LM under bf16: 4)."""
    main_grad_bytes: int = 0
    """Bytes per gradient element held in memory (0: the gradient dtype; Megatron-LM's fp32 main_grad buffer: 4)."""
    main_grad_buffer: bool = False
    """Gradients live in one contiguous buffer the reduction buckets view: no DDP bucket copy (Megatron-LM)."""
    framework: str = "megatron-lm"
    """Id of the framework profile the mechanisms below come from (specs/framework.py)."""
    kernels: str = "fused"
    """Memory-bound kernels: 'fused', 'eager' or 'compiled' (rates/kernels.py derives their bytes)."""
    fused_loss: bool = False
    """The loss works in place on the logits (framework profile, or the run's own loss kernel)."""
    attention_kernel: str = "flash2"
    """'flash2' (FlashAttention-2) or 'native' (the generation's own kernel: FlashAttention-3 / cuDNN on Hopper)."""
    zero3_prefetch: bool = True
    """ZeRO-3/FSDP gathers the next unit while the current one computes."""
    zero3_regather_for_recompute: bool = False
    """Full recomputation gathers each unit's weights once more (DeepSpeed ZeRO-3)."""
    zero3_comm_per_gpu_nic: bool = False
    """ZeRO-3 traffic crosses each rank's own NIC without node aggregation (DeepSpeed ZeRO-3 of 2021)."""
    zero3_live_params: float = 0.0
    """Module-wise ZeRO-3 (DeepSpeed): gathered parameters kept at once (0: whole FSDP units)."""
    zero3_reduce_bucket_params: float = 0.0
    """Module-wise ZeRO-3: gradient elements held for the reduce-scatter."""
    layer_host_s: float = 0.0
    """Host time per block and pass the GPU waits for, seconds."""
    layer_host_min_zero: int = 0
    """Lowest ZeRO stage at which layer_host_s applies (``Framework.layer_host_min_zero``)."""
    step_overhead_s: float = 0.0
    """Host time per step the GPUs wait for, seconds."""
    pipeline_host_s: float = 0.0
    """Host time per micro-batch, per pass and pipeline stage the GPU waits for (a pipeline engine's instructions), s."""
    recipe: Recipe = DEFAULT_RECIPE
    """Offload, LoRA/QLoRA and FP8 details (``memory/recipe.py``; time terms in ``estimate/recipe_terms.py``)."""
    moe: MoeDispatch = MoeDispatch()
    """A MoE model's token dispatcher, all-to-all overlap and routing imbalance (``comm/moe_dispatch.py``)."""

    @property
    def fp8_params(self) -> bool:
        """FP8 primary weights in effect: fp8-mixed with ``Fp8Recipe.primary_weights``, on a model trained whole
        (a LoRA base keeps its own bytes)."""
        return self.precision == "fp8-mixed" and self.recipe.fp8.primary_weights and self.recipe.lora is None

    @property
    def attention_label(self) -> str:
        """The attention the estimate priced: the fused kernel's name, or 'unfused' (QKᵀ and PV as batched GEMMs with
        a materialised softmax) when flash attention is off."""
        return self.attention_kernel if self.flash_attention else "unfused"


def workload_for(framework, *, seq_len: int, global_batch: int, precision: str = "bf16-mixed", optimizer: str = "adamw",
                 flash_attention: bool = True, dropout: bool = False, dp_overlap: bool | None = None,
                 grad_reduce_bytes: int | None = None, compile: bool | None = None,
                 attention_kernel: str | None = None, fused_loss: bool | None = None, recipe=None,
                 tp_comm_overlap: bool = False, moe: MoeDispatch | None = None) -> Workload:
    """A Workload whose mechanisms come from ``framework`` (a Framework profile), with the user's explicit choices
    (not None) overriding the matching mechanism."""
    from shardlab.specs.framework import effective_grad_bytes

    fw = framework
    wire, held = effective_grad_bytes(fw, precision, grad_reduce_bytes)
    return Workload(seq_len=seq_len, global_batch=global_batch, precision=precision, optimizer=optimizer,
                    flash_attention=flash_attention, dropout=dropout,
                    dp_overlap=fw.dp_overlap if dp_overlap is None else dp_overlap, tp_comm_overlap=bool(tp_comm_overlap),
                    grad_reduce_bytes=wire, main_grad_bytes=held, main_grad_buffer=fw.main_grad_buffer,
                    framework=fw.id, kernels=fw.kernels_for(compile),
                    attention_kernel=attention_kernel or fw.attention_kernel,
                    fused_loss=fw.fused_loss if fused_loss is None else fused_loss, zero3_prefetch=fw.zero3_prefetch,
                    zero3_regather_for_recompute=fw.zero3_regather_for_recompute,
                    zero3_comm_per_gpu_nic=fw.zero3_comm_per_gpu_nic,
                    zero3_live_params=fw.zero3_live_params, zero3_reduce_bucket_params=fw.zero3_reduce_bucket_params,
                    layer_host_s=fw.layer_host_s, layer_host_min_zero=fw.layer_host_min_zero,
                    step_overhead_s=fw.step_overhead_s,
                    pipeline_host_s=fw.pipeline_host_s,
                    **({"recipe": recipe} if recipe is not None else {}), **({"moe": moe} if moe is not None else {}))


def workload_overheads(wl, ov: Overheads) -> Overheads:
    """The memory overheads with the framework's buffer mechanisms (none when overheads are switched off): no DDP
    bucket copy nor ZeRO-1 bucket beside a main-grad buffer, and module-wise ZeRO-3 buffers.
    ``wl``: a Workload or a Framework profile (both carry these fields)."""
    if getattr(wl, "main_grad_buffer", False):
        # the reduction buckets are views of the buffer, and the distributed optimizer reduce-scatters in place into the
        # rank's shard of it (megatron/core/distributed/param_and_grad_buffer.py): no bucket copy, no ZeRO-1 bucket
        ov = replace(ov, ddp_bucket_copy=False, zero_bucket_layers=0.0)
    if not ov.fsdp_prefetch_units or not wl.zero3_live_params:
        return ov
    return replace(ov, zero3_live_params=wl.zero3_live_params, zero3_reduce_bucket_params=wl.zero3_reduce_bucket_params)


def workload_memory(layout, spec: ModelSpec, accelerator, wl: Workload, microbatches: int,
                    overheads: Overheads = Overheads()):
    """``training_memory`` of ``layout`` under the workload's settings and framework mechanisms (fused loss,
    compiled activations, module-wise ZeRO-3 buffers): the one memory report estimate, plan and memory share."""
    from shardlab.comm.moe_dispatch import overlap_applies
    from shardlab.memory.training import training_memory

    moe = spec.moe is not None
    return training_memory(layout, model=spec, accelerator=accelerator, seq_len=wl.seq_len, precision=wl.precision,
                           optimizer=wl.optimizer, microbatches=microbatches, overheads=workload_overheads(wl, overheads),
                           flash_attention=wl.flash_attention, dropout=wl.dropout, fused_loss=wl.fused_loss,
                           recipe=wl.recipe, compiled=wl.kernels == "compiled", grad_bytes=wl.main_grad_bytes,
                           expert_imbalance=wl.moe.expert_imbalance if moe else 1.0,
                           ep_overlap=moe and overlap_applies(wl, layout))
