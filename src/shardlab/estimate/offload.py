"""Time of offloaded training (``--offload``): host-link traffic per step, the bandwidth that would hide it, the CPU
optimizer step, and what stays exposed.

Traffic per rank (``memory/offload.py`` says what lives where; P = the rank's parameter partition, bytes per element
as stored; m = micro-batches per step):
    optimizer  GPU→host  gradient partition, 2·P bytes, once per step after the last reduction     (ZeRO-Offload §4.1)
               host→GPU  updated bf16 parameters, 2·P bytes, once per step
    params     host→GPU  the weight shard before each forward and each backward gather: 2 · 2·P bytes per micro-batch
               GPU→host  updated weights after the GPU optimizer step, 2·P bytes per step       (ZeRO-Infinity §5)
    both       host→GPU  as params; GPU→host the reduced gradient shard, 2·P per micro-batch (FSDP CPU offload)
NVMe (ZeRO-Infinity): offloaded optimizer state is read and written once per step (2 × 12·P bytes) over the NVMe
bandwidth, and parameter shards stream from NVMe as they do from host memory.

Hiding: per-micro-batch transfers overlap that micro-batch's compute (prefetch), so the link must carry
bytes / compute-time to hide them (``bandwidth_to_hide_gbps``); the excess is exposed. The once-per-step traffic
and the CPU Adam step sit between two steps: exposed (ZeRO-Offload's one-step delayed parameter update, §4.3, would
overlap them but changes the optimization; it is not assumed). The gradient copy of ``optimizer`` overlaps the
backward (ZeRO-Offload overlaps it, §4.2), so only the parameter upload and the CPU step count.

CPU Adam: ZeRO-Offload's vectorized CPU-Adam updates CPU_ADAM_PARAMS_PER_S parameters per second on the host of one
node, shared by the node's GPUs (each rank's partition is updated by the same CPU sockets).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.memory.offload import Offload

CPU_ADAM_PARAMS_PER_S = 10e9 / 2.57
"""Measured CPU-Adam throughput: 10 billion parameters updated in 2.57 s (ZeRO-Offload, Ren et al. 2021,
arXiv 2101.06840, Table 3: DeepSpeed's vectorized CPU-Adam on the paper's DGX-2 host; PyTorch's CPU Adam took
14.76 s). A host with less memory bandwidth is slower. The two figures are quoted from the paper's Table 3 and have
not been re-checked against a second source; `tests/test_estimate_recipes.py` pins the arithmetic, not the rate."""
NVME_GBPS = 7.0
"""NVMe bandwidth per GPU, GB/s, an estimate: one PCIe 4.0 ×4 drive per GPU, whose link carries 16 GT/s × 4 lanes ×
128/130 ≈ 7.9 GB/s (PCIe 4.0 base specification); sequential transfers reach somewhat less."""


@dataclass(frozen=True)
class OffloadTime:
    """Host-link and CPU time of one optimizer step on one rank."""

    h2d_bytes: float
    """Host→GPU bytes per step."""
    d2h_bytes: float
    """GPU→host bytes per step."""
    nvme_bytes: float
    """NVMe bytes read + written per step (0 for cpu offload)."""
    per_microbatch_bytes: float
    """Of the above, the bytes each micro-batch moves (they can overlap that micro-batch's compute)."""
    link_gbps: float
    """Host-link bandwidth used, GB/s per direction (the accelerator's host link × its efficiency)."""
    transfer_s: float
    """Time on the host link per step, the busier direction."""
    cpu_adam_s: float
    """CPU optimizer step (0 when the optimizer stays on the GPU)."""
    nvme_s: float
    """NVMe time per step."""
    bandwidth_to_hide_gbps: float
    """Host-link GB/s that would hide the per-micro-batch traffic under compute."""
    exposed_s: float
    """What adds to the step: per-step transfers + CPU step + NVMe + per-micro-batch traffic beyond compute."""


def traffic_bytes(off: Offload, partition_params: float, microbatches: int, weight_bytes: int = 2,
                  grad_bytes: int = 2, optimizer_bytes: float = 12) -> dict:
    """{'h2d_step', 'd2h_step', 'h2d_mb', 'd2h_mb', 'nvme_step'} bytes for a rank whose ZeRO partition has
    ``partition_params`` elements (the ZeRO-3 shard for params/both)."""
    P, m = float(partition_params), microbatches
    t = {"h2d_step": 0.0, "d2h_step": 0.0, "h2d_mb": 0.0, "d2h_mb": 0.0, "nvme_step": 0.0}
    if off.what == "optimizer":
        t["d2h_step"] += grad_bytes * P
        t["h2d_step"] += weight_bytes * P
    if off.params:
        t["h2d_mb"] += 2 * weight_bytes * P          # forward gather and backward re-gather
    if off.what == "params":
        t["d2h_step"] += weight_bytes * P            # GPU optimizer writes the updated shard back
    if off.what == "both":
        t["d2h_mb"] += grad_bytes * P                # reduced gradient shard, every micro-batch
    if off.device == "nvme":
        if off.optimizer:
            t["nvme_step"] += 2 * optimizer_bytes * P   # read and write master weights and moments
        if off.params:
            t["nvme_step"] += weight_bytes * P * (2 * m + 1)
    return t


def offload_time(off: Offload, *, partition_params: float, microbatches: int, compute_per_microbatch_s: float,
                 backward_last_s: float, link_bytes_per_s: float, gpus_per_node: int,
                 cpu_adam_params_per_s: float = CPU_ADAM_PARAMS_PER_S, nvme_gbps: float = NVME_GBPS,
                 optimizer_bytes: float = 12) -> OffloadTime:
    """Offload time of one step on one rank (scalars). ``link_bytes_per_s``: host link per direction, achieved."""
    if off.what == "none":
        return OffloadTime(0, 0, 0, 0, link_bytes_per_s / 1e9, 0, 0, 0, 0, 0)
    m = microbatches
    t = traffic_bytes(off, partition_params, m, optimizer_bytes=optimizer_bytes)
    h2d = t["h2d_step"] + m * t["h2d_mb"]
    d2h = t["d2h_step"] + m * t["d2h_mb"]
    transfer = max(h2d, d2h) / link_bytes_per_s
    per_mb = max(t["h2d_mb"], t["d2h_mb"])
    hide_gbps = per_mb / compute_per_microbatch_s / 1e9 if compute_per_microbatch_s > 0 else 0.0
    mb_exposed = m * max(0.0, per_mb / link_bytes_per_s - compute_per_microbatch_s)
    cpu = partition_params * gpus_per_node / cpu_adam_params_per_s if off.optimizer else 0.0
    nvme = t["nvme_step"] / (nvme_gbps * 1e9)
    if off.what == "optimizer":  # gradient copy hidden under the backward; the parameter upload after the CPU step
        step_exposed = max(0.0, t["d2h_step"] / link_bytes_per_s - backward_last_s) + t["h2d_step"] / link_bytes_per_s
    else:
        step_exposed = max(t["h2d_step"], t["d2h_step"]) / link_bytes_per_s
    return OffloadTime(h2d, d2h, t["nvme_step"], per_mb, link_bytes_per_s / 1e9, transfer, cpu, nvme, hide_gbps,
                       step_exposed + cpu + nvme + mb_exposed)
