"""The rank grid of a layout: each rank's coordinates (tp fastest, then cp, dp, pp: Megatron-LM's order; ep inside
dp), the groups along an axis, and how many nodes a group spans (the link its collectives use)."""

from __future__ import annotations

from shardlab.errors import ShardlabError
from shardlab.layout import AXES, Layout


def axis_sizes(layout: Layout) -> dict[str, int]:
    return {"tp": layout.tp, "cp": layout.cp, "dp": layout.dp, "pp": layout.pp}


def axis_stride(layout: Layout, axis: str) -> int:
    """Rank distance between neighbours along ``axis`` (ep uses the dp stride; with the experts split over fewer ranks
    than TP, ``layout.expert_grid``'s: etp)."""
    if axis == "ep" and layout.expert_tp < layout.tp:
        return layout.expert_tp
    sizes = axis_sizes(layout)
    axis = "dp" if axis == "ep" else axis
    stride = 1
    for a in AXES:
        if a == axis:
            return stride
        stride *= sizes[a]
    raise ShardlabError(f"unknown axis '{axis}'; axes are {', '.join(AXES)} and ep")


def rank_coords(rank: int, layout: Layout) -> dict[str, int]:
    """Coordinates of ``rank`` on each axis (tp fastest); includes ep (position inside the EP group)."""
    if not 0 <= rank < layout.world_size:
        raise ShardlabError(f"rank {rank} is outside the world of {layout.world_size} ranks")
    out, r = {}, rank
    for a in AXES:
        n = axis_sizes(layout)[a]
        out[a] = r % n
        r //= n
    out["ep"] = out["dp"] % layout.ep
    if layout.expert_tp < layout.tp:       # the expert grid etp, ep, edp over the stage's ranks (layout.expert_grid)
        out["ep"] = (rank % (layout.tp * layout.cp * layout.dp)) // layout.expert_tp % layout.ep
    return out


def coords_rank(coords: dict[str, int], layout: Layout) -> int:
    """Inverse of rank_coords (ep is ignored: it is derived from dp)."""
    return sum(coords[a] * axis_stride(layout, a) for a in AXES)


def group_ranks(layout: Layout, axis: str, rank: int = 0) -> list[int]:
    """The ranks of ``rank``'s group along ``axis`` (tp, cp, dp, pp, ep, or dp_shard = dp × cp)."""
    c = rank_coords(rank, layout)
    if axis == "ep" and layout.expert_tp < layout.tp:
        first = rank - c["ep"] * layout.expert_tp
        return [first + i * layout.expert_tp for i in range(layout.ep)]
    if axis == "ep":
        start = c["dp"] - c["ep"]
        return [coords_rank({**c, "dp": start + i}, layout) for i in range(layout.ep)]
    if axis == "dp_shard":
        return sorted(coords_rank({**c, "dp": d, "cp": k}, layout) for d in range(layout.dp) for k in range(layout.cp))
    n = axis_sizes(layout)[axis] if axis in AXES else None
    if n is None:
        raise ShardlabError(f"unknown axis '{axis}'; axes are {', '.join(AXES)}, ep and dp_shard")
    return [coords_rank({**c, axis: i}, layout) for i in range(n)]


def all_groups(layout: Layout, axis: str) -> list[list[int]]:
    """Every group along ``axis`` (each rank appears in exactly one)."""
    seen, groups = set(), []
    for r in range(layout.world_size):
        if r not in seen:
            g = group_ranks(layout, axis, r)
            seen.update(g)
            groups.append(g)
    return groups


def group_nodes(layout: Layout, axis: str, gpus_per_node: int, rank: int = 0) -> int:
    """How many nodes the group of ``rank`` along ``axis`` spans (1 = stays inside one node)."""
    return len({r // gpus_per_node for r in group_ranks(layout, axis, rank)})


def group_span_nodes(layout: Layout, axis: str, gpus_per_node: int) -> int:
    """Nodes spanned by an ``axis`` group, computed from strides without listing ranks (any world size).

    Groups are regular: members are ``stride`` apart. When stride·size fits in a node (and nodes hold
    a multiple of it) the group stays inside one node; otherwise it spans
    ceil(size / members-per-node) nodes. When a node's GPU count is not a multiple of the group's extent (6 GPUs
    per node and groups of 4), groups straddle nodes: the widest group is found from the groups' first ranks (one
    per group, no rank lists), never more nodes than the job has.
    """
    size = {"ep": layout.ep, "dp_shard": layout.dp_shard}.get(axis) or axis_sizes(layout)[axis]
    stride = layout.tp if axis == "dp_shard" else axis_stride(layout, axis)
    if size == 1:
        return 1
    nodes = -(-layout.world_size // gpus_per_node)
    if stride >= gpus_per_node:                     # consecutive members at least a node apart
        return min(size, nodes)
    extent = stride * size
    if gpus_per_node % extent == 0 or (extent % gpus_per_node == 0 and gpus_per_node % stride == 0):
        return -(-size // max(1, gpus_per_node // stride))     # aligned: every group spans the same nodes
    span_ranks = (size - 1) * stride
    widest = max((b + span_ranks) // gpus_per_node - b // gpus_per_node + 1
                 for hi in range(0, layout.world_size, extent) for b in range(hi, hi + stride))
    return min(widest, nodes)
