"""Process-group set-up for rank programs started by torchrun: backend, device, timeout, free ports.

The backend follows the device: NCCL when CUDA GPUs are visible, gloo on CPU. torchrun exports RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; :func:`init_from_env` reads them. Process groups
are returned explicitly (a :class:`DistContext`), never kept in module globals.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

DEFAULT_PG_TIMEOUT_S = 60.0
"""Collective timeout: a rank that waits longer for a peer fails (so a hung peer ends the job)."""


@dataclass(frozen=True)
class DistContext:
    """Where this rank stands in the job."""

    rank: int
    """Global rank (0 .. world_size-1)."""
    world_size: int
    """Number of ranks."""
    local_rank: int
    """Rank on this node (picks the GPU)."""
    backend: str
    """'gloo' (CPU) or 'nccl' (CUDA)."""
    device_type: str
    """'cpu' or 'cuda'."""
    group: object
    """The default (world) process group."""

    @property
    def device(self):
        import torch

        return torch.device(self.device_type, self.local_rank) if self.device_type == "cuda" else torch.device("cpu")


def choose_backend(device_type: str | None = None) -> tuple[str, str]:
    """(backend, device_type): NCCL on CUDA, gloo on CPU; ``device_type`` None means CUDA when available.

    ``SHARDLAB_DEVICE=cpu`` forces the CPU path on a GPU machine.
    """
    import torch

    want = device_type or os.environ.get("SHARDLAB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if want == "cuda":
        if not torch.cuda.is_available():
            from shardlab.errors import ShardlabError

            raise ShardlabError("--device cuda asked for but no CUDA GPU is visible; use --device cpu")
        return "nccl", "cuda"
    return "gloo", "cpu"


def init_from_env(timeout_s: float | None = None, device_type: str | None = None) -> DistContext:
    """Initialise the default process group from torchrun's environment (gloo on CPU, NCCL on CUDA).

    ``timeout_s`` bounds every collective (default: ``SHARDLAB_PG_TIMEOUT_S``, set by the launcher to half
    its own timeout, else 60 s). Also pins CPU threads to OMP_NUM_THREADS (1 by default: ranks share cores).
    """
    import torch
    import torch.distributed as dist

    if timeout_s is None:
        timeout_s = float(os.environ.get("SHARDLAB_PG_TIMEOUT_S", DEFAULT_PG_TIMEOUT_S))

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    backend, dev = choose_backend(device_type)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if dev == "cuda":
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        kw = {"device_id": torch.device("cuda", local)} if dev == "cuda" else {}
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s), **kw)
    return DistContext(rank, world, local, backend, dev, dist.group.WORLD)


def destroy() -> None:
    """Tear the default process group down after every rank got here (safe to call twice).

    The barrier matters: a rank that closes its gloo connections while a peer is still finishing its last
    collective can make that peer abort (SIGABRT).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the OS choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return s.getsockname()[1]
