"""The memory estimators usually forget, each named, with a documented and configurable default.

Users of other estimators report predictions several times below what they observe; most of the gap is
here. Defaults marked "estimate" are typical values, not measurements of your system: override them
with ``--overheads FILE`` (YAML with any of the fields below), or measure them with ``shardlab run``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from shardlab.errors import ShardlabError

MiB = 2**20

MEMORY_MARGIN = 0.05
"""Share of each GPU's memory a plan leaves free by default (``plan --max-memory-fraction``, default 1 − this).
The estimate counts 10% of the dynamic memory as allocator fragmentation (``Overheads.fragmentation``); measured
fragmentation of PyTorch's caching allocator is larger on LLM training: GMLake (Guo et al., ASPLOS 2024, A100-80GB,
eight LLM fine-tuning workloads) removed 15% of it on average and up to 33%. The margin keeps 5% of the GPU for
that rest and for what no estimate sees (a framework's extra workspace, a longer sample). vLLM keeps 10% by default
for serving (``gpu_memory_utilization`` 0.9). ``--max-memory-fraction 1`` turns the margin off."""


def margin_note(used_bytes: float, capacity_bytes: float) -> str | None:
    """A sentence when a layout fits but uses more than the share a plan allows by default, else None."""
    share = used_bytes / capacity_bytes if capacity_bytes else 0.0
    if not 1.0 - MEMORY_MARGIN < share <= 1.0:
        return None
    return (f"{100 * (1 - share):.1f}% of GPU memory left, under the {100 * MEMORY_MARGIN:g}% a plan keeps free by "
            "default for allocator fragmentation the estimate does not count (GMLake, ASPLOS 2024): a real run may "
            "run out of memory")


@dataclass(frozen=True)
class Overheads:
    """Per-process memory outside model states and layer activations."""

    cuda_context_bytes: int = 512 * MiB
    """CUDA context, kernels and module images loaded by the framework. Estimate: 300-600 MiB is commonly
    reported per process with CUDA 12 lazy loading (nvidia-smi minus torch.cuda.memory_reserved)."""
    library_workspace_bytes: int = 64 * MiB
    """cuBLAS/cuBLASLt and attention-kernel workspaces. PyTorch's default cuBLAS workspace is 32 MiB per
    handle on Hopper (CUBLAS_WORKSPACE_CONFIG); doubled for cuBLASLt and flash-attention scratch (estimate)."""
    nccl_bytes_per_group: int = 256 * MiB
    """NCCL buffers per communicator this rank belongs to (groups of size > 1). Estimate: NCCL_BUFFSIZE
    (4 MiB, NCCL docs) × 2 ring neighbours × up to 32 channels."""
    ddp_bucket_copy: bool = True
    """PyTorch DDP keeps gradient buckets beside the .grad tensors unless gradient_as_bucket_view=True
    (torch.nn.parallel.DistributedDataParallel docs), doubling gradient memory under ZeRO-0."""
    zero_bucket_layers: float = 1.0
    """ZeRO-1/2 reduce-scatter / all-gather bucket, in units of one layer's gradients (estimate; DeepSpeed's
    reduce_bucket_size default of 5e8 elements is larger)."""
    fsdp_prefetch_units: int = 2
    """ZeRO-3/FSDP: unsharded parameter units alive at once (the current one and the prefetched next;
    FSDP2 default forward/backward prefetch of one unit)."""
    fsdp_reduce_scatter_units: int = 1
    """ZeRO-3/FSDP: unsharded gradient units alive at once while being reduce-scattered (FSDP2: one)."""
    zero3_live_params: float = 0.0
    """ZeRO-3 that gathers module by module (DeepSpeed): parameters kept gathered at once, at least the largest
    module (DeepSpeed stage3_max_live_parameters, default 1e9: deepspeed/runtime/zero/config.py). 0: whole wrap units
    (FSDP). Set from the framework profile."""
    zero3_reduce_bucket_params: float = 0.0
    """With ``zero3_live_params``: gradient elements held for the reduce-scatter, at least the largest module's
    (DeepSpeed reduce_bucket_size, default 5e8). Set from the framework profile."""
    working_buffers: bool = True
    """The logits and loss of the last stage, and communication staging buffers (pipeline sends, sequence-parallel
    gathers, ring-attention K/V blocks, expert all-to-all): real memory outside the layer activations, counted here
    so that --no-overheads reports model states and layer activations only."""
    fragmentation: float = 0.10
    """Caching-allocator fragmentation as a share of the dynamic memory (activations, logits, communication
    buffers). Estimate: 5-15% is typical for PyTorch's caching allocator without expandable segments."""

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


NONE = Overheads(cuda_context_bytes=0, library_workspace_bytes=0, nccl_bytes_per_group=0, ddp_bucket_copy=False,
                 zero_bucket_layers=0.0, fsdp_prefetch_units=0, fsdp_reduce_scatter_units=0,
                 working_buffers=False, fragmentation=0.0)
"""No overheads: model states and activations only, as most other estimators report."""


def load_overheads(path: str | None, disabled: bool = False) -> Overheads:
    """Defaults, or NONE, or the defaults with fields from a YAML file (strictly checked)."""
    if disabled:
        return NONE
    if not path:
        return Overheads()
    from shardlab.catalog import load_yaml

    from shardlab.limits import MAX_BYTES
    from shardlab.numbers import check_number

    data = load_yaml(path, "overheads file")
    allowed = {f.name: f.type for f in fields(Overheads)}
    if not isinstance(data, dict) or set(data) - set(allowed):
        raise ShardlabError(f"{path}: an overheads file maps fields {sorted(allowed)} to values")
    for k, v in data.items():
        if isinstance(v, bool) != (k in ("ddp_bucket_copy", "working_buffers")):
            raise ShardlabError(f"{path}: overhead '{k}' must be a non-negative number (ddp_bucket_copy, working_buffers: "
                                f"true/false), got {v!r}")
        if not isinstance(v, bool):
            whole = k.endswith(("_bytes", "_per_group", "_units"))
            check_number(v, f"{path}: overhead '{k}'", integer=whole, allow_min=True,
                         maximum=MAX_BYTES if whole else (1.0 if k == "fragmentation" else 1e6))
    return replace(Overheads(), **data)
