"""shardlab export: a plan or a layout as a framework's own files; and the hooks that let plan export its winner
(--export) and estimate/memory/plan read a framework file (--from, ``cli.from_file``)."""

from __future__ import annotations

import argparse
import json
import os

from shardlab.cli.common import add_estimate_args, add_output_args, positive_int

TARGETS = ("torchtitan", "megatron", "deepspeed", "accelerate", "vllm", "sglang", "tensorrt-llm", "slurm", "skypilot",
           "shardlab")
EXAMPLES = """examples:
  shardlab plan --json > plan.json && shardlab export --to torchtitan --plan plan.json --out job.toml
  shardlab export --to megatron llama-3.1-70b --gpus 64 --tp 8 --pp 2 --zero 1 --global-batch 512 --out run.sh
  shardlab export --to deepspeed llama-3.1-8b --gpus 16 --zero 3 --global-batch 256 --json
  shardlab export --to vllm llama-3.1-70b --inference --tp 4 --batch 32 --prompt-len 2048 --output-len 256
  shardlab export --to slurm --plan plan.json --launch megatron --out job.sbatch
  shardlab plan --export skypilot --out task.yaml         # the winner, straight to a SkyPilot task
  shardlab estimate --from job.toml                        # read a framework file back and estimate it
"""


def register(sub) -> None:
    from shardlab.cli.plan_args import add_assumption_args, add_inference_args

    p = sub.add_parser("export", help="write a plan or layout as a framework's config (torchtitan, megatron, "
                                      "deepspeed, accelerate, vllm, sglang, tensorrt-llm, slurm, skypilot)",
                       description="Turn a layout (flags, or the winner of `shardlab plan --json` with --plan) into the "
                                   "file a framework runs; say what the framework could not express, and refuse "
                                   "layouts it cannot run. Read such files back with `shardlab estimate --from FILE`.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--to", required=True, choices=TARGETS, help="target framework or launcher")
    add_estimate_args(p)
    g = p.add_argument_group("export")
    g.add_argument("--plan", metavar="FILE", help="a `shardlab plan --json` document: export its winner")
    g.add_argument("--rank", type=positive_int, default=None,
                   help="with --plan: which plan (1 = the best; default: the plan's winner, the best disaggregated "
                        "layout where a serving plan's comparison says splitting prefill and decode wins)")
    add_export_file_args(g)
    g.add_argument("--spot", action="store_true", help="skypilot: ask for spot instances (and price them so)")
    add_assumption_args(p)
    add_inference_args(p)
    add_output_args(p)
    from shardlab.cli.from_file import add_from_arg, with_from

    add_from_arg(p)                      # a shardlab job file (or a framework's) as FILE or --from FILE
    p.set_defaults(func=with_from(p, cmd_export))


def add_export_file_args(g, default_out: str = "print it") -> None:
    g.add_argument("--out", metavar="PATH", default=None,
                   help=f"write the file here; an existing file is kept unless --force (default: {default_out})")
    g.add_argument("--force", action="store_true", help="with --out: replace an existing file of that name")
    g.add_argument("--launch", choices=("torchtitan", "megatron", "deepspeed", "accelerate", "vllm", "shardlab"),
                   default=None,
                   help="slurm/skypilot: the framework each node runs (default: the plan's, or --framework's; torchtitan "
                        "when that is none of these; vllm to serve; shardlab: `shardlab run train` on the layout)")


# ---- building the job ----------------------------------------------------------------------------
def window_refusal(target: str):
    """The one line for --sliding-window-cache where the launch file cannot set a per-layer window."""
    from shardlab.errors import ShardlabError

    return ShardlabError(f"--sliding-window-cache: the {target} launch file does not set a per-layer attention window "
                         "yet, so the engine it starts would keep every token; drop the flag to export what that "
                         "engine runs")


def serving_engine(args):
    """(engine profile, framework id) of a serving export: the engine the file runs (sglang, tensorrt-llm) prices its
    KV blocks unless --framework names another; vllm otherwise. shardlab's job file carries the engine (and version)
    the job was priced with (--engine, or the file's [framework] name)."""
    from shardlab.cli.inference_args import engine_from_args

    to = getattr(args, "to", None)
    if to in ("sglang", "tensorrt-llm") and getattr(args, "framework", None) is None:
        args.framework = to
    if getattr(args, "sliding_window_cache", False) and to in ("sglang", "tensorrt-llm"):   # vLLM keeps windows itself
        raise window_refusal(to)
    engine = engine_from_args(args)
    return engine, to if to in ("sglang", "tensorrt-llm") else engine.id if to == "shardlab" else "vllm"


def serving_not_carried(args) -> dict:
    """``{'serving_not_carried': {...}}``: the serving flags set that no launch file carries (``recipe_unsupported``
    lists them, ``export.job.SERVING_NOT_CARRIED`` says why)."""
    from shardlab.export.job import SERVING_NOT_CARRIED

    vals = {k: getattr(args, k, None) for k in SERVING_NOT_CARRIED}
    vals = {k: v for k, v in vals.items() if v not in (None, False, 0, 0.0)}
    return {"serving_not_carried": vals} if vals else {}


def job_from_args(args, cat):
    """A LaunchJob from the estimate flags (training) or the inference flags."""
    from shardlab.cli.common import cluster_from_args, resolve_gpu, resolve_model
    from shardlab.cli.inference_args import precision_from_args
    from shardlab.cli.plan_cmds import training_estimate_from_args
    from shardlab.errors import ShardlabError
    from shardlab.estimate.inference import estimate_inference
    from shardlab.export.build import price_notes
    from shardlab.export.job import LaunchJob, Serve
    from shardlab.layout import Layout
    from shardlab.layout_checks import validate

    spot = getattr(args, "spot", False)
    if args.inference:
        spec, _ = resolve_model(args, cat)
        if spec is None:
            raise ShardlabError("export needs a model's shapes: give MODEL, not --params")
        from shardlab.cli.inference_args import case_kw, replica_gpus

        if getattr(args, "disaggregated", None):
            from shardlab.cli.disagg_cmds import export_job

            return export_job(args, cat, spec)
        group = replica_gpus(args)
        gpus = args.gpus or group
        if gpus % group:
            raise ShardlabError(f"--gpus {gpus} is not a multiple of tp×pp = {group}")
        replicas = gpus // group
        per = -(-args.batch // replicas)
        cluster = cluster_from_args(args, cat, group)
        import dataclasses

        engine, fw = serving_engine(args)
        prec = asked = precision_from_args(args, cluster.accelerator, spec)
        served_16bit = ("int4", "int8") + (("fp4",) if fw in ("vllm", "sglang") else ())
        if prec.weights in served_16bit and spec.checkpoint_weights != prec.weights:
            # the file serves the bf16 checkpoint (vllm.py says why): predict that
            prec = dataclasses.replace(prec, weights="bf16", group_size=None, activations="bf16",
                                       weights_from_checkpoint=False)
        moe = {k: v for k, v in case_kw(args, spec, cat).items() if k not in ("speculation", "draft_spec")}
        est = estimate_inference(spec, cluster, tp=args.tp, pp=args.pp, batch=per, prompt_len=args.prompt_len,
                                 output_len=args.output_len, precision=prec, engine=engine, **moe)
        blocks = int(est.case.blocks.num_blocks)   # the serving model's KV allocation (memory.inference.kv_blocks)
        lay = validate(Layout(tp=args.tp, pp=args.pp), spec)
        cap = min(per, args.max_num_seqs or per)     # --max-num-seqs caps the sequences each replica runs at once
        return LaunchJob(spec.name, lay, args.prompt_len + args.output_len, per,
                         "fp16-mixed" if asked.weights == "fp16" else args.precision, gpu=cluster.accelerator.id,
                         gpus_per_node=cluster.gpus_per_node, framework=fw,
                         serve=Serve(cap, args.prompt_len, args.output_len, replicas, kv_blocks=blocks,
                                     gpu_memory_utilization=engine.gpu_memory_utilization,
                                     kv_cache_dtype="fp8" if prec.kv_cache == "fp8" else "auto",
                                     weights=asked.weights, group_size=asked.group_size, activations=asked.activations,
                                     weights_from_checkpoint=asked.weights_from_checkpoint, ep=est.case.ep,
                                     dp_attention=est.case.attention_dp, load=getattr(args, "file_load", None)),
                         notes={**price_notes(cat, cluster.accelerator.id, spot), **serving_not_carried(args)})
    est = training_estimate_from_args(args, cat)
    from shardlab.export.job import assumptions_of, recipe_notes

    notes = {"step_time_s": est.step_time_s, "scored_for": est.workload.framework,
             **price_notes(cat, resolve_gpu(args, cat), spot),
             **recipe_notes(getattr(args, "offload", "none"), getattr(args, "lora_rank", None),
                            getattr(args, "quantize_base", "none"), getattr(args, "offload_device", None),
                            getattr(args, "lora_targets", None))}
    if getattr(est, "train_time_s", None):
        notes.update(train_hours=est.train_time_s / 3600, tokens=est.tokens)
    return LaunchJob(est.model.name, est.layout, est.workload.seq_len, est.workload.global_batch, est.workload.precision,
                     est.workload.optimizer, est.accelerator.id, est.cluster.gpus_per_node,
                     framework=getattr(args, "framework", None), notes=notes,
                     grad_reduce_bytes=est.workload.grad_reduce_bytes or None, dropout=bool(est.workload.dropout),
                     tp_comm_overlap=est.workload.tp_comm_overlap,
                     inter_node_gbit=getattr(args, "inter_node_gbit", None),
                     assumptions=assumptions_of(flash_attention=not getattr(args, "no_flash_attention", False),
                                                compile=getattr(args, "compile", None),
                                                dp_overlap=not getattr(args, "no_dp_overlap", False),
                                                attention_kernel=getattr(args, "attention_kernel", None),
                                                fused_loss=getattr(args, "fused_loss", None)),
                     fp8_params=est.workload.fp8_params, moe_dispatcher=est.workload.moe.dispatcher,
                     ep_comm_overlap=est.workload.moe.ep_comm_overlap,
                     expert_imbalance=est.workload.moe.expert_imbalance)


def _render(job, cat, target: str, inner: str | None, cluster, spec=None):
    """(the job with its notes for the framework the file runs, the rendered Export). ``spec``: the model when it
    came from a file or hf: id (``job.model`` is then its name, not a catalog id)."""
    from dataclasses import replace

    from shardlab.export import render
    from shardlab.export.job import recipe_unsupported
    from shardlab.export.retarget import retarget

    spec = spec or cat.model(job.model)
    if job.serve is None and cluster is not None:
        job = retarget(job, spec, target, inner, cat, cluster)
    exp = render(job, spec, target, inner)
    return job, replace(exp, unsupported=exp.unsupported + recipe_unsupported(job, inner or target))


def _plan_cluster(doc: dict, cat, job):
    """The plan document's cluster (its GPUs and links) for re-estimating its winner."""
    from shardlab.specs.hardware import Cluster

    from shardlab.specs.hardware import per_node_gbit, per_node_rate

    def link(lid: str):          # a link at --inter-node-gbit N: '<catalog id>@<N>gbit-per-node'
        rated = per_node_gbit(lid)
        return per_node_rate(cat.link(rated[0]), rated[1], job.gpus_per_node) if rated else cat.link(lid)

    acc = cat.accelerator(job.gpu)
    return Cluster(accelerator=acc, num_gpus=job.gpus, gpus_per_node=job.gpus_per_node,
                   intra_link=link(doc.get("intra_link") or acc.system["intra_link"]),
                   inter_link=link(doc.get("inter_link") or acc.system["inter_link"]))


def check_export_out(out: str, force: bool) -> None:
    """An export never writes through a symbolic link (dangling or not), and replaces an existing file only with
    --force: a README or a script named by mistake is kept."""
    from shardlab.errors import ShardlabError

    if os.path.islink(out):
        raise ShardlabError(f"--out {out} is a symbolic link; shardlab never writes through one: give the file's own "
                            f"path or a new name")
    if os.path.lexists(out) and not force:
        raise ShardlabError(f"--out {out} exists and was kept; add --force to replace it, or give a new name")


def _write(exp, job, out: str | None, as_json: bool, force: bool = False):
    from shardlab.export import to_json
    from shardlab.export.retarget import retarget_line
    from shardlab.render.table import table

    if out:
        from shardlab.safeout import write_text

        check_export_out(out, force)
        write_text(out, exp.text, "--out")
    if out:
        from dataclasses import replace

        exp = replace(exp, launch=exp.launch.replace(exp.filename, out))
    doc = to_json(exp, out, job)
    note = retarget_line(job)
    if note:
        doc["retarget"] = job.notes["retarget"]
    if not out and not as_json:
        if note:
            import sys

            sys.stderr.write(note + "\n")
        from shardlab.render.table import KEEP

        # the file itself: never wrapped to the terminal's width (a wrapped comment line is a command in a script)
        return doc, "\n".join(KEEP + line for line in exp.text.rstrip("\n").split("\n"))
    rows = [[u.setting, str(u.value), u.why] for u in exp.unsupported] or [["(none)", "", "every setting carried over"]]
    text = "\n".join([f"wrote {out} ({exp.kind}; checked against {exp.checked_against})" if out else exp.kind,
                      f"launch: {exp.launch}", *([note] if note else []), "",
                      table(["could not express", "value", "why / what the framework does instead"], rows, align="lll")])
    return doc, text


def cmd_export(args):
    from shardlab.cli.plan_cmds import _catalog
    from shardlab.errors import ShardlabError
    from shardlab.export.build import check_job, job_from_plan, plan_model

    cat = _catalog(args)
    if args.plan:
        if args.model:
            raise ShardlabError("give MODEL and layout flags, or --plan FILE, not both")
        from shardlab.safeio import load_json

        doc = load_json(args.plan, "--plan (a `shardlab plan --json` document)")
        try:     # a tampered or hand-edited plan: a field of the wrong type is one line, never a traceback
            spec = plan_model(doc, cat)
            job = check_job(job_from_plan(doc, cat, args.rank, spec), spec, f"--plan {args.plan}")
            if not job.serve:
                from shardlab.export import check_fields
                from shardlab.export.job import job_fields

                check_fields(job_fields(job), f"--plan {args.plan}")
            if args.spot and job.notes:
                from shardlab.export.build import price_notes

                for k in ("usd_per_gpu_hour", "price_source"):     # the plan's on-demand price is not the spot price
                    job.notes.pop(k, None)
                job.notes.update(price_notes(cat, job.gpu, True))
            cluster = None if job.serve else _plan_cluster(doc, cat, job)
            fw, prec = doc.get("framework"), (doc.get("workload") or {}).get("precision")
            if not (fw is None or isinstance(fw, str) or isinstance(fw, dict) and isinstance(fw.get("id"), str)):
                raise TypeError("framework must be a name, or an object with an id")
            if prec is not None and not isinstance(prec, str):
                raise TypeError("workload.precision must be a name")
            job, exp = _render(job, cat, args.to, args.launch, cluster, spec)
            return _write(exp, job, args.out, args.json, args.force)
        except ShardlabError:
            raise
        except (AttributeError, TypeError, ValueError, KeyError, IndexError, ArithmeticError) as e:
            raise ShardlabError(f"--plan {args.plan} is not a `shardlab plan --json` document as written "
                                f"({type(e).__name__}: {str(e)[:100]}); regenerate it with shardlab plan --json") from None
    else:
        from shardlab.cli.common import cluster_from_args

        job = job_from_args(args, cat)
        cluster = None if job.serve else cluster_from_args(args, cat, job.gpus)
    job, exp = _render(job, cat, args.to, args.launch, cluster, cat.model(args.model) if args.model else None)
    return _write(exp, job, args.out, args.json, args.force)


# ---- plan --export -------------------------------------------------------------------------------
def add_plan_export_args(p) -> None:
    g = p.add_argument_group("export the winner")
    g.add_argument("--export", choices=TARGETS, default=None, metavar="TARGET",
                   help=f"write the best plan as a framework file ({', '.join(TARGETS)})")
    g.add_argument("--save", default=None, metavar="FILE",
                   help="write the best plan as a shardlab job file (= --export shardlab --out FILE); "
                        "`shardlab estimate FILE` gives its step time back")
    add_export_file_args(g, "the file name the export gives, in the current directory; an existing file there is "
                            "never replaced")


def with_export(fn):
    """Wrap `plan`'s handler: with --export, write the winner's file and add it to the output."""

    def handler(args):
        if getattr(args, "save", None):
            from shardlab.errors import ShardlabError

            if args.export not in (None, "shardlab") or (args.out and args.out != args.save):
                raise ShardlabError("--save FILE writes a shardlab job file; drop --export/--out, or use --export "
                                    "TARGET --out FILE for a framework's file")
            args.export, args.out = "shardlab", args.save
        if not getattr(args, "export", None) and (getattr(args, "out", None) or getattr(args, "launch", None)):
            from shardlab.errors import ShardlabError

            raise ShardlabError("--out and --launch say where and how to write an export: add --export TARGET")
        if getattr(args, "export", None) in ("sglang", "tensorrt-llm") and getattr(args, "sliding_window_cache", False):
            raise window_refusal(args.export)
        doc, text = fn(args)
        if not getattr(args, "export", None):
            return doc, text
        from shardlab.cli.plan_cmds import _catalog
        from shardlab.export.build import job_from_plan

        if not doc.get("plans"):
            from shardlab.errors import ShardlabError

            raise ShardlabError(f"no layout fits, so --export {args.export} wrote nothing; run the same plan without "
                                f"--export to see why (rejections), then add GPUs or change the workload")
        cat = _catalog(args)
        plan = json.loads(json.dumps(doc, default=str))
        spec = cat.model(args.model) if getattr(args, "model", None) else None
        # the winner: disaggregated where the comparison says so, unless a launcher (one command per node) writes it
        job = job_from_plan(plan, cat, 1 if args.export in ("slurm", "skypilot") else None, spec)
        if job.serve is not None:          # the serving flags the plan priced that no file carries
            from dataclasses import replace

            job = replace(job, notes={**job.notes, **serving_not_carried(args)})
        job, exp = _render(job, cat, args.export, args.launch, None if job.serve else _plan_cluster(plan, cat, job), spec)
        out = args.out or exp.filename
        if not args.out and os.path.lexists(out) and not args.force:
            from shardlab.errors import ShardlabError

            raise ShardlabError(f"--export {args.export} would write {out}, which exists and was kept: give --out PATH "
                                f"(a new name), or add --force to replace it")
        edoc, etext = _write(exp, job, out, True, args.force)
        doc["export"] = edoc
        return doc, text + "\n\n" + etext

    return handler


def hook(p, fn, export: bool = False) -> None:
    """Give a command --from FILE (and, for plan, --export TARGET/--out/--launch) around its handler ``fn``."""
    from shardlab.cli.from_file import add_from_arg, with_from

    add_from_arg(p)
    if export:
        add_plan_export_args(p)
        fn = with_export(fn)
    p.set_defaults(func=with_from(p, fn))
