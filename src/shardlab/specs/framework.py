"""Training frameworks as data: the physical mechanisms that make the same layout run at different speeds.

A profile holds only mechanisms, each with its source (catalog/data/frameworks.yaml): how memory-bound kernels
are fused, what overlaps with what, the dtype collectives carry, how ZeRO-3/FSDP gathers weights, and the host
time a step spends outside the GPU's queue. The estimate reads a profile; a user flag (``--no-dp-overlap``,
``--grad-reduce-fp32``, ``--compile``) overrides the matching mechanism for one estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import field_name

KERNELS = ("fused", "eager", "compiled")
BF16_BASED = ("bf16-mixed", "fp8-mixed")
"""Mixed precisions whose working weights are bf16 (FP8 GEMMs keep bf16 weights and gradients)."""
MIXED = ("bf16-mixed", "fp16-mixed", "fp8-mixed")
"""Precisions with separate low-precision gradients and fp32 master weights."""


def effective_grad_bytes(fw, precision: str, explicit: int | None = None) -> tuple[int, int]:
    """(bytes per gradient element on the wire, bytes per gradient element held in memory); 0 means the gradient
    dtype. ``fw``: a Framework profile; ``explicit``: the user's --grad-reduce-fp32/-bf16 (4 or 2), None for the default.

    A framework with a main-grad buffer (Megatron-LM) reduces and holds gradients in one dtype: fp32 under bf16 mixed
    precision by default (megatron/training/arguments.py: ``--bf16`` sets accumulate_allreduce_grads_in_fp32, undone by
    ``--grad-reduce-in-bf16``; docs/source/api-guide/distributed_optimizer: "bf16 param, fp32 grads", 18 bytes per
    parameter, 6 + 12/d with the distributed optimizer), the gradient dtype otherwise."""
    if not getattr(fw, "main_grad_buffer", False):
        return (fw.grad_reduce_bytes if explicit is None else explicit), 0
    wire = explicit if explicit is not None else 4 if precision in BF16_BASED else fw.grad_reduce_bytes
    return wire, (wire if precision in MIXED else 0)


@dataclass(frozen=True)
class Framework:
    """One training framework's mechanisms."""

    id: str
    """Catalog id (megatron-lm, deepspeed, pytorch-fsdp, torchtitan)."""
    name: str
    """Readable name and the versions the profile describes."""
    kernels: str
    """Memory-bound kernels of a block: 'fused' (hand-written fused kernels: Megatron-LM's fused LayerNorm,
    bias-GeLU, bias-dropout-add and scale-mask-softmax), 'eager' (one kernel per PyTorch operator) or 'compiled'
    (torch.compile/Inductor fuses each elementwise chain into one kernel). ``estimate.kernels`` derives the
    bytes each level moves."""
    attention_kernel: str
    """Attention kernel: 'flash2' (FlashAttention-2, Dao 2023) or 'native' (the GPU generation's own kernel where it has
    one: FlashAttention-3 (Shah et al. 2024) or cuDNN's fused attention on Hopper)."""
    fused_loss: bool
    """The cross-entropy kernel works in place on the logits (Megatron-Core --cross-entropy-loss-fusion, flash-attn's
    cross_entropy): no fp32 copy and saved log-softmax of the logits, in memory and in HBM traffic."""
    compiles: bool
    """The framework can compile the model (torch.compile): ``--compile`` switches eager kernels to compiled."""
    dp_overlap: bool
    """Gradient reduction runs under the backward (bucketed DDP, FSDP's per-unit reduce-scatter, Megatron
    --overlap-grad-reduce, DeepSpeed overlap_comm)."""
    zero3_prefetch: bool
    """ZeRO-3/FSDP issues the next unit's all-gather while the current unit computes (FSDP backward_prefetch,
    FSDP2's implicit prefetch, DeepSpeed's prefetch bucket)."""
    zero3_regather_for_recompute: bool
    """Under full recomputation the weights are gathered once more for the re-run forward (DeepSpeed ZeRO-3
    releases them after each module's forward); FSDP recomputes inside the unit's backward, after its one gather."""
    zero3_comm_per_gpu_nic: bool
    """ZeRO-3 collectives move each rank's whole share through its own inter-node NIC (no aggregation of a
    node's NICs across its GPUs' traffic). A switch the fit chooses (validation.fit.SWITCHES; prior false, NCCL's
    rings over the node's NICs): true for DeepSpeed, where only the 2021 ZeRO-3 runs inform it (docs/validation.md)."""
    zero3_live_params: float
    """ZeRO-3 gathers module by module and keeps at most this many parameters gathered (at least the largest module):
    DeepSpeed stage3_max_live_parameters. 0: whole wrap units, the current and the prefetched one (FSDP)."""
    zero3_reduce_bucket_params: float
    """With module-wise ZeRO-3: gradient elements held for the reduce-scatter (DeepSpeed reduce_bucket_size)."""
    grad_reduce_bytes: int
    """Bytes per gradient element on the wire; 0 = the gradient dtype (fp32 reduction = 4)."""
    layer_host_s: float
    """Host time per block and pass (forward, recomputed forward, backward) that the GPU waits for, seconds: hooks
    and Python work the host cannot run ahead of the GPU (e.g. a synchronising activation-checkpoint boundary)."""
    step_overhead_s: float
    """Host time per optimizer step the GPU waits for (optimizer launch, gradient-norm sync, logging), seconds."""
    schedules: tuple[str, ...]
    """Pipeline schedules it runs (shardlab names: gpipe, 1f1b, interleaved, zb-h1); empty: no pipeline parallelism."""
    axes: tuple[str, ...]
    """Model-parallel axes it runs besides data parallelism: tp (with sp), cp, ep."""
    zero_stages: tuple[int, ...]
    """ZeRO stages it has (0 = plain data parallelism; FSDP FULL_SHARD = 3, SHARD_GRAD_OP = 2)."""
    hybrid_sharding: bool
    """It shards inside a node and replicates across nodes (FSDP HYBRID_SHARD, torchtitan's data_parallel_replicate_degree,
    DeepSpeed ZeRO++ hpZ / MiCS, Megatron's --num-distributed-optimizer-instances)."""
    pipeline_max_zero: int
    """Highest ZeRO stage it combines with pipeline parallelism (DeepSpeed's pipeline engine: ZeRO-1; FSDP2 + PP: 3)."""
    source: str
    """Where each mechanism comes from (documentation, source files, papers)."""
    notes: str = ""
    """Versions covered and caveats."""
    main_grad_buffer: bool = False
    """Gradients accumulate into one contiguous buffer that the reduction buckets view, so no bucket copy exists, held
    in the reduction dtype; under bf16 (and FP8-on-bf16) mixed precision that dtype is fp32 unless the user asks for
    bf16 reduction (Megatron-Core DistributedDataParallel's main_grad buffer; ``effective_grad_bytes``)."""
    pipeline_host_s: float = 0.0
    """Host time per micro-batch, pass (forward, backward) and pipeline stage that the GPU waits for, seconds: a
    pipeline engine that interprets its schedule instruction by instruction in Python with blocking point-to-point
    handshakes (DeepSpeed's PipelineEngine). 0 where the schedule is issued ahead of the GPU."""
    layer_host_min_zero: int = 0
    """Lowest ZeRO stage at which ``layer_host_s`` stalls the GPU: 3 where the stalling host work is FSDP's per-unit
    hooks around the all-gather of a unit resharded every micro-batch (unshard with its CPU-side wait, reshard,
    copy-in/copy-out, the reduce-scatter hook), which the step model prices at ZeRO-3 only (at ZeRO-2 it keeps the
    weights resident between micro-batches); below it the host's work is queued ahead of the GPU. 0: at every stage
    (DeepSpeed's activation checkpointing synchronises per module whatever the stage)."""
    ddp_one_dimensional: bool = False
    """Its plain data parallelism (ZeRO-0) runs on a one-dimensional mesh only: with dp > 1 it does not combine with
    TP, PP or CP (torchtitan's apply_ddp: 'DDP has not supported > 1D parallelism'), and CP needs sharding (torchtitan
    applies FSDP over the data-parallel and context-parallel ranks together)."""
    moe_tp_needs_sp: bool = False
    """It trains mixture-of-experts layers under tensor parallelism only with sequence parallelism (Megatron-Core's
    MoELayer.forward raises otherwise: its token dispatcher expects each TP rank's sequence shard)."""
    expert_tp: str = "tp"
    """The routed experts' tensor-parallel degrees it runs (``Layout.etp``): 'tp', only the attention's; 'one', that
    or 1, experts whole with the expert group carved from the TP and data-parallel ranks (torchtitan's
    expert_tensor_parallel_degree); 'divisor', any divisor of tp (Megatron-Core's --expert-tensor-parallel-size)."""

    def refusal(self, layout, spec=None) -> str | None:
        """Why this framework cannot run ``layout`` (of ``spec``, when given) (one line naming the fix), or None."""
        if layout.pp > 1 and not self.schedules:
            return (f"{self.id} has no pipeline parallelism; use {field_name('layout.pp')} 1 or a framework that has it "
                    "(megatron-lm, torchtitan)")
        if layout.pp > 1 and layout.schedule not in self.schedules:
            return (f"{self.id} does not run the {layout.schedule} pipeline schedule; use "
                    f"{field_name('layout.schedule')} {' or '.join(self.schedules)}")
        for axis, deg in (("tp", layout.tp), ("cp", layout.cp), ("ep", layout.ep)):
            if deg > 1 and axis not in self.axes:
                return (f"{self.id} has no {axis.upper()} parallelism; use {field_name('layout.' + axis)} 1 or another "
                        f"{field_name('framework.name')}")
        if layout.dp_replicate > 1 and not self.hybrid_sharding:
            return (f"{self.id} has no hybrid sharding; drop {field_name('layout.dp_replicate')} or choose another "
                    f"{field_name('framework.name')}")
        if layout.zero not in self.zero_stages:
            return (f"{self.id} has no ZeRO stage {layout.zero}; use {field_name('layout.zero')} "
                    f"{' or '.join(map(str, self.zero_stages))}")
        if layout.pp > 1 and layout.zero > self.pipeline_max_zero:
            return (f"{self.id} does not combine ZeRO-{layout.zero} with pipeline parallelism; use "
                    f"{field_name('layout.zero')} "
                    f"{self.pipeline_max_zero} or less with {field_name('layout.pp')} {layout.pp}")
        if self.ddp_one_dimensional and layout.zero == 0 and (layout.cp > 1 or (
                layout.dp > 1 and max(layout.tp, layout.pp) > 1)):
            return (f"{self.id}'s data parallelism without sharding (ZeRO-0) is one-dimensional: with "
                    f"{field_name('layout.dp')} > 1 it does not combine with TP or PP, and CP needs sharding; use "
                    f"{field_name('layout.zero')} 2 or 3")
        etp = getattr(layout, "etp", 0)
        if etp and etp != layout.tp and self.expert_tp == "one" and layout.ep == 1:
            return (f"{self.id} splits the experts like the attention without expert parallelism (its expert TP applies "
                    f"only with {field_name('layout.ep')} > 1); drop {field_name('layout.etp')} or add EP")
        if etp and etp != layout.tp and not (self.expert_tp == "divisor" or (self.expert_tp == "one" and etp == 1)):
            return (f"{self.id} splits the experts like the attention"
                    + (" or runs them whole (expert TP 1)" if self.expert_tp == "one" else "")
                    + f"; use {field_name('layout.etp')} " + ("1 or " if self.expert_tp == "one" else "")
                    + f"{layout.tp} (the TP degree), or another {field_name('framework.name')}")
        if self.moe_tp_needs_sp and spec is not None and spec.moe is not None and layout.tp > 1 \
                and not layout.sequence_parallel:
            return (f"{self.id} trains mixture-of-experts layers under tensor parallelism only with sequence "
                    f"parallelism; add {field_name('layout.sequence_parallel')}")
        return None

    def kernels_for(self, compile: bool | None) -> str:
        """The kernel level when the user asks for compilation (None: the framework's default)."""
        if compile and self.compiles and self.kernels == "eager":
            return "compiled"
        if compile is False and self.kernels == "compiled":
            return "eager"
        return self.kernels
