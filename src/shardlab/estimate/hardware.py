"""Achieved rates: matmul efficiency vs matrix size, memory-bound throughput, and group bandwidth.

- Matmul: eff(d) = max_fraction · d / (d + half_size) of the dense peak, d = the smallest dimension of
  the GEMM (a saturating curve: small TP shards and narrow heads run further from peak). Each accelerator
  may carry its own curve in the catalog (``efficiency:``), fitted to published runs or measured by
  ``shardlab calibrate``; otherwise DEFAULT_MATMUL applies and the output says it is an estimate.
- Memory-bound kernels (norms, activations, softmax, residuals, the optimizer) stream at
  MEMORY_EFFICIENCY of the HBM bandwidth.
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
    max_fraction=0.72, half_size=100.0,
    source="estimate: the A100 curve fitted to Megatron-LM runs (docs/validation.md), used for accelerators with "
           "no published runs; calibrate with `shardlab calibrate` to replace it")
"""Fallback curve for accelerators whose catalog entry has no ``efficiency`` (kept equal to a100-80gb's fit)."""

MEMORY_EFFICIENCY = 0.90
"""Share of HBM bandwidth streaming kernels reach. Source: device-to-device copies recorded in this workplace's
device notes (lent machines, 2026-10/11; not measured by shardlab): 3.0 of 3.35 TB/s on an H100 SXM and 4.3 of
4.8 TB/s on an H200 (docs/validation.md)."""


def matmul_curve(acc: Accelerator) -> tuple[MatmulEfficiency, bool]:
    """(curve, is_default) for ``acc``."""
    return (acc.efficiency, False) if acc.efficiency is not None else (DEFAULT_MATMUL, True)


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
    """Time to stream ``nbytes`` through HBM at MEMORY_EFFICIENCY of the bandwidth."""
    return np.asarray(nbytes, dtype=float) / (acc.memory_bandwidth_bytes_per_s * MEMORY_EFFICIENCY)


@dataclass(frozen=True)
class GroupLink:
    """How a communication group's traffic crosses the hardware (arrays over candidates)."""

    alpha_s: np.ndarray
    """Latency per algorithm step (the slowest link crossed)."""
    beta_bytes_per_s: np.ndarray
    """Bus bandwidth available to the group."""
    nodes: np.ndarray
    """Nodes the group spans (1 = inside a node)."""


def group_link(cluster: Cluster, size, stride) -> GroupLink:
    """Link parameters for groups of ``size`` ranks ``stride`` apart (array-safe)."""
    size = np.asarray(size)
    stride = np.asarray(stride)
    gpn = cluster.gpus_per_node
    per_node = np.where(stride < gpn, np.maximum(gpn // np.maximum(stride, 1), 1), 1)
    per_node = np.minimum(per_node, np.maximum(size, 1))
    nodes = -(-size // per_node)
    intra, inter = cluster.intra_link, cluster.inter_link
    inside = nodes <= 1
    beta = np.where(inside, intra.bytes_per_s, np.minimum(intra.bytes_per_s, per_node * inter.bytes_per_s))
    alpha = np.where(inside, intra.latency_s, inter.latency_s)
    return GroupLink(alpha, beta, nodes)
