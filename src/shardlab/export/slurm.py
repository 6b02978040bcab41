"""Slurm batch script: one task per node, ``srun torchrun`` with the c10d rendezvous on the first node, and the
framework file (``--launch``; by default the framework the plan was scored for, else torchtitan, and vllm for
serving) written by a heredoc.
Checked with ``bash -n`` and torch's own torchrun argument parser (tests)."""

from __future__ import annotations

import re

from shardlab.limits import MAX_GPUS, MAX_GPUS_PER_NODE

from shardlab.export.job import Export, Imported, LaunchJob, header
from shardlab.export.launcher import default_inner, node_commands, per_node_replicas, read_embedded
from shardlab.export.text import comment_block

CHECKED = "bash -n; torch 2.13 torchrun argument parser (torch.distributed.run)"


def render(job: LaunchJob, spec, inner: str | None = None) -> Export:
    inner = inner or default_inner(job)
    torchrun = (f'torchrun --nnodes "$SLURM_NNODES" --nproc-per-node {job.procs_per_node} --rdzv-id "$SLURM_JOB_ID" '
                f'--rdzv-backend c10d --rdzv-endpoint "$head_node:29500"')
    write, cmd, inner_exp = node_commands(job, spec, inner, torchrun, "$SLURM_NODEID", "$head_node")
    uns = inner_exp.unsupported
    cpu = _is_cpu(job.gpu)          # a CPU "accelerator" asks Slurm for no GPUs
    sb = [f"--job-name=shardlab-{job.model}", f"--nodes={job.nodes}", "--ntasks-per-node=1",
          *([] if cpu else [f"--gpus-per-node={job.procs_per_node}"]), "--exclusive"]
    lines = ["#!/bin/bash", *[f"#SBATCH {s}" for s in sb],
             comment_block(header(job, "slurm", uns, inner) + [f"runs {inner} ({inner_exp.checked_against})"]).rstrip(),
             "set -euo pipefail",
             f"# the Python environment with torch and {inner}: $VENV, else .venv in the submit directory, if present",
             'venv="${VENV:-${SLURM_SUBMIT_DIR:-.}/.venv}"',
             'if [ -f "$venv/bin/activate" ]; then source "$venv/bin/activate"; fi',
             'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)', "export head_node",
             f"# threads per rank: the node's cores over its {job.procs_per_node} ranks (at least 1)",
             f"threads=$(( ${{SLURM_CPUS_ON_NODE:-{8 * job.procs_per_node}}} / {job.procs_per_node} ))",
             "export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 ))"]
    body = "\n".join(lines) + "\n" + write
    # accelerate needs each task's own $SLURM_NODEID, so its line is expanded inside the task
    body += f"srun bash -c '{cmd}'\n" if inner == "accelerate" else f"srun {cmd}\n"
    return Export("slurm", f"Slurm sbatch script running {inner}", f"{job.model}.sbatch", body,
                  f"{CHECKED}; embedded {inner_exp.checked_against}", uns, f"sbatch {job.model}.sbatch")


def _is_cpu(gpu: str) -> bool:
    from shardlab.catalog import get_catalog
    from shardlab.errors import ShardlabError

    try:
        return get_catalog().accelerator(gpu).generation == "cpu"
    except ShardlabError:             # an accelerator from the user's catalog file: a GPU, as before
        return False


def _bounded(m: re.Match | None, field: str, maximum: int) -> None:
    """A count from an #SBATCH line: a whole number from 1 to ``maximum`` (checked as digits, before int())."""
    from shardlab.export.text import FieldError

    if m and (len(m.group(1)) > len(str(maximum)) or not 1 <= int(m.group(1)) <= maximum):
        raise FieldError(field, f"a whole number from 1 to {maximum:,}", m.group(1))


def read(text: str, catalog) -> Imported:
    inner = read_embedded(text, catalog)
    f = dict(inner.fields)
    und = list(inner.understood)
    nodes = re.search(r"#SBATCH\s+(?:--nodes|-N)[= ](\d+)", text)
    gpn = re.search(r"#SBATCH\s+--gpus-per-node[= ](?:\w+:)?(\d+)", text)
    _bounded(nodes, "#SBATCH --nodes", MAX_GPUS)
    _bounded(gpn, "#SBATCH --gpus-per-node", MAX_GPUS_PER_NODE)
    if nodes and gpn and inner.source != "vllm":
        f["gpus"] = int(nodes.group(1)) * int(gpn.group(1))
        und.append((f"#SBATCH {nodes.group(1)} nodes × {gpn.group(1)} GPUs", f"{f['gpus']} GPUs"))
    if gpn:
        f["gpus_per_node"] = int(gpn.group(1))
    if nodes and inner.source == "vllm":
        per_node_replicas(f, und, int(nodes.group(1)), f.get("gpus_per_node"))
    return Imported("slurm", f, tuple(und), inner.ignored, inner.framework)
