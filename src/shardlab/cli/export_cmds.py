"""shardlab export: a plan or a layout as a framework's own files; and the hooks that let plan export its winner
(--export) and estimate/memory/plan read a framework file (--from)."""

from __future__ import annotations

import argparse
import json

from shardlab.cli.common import add_estimate_args, add_output_args, positive_int

TARGETS = ("torchtitan", "megatron", "deepspeed", "accelerate", "vllm", "slurm", "skypilot")
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
    from shardlab.cli.plan_cmds import _add_assumption_args, _add_inference_args

    p = sub.add_parser("export", help="write a plan or layout as a framework's config (torchtitan, megatron, "
                                      "deepspeed, accelerate, vllm, slurm, skypilot)",
                       description="Turn a layout (flags, or the winner of `shardlab plan --json` with --plan) into the "
                                   "file a framework runs; say what the framework could not express, and refuse "
                                   "layouts it cannot run. Read such files back with `shardlab estimate --from FILE`.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--to", required=True, choices=TARGETS, help="target framework or launcher")
    add_estimate_args(p)
    g = p.add_argument_group("export")
    g.add_argument("--plan", metavar="FILE", help="a `shardlab plan --json` document: export its winner")
    g.add_argument("--rank", type=positive_int, default=1, help="with --plan: which plan (1 = the winner)")
    add_export_file_args(g)
    g.add_argument("--spot", action="store_true", help="skypilot: ask for spot instances (and price them so)")
    _add_assumption_args(p)
    _add_inference_args(p)
    add_output_args(p)
    p.set_defaults(func=cmd_export)


def add_export_file_args(g) -> None:
    g.add_argument("--out", metavar="PATH", default=None, help="write the file here (default: print it)")
    g.add_argument("--launch", choices=("torchtitan", "megatron", "deepspeed", "accelerate", "vllm"), default=None,
                   help="slurm/skypilot: the framework each node runs (default: the plan's, or --framework's; torchtitan "
                        "when that is none of these; vllm to serve)")


# ---- building the job ----------------------------------------------------------------------------
def job_from_args(args, cat):
    """A LaunchJob from the estimate flags (training) or the inference flags."""
    from shardlab.cli.common import cluster_from_args, resolve_gpu, resolve_model
    from shardlab.cli.inference_cmds import engine_from_args, precision_from_args
    from shardlab.cli.plan_cmds import training_estimate_from_args
    from shardlab.errors import ShardlabError
    from shardlab.estimate.inference import estimate_inference
    from shardlab.export.build import price_notes
    from shardlab.export.job import LaunchJob, Serve
    from shardlab.layout import Layout, validate

    spot = getattr(args, "spot", False)
    if args.inference:
        spec, _ = resolve_model(args, cat)
        if spec is None:
            raise ShardlabError("export needs a model's shapes: give MODEL, not --params")
        group = args.tp * args.pp
        gpus = args.gpus or group
        if gpus % group:
            raise ShardlabError(f"--gpus {gpus} is not a multiple of tp×pp = {group}")
        replicas = gpus // group
        per = -(-args.batch // replicas)
        cluster = cluster_from_args(args, cat, group)
        import dataclasses

        prec = asked = precision_from_args(args, cluster.accelerator)
        if prec.weights in ("int4", "int8"):   # the file serves the bf16 checkpoint (vllm.py says why): predict that
            prec = dataclasses.replace(prec, weights="bf16", group_size=None, activations="bf16")
        est = estimate_inference(spec, cluster, tp=args.tp, pp=args.pp, batch=per, prompt_len=args.prompt_len,
                                 output_len=args.output_len, precision=prec, engine=engine_from_args(args))
        blocks = int(est.case.blocks.num_blocks)   # the serving model's KV allocation (memory.inference.kv_blocks)
        lay = validate(Layout(tp=args.tp, pp=args.pp), spec)
        return LaunchJob(spec.name, lay, args.prompt_len + args.output_len, per, args.precision, gpu=cluster.accelerator.id,
                         gpus_per_node=cluster.gpus_per_node, framework="vllm",
                         serve=Serve(per, args.prompt_len, args.output_len, replicas, kv_blocks=blocks,
                                     kv_cache_dtype="fp8" if prec.kv_cache == "fp8" else "auto",
                                     weights=asked.weights),
                         notes=price_notes(cat, cluster.accelerator.id, spot))
    est = training_estimate_from_args(args, cat)
    from shardlab.export.job import recipe_notes

    notes = {"step_time_s": est.step_time_s, "scored_for": est.workload.framework,
             **price_notes(cat, resolve_gpu(args, cat), spot),
             **recipe_notes(getattr(args, "offload", "none"), getattr(args, "lora_rank", None),
                            getattr(args, "quantize_base", "none"))}
    if getattr(est, "train_time_s", None):
        notes.update(train_hours=est.train_time_s / 3600, tokens=est.tokens)
    return LaunchJob(est.model.name, est.layout, est.workload.seq_len, est.workload.global_batch, est.workload.precision,
                     est.workload.optimizer, est.accelerator.id, est.cluster.gpus_per_node,
                     framework=getattr(args, "framework", None), notes=notes,
                     grad_reduce_bytes=est.workload.grad_reduce_bytes or None, dropout=bool(est.workload.dropout))


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
    return job, replace(exp, unsupported=exp.unsupported + recipe_unsupported(job))


def _plan_cluster(doc: dict, cat, job):
    """The plan document's cluster (its GPUs and links) for re-estimating its winner."""
    from shardlab.specs.hardware import Cluster

    acc = cat.accelerator(job.gpu)
    return Cluster(accelerator=acc, num_gpus=job.gpus, gpus_per_node=job.gpus_per_node,
                   intra_link=cat.link(doc.get("intra_link") or acc.system["intra_link"]),
                   inter_link=cat.link(doc.get("inter_link") or acc.system["inter_link"]))


def _write(exp, job, out: str | None, as_json: bool):
    from shardlab.export import to_json
    from shardlab.export.retarget import retarget_line
    from shardlab.report.table import table

    if out:
        from shardlab.safeout import write_text

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
        return doc, exp.text.rstrip("\n")
    rows = [[u.setting, str(u.value), u.why] for u in exp.unsupported] or [["(none)", "", "every setting carried over"]]
    text = "\n".join([f"wrote {out} ({exp.kind}; checked against {exp.checked_against})" if out else exp.kind,
                      f"launch: {exp.launch}", *([note] if note else []), "",
                      table(["could not express", "value", "why / what the framework does instead"], rows, align="lll")])
    return doc, text


def cmd_export(args):
    from shardlab.cli.plan_cmds import _catalog
    from shardlab.errors import ShardlabError
    from shardlab.export.build import job_from_plan, plan_model

    cat = _catalog(args)
    if args.plan:
        if args.model:
            raise ShardlabError("give MODEL and layout flags, or --plan FILE, not both")
        from shardlab.safeio import load_json

        doc = load_json(args.plan, "--plan (a `shardlab plan --json` document)")
        try:     # a tampered or hand-edited plan: a field of the wrong type is one line, never a traceback
            spec = plan_model(doc, cat)
            job = job_from_plan(doc, cat, args.rank, spec)
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
            return _write(exp, job, args.out, args.json)
        except ShardlabError:
            raise
        except (AttributeError, TypeError, ValueError, KeyError, IndexError, OverflowError) as e:
            raise ShardlabError(f"--plan {args.plan} is not a `shardlab plan --json` document as written "
                                f"({type(e).__name__}: {str(e)[:100]}); regenerate it with shardlab plan --json") from None
    else:
        from shardlab.cli.common import cluster_from_args

        job = job_from_args(args, cat)
        cluster = None if job.serve else cluster_from_args(args, cat, job.gpus)
    job, exp = _render(job, cat, args.to, args.launch, cluster, cat.model(args.model) if args.model else None)
    return _write(exp, job, args.out, args.json)


# ---- plan --export -------------------------------------------------------------------------------
def add_plan_export_args(p) -> None:
    g = p.add_argument_group("export the winner")
    g.add_argument("--export", choices=TARGETS, default=None, metavar="TARGET",
                   help=f"write the best plan as a framework file ({', '.join(TARGETS)})")
    add_export_file_args(g)


def with_export(fn):
    """Wrap `plan`'s handler: with --export, write the winner's file and add it to the output."""

    def handler(args):
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
        job = job_from_plan(plan, cat, 1, spec)
        job, exp = _render(job, cat, args.export, args.launch, None if job.serve else _plan_cluster(plan, cat, job), spec)
        out = args.out or exp.filename
        edoc, etext = _write(exp, job, out, True)
        doc["export"] = edoc
        return doc, text + "\n\n" + etext

    return handler


# ---- --from FILE ---------------------------------------------------------------------------------
def add_from_arg(p) -> None:
    p.add_argument("--from", dest="from_file", metavar="FILE", default=None,
                   help="read the layout from a framework file (torchtitan TOML, DeepSpeed JSON, Accelerate YAML, "
                        "Megatron-LM arguments, vllm serve line, Slurm or SkyPilot script)")


ARG_OF = {"model": "model", "gpus": "gpus", "dp": "dp", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "zero": "zero",
          "vpp": "vpp", "micro_batch": "micro_batch", "recompute": "recompute", "sequence_parallel": "sequence_parallel",
          "schedule": "schedule", "stage_layers": "stage_layers", "seq_len": "seq_len", "global_batch": "global_batch",
          "precision": "precision", "gpu": "gpu", "gpus_per_node": "gpus_per_node", "prompt_len": "prompt_len",
          "output_len": "output_len", "max_num_seqs": "batch", "gpu_memory_utilization": "gpu_memory_utilization",
          "weights": "weights", "kv_cache": "kv_cache_dtype"}
GRAD_REDUCE_ARG = {4: "grad_reduce_fp32", 2: "grad_reduce_bf16"}
"""A file's gradient-reduction dtype (bytes) -> the switch of estimate/plan that says the same."""


def apply_import(args, imp, parser) -> None:
    """Set the command's flags from an import; a flag the user set to something else is a conflict (exit 2)."""
    from shardlab.errors import ShardlabError

    f = dict(imp.fields)
    serving = "max_num_seqs" in f or imp.source == "vllm" or (imp.framework == "vllm")
    if serving:
        if not hasattr(args, "inference"):
            raise ShardlabError(f"{args.from_file} is a serving config; read it with `shardlab estimate --from`")
        args.inference = True
        f.pop("gpus", None)
        if f.get("replicas", 1) > 1:
            f["max_num_seqs"] = f.get("max_num_seqs", 1)
    if "dp_from_world" in f and "dp" not in f:
        f.pop("dp_from_world")
    if str(f.get("kv_cache_dtype", "auto")).startswith("fp8"):
        f["kv_cache"] = "fp8"                          # vLLM's fp8 / fp8_e4m3 / fp8_e5m2: one byte per element
    for key, dest in ARG_OF.items():
        if key not in f or not hasattr(args, dest):
            continue
        val = f[key]
        if dest == "stage_layers" and val is not None:
            val = tuple(val)
        cur, default = getattr(args, dest), parser.get_default(dest)
        if dest == "model" and cur is None:
            setattr(args, dest, val)
            continue
        if cur is not None and cur != default and cur != val:
            raise ShardlabError(f"--{dest.replace('_', '-')} {cur} conflicts with {args.from_file} ({key} = {val}); "
                                f"drop the flag or edit the file")
        setattr(args, dest, val)
    _apply_dropout(args, f)
    red = GRAD_REDUCE_ARG.get(f.get("grad_reduce_bytes"))
    if red and hasattr(args, red):
        other = GRAD_REDUCE_ARG[6 - f["grad_reduce_bytes"]]
        if getattr(args, other, False):
            raise ShardlabError(f"--{other.replace('_', '-')} conflicts with {args.from_file}, which reduces gradients in "
                                f"{'fp32' if red == 'grad_reduce_fp32' else 'bf16/fp16'}; drop the flag or edit the file")
        setattr(args, red, True)
    if imp.framework and hasattr(args, "framework") and getattr(args, "framework", None) is None:
        args.framework = imp.framework
    if "model" not in f and getattr(args, "model", None) is None and getattr(args, "params", None) is None:
        unknown = next((x for x in imp.ignored if "give MODEL" in x), None)
        if unknown:                     # never the command's default model in its place
            raise ShardlabError(f"{args.from_file} names a model shardlab does not know ({unknown.split(' (')[0]}); "
                                f"give MODEL: a catalog id (see `shardlab models`), hf:ORG/NAME or a config.json")
    _check_against_model(args, f, imp)
    from shardlab.export import check_batch, field_names

    check_batch({k: v for k, v in f.items() if k != "gpus" or "dp" not in f}, args.from_file,
                field_names(imp.source, imp.framework))


def _apply_dropout(args, f: dict) -> None:
    """A file's dropout (Megatron-LM's --attention/--hidden-dropout) onto --dropout: a switch on estimate/plan,
    auto/on/off on memory."""
    from shardlab.errors import ShardlabError

    if "dropout" not in f or not hasattr(args, "dropout"):
        return
    want, cur = bool(f["dropout"]), args.dropout
    if isinstance(cur, str):                           # memory: auto / on / off
        if cur != "auto" and (cur == "on") != want:
            raise ShardlabError(f"--dropout {cur} conflicts with {args.from_file}, which {'has' if want else 'has no'} "
                                f"dropout; drop the flag or edit the file")
        args.dropout = "on" if want else "off"
        return
    if cur and not want:                               # estimate / plan: the switch given, the file has none
        raise ShardlabError(f"--dropout conflicts with {args.from_file}, which has no dropout; drop the flag or edit "
                            f"the file")
    args.dropout = want


def _check_against_model(args, fields: dict, imp) -> None:
    """The file's degrees against the catalog model the command will run (named in the file or given as MODEL), before
    the command's own checks, which would name flags (--pp, --tp) the user never gave: this names the file's fields."""
    from shardlab.catalog import get_catalog
    from shardlab.export import check_against_model, field_names

    name = getattr(args, "model", None) or getattr(args, "model_default", None)
    if not isinstance(name, str) or getattr(args, "params", None) is not None:
        return
    spec = get_catalog(getattr(args, "catalog", None) or ()).models.get(name.lower())
    if spec is None:                  # hf: ids and model files are read by the command itself
        return
    mine = {k: v for k, v in fields.items() if k in ("tp", "pp", "vpp", "ep", "stage_layers")}
    if "pp" in mine or "vpp" in mine:          # the other factor of pp × vpp may be a flag
        mine.update(pp=getattr(args, "pp", None) or 1, vpp=getattr(args, "vpp", None) or 1)
    check_against_model(mine, spec, args.from_file, field_names(imp.source, imp.framework))


def import_text(imp) -> str:
    from shardlab.report.table import table

    rows = [[a, b] for a, b in imp.understood]
    lines = [table(["in the file", "became"], rows, title=f"read as {imp.source} ({imp.framework or 'framework unknown'})",
                   align="ll")]
    if imp.ignored:
        lines.append("ignored (not modelled or not in the file): " + "; ".join(imp.ignored))
    return "\n".join(lines)


def _beside_best(args, doc: dict) -> str:
    """plan --from: the imported layout's own estimate beside the search's winner."""
    from shardlab.cli.plan_cmds import _catalog, training_estimate_from_args
    from shardlab.errors import ShardlabError

    if args.inference or not doc.get("plans"):
        return ""
    args.gpus = args.gpus or doc["gpus"]
    try:
        mine = training_estimate_from_args(args, _catalog(args))
    except ShardlabError as e:
        return f"your file's layout: cannot be estimated on {doc['gpus']} GPUs ({e})"
    best = doc["plans"][0]["step_time_s"]
    doc["imported_estimate"] = {"layout": mine.layout.to_dict(), "step_time_s": mine.step_time_s,
                                "fits": mine.memory.fits if hasattr(mine, "memory") else None,
                                "best_step_time_s": best}
    return (f"your file's layout: {mine.step_time_s:.2f} s/step; the best plan: {best:.2f} s/step "
            f"({mine.step_time_s / best:.2f}× the best's time)")


def with_from(parser, fn):
    """Wrap a handler (estimate, memory, plan): with --from FILE, fill the flags from the file first."""

    def handler(args):
        if not getattr(args, "from_file", None):
            return fn(args)
        from shardlab.catalog import get_catalog
        from shardlab.export import read_file

        imp = read_file(args.from_file, get_catalog(args.catalog))
        apply_import(args, imp, parser)
        doc, text = fn(args)
        doc["imported"] = imp.to_dict()
        extra = _beside_best(args, doc) if parser.prog.endswith(" plan") else ""
        return doc, import_text(imp) + "\n\n" + text + (f"\n\n{extra}" if extra else "")

    return handler


def hook(p, fn, export: bool = False) -> None:
    """Give a command --from FILE (and, for plan, --export TARGET/--out/--launch) around its handler ``fn``."""
    add_from_arg(p)
    if export:
        add_plan_export_args(p)
        fn = with_export(fn)
    p.set_defaults(func=with_from(p, fn))
