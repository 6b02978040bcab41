"""Accelerators, links and clusters: the hardware side of every estimate."""

from __future__ import annotations

import numpy as np
from dataclasses import dataclass

from shardlab.errors import ShardlabError, field_name

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")


@dataclass(frozen=True)
class MatmulEfficiency:
    """Achieved share of peak matmul FLOP/s as a function of matrix size (the estimate's compute model).

    eff(n) = max_fraction · n / (n + half_size): a saturating curve in the GEMM's smallest dimension
    n = min(M, N, K), so small
    matrices (narrow TP shards, small hidden sizes) run further from peak than large ones.
    """

    max_fraction: float
    """Share of the dense peak reached by very large GEMMs."""
    half_size: float
    """The GEMM dimension (elements) at which half of max_fraction is reached."""
    source: str = ""
    """Where the two numbers come from (fit to published runs, or a user calibration)."""


TRAINING_PRECISION = {"fp32": "fp32", "bf16": "bf16-mixed", "fp16": "fp16-mixed"}
"""Peak dtype -> the --precision value whose GEMMs run at it (fp8-mixed also needs the bf16 peak)."""


@dataclass(frozen=True)
class Accelerator:
    """One GPU (or accelerator) model."""

    id: str
    """Catalog id, lowercase and hyphenated (h100-sxm)."""
    name: str
    """Marketing name."""
    vendor: str
    """nvidia, amd, ..."""
    peak_tflops: dict[str, float | None]
    """Dense peak TFLOP/s (TOPS for int8/int4) by dtype (fp32, tf32, bf16, fp16, fp8, int8, int4, fp4: NVFP4 block-scaled); None where unsupported."""
    memory_gib: float
    """Memory the framework can use, GiB (2**30 bytes)."""
    memory_bandwidth_gbps: float
    """Memory bandwidth, GB/s (1e9 bytes)."""
    scale_up_link: str
    """Link id joining GPUs inside a server (nvlink4, pcie4, ...)."""
    host_link: str
    """Link id to the host (pcie4, pcie5)."""
    tdp_w: float
    """Board power, watts."""
    system: dict
    """Usual server: gpus_per_node, intra_link, inter_link."""
    source: str
    """Where the numbers come from."""
    notes: str = ""
    """Conflicts and caveats."""
    efficiency: MatmulEfficiency | None = None
    """Achieved-matmul model for the estimate (None: the estimate's shared default)."""
    op_overhead_us: float = 0.0
    """Host time to dispatch one operator that the device cannot hide, microseconds. 0 for GPUs: launches are
    asynchronous and hidden while kernels are longer than a launch; eager PyTorch on a CPU pays it for every
    operator (tens of µs). ``shardlab calibrate`` measures it."""
    generation: str = ""
    """Architecture generation (ampere, hopper, ...): validation groups runs by framework × generation, and parts of
    one generation share the silicon's efficiencies."""
    attention_efficiency: float | None = None
    """Share of the dense peak the fused attention kernel reaches on the model's attention FLOPs (forward and
    backward; FlashAttention-class kernels). None: the generation's value (catalog/data/efficiencies.yaml)."""
    memory_efficiency: float | None = None
    """Share of the HBM bandwidth that streaming (memory-bound) kernels reach. None: the generation's value."""
    overlap_efficiency: float | None = None
    """Share of a compute window that communication overlapping it can hide under: concurrent NCCL kernels take SMs
    and memory bandwidth from the compute (which slows) and streams order the work, so C seconds of collectives
    overlapped with W seconds of compute add max(0, C − η·W). None: the generation's value."""
    attention_native_speedup: float = 1.0
    """Speed-up of the generation's native attention kernels (FlashAttention-3 / cuDNN on Hopper) over
    FlashAttention-2, which ``attention_efficiency`` describes; 1 where FlashAttention-2 is the best kernel."""
    efficiency_source: str = ""
    """Where the three efficiencies come from (the generation's fit, a calibration profile, or a default)."""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gbps * 1e9

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; raises ShardlabError naming a usable dtype when absent."""
        v = self.peak_tflops.get(dtype)
        if v is None:
            have = [k for k, x in self.peak_tflops.items() if x]
            flags = [TRAINING_PRECISION[k] for k in have if k in TRAINING_PRECISION]
            fix = (f"pass {field_name('workload.precision')} {' or '.join(flags)}" if flags
                   else f"use a precision with one of: {', '.join(have)}")
            raise ShardlabError(f"{self.id} has no {dtype} peak in the catalog; {fix}")
        return float(v) * 1e12


@dataclass(frozen=True)
class Link:
    """An interconnect, per GPU and per direction."""

    id: str
    """Catalog id (nvlink4, ib-ndr, ethernet-10g)."""
    name: str
    """Readable name."""
    bandwidth_gbps: float
    """Line rate per GPU per direction, GB/s (1e9 bytes)."""
    latency_us: float
    """alpha: time of one algorithm step on a tiny message, microseconds."""
    efficiency: float
    """Share of the line rate a collective's bus bandwidth reaches on large messages."""
    scope: str
    """'intra' (inside a node) or 'inter' (between nodes)."""
    source: str
    """Where the numbers come from."""
    mesh_peers: int = 0
    """Peer links per GPU of a fully connected mesh (MI300X Infinity Fabric: 7), each of ``bandwidth_gbps``: a
    collective over n ranks runs min(n − 1, mesh_peers) rings at once, one per link (RCCL's multi-ring mesh);
    0 for a switched fabric or a single path."""

    socket_gpus: int = 0
    """GPUs under one CPU socket of a two-socket PCIe server (0: not such a link). A ring over more ranks crosses
    the CPU interconnect, where NCCL uses no peer-to-peer copy by default (NCCL_P2P_LEVEL: not across SYS paths)
    and stages each chunk through a host-memory buffer (its SHM transport): written out and read back, two PCIe
    crossings per transfer, half the bandwidth of a direct peer copy."""

    def lanes(self, ranks: int) -> int:
        """Links a collective over ``ranks`` ranks drives at once (1 off a mesh)."""
        return max(1, min(int(ranks) - 1, self.mesh_peers)) if self.mesh_peers else 1

    def ring_bytes_per_s(self, ranks):
        """Bus bandwidth of a collective over ``ranks`` ranks inside one node: a mesh's parallel rings, or half the
        link for rings that cross CPU sockets through host memory (array-safe in ranks)."""
        r = np.asarray(ranks)
        lanes = np.clip(r - 1, 1, self.mesh_peers) if self.mesh_peers else 1
        staged = np.where((self.socket_gpus > 0) & (r > self.socket_gpus), 0.5, 1.0) if self.socket_gpus else 1.0
        out = self.bytes_per_s * lanes * staged
        return float(out) if np.ndim(out) == 0 else out

    @property
    def bytes_per_s(self) -> float:
        """Achievable bandwidth (line rate × efficiency), bytes/s: the β of the α–β model."""
        return self.bandwidth_gbps * 1e9 * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster: N GPUs, grouped into nodes joined by an inter-node link."""

    accelerator: Accelerator
    """The GPU model every rank runs on."""
    num_gpus: int
    """World size."""
    gpus_per_node: int
    """GPUs sharing the intra-node link (an NVLink domain)."""
    intra_link: Link
    """Link between GPUs of one node."""
    inter_link: Link
    """Link between nodes, per GPU (rail-optimized: one NIC per GPU)."""

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.gpus_per_node)

    def require_whole_nodes(self) -> Cluster:
        """This cluster, if it is part of one node or whole nodes; else an error naming the fix (8 GPUs on nodes of
        3 would be priced as 3 nodes, 9 GPU slots). For a training job's cluster only: serving pools of independent
        replicas may leave a node part-used (a 12-GPU prefill pool of 6 × TP 2 on nodes of 8), so ``Cluster``
        itself does not check."""
        n, gpn = self.num_gpus, self.gpus_per_node
        # a rack-scale NVLink domain (GB200 NVL72's 72 GPUs) is often partly used: NeMo's GB200 tables run 128 and 256
        # GPUs; servers of up to 16 GPUs are filled whole
        if n > gpn > 0 and n % gpn and gpn <= 16:
            div = next(d for d in range(gpn - 1, 0, -1) if n % d == 0)
            raise ShardlabError(f"{n} GPUs do not fill whole nodes of {gpn}; use a multiple of {gpn} "
                                f"({field_name('cluster.gpus')} {n - n % gpn} or {n - n % gpn + gpn}) or "
                                f"{field_name('cluster.gpus_per_node')} that divides {n} (e.g. {div})")
        return self

    def link_for_group(self, group_span_gpus: int) -> Link:
        """The slowest link a group crosses when its members are ``group_span_gpus`` consecutive ranks apart."""
        return self.intra_link if group_span_gpus <= self.gpus_per_node else self.inter_link


PER_NODE_SUFFIX = "gbit-per-node"
"""A link at a stated per-node rate is named '<catalog id>@<N>gbit-per-node' (``per_node_rate``)."""


def per_node_gbit(link_id) -> tuple[str, float] | None:
    """(catalog link id, Gb/s per node) of a link id ``per_node_rate`` made, else None."""
    base, _, rate = str(link_id or "").partition("@")
    if not rate.endswith(PER_NODE_SUFFIX):
        return None
    try:
        v = float(rate[:-len(PER_NODE_SUFFIX)])
    except ValueError:
        return None
    return (base, v) if 0 < v < 1e9 else None


def per_node_rate(link: Link, gbit_per_node: float, gpus_per_node: int) -> Link:
    """``link`` at a stated inter-node rate per node (Gb/s), spread over the node's GPUs."""
    from dataclasses import replace

    return replace(link, id=f"{link.id}@{gbit_per_node:g}{PER_NODE_SUFFIX}", bandwidth_gbps=gbit_per_node / 8 / gpus_per_node)
