"""Slurm batch script: one task per node, ``srun torchrun`` with the c10d rendezvous on the first node, and the
framework file (``--launch``; by default the framework the plan was scored for, else torchtitan, and vllm for
serving) written by a heredoc.
Checked with ``bash -n`` and torch's own torchrun argument parser (tests)."""

from __future__ import annotations

import re

from shardlab.limits import MAX_GPUS, MAX_GPUS_PER_NODE

from shardlab.export.job import DEFAULT_GPUS_PER_NODE, Export, Imported, LaunchJob, header
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


def _sbatch(text: str, option: str) -> re.Match | None:
    """The last ``#SBATCH OPTION=N`` (or ``OPTION N``) line's count (Slurm takes the last of a repeated option);
    ``option`` is a regular expression of the option's spellings."""
    found = list(re.finditer(rf"^#SBATCH\s+(?:{option})(?:=|\s+)(?:[A-Za-z][\w.-]*:)?(\d+)\b", text, flags=re.M))
    return found[-1] if found else None


def launch_line_per_node(text: str) -> re.Match | None:
    """``--nproc-per-node N`` of the command a launcher script runs on each node (torchrun, or ``shardlab run
    train``), outside the heredocs that write the framework's own file: the ranks it starts on every node."""
    from shardlab.export.launcher import EOF_MARK

    body = re.sub(rf"<<'{EOF_MARK}'\n.*?\n{EOF_MARK}\n", "\n", text, flags=re.S)
    found = list(re.finditer(r"^[^#\n]*?--nproc[-_]per[-_]node(?:=|\s+)(\d+)\b", body, flags=re.M))
    return found[-1] if found else None


def default_per_node(f: dict, und: list, nodes: int | None, where: str) -> None:
    """GPUs per node where a launcher file does not say them: its GPUs over its ``nodes`` where those divide, else
    shardlab's default node (``DEFAULT_GPUS_PER_NODE``), no larger than the job's GPUs: never the whole job's GPUs
    as one node's when it asks for several."""
    gpus = f.get("gpus")
    if gpus is None and "dp" in f:              # a file that gives degrees, not GPUs (torchtitan's): their product
        gpus = 1
        for k in ("dp", "tp", "pp", "cp"):
            v = f.get(k, 1)
            gpus = gpus * v if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_GPUS else None
            if gpus is None or gpus > MAX_GPUS:
                gpus = None
                break
    known = isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 1
    if known and nodes and gpus % nodes == 0 and 1 <= gpus // nodes <= MAX_GPUS_PER_NODE:
        f["gpus_per_node"] = gpus // nodes
        und.append((f"{gpus} GPUs over {where} {nodes}", f"{gpus // nodes} GPUs per node"))
        return
    f["gpus_per_node"] = min(DEFAULT_GPUS_PER_NODE, gpus) if known else DEFAULT_GPUS_PER_NODE
    und.append(("no GPUs per node in the file", f"{f['gpus_per_node']} GPUs per node (shardlab's default node)"))
    if not known and nodes and gpus is None and "gpus" not in f:
        # nor the job's GPUs (Megatron-LM takes its data parallelism from the world size): the nodes it asks for,
        # each a default node, as the exporter writes them
        f["gpus"] = nodes * DEFAULT_GPUS_PER_NODE
        und.append((f"{where} {nodes} × {DEFAULT_GPUS_PER_NODE}", f"{f['gpus']} GPUs"))


def read(text: str, catalog) -> Imported:
    inner = read_embedded(text, catalog)
    f = dict(inner.fields)
    und = list(inner.understood)
    nodes = _sbatch(text, "--nodes|-N")
    _bounded(nodes, "#SBATCH --nodes", MAX_GPUS)
    n = int(nodes.group(1)) if nodes else None
    # what the script says one node runs: Slurm's GPUs per node, its generic resources, GPUs per task × tasks per
    # node, the ranks the launch line starts on each node, one task per GPU; or the GPUs of all the nodes
    gpn, gres = _sbatch(text, "--gpus-per-node"), re.search(r"^#SBATCH\s+--gres(?:=|\s+)(?:\S*,)?gpu"
                                                                r"(?::[A-Za-z][\w.-]*)?:(\d+)\b", text, flags=re.M)
    per_task, tasks = _sbatch(text, "--gpus-per-task"), _sbatch(text, "--ntasks-per-node")
    launch, total = launch_line_per_node(text), _sbatch(text, "--gpus|-G")
    for m, name in ((gpn, "#SBATCH --gpus-per-node"), (gres, "#SBATCH --gres=gpu:N"),
                    (per_task, "#SBATCH --gpus-per-task"), (tasks, "#SBATCH --ntasks-per-node"),
                    (launch, "--nproc-per-node (the launch line)")):
        _bounded(m, name, MAX_GPUS_PER_NODE)
    _bounded(total, "#SBATCH --gpus", MAX_GPUS)
    per, said = None, ""
    if gpn or gres:
        per, said = int((gpn or gres).group(1)), (gpn or gres).group(0).split(None, 1)[1]
    elif per_task:
        per = int(per_task.group(1)) * (int(tasks.group(1)) if tasks else 1)
        said = f"--gpus-per-task {per_task.group(1)} × --ntasks-per-node {tasks.group(1) if tasks else 1}"
    elif launch:
        per, said = int(launch.group(1)), f"--nproc-per-node {launch.group(1)}"
    elif tasks and int(tasks.group(1)) > 1:                   # one task (rank) per GPU
        per, said = int(tasks.group(1)), f"--ntasks-per-node {tasks.group(1)}"
    elif total and int(total.group(1)) % (n or 1) == 0:
        per, said = int(total.group(1)) // (n or 1), f"--gpus {total.group(1)} over {n or 1} node(s)"
    if per is not None and not 1 <= per <= MAX_GPUS_PER_NODE:
        from shardlab.export.text import FieldError

        raise FieldError("#SBATCH GPUs per node", f"a whole number from 1 to {MAX_GPUS_PER_NODE:,}", per)
    if per is not None and n and inner.source != "vllm":
        f["gpus"] = n * per
        und.append((f"#SBATCH {n} nodes × {per} GPUs", f"{f['gpus']} GPUs"))
    if per is not None:
        f["gpus_per_node"] = per
        und.append((said[:80], f"{per} GPUs per node"))
    elif "gpus_per_node" in f:                  # the framework's own line said it (torchrun --nnodes 2, num_machines)
        pass
    elif inner.source == "vllm":                # the serve line's GPUs are per node or the whole job's: the default
        f["gpus_per_node"] = DEFAULT_GPUS_PER_NODE
        und.append(("no GPUs per node in the file", f"{DEFAULT_GPUS_PER_NODE} GPUs per node (shardlab's default node)"))
    else:
        default_per_node(f, und, n, "#SBATCH --nodes")
    if n and inner.source == "vllm":
        per_node_replicas(f, und, n, f.get("gpus_per_node"))
    return Imported("slurm", f, tuple(und), inner.ignored, inner.framework)
