"""Achieved rates: matmul efficiency vs matrix size, attention kernels, memory-bound throughput, group bandwidth.

- Matmul: eff(n) = max_fraction · n / (n + half_size) of the dense peak, n = min(M, N, K), the smallest
  dimension of the GEMM (a saturating curve: small TP shards and narrow heads run further from peak).
- Attention (FlashAttention-class fused kernels): the model's attention FLOPs at a share of the dense peak.
- Memory-bound kernels (norms, activations, residuals, the optimizer) stream at a share of the HBM bandwidth.
Each accelerator carries these three from its generation's entry in catalog/data/efficiencies.yaml (fitted to
published runs, docs/validation.md) or from a calibration profile (``shardlab calibrate``); an accelerator with
neither uses the DEFAULT_* values below and the estimate says so.
- A collective's group of ``size`` ranks, ``stride`` apart in the rank grid: inside one node it runs on
  the intra-node link; across nodes NCCL runs one ring per rail, so k members per node share the node
  boundary over k NICs and the bus bandwidth is min(intra, k × per-GPU inter-node bandwidth)
  (measured: 8 × HDR DGX A100 nodes reach 192 GB/s inter-node busbw, NVIDIA/nccl#812).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.specs.hardware import Accelerator, Cluster, MatmulEfficiency

DEFAULT_MATMUL = MatmulEfficiency(
    max_fraction=0.6, half_size=100.0,
    source="estimate: no fitted or measured curve for this accelerator's generation; calibrate with `shardlab calibrate`")
"""Fallback curve for accelerators whose generation has no entry in efficiencies.yaml and no calibration."""
DEFAULT_ATTENTION_EFFICIENCY = 0.4
"""Fallback attention-kernel share of peak (estimate, flagged in the output)."""
DEFAULT_MEMORY_EFFICIENCY = 0.8
"""Fallback HBM streaming share (estimate, flagged in the output)."""
DEFAULT_OVERLAP_EFFICIENCY = 0.7
"""Fallback share of a compute window overlapped communication hides under (estimate, flagged in the output)."""


def matmul_curve(acc: Accelerator) -> tuple[MatmulEfficiency, bool]:
    """(curve, is_default) for ``acc``."""
    return (acc.efficiency, False) if acc.efficiency is not None else (DEFAULT_MATMUL, True)


def attention_efficiency(acc: Accelerator) -> float:
    """Share of the dense peak the fused attention kernel reaches on ``acc``."""
    return acc.attention_efficiency if acc.attention_efficiency is not None else DEFAULT_ATTENTION_EFFICIENCY


def overlap_efficiency(acc: Accelerator) -> float:
    """Share of a compute window that overlapped communication hides under on ``acc``."""
    return acc.overlap_efficiency if acc.overlap_efficiency is not None else DEFAULT_OVERLAP_EFFICIENCY


def memory_efficiency(acc: Accelerator) -> float:
    """Share of the HBM bandwidth streaming kernels reach on ``acc``."""
    return acc.memory_efficiency if acc.memory_efficiency is not None else DEFAULT_MEMORY_EFFICIENCY


def gemm_efficiency(d, curve: MatmulEfficiency):
    """Achieved share of peak for a GEMM whose smallest dimension is ``d`` (array-safe)."""
    d = np.asarray(d, dtype=float)
    return curve.max_fraction * d / (d + curve.half_size)


def gemm_time_s(m, n, k, peak_flops: float, curve: MatmulEfficiency):
    """Time of an (m × k)·(k × n) GEMM: 2mnk / (peak · eff(min(m, n, k)))."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    flops = 2.0 * m * n * k
    return flops / (peak_flops * gemm_efficiency(np.minimum(np.minimum(m, n), k), curve))


def memory_time_s(nbytes, acc: Accelerator):
    """Time to stream ``nbytes`` through HBM at the accelerator's memory efficiency."""
    return np.asarray(nbytes, dtype=float) / (acc.memory_bandwidth_bytes_per_s * memory_efficiency(acc))


ATTENTION_FLASH1_SPEED = 0.5
"""FlashAttention (v1, Dao et al. 2022) relative to FlashAttention-2: 'around 2x speedup compared to FlashAttention'
(Dao 2023, arXiv 2307.08691, abstract and §4.1)."""
ATTENTION_KERNELS = ("flash1", "flash2", "native")


def attention_time_s(flops, acc: Accelerator, dtype: str, kernel: str = "flash2"):
    """Time of ``flops`` of fused attention at the accelerator's attention share: FlashAttention-2 ('flash2'), its
    predecessor ('flash1', half as fast) or the generation's native kernel ('native': FlashAttention-3 / cuDNN on
    Hopper, faster by the generation's speed-up)."""
    return np.asarray(flops, dtype=float) / (acc.peak_flops(dtype) * attention_efficiency(acc)
                                             * attention_kernel_speed(acc, kernel))


def attention_kernel_speed(acc: Accelerator, kernel: str) -> float:
    """The kernel's rate relative to FlashAttention-2's on ``acc`` (``attention_time_s``)."""
    return acc.attention_native_speedup if kernel == "native" else ATTENTION_FLASH1_SPEED if kernel == "flash1" else 1.0


@dataclass(frozen=True)
class GroupLink:
    """How a communication group's traffic crosses the hardware (arrays over candidates)."""

    alpha_s: np.ndarray
    """Latency per algorithm step (the slowest link crossed)."""
    beta_bytes_per_s: np.ndarray
    """Bus bandwidth available to the group."""
    nodes: np.ndarray
    """Nodes the group spans (1 = inside a node)."""


def ranks_per_node(cluster: Cluster, size, stride):
    """Members of a group of ``size`` ranks ``stride`` apart that share one node (array-safe)."""
    stride = np.asarray(stride)
    gpn = cluster.gpus_per_node
    per_node = np.where(stride < gpn, np.maximum(gpn // np.maximum(stride, 1), 1), 1)
    return np.minimum(per_node, np.maximum(np.asarray(size), 1))


def across_nodes_bytes_per_s(cluster: Cluster, per_node, per_gpu_nic: bool = False):
    """Bus bandwidth of a ring whose ``per_node`` members in each node leave it through their own NICs in parallel
    channels: min(intra-node, per_node × one NIC); ``per_gpu_nic``: one NIC (array-safe)."""
    inter = cluster.inter_link.bytes_per_s
    return inter if per_gpu_nic else np.minimum(cluster.intra_link.bytes_per_s, np.asarray(per_node) * inter)


def group_link(cluster: Cluster, size, stride, per_gpu_nic: bool = False) -> GroupLink:
    """Link parameters for groups of ``size`` ranks ``stride`` apart (array-safe).

    ``per_gpu_nic``: the group's traffic crosses each rank's own NIC without sharing a node's NICs (a ring whose
    every hop leaves the node): the bus bandwidth is one GPU's inter-node rate however many members a node holds."""
    size = np.asarray(size)
    per_node = ranks_per_node(cluster, size, stride)
    nodes = -(-size // per_node)
    # a node whose GPU count is not a multiple of the group's extent (6 per node, groups of 4) has groups straddling
    # two nodes; the slowest group sets the pace (rank_grid.group_span_nodes finds the widest exactly)
    st, gpn = np.maximum(np.asarray(stride), 1), cluster.gpus_per_node
    ext = st * size
    straddle = ((size > 1) & (ext < gpn) & (gpn % ext != 0) & (cluster.num_gpus > gpn))
    nodes = np.where(straddle, np.maximum(nodes, 2), nodes)
    per_node = np.where(straddle, np.maximum(size // 2, 1), per_node)   # its members split over the two nodes
    intra, inter = cluster.intra_link, cluster.inter_link
    inside = nodes <= 1
    across = across_nodes_bytes_per_s(cluster, per_node, per_gpu_nic)
    beta = np.where(inside, intra.ring_bytes_per_s(size), across)   # a mesh's parallel rings; host-staged PCIe rings
    alpha = np.where(inside, intra.latency_s, inter.latency_s)
    return GroupLink(alpha, beta, nodes)
