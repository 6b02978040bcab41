"""The rows of the communication inventory (``comm.inventory``): one collective kind per row, priced on the link its
group crosses as the step model prices it (``comm.pricing``, ``comm.collectives``)."""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.comm.collectives import collective_time
from shardlab.layout import Layout
from shardlab.specs.hardware import Cluster

DDP_BUCKET_BYTES = 25 * 2**20
"""Gradient bucket size: PyTorch DDP's default ``bucket_cap_mb=25`` (MiB)."""


@dataclass(frozen=True)
class CommItem:
    """One kind of collective a training step issues (as seen by the busiest rank)."""

    axis: str
    """Parallel axis: TP, SP, CP, PP, DP, ZeRO (FSDP for stage 3) or EP."""
    op: str
    """Collective: all-reduce, reduce-scatter, all-gather, all-to-all, send-recv."""
    phase: str
    """When it runs: forward, backward or step (after backward, before/with the optimizer)."""
    bytes_per_call: int
    """S of one call (nccl-tests convention: full buffer; all-to-all: what one rank sends)."""
    calls_per_step: int
    """Calls per optimizer step on one rank."""
    group_size: int
    """Ranks in the group."""
    link_id: str
    """The slowest link the group crosses (inter-node link when it spans nodes)."""
    nodes_spanned: int
    """Nodes the group spans (> 1: the inter-node link, ``_price``)."""
    time_per_call_s: float
    """α–β time of one call (``collective_time``, rings as the step model prices them); gradient buckets: the
    stream's time ÷ its calls (``dp_stream_s``)."""
    time_per_step_s: float
    """time_per_call_s × calls_per_step: per group, the step model's total for the same calls (``comm.exposure``)."""
    overlap: str
    """'critical' (compute waits for it) or 'overlappable' (can hide behind compute)."""
    note: str = ""
    """What it is and where it comes from."""
    regime: str = ""
    """latency or bandwidth (of one call)."""
    risk: str = ""
    """What could go wrong (crosses nodes on the critical path, latency-bound, ...); empty when none."""


def price(op: str, size: float, n: int, span: int, cluster: Cluster, per_gpu_nic: bool = False):
    """collective_time on the link a group of ``n`` ranks spanning ``span`` nodes crosses.

    Inside a node: the intra-node link. Across nodes, all-reduce / reduce-scatter / all-gather / broadcast run as
    NCCL's rings over all n ranks (its ring algorithm has no node-level hierarchy): every hop carries (n−1)/n of
    the buffer, and the n/span members in a node leave it through their own NICs in parallel channels, so the bus
    bandwidth is min(intra-node, n/span × one NIC) (``rates.hardware.group_link``, the step model's pricing;
    ``per_gpu_nic``: one NIC). All-to-all is a pairwise exchange (hierarchical phases: each peer's share on the link
    that reaches it); send/recv crosses one link."""
    import dataclasses

    from shardlab.rates.hardware import across_nodes_bytes_per_s

    link = cluster.inter_link if span > 1 else cluster.intra_link
    if span > 1 and op in ("all-reduce", "reduce-scatter", "all-gather", "broadcast"):
        beta = float(across_nodes_bytes_per_s(cluster, max(1, n // span), per_gpu_nic))
        ring_link = dataclasses.replace(link, bandwidth_gbps=beta / (link.efficiency * 1e9))
        return collective_time(op, size, n, ring_link, "ring"), link
    hier = span > 1 and n % span == 0 and n // span > 1
    # rings, as the step model prices every collective (comm.pricing): one pricing for comm plan and estimate
    return collective_time(op, size, n, link, "ring", nodes=span if hier else 1,
                           intra_link=cluster.intra_link if hier else None), link


def item(axis, op, phase, size, calls, n, span, cluster, overlap, note, per_gpu_nic: bool = False,
          total_s: float | None = None) -> CommItem:
    """One inventory row; ``total_s`` gives the calls' time per step where the step model prices them as one stream
    (gradient buckets: ``dp_stream_s``), else calls × the α–β time of one."""
    cost, link = price(op, size, n, span, cluster, per_gpu_nic)
    risk = []
    if overlap == "critical" and span > 1 and axis in ("TP", "SP"):
        risk.append(f"{axis} group crosses nodes on {link.id}: keep tp ≤ GPUs per node")
    elif overlap == "critical" and span > 1:
        risk.append(f"on the critical path over {link.id}")
    if cost.regime == "latency" and calls >= 100:
        risk.append("latency-bound: many small messages")
    per_step = cost.time_s * calls if total_s is None else float(total_s)
    return CommItem(axis, op, phase, int(size), int(calls), n, link.id, span, per_step / max(int(calls), 1), per_step,
                    overlap, note, cost.regime, "; ".join(risk))


def dp_stream_s(cluster: Cluster, layout: Layout, op: str, group: str, nbytes: float) -> float:
    """One step's ``op`` of ``nbytes`` over the dense or expert data-parallel group, priced as the step model prices it
    (``comm.pricing.dp_coefficients``): the buckets run back to back as one α–β stream (latency once: NCCL
    pipelines a communicator's consecutive calls; the estimate's validation against published runs uses this
    pricing). 'replica-all-reduce': HSDP's replicas all-reduce the gradient shard (``nbytes``: the unsharded local
    gradient)."""
    from shardlab.comm.pricing import dp_coefficients

    lat, per_byte = dp_coefficients(cluster, tp=layout.tp, cp=layout.cp, dp=layout.dp, ep=layout.ep,
                                    rep=layout.dp_replicate, etp=layout.etp)[(op, group)]
    return float(lat + per_byte * nbytes) if nbytes else 0.0


def grad_wire_bytes(framework, precision: str, explicit: int | None = None) -> int:
    """Bytes per gradient element the reductions carry: an estimate's Workload states it; a Framework profile gives its
    default for ``precision`` (``specs.framework.effective_grad_bytes``) unless the user chose (``explicit``: 4 or 2);
    0: the gradient dtype."""
    from shardlab.specs.framework import effective_grad_bytes

    if framework is None:
        return explicit or 0
    if hasattr(framework, "main_grad_bytes"):      # a Workload: the user's flags are already applied
        return framework.grad_reduce_bytes
    return effective_grad_bytes(framework, precision, explicit)[0]
