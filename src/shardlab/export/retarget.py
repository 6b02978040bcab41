"""The step time of an exported file as the framework that runs it would take, when the plan was scored for another.

A plan scored for Megatron-LM and exported as a torchtitan job runs torchtitan's kernels, host time and FSDP
schedule, not Megatron-LM's: the same layout can be much slower (or faster). The exported file is read back as
``shardlab estimate --from FILE`` reads it, estimated under the target's framework profile, and that time (with the
plan's own beside it) goes into the file's header, the cost of a SkyPilot task and the command's output.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.errors import ShardlabError
from shardlab.export.job import LaunchJob
from shardlab.export.launcher import RUNS_AS, default_inner


def runs_as(job: LaunchJob, target: str, inner: str | None) -> str | None:
    """The framework profile of what the exported file runs (None for serving or an unknown inner target)."""
    from shardlab.export import LAUNCHERS

    if job.serve is not None:
        return None
    return RUNS_AS.get((inner or default_inner(job)) if target in LAUNCHERS else target)


def retarget(job: LaunchJob, spec, target: str, inner: str | None, catalog, cluster) -> LaunchJob:
    """``job`` with its notes re-estimated for the framework the file runs, when the plan was scored for another
    framework (not a variant calibrated from the file's); otherwise ``job`` unchanged. ``cluster``: the plan's GPUs
    and links."""
    from shardlab.estimate.training import DEFAULT_FRAMEWORK, estimate_training
    from shardlab.export import read_text, render
    from shardlab.export.build import job_from_fields

    fw, before = runs_as(job, target, inner), job.notes.get("step_time_s")
    scored = job.notes.get("scored_for") or job.framework or DEFAULT_FRAMEWORK
    if fw is None or not before or scored == fw or scored.startswith(fw + "-"):   # the same, or calibrated from it
        return job
    try:
        if job.notes.get("recipe"):
            raise ShardlabError(f"the file does not carry the plan's {', '.join(job.notes['recipe'])}")
        imp = read_text(render(job, spec, target, inner).text, catalog, target)   # what `estimate --from FILE` reads
        back = job_from_fields({"gpus": job.gpus, **imp.fields}, catalog, base=job)
        if back.layout.world_size != job.gpus:
            raise ShardlabError(f"the file's layout spans {back.layout.world_size} GPUs, not {job.gpus}")
        # the batch and sequence are the training script's where the file cannot carry them (an Accelerate config)
        from shardlab.comm.moe_dispatch import MoeDispatch

        est = estimate_training(spec, back.layout, cluster, seq_len=job.seq_len, global_batch=job.global_batch,
                                precision=back.precision, framework=catalog.framework(fw),
                                # the optimizer the file runs where it names one (DeepSpeed's "Adam" for 8-bit Adam)
                                optimizer=back.optimizer if "optimizer" in imp.fields else job.optimizer,
                                tp_comm_overlap=back.tp_comm_overlap,
                                moe=MoeDispatch(back.moe_dispatcher, back.ep_comm_overlap, job.expert_imbalance))
    except ShardlabError as e:
        notes = {**job.notes, "retarget": {"framework": fw, "scored_for": scored, "error": str(e)}}
        return replace(job, notes=notes)
    ratio = est.step_time_s / before
    notes = {**job.notes, "step_time_s": est.step_time_s,
             "retarget": {"framework": fw, "scored_for": scored, "scored_step_time_s": before,
                          "step_time_s": est.step_time_s, "fits": bool(est.memory.fits)}}
    if notes.get("train_hours"):
        notes["train_hours"] *= ratio
    return replace(job, notes=notes)


def retarget_line(job: LaunchJob) -> str | None:
    """One line for the command's output (None when the plan's framework is the file's)."""
    r = job.notes.get("retarget")
    if not r:
        return None
    if "error" in r:
        return (f"note: this file runs {r['framework']}, but its step time was not re-estimated ({r['error']}); the time "
                f"given is {r['scored_for']}'s")
    fits = "" if r["fits"] else " and, as the file reads back, does not fit in GPU memory"
    return (f"note: this file runs {r['framework']}: an estimated {r['step_time_s']:.2f} s/step, "
            f"{r['step_time_s'] / r['scored_step_time_s']:.2f}× the {r['scored_step_time_s']:.2f} s the layout was estimated "
            f"at under {r['scored_for']}{fits}; `shardlab plan --framework {r['framework']}` searches the layouts "
            f"{r['framework']} runs best")
