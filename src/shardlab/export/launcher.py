"""What the cluster launchers (slurm, skypilot) run on each node: the framework file written by a heredoc and the
framework's start command behind torchrun's rendezvous flags; and the inverse (find the embedded file or command
in a launcher script and read it with its own target's reader)."""

from __future__ import annotations

import re

from shardlab.errors import ShardlabError

INNER = ("torchtitan", "megatron", "deepspeed", "accelerate", "vllm", "shardlab")
EOF_MARK = "SHARDLAB_EOF"
INSTALL = {"torchtitan": "pip install torchtitan==0.2.2", "deepspeed": "pip install deepspeed==0.19.8",
           "accelerate": "pip install accelerate==1.15.0", "vllm": "pip install vllm==0.11.0",
           "megatron": "git clone --branch core_r0.16.0 https://github.com/NVIDIA/Megatron-LM && cd Megatron-LM && pip install -e .",
           "shardlab": "pip install torch==2.13.0 && pip install -e '.[runtime]'"}


RUNS_AS = {"torchtitan": "torchtitan", "megatron": "megatron-lm", "deepspeed": "deepspeed", "accelerate": "pytorch-fsdp"}
"""Training target (or launcher --launch) -> the catalog framework profile that describes how it trains."""


def default_inner(job) -> str:
    """What a launcher runs by default: the target of the job's framework (torchtitan when none is), vllm to serve."""
    if job.serve is not None:
        return "vllm"
    return {fw: target for target, fw in RUNS_AS.items()}.get(job.framework or "", "torchtitan")


def heredoc(filename: str, text: str) -> str:
    return f"cat > {filename} <<'{EOF_MARK}'\n{text.rstrip()}\n{EOF_MARK}\n"


def node_commands(job, spec, inner: str, torchrun: str, accelerate_rank: str, head: str):
    """(shell lines that write the framework file, the command each node runs, the inner Export)."""
    from shardlab.export import render

    if inner not in INNER:
        raise ShardlabError(f"--launch {inner}: choose one of {', '.join(INNER)}")
    if inner == "vllm" and job.serve is not None and job.nodes > 1 and \
            job.layout.tp * job.layout.pp <= job.gpus_per_node:
        # a replica fits a node: every node serves its own replicas (vLLM's data parallelism is per node here)
        import dataclasses

        from shardlab.export.job import Refused, Unsupported

        group = job.layout.tp * job.layout.pp
        per_node = job.gpus_per_node // group
        if per_node * job.nodes != job.serve.replicas:
            raise Refused(f"{job.serve.replicas} replicas of TP×PP {group} do not spread evenly over {job.nodes} nodes of "
                          f"{job.gpus_per_node} GPUs ({per_node} fit on each): use a TP×PP that divides "
                          f"{job.gpus_per_node}, or --gpus {per_node * job.nodes * group}")
        node_job = dataclasses.replace(job, serve=dataclasses.replace(job.serve, replicas=per_node))
        exp = render(node_job, spec, inner)
        note = Unsupported("replicas", job.serve.replicas, f"each of the {job.nodes} nodes runs its own vllm serve of "
                                                          f"{per_node} replica(s) with its own endpoint: put a load "
                                                          f"balancer in front")
        exp = dataclasses.replace(exp, unsupported=(*exp.unsupported, note))
        return "", _vllm_command(exp.text), exp
    if inner == "shardlab":
        exp = runtime_export(job, accelerate_rank, head)
        return "", exp.text, exp
    inner_exp = render(job, spec, inner)
    fn = inner_exp.filename
    if inner == "torchtitan":
        return heredoc(fn, inner_exp.text), f"{torchrun} -m torchtitan.train --job.config_file {fn}", inner_exp
    if inner == "megatron":
        body = inner_exp.text.split("pretrain_gpt.py", 1)[1]
        return "", f"{torchrun} pretrain_gpt.py{body.rstrip()}", inner_exp
    if inner == "deepspeed":
        return heredoc(fn, inner_exp.text), f"{torchrun} train.py --deepspeed --deepspeed_config {fn}", inner_exp
    if inner == "accelerate":
        cmd = (f"accelerate launch --config_file {fn} --num_machines {job.nodes} --num_processes {job.gpus} "
               f"--machine_rank {accelerate_rank} --main_process_ip {head} --main_process_port 29500 train.py")
        return heredoc(fn, inner_exp.text), cmd, inner_exp
    return "", _vllm_command(inner_exp.text), inner_exp


SLURM_RANK = "$SLURM_NODEID"
"""The node-rank variable the Slurm launcher passes; ``shardlab run train`` reads Slurm's environment itself."""
RUNTIME_STEPS = 10
"""Steps of the exported runtime job: step 0 measures memory, step 1 records the collectives, the rest are timed."""


def runtime_strategy(layout) -> tuple[str, list[str]]:
    """``shardlab run train``'s --strategy and degree flags for a layout: fsdp for ZeRO-3 (else ddp when data-parallel),
    tp-megatron beside ddp or DTensor tp under fsdp, pp, and ddp+ep for experts (combinations the runtime's
    ``runtime.parallel.strategy`` accepts; ``runtime_export`` refuses experts beside tp, pp or fsdp as it does)."""
    parts, flags = [], []
    if layout.zero == 3:
        parts.append("fsdp")
    elif layout.dp > 1 or layout.ep > 1:
        parts.append("ddp")
    if layout.tp > 1:
        parts.append("tp" if "fsdp" in parts else "tp-megatron")
        flags += ["--tp", str(layout.tp)]
    if layout.pp > 1:
        parts.append("pp")
        flags += ["--pp", str(layout.pp)]
    if layout.ep > 1:
        parts.append("ep")
        flags += ["--ep", str(layout.ep)]
    return "+".join(parts) or "ddp", flags


def runtime_export(job, rank: str, head: str):
    """The ``shardlab run train`` line each node runs (``--launch shardlab``): the plan's layout on the runtime's small
    GPT (the layout is what it checks; the model's size is the estimate's business), every rank's memory, step time
    and collectives measured against the predictions. Under Slurm the command reads SLURM_* for its rendezvous (a
    static one: Slurm's node ids are the node ranks); elsewhere it gets the node rank and the head node's address."""
    from shardlab.export.job import Export, Refused, Unsupported

    if job.serve is not None:
        raise Refused("--launch shardlab runs training layouts (shardlab run train); a serving job launches vllm")
    strategy, flags = runtime_strategy(job.layout)
    lay = job.layout
    if lay.cp > 1:
        raise Refused(f"--launch shardlab: the runtime has no context parallelism (cp {lay.cp}); export this layout to a "
                      "framework instead (--launch megatron or torchtitan)")
    if lay.ep > 1 and (lay.tp > 1 or lay.pp > 1 or lay.zero == 3):
        # the runtime's rule (runtime.parallel.strategy): experts run split over data-parallel ranks only
        raise Refused(f"--launch shardlab: the runtime runs expert parallelism as ddp+ep only, not {strategy}; export "
                      "this layout to a framework instead (--launch megatron)")
    device = "cpu" if job.gpu.startswith("cpu") else "cuda"
    cmd = ["shardlab", "run", "train", "--strategy", strategy, *flags, "--nproc-per-node", str(job.procs_per_node),
           "--steps", str(RUNTIME_STEPS), "--device", device]
    if job.nodes > 1 and rank != SLURM_RANK:
        cmd += ["--nodes", str(job.nodes), "--node-rank", rank, "--rdzv-endpoint", f"{head}:29500"]
    cmd.append("--json")
    notes = (Unsupported("model", job.model, "the runtime runs the layout on its own small GPT (fp32): it checks the "
                                             "layout's memory, collectives and step times against the predictions, "
                                             "not the model's"),)
    if lay.zero in (1, 2):
        notes += (Unsupported("zero", lay.zero, "the runtime shards with FSDP (ZeRO-3) or not at all: ddp here"),)
    if lay.vpp > 1:
        notes += (Unsupported("vpp", lay.vpp, "the line runs 1F1B; add --schedule interleaved --vpp N to run the "
                                              "interleaved schedule"),)
    if lay.dp_replicate > 1:
        notes += (Unsupported("dp_replicate", lay.dp_replicate, "the runtime runs one flat data-parallel group (no HSDP)"),)
    return Export("shardlab", "shardlab run train command", "", " ".join(cmd),
                  "the runtime's strategy rules", notes)


def _vllm_command(text: str) -> str:
    """The `vllm serve ...` command of a vllm export (the command line, not a comment naming it)."""
    return text[re.search(r"^vllm serve ", text, flags=re.M).start():].rstrip()


def per_node_replicas(fields: dict, und: list, nodes: int, gpus_per_node: int | None) -> None:
    """A launcher serving on ``nodes`` nodes whose replicas fit one node runs the vllm command on every node
    (``node_commands``): the replicas in the command are per node."""
    group = fields.get("tp", 1) * fields.get("pp", 1)
    reps = fields.get("replicas", 1)
    if nodes > 1 and gpus_per_node and group * reps <= gpus_per_node:
        fields["replicas"] = reps * nodes
        und.append((f"{reps} replica(s) on each of {nodes} nodes", f"{fields['replicas']} replicas"))


def read_embedded(text: str, catalog):
    """Read the framework file or command a launcher script carries; returns its Imported."""
    from shardlab.export import read_text

    docs = re.findall(rf"<<'{EOF_MARK}'\n(.*?)\n{EOF_MARK}\n", text, flags=re.S)
    if docs:
        return read_text(docs[0], catalog)
    if "pretrain_gpt.py" in text:
        return read_text(text, catalog, "megatron")
    if "vllm serve" in text:
        return read_text(text, catalog, "vllm")
    if re.search(r"^\s*(?:srun\s+)?shardlab run train ", text, flags=re.M):
        return read_runtime_command(text)
    raise ShardlabError("the launcher script carries no framework file or command shardlab can read")


def read_runtime_command(text: str):
    """The layout of a ``shardlab run train`` line (``--launch shardlab``): its strategy's parts and degrees."""
    from shardlab.export.job import Imported

    line = re.search(r"^\s*(?:srun\s+)?shardlab run train .*$", text, flags=re.M)
    words = line.group(0).split() if line else []
    value = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    parts = value.get("--strategy", "ddp").split("+")
    f: dict = {}
    und = []
    for flag in ("--tp", "--pp", "--ep"):
        if flag in value and value[flag].isdigit():
            f[flag[2:]] = int(value[flag])
            und.append((f"{flag} {value[flag]}", f"{flag[2:]} {value[flag]}"))
    if "fsdp" in parts:
        f["zero"] = 3
        und.append(("--strategy fsdp", "ZeRO-3"))
    head = re.search(r"^# shardlab export --to \S+: train (\S+) on (\d+) × (\S+)", text, flags=re.M)
    if head and head.group(2).isdigit() and len(head.group(2)) < 8:   # the runtime runs its own model: the header
        f.update(model=head.group(1), gpus=int(head.group(2)), gpu=head.group(3))   # names the one it was planned for
        und.append((f"header: {head.group(1)} on {head.group(2)} × {head.group(3)}", "model, gpus, gpu"))
    return Imported("shardlab", f, tuple(und), ("the runtime's own small model (--steps, --device)",), None)
