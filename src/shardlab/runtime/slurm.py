"""The rendezvous ``run train`` takes from a Slurm allocation, so ``srun shardlab run train ...`` needs no flags.

Slurm sets, in every task (Slurm docs, sbatch/srun "OUTPUT ENVIRONMENT VARIABLES"): ``SLURM_JOB_ID``,
``SLURM_NNODES`` (nodes in the allocation), ``SLURM_NODEID`` (this node's index, 0-based), ``SLURM_NTASKS``,
``SLURM_JOB_NODELIST`` (the nodes in Slurm's compressed form, ``node[01-04,07],gpu3``). One shardlab per node starts
torchrun for that node's ranks, so the job needs ``srun --ntasks-per-node=1``; the head node is the first of the list
(what ``scontrol show hostnames`` prints first), as in the sbatch script ``shardlab export --to slurm`` writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardlab.errors import ShardlabError

RDZV_PORT = 29500
"""torchrun's default rendezvous port (torch.distributed.run --master-port default), on the head node."""


@dataclass(frozen=True)
class SlurmRendezvous:
    """Where and how the nodes of a Slurm job meet."""

    nnodes: int
    """Nodes in the allocation (SLURM_NNODES)."""
    node_rank: int
    """This node's index (SLURM_NODEID); c10d may number the nodes in another order."""
    endpoint: str
    """The head node and port, HOST:PORT."""
    rdzv_id: str
    """``slurm-<SLURM_JOB_ID>``: the same on every node, different for every job."""


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'node[01-04,07],gpu3' -> 'node01', 'a,b' -> 'a', 'x[3]' -> 'x3'."""
    text = nodelist.strip()
    m = re.match(r"([^,\[\]]*)(?:\[([^\]]*)\])?([^,\[\]]*)", text)
    if not text or not m or not (m.group(1) or m.group(2)):
        raise ShardlabError(f"SLURM_JOB_NODELIST '{nodelist[:80]}' names no host; run inside a Slurm allocation, or "
                            "give --rdzv-endpoint HOST:PORT")
    prefix, ranges, suffix = m.groups()
    if ranges is None:
        return prefix + suffix
    first = ranges.split(",", 1)[0].split("-", 1)[0].strip()
    if not first.isdigit():
        raise ShardlabError(f"SLURM_JOB_NODELIST '{nodelist[:80]}': cannot read its first host; give --rdzv-endpoint")
    return prefix + first + suffix


def from_environment(env) -> SlurmRendezvous | None:
    """The rendezvous of the Slurm job ``env`` belongs to when it spans several nodes, else None."""
    if not env.get("SLURM_JOB_ID") or not env.get("SLURM_NNODES"):
        return None

    def whole(name: str) -> int:
        v = env.get(name, "")
        if not v.isdigit() or len(v) > 7:
            raise ShardlabError(f"{name}='{v[:20]}' is not a whole number; run inside a Slurm allocation, or give "
                                "--nodes/--rdzv-endpoint yourself")
        return int(v)

    nnodes = whole("SLURM_NNODES")
    if nnodes < 2:
        return None
    if env.get("SLURM_NTASKS") and whole("SLURM_NTASKS") != nnodes:
        raise ShardlabError(f"this Slurm step runs {env['SLURM_NTASKS']} tasks on {nnodes} nodes; run one shardlab per "
                            "node (srun --ntasks-per-node=1 shardlab run train ...): it starts that node's ranks itself")
    node = whole("SLURM_NODEID")
    if node >= nnodes:
        raise ShardlabError(f"SLURM_NODEID {node} is outside 0..{nnodes - 1} (SLURM_NNODES {nnodes})")
    job = env["SLURM_JOB_ID"]
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", job):
        raise ShardlabError(f"SLURM_JOB_ID '{job[:20]}' is not a job id; give --rdzv-id yourself")
    return SlurmRendezvous(nnodes, node, f"{first_host(env.get('SLURM_JOB_NODELIST', ''))}:{RDZV_PORT}", f"slurm-{job}")
