"""SkyPilot task YAML (SkyPilot 0.14.1 task schema, checked with ``sky.Task.from_yaml_str``): resources with the
accelerator type and count, num_nodes, spot or on-demand, the set-up and the run command (torchrun with the
rendezvous SkyPilot's environment variables give), and the plan's cost estimate in a comment."""

from __future__ import annotations

import re

import yaml

from shardlab.errors import ShardlabError
from shardlab.safeio import yaml_load
from shardlab.export.job import Export, Imported, LaunchJob, header
from shardlab.export.launcher import INSTALL, default_inner, node_commands, per_node_replicas, read_embedded
from shardlab.export.names import gpu_from_skypilot, skypilot_accelerator
from shardlab.export.text import FieldError, comment_block, flag, section, whole

CHECKED = "SkyPilot 0.14.1 (sky.Task.from_yaml_str, task JSON schema)"


def _cost_lines(job: LaunchJob) -> list[str]:
    n = job.notes
    if not n.get("usd_per_gpu_hour"):
        return ["cost: no price known for this GPU (shardlab cost --price USD)"]
    rate = n["usd_per_gpu_hour"] * job.gpus
    out = [f"cost estimate: {job.gpus} × {job.gpu} at ${n['usd_per_gpu_hour']:.2f}/GPU-h = ${rate:,.2f}/h "
           f"({'spot' if n.get('spot') else 'on-demand'}; {n.get('price_source', 'shardlab prices')})"]
    if n.get("train_hours"):
        what = f"{n['tokens']:.3g} tokens" if n.get("tokens") else "the plan's --tokens"
        out.append(f"  {n['train_hours']:,.1f} h to train {what} (shardlab estimate) = ${rate * n['train_hours']:,.0f}")
    return out


def _block(text: str, indent: str = "  ") -> str:
    return "".join(indent + ln + "\n" if ln else "\n" for ln in text.rstrip("\n").split("\n"))


def render(job: LaunchJob, spec, inner: str | None = None) -> Export:
    inner = inner or default_inner(job)
    acc = skypilot_accelerator(job.gpu)
    torchrun = ("torchrun --nnodes \"$SKYPILOT_NUM_NODES\" --nproc-per-node \"$SKYPILOT_NUM_GPUS_PER_NODE\" "
                "--node-rank \"$SKYPILOT_NODE_RANK\" --master-addr \"$head_ip\" --master-port 29500")
    write, cmd, inner_exp = node_commands(job, spec, inner, torchrun, "\"$SKYPILOT_NODE_RANK\"", "\"$head_ip\"")
    uns = inner_exp.unsupported
    run = "set -euo pipefail\nhead_ip=$(echo \"$SKYPILOT_NODE_IPS\" | head -n 1)\n" + write + cmd + "\n"
    comments = header(job, "skypilot", uns, inner) + _cost_lines(job) + [f"runs {inner} ({inner_exp.checked_against})",
                                                                  f"checked against {CHECKED}"]
    text = (comment_block(comments)
            + f"name: shardlab-{re.sub(r'[^a-z0-9-]', '-', job.model.lower())}\n"
            + f"num_nodes: {job.nodes}\n"
            # shardlab installs from its own source: the folder `sky launch` runs in, synced to every node
            + ("workdir: .\n" if inner == "shardlab" else "")
            + "resources:\n"
            + f"  accelerators: {acc}:{job.procs_per_node}\n"
            + f"  use_spot: {'true' if job.notes.get('spot') else 'false'}\n"
            + "setup: |\n" + _block(INSTALL[inner])
            + "run: |\n" + _block(run))
    return Export("skypilot", f"SkyPilot task YAML running {inner}", f"{job.model}-sky.yaml", text,
                  f"{CHECKED}; embedded {inner_exp.checked_against}", uns, f"sky launch -c shardlab {job.model}-sky.yaml")


def read(text: str, catalog) -> Imported:
    from shardlab import limits as L

    try:
        doc = yaml_load(text)
    except yaml.YAMLError as e:
        raise ShardlabError(f"not a valid SkyPilot YAML: {str(e).splitlines()[0]}") from None
    except (ValueError, TypeError, OverflowError):      # a number thousands of digits long, a date that is none
        raise ShardlabError("not a valid SkyPilot YAML: it has a value YAML cannot read (a number thousands of "
                            "digits long?)") from None
    if not isinstance(doc, dict) or "run" not in doc:
        raise ShardlabError("not a SkyPilot task: it has no run section")
    if not isinstance(doc["run"], str):
        raise FieldError("run", "the command each node runs (text)", doc["run"], wrong_type=True)
    res = section(doc, "resources")
    nodes = whole(doc["num_nodes"], "num_nodes", 1, L.MAX_GPUS) if doc.get("num_nodes") is not None else 1
    spot = flag(res.get("use_spot", False), "resources.use_spot")
    accs, ign = res.get("accelerators"), []
    if isinstance(accs, (dict, list)) and accs:      # candidates SkyPilot picks from: the first is estimated
        if len(accs) > 1:
            ign.append(f"resources.accelerators after the first of {len(accs)} candidates")
        first = next(iter(accs.items())) if isinstance(accs, dict) else accs[0]
        if isinstance(first, tuple):
            first = f"{first[0]}:{first[1]}" if isinstance(first[0], str) and first[1] is not None else first[0]
        accs = first
        if not isinstance(accs, str):
            raise FieldError("resources.accelerators", "an accelerator name and count (H100:8)", accs, wrong_type=True)
    inner = read_embedded(doc["run"], catalog)
    f, und = dict(inner.fields), list(inner.understood)
    if isinstance(accs, str):
        name, _, count = accs.partition(":")
        gpu = gpu_from_skypilot(name)
        if gpu:
            f["gpu"] = gpu
        per = whole(count or "1", "resources.accelerators count (the GPUs per node after ':')", 1, L.MAX_GPUS_PER_NODE)
        f["gpus_per_node"] = per
        if inner.source != "vllm":
            f["gpus"] = nodes * per
        else:
            per_node_replicas(f, und, nodes, per)
        und.append((f"resources.accelerators {accs[:60]} × num_nodes {nodes}", f"{gpu or name[:40]}"))
    elif accs is not None:
        raise FieldError("resources.accelerators", "an accelerator name and count (H100:8)", accs, wrong_type=True)
    else:                   # no accelerators: the ranks the run line starts per node, else GPUs over num_nodes
        from shardlab.export.job import DEFAULT_GPUS_PER_NODE
        from shardlab.export.slurm import default_per_node, launch_line_per_node

        launch = launch_line_per_node(doc["run"])
        if "gpus_per_node" in f and not launch:     # the framework's own line said it (torchrun --nnodes 2, ...)
            pass
        elif launch:
            per = whole(launch.group(1), "--nproc-per-node (the run command)", 1, L.MAX_GPUS_PER_NODE)
            f["gpus_per_node"] = per
            if inner.source != "vllm":
                f["gpus"] = nodes * per
            und.append((f"--nproc-per-node {per} × num_nodes {nodes}", f"{per} GPUs per node"))
        elif inner.source == "vllm":
            f["gpus_per_node"] = DEFAULT_GPUS_PER_NODE
            und.append(("no resources.accelerators",
                        f"{DEFAULT_GPUS_PER_NODE} GPUs per node (shardlab's default node)"))
            per_node_replicas(f, und, nodes, DEFAULT_GPUS_PER_NODE)
        else:
            default_per_node(f, und, nodes, "num_nodes")
    f["spot"] = spot
    return Imported("skypilot", f, tuple(und), inner.ignored + tuple(ign), inner.framework)
