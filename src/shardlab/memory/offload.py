"""CPU/NVMe offload of model states (``--offload optimizer|params|both``): what leaves the GPU and where it goes.

Sources:
- ZeRO-Offload (Ren et al. 2021, arXiv 2101.06840) §4, Fig. 2: with ZeRO-2 the fp32 master weights, momentum and
  variance of a rank's partition live in CPU memory, its fp16/bf16 gradient partition is copied there after the
  reduce-scatter, the CPU runs Adam, and the updated bf16 parameters return to the GPU. The GPU keeps the bf16
  weights and only the gradient buckets in flight. DeepSpeed offers this with ZeRO stages 1-3 (``offload_optimizer``).
- ZeRO-Infinity (Rajbhandari et al. 2021, arXiv 2104.07857) §5: with ZeRO-3 the parameter shards can live in CPU
  memory or on NVMe too (``offload_param``); each is copied to the GPU before its all-gather, forward and backward.
- PyTorch FSDP ``CPUOffload(offload_params=True)`` / FSDP2 ``CPUOffloadPolicy``: sharded parameters, their gradients
  and therefore the optimizer step all stay on the CPU: ``both`` here.

Modes (what moves off the GPU, per rank, on top of the ZeRO partitioning):
    optimizer  master weights + moments + the gradient partition (ZeRO-2/3: the GPU keeps buckets only; ZeRO-1
               accumulates full gradients on the GPU before reducing, so they stay)            needs ZeRO >= 1
    params     the bf16 weight shards; gradients and optimizer state stay on the GPU            needs ZeRO-3
    both       weights, gradients and optimizer state (FSDP CPU offload)                         needs ZeRO-3
Device ``nvme`` (ZeRO-Infinity) puts the same bytes on NVMe; the CPU then holds only staging buffers (not counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import ShardlabError, field_name

MODES = ("none", "optimizer", "params", "both")
DEVICES = ("cpu", "nvme")


@dataclass(frozen=True)
class Offload:
    """Which model states leave the GPU, and to which device."""

    what: str = "none"
    """none, optimizer, params or both."""
    device: str = "cpu"
    """cpu (pinned host memory) or nvme (ZeRO-Infinity)."""

    @property
    def optimizer(self) -> bool:
        return self.what in ("optimizer", "both")

    @property
    def params(self) -> bool:
        return self.what in ("params", "both")

    @property
    def gradients(self) -> bool:
        """The gradient partition lives off the GPU (optimizer offload with ZeRO-2/3, or both)."""
        return self.what in ("optimizer", "both")


def check_offload(off: Offload, zero: int) -> Offload:
    """Validate the mode against the ZeRO stage; a ShardlabError names the fix."""
    if off.what not in MODES:
        raise ShardlabError(f"{field_name('recipe.offload')} must be one of {', '.join(MODES[1:])}, got '{off.what}'")
    if off.device not in DEVICES:
        raise ShardlabError(f"{field_name('recipe.offload_device')} must be cpu or nvme, got '{off.device}'")
    if off.what == "optimizer" and zero < 1:
        raise ShardlabError(f"{field_name('recipe.offload')} optimizer needs a partitioned optimizer: add "
                            f"{field_name('layout.zero')} 1, 2 or 3 (DeepSpeed ZeRO-Offload)")
    if off.params and zero < 3:
        raise ShardlabError(f"{field_name('recipe.offload')} {off.what} moves parameter shards, which exist only with "
                            f"ZeRO-3/FSDP: add {field_name('layout.zero')} 3")
    return off


@dataclass(frozen=True)
class OffloadSplit:
    """Model-state bytes of one rank after offload: what stays on the GPU and what the host (or NVMe) holds."""

    gpu_weights: int
    gpu_gradients: int
    gpu_master: int
    gpu_moments: int
    host: dict
    """Bytes off the GPU by category: weights, gradients, master_weights, moments."""

    @property
    def host_total(self) -> int:
        return sum(self.host.values())


def split_states(weights: int, gradients: int, master: int, moments: int, zero: int, off: Offload,
                 grad_partition: int = 0) -> OffloadSplit:
    """Move the categories ``off`` selects off the GPU. Inputs are the rank's bytes after ZeRO (``StateReport``).

    ``grad_partition``: bytes of the rank's reduced gradient partition (optimizer elements × gradient bytes). With
    ZeRO-2/3 that is the rank's whole gradient and it leaves the GPU; ZeRO-1 keeps full gradients on the GPU (they
    accumulate there before the reduction) and copies the reduced partition to the host for the CPU optimizer."""
    if off.what == "none":
        return OffloadSplit(weights, gradients, master, moments, {})
    host: dict[str, int] = {}
    gw, gg, gm, gv = weights, gradients, master, moments
    if off.params:
        host["weights"], gw = weights, 0
    if off.optimizer:
        host["master_weights"], host["moments"], gm, gv = master, moments, 0, 0
        if zero >= 2:
            host["gradients"], gg = gradients, 0
        else:
            host["gradients"] = grad_partition
    return OffloadSplit(gw, gg, gm, gv, host)
