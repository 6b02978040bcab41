"""One published run as a `shardlab estimate` command: the flags that state its settings, and its model as a file.

``shardlab validate --run ID`` prints them with the estimate, so a user can rerun any validation row through the
ordinary CLI (and change one setting at a time); ``tests/test_validation.py`` runs every row's command and checks it
reproduces the validation's prediction exactly.
"""

from __future__ import annotations

import dataclasses

from shardlab.validation import PublishedRun, predict_inputs, run_spec


def model_yaml(spec) -> str:
    """The ModelSpec as a YAML model file (fields that differ from the defaults), readable by every MODEL argument."""
    import yaml

    from shardlab.specs.model import ModelSpec

    defaults = {f.name: f.default for f in dataclasses.fields(ModelSpec) if f.default is not dataclasses.MISSING}
    d = {k: v for k, v in dataclasses.asdict(spec).items() if k != "name" and (k not in defaults or v != defaults[k])}
    return yaml.safe_dump({"models": {spec.name or "published-run": d}}, sort_keys=False, width=120)


def estimate_argv(run: PublishedRun, catalog, model_path: str | None = None) -> list[str]:
    """``shardlab estimate`` arguments that state ``run``'s settings (model: its catalog id, or ``model_path``)."""
    spec, lay, cluster, kw = predict_inputs(run, catalog)
    c = run.config
    model = c["model"] if isinstance(c["model"], str) else (model_path or f"{run.id}.yaml")
    argv = [model, "--framework", run.framework, "--gpu", run.gpu, "--gpus", str(c["gpus"]),
            "--gpus-per-node", str(cluster.gpus_per_node), "--intra-link", c.get("intra_link", cluster.intra_link.id),
            "--inter-link", c.get("inter_link", cluster.accelerator.system["inter_link"])]
    if c.get("inter_node_gbit"):
        argv += ["--inter-node-gbit", str(c["inter_node_gbit"])]
    for flag, value, default in (("--tp", lay.tp, 1), ("--pp", lay.pp, 1), ("--cp", lay.cp, 1), ("--ep", lay.ep, 1),
                                 ("--vpp", lay.vpp, 1), ("--dp-replicate", lay.dp_replicate, 1), ("--etp", lay.etp, 0)):
        if value != default:
            argv += [flag, str(value)]
    if lay.pp > 1:
        argv += ["--schedule", lay.schedule]
    if lay.sequence_parallel:
        argv.append("--sequence-parallel")
    argv += ["--zero", str(lay.zero), "--micro-batch", str(lay.micro_batch), "--global-batch", str(kw["global_batch"]),
             "--seq-len", str(kw["seq_len"]), "--recompute", lay.recompute, "--precision", kw["precision"]]
    if lay.recompute_modules:
        argv += ["--recompute-modules", ",".join(lay.recompute_modules)]
    if lay.recompute_fraction != 1.0:
        argv += ["--recompute-fraction", f"{lay.recompute_fraction:g}"]
    if kw["compile"]:
        argv.append("--compile")
    if "recipe" in kw and kw["recipe"].fp8.primary_weights:
        argv.append("--fp8-params")                  # FP8 primary weights, gathered in FP8
    elif "recipe" in kw and kw["recipe"].fp8.all_gather:
        argv.append("--fp8-all-gather")
    if kw.get("tp_comm_overlap"):
        argv.append("--tp-comm-overlap")
    moe = kw.get("moe")
    if moe is not None and moe.dispatcher != "alltoall":
        argv += ["--moe-dispatcher", moe.dispatcher]
    if moe is not None and moe.ep_comm_overlap:
        argv.append("--ep-comm-overlap")
    if moe is not None and moe.expert_imbalance != 1.0:
        argv += ["--expert-imbalance", f"{moe.expert_imbalance:g}"]
    if kw["attention_kernel"]:
        argv += ["--attention-kernel", kw["attention_kernel"]]
    if kw["fused_loss"] is not None:
        argv.append("--fused-loss" if kw["fused_loss"] else "--no-fused-loss")
    if kw["grad_reduce_bytes"]:
        argv.append("--grad-reduce-fp32" if kw["grad_reduce_bytes"] == 4 else "--grad-reduce-bf16")
    if kw["flash_attention"] is False:
        argv.append("--no-flash-attention")
    if kw["dropout"]:
        argv.append("--dropout")
    if kw["dp_overlap"] is False:
        argv.append("--no-dp-overlap")
    return argv


def metric_from_estimate_doc(run: PublishedRun, doc: dict) -> float:
    """The run's metric from `shardlab estimate --json` output (validation.predicted_metric on the JSON)."""
    if run.metric == "tokens_per_s_per_gpu":
        return doc["tokens_per_s"] / doc["gpus"]
    return doc["hardware_tflops_per_gpu"] if run.convention == "hardware" else doc["model_tflops_per_gpu"]


def needs_model_file(run: PublishedRun) -> bool:
    return not isinstance(run.config["model"], str)


def run_model_yaml(run: PublishedRun, catalog) -> str | None:
    """The run's model as YAML when it is not a catalog id (shape shorthand of the validation data), else None."""
    return model_yaml(run_spec(run, catalog)) if needs_model_file(run) else None
