"""Where a rank's parameter sits in the full tensor: its global shape and the offset of its local block.

DTensor parameters (the DTensor TP plan, FSDP2) carry their placements, so the region is computed from them
(``compute_local_shape_and_global_offset``); the hand-written layers (Megatron TP, expert parallelism) mark theirs
with :func:`mark_region` when they cut the full tensor. A plain unmarked parameter is the whole tensor. A checkpoint
loader reads exactly this region from the file (``runtime.checkpoint.load``).
"""

from __future__ import annotations

ATTR = "_shardlab_region"


def mark_region(param, global_shape, offset):
    """Record that ``param`` is the block of a ``global_shape`` tensor starting at ``offset`` (one int per dim)."""
    setattr(param, ATTR, (tuple(int(d) for d in global_shape), tuple(int(o) for o in offset)))
    return param


def remember(module) -> None:
    """Copy the marks of ``module``'s own parameters onto the module: ``Module.to_empty`` (meta-device initialisation:
    build and cut on meta, then allocate only the shards) replaces the parameter objects and their attributes."""
    module._shardlab_regions = {n: getattr(p, ATTR) for n, p in module.named_parameters(recurse=False)
                                if hasattr(p, ATTR)}


def region(param, remembered=None) -> tuple[tuple[int, ...], tuple[int, ...], object]:
    """(global shape, offset of the local block, the local tensor to write); ``remembered``: the owning module's
    record of this parameter (``remember``)."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local = param.to_local()
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        if tuple(shape) != tuple(local.shape):
            raise RuntimeError(f"local shard {tuple(local.shape)} differs from its placement's {tuple(shape)}")
        return tuple(param.shape), tuple(int(o) for o in offset), local
    marked = getattr(param, ATTR, None) or remembered
    if marked is not None:
        return marked[0], marked[1], param
    return tuple(param.shape), (0,) * param.dim(), param
