"""--from FILE on estimate, memory and plan: read a framework's file (``shardlab.export.read_file``), set the
command's flags from it (a flag the user set to something else is a conflict), check what it says against the
model, and show what was read beside the command's own output."""

from __future__ import annotations

from shardlab.cli.file_beside import beside_best
from shardlab.cli.file_load import apply_load
from shardlab.cli.file_names import file_names, set_keys


def add_from_arg(p) -> None:
    p.add_argument("--from", dest="from_file", metavar="FILE", default=None,
                   help="read the job from a file: a shardlab job file (also accepted as the first argument), a "
                        "torchtitan TOML, DeepSpeed JSON, Accelerate YAML, Megatron-LM arguments, vllm serve line, "
                        "Slurm or SkyPilot script")
    p.add_argument("--set", dest="set_fields", action="append", default=None, metavar="KEY=VALUE",
                   help="with a job file: override one of its fields (layout.tp=4, workload.global_batch=512; "
                        "repeatable)")


def apply_sets(imp, sets: list[str] | None) -> None:
    """--set section.key=value (or key=value) over the fields a file gave; the value is read as TOML (a number, true,
    a string), and a key the job file does not have is refused naming the keys it has."""
    import tomllib

    from shardlab.errors import ShardlabError
    from shardlab.export.shardlab import SECTIONS

    known = {k for sec, keys in SECTIONS.items() if sec not in ("shardlab", "estimate") for k in keys}
    for item in sets or ():
        key, eq, raw = item.partition("=")
        name = key.strip().rpartition(".")[2]
        if not eq or not name:
            raise ShardlabError(f"--set {item!r}: write SECTION.KEY=VALUE, e.g. layout.tp=4")
        if name not in known or name in ("format", "version"):
            raise ShardlabError(f"--set {key}: a job file has no field '{name}'; fields: {', '.join(sorted(known))}")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        section = key.strip().rpartition(".")[0]
        if section and section not in SECTIONS:
            raise ShardlabError(f"--set {key}: a job file has no section [{section}]; sections: "
                                f"{', '.join(s for s in SECTIONS if s not in ('shardlab', 'estimate'))}")
        from shardlab.export.shardlab import check_load, check_types, kv_field

        check_types({name: value}, f"--set {key}")
        check_load({name: value})
        if name == "kv_cache_dtype":
            value, name = kv_field(value), "kv_cache"
            if value is None:
                imp.fields.pop("kv_cache", None)
                continue
        name = {"name": "model" if section == "model" else "framework"}.get(name, name)
        if name == "framework":
            imp = imp.__class__(imp.source, imp.fields, imp.understood, imp.ignored, str(value))
        imp.fields[name] = tuple(value) if name in ("stage_layers", "recompute_modules", "lora_targets") and isinstance(value, list) \
            else value
        if name == "recompute" and value != "selective":   # the modules say what selective re-runs: they go with it
            imp.fields.pop("recompute_modules", None)
    if sets:                     # the same checks a file's own values get
        from shardlab.export import check_fields, field_names

        check_fields(imp.fields, "--set", field_names(imp.source, imp.framework))
    return imp


def is_job_file(path) -> bool:
    """True for a regular file (never a FIFO or device) whose first 4 KiB read as a shardlab job file."""
    import os

    try:
        if not isinstance(path, str) or not os.path.isfile(path):
            return False
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    from shardlab.export.shardlab import is_job_text

    return is_job_text(head)


def job_file_argument(args) -> None:
    """A shardlab job file given as the command's first argument (MODEL) is read as --from FILE."""
    import os

    model = getattr(args, "model", None)
    if getattr(args, "from_file", None) or not isinstance(model, str) or not os.path.isfile(model):
        return                                   # by content: `plan --save plan.json` writes one under any name
    if is_job_file(model):
        args.from_file, args.model = model, None


ARG_OF = {"lora_rank": "lora_rank", "quantize_base": "quantize_base", "offload": "offload",
          "offload_device": "offload_device", "lora_targets": "lora_targets", "model": "model", "gpus": "gpus", "dp": "dp", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "etp": "etp", "zero": "zero",
          "vpp": "vpp", "micro_batch": "micro_batch", "recompute": "recompute", "sequence_parallel": "sequence_parallel",
          "schedule": "schedule", "stage_layers": "stage_layers", "seq_len": "seq_len", "global_batch": "global_batch",
          "precision": "precision", "gpu": "gpu", "gpus_per_node": "gpus_per_node", "prompt_len": "prompt_len",
          "output_len": "output_len", "max_num_seqs": "batch", "gpu_memory_utilization": "gpu_memory_utilization",
          "weights": "weights", "group_size": "group_size", "activations": "activations", "kv_cache": "kv_cache_dtype", "optimizer": "optimizer",
          "recompute_fraction": "recompute_fraction", "recompute_modules": "recompute_modules", "wrap": "wrap",
          "moe_dispatcher": "moe_dispatcher", "expert_imbalance": "expert_imbalance",
          "dp_replicate": "dp_replicate",
          "replicas": "replicas", "disaggregated": "disaggregated", "prefill_tp": "prefill_tp", "prefill_gpu": "prefill_gpu",
          "prefill_pp": "prefill_pp", "inter_node_gbit": "inter_node_gbit"}
GRAD_REDUCE_ARG = {4: "grad_reduce_fp32", 2: "grad_reduce_bf16"}
"""A file's gradient-reduction dtype (bytes) -> the switch of estimate/plan that says the same."""


def apply_import(args, imp, parser) -> None:
    """Set the command's flags from an import; a flag the user set to something else is a conflict (exit 2)."""
    from shardlab.errors import ShardlabError

    f = dict(imp.fields)
    serving = ("max_num_seqs" in f or imp.source in ("vllm", "sglang", "tensorrt-llm")
               or imp.framework in ("vllm", "sglang", "tensorrt-llm"))
    if serving:
        if not hasattr(args, "inference"):
            raise ShardlabError(f"{args.from_file} is a serving config; read it with `shardlab estimate --from`")
        args.inference = True
        from shardlab.serving.engines import builtin_engines

        if imp.source == "shardlab" and imp.framework and imp.framework.lower() not in builtin_engines():
            raise ShardlabError(f"{args.from_file}: [framework] name = {imp.framework[:40]!r} is not a serving engine "
                                f"(a serving job runs one of {', '.join(builtin_engines())}); fix the file")
        if parser.prog.split()[1:] == ["plan"]:     # the file's layout, shown beside the search's best
            from shardlab.cli.file_beside import LAYOUT_KEYS

            args.file_serving_layout = {k: f[k] for k in LAYOUT_KEYS if k in f}
        f.pop("gpus", None)
        if parser.prog.split()[1:] == ["plan"] and getattr(args, "gpus", None) in (None, parser.get_default("gpus")):
            if "serve_gpus" in f:                # a saved serving plan searches the GPUs it was planned for
                args.gpus = f["serve_gpus"]
            elif "tp" in f:                      # an engine's launch line: the GPUs it runs
                args.gpus = (int(f.get("replicas") or 1) * int(f["tp"]) * int(f.get("pp") or 1)
                             * int(f.get("dp_attention") or 1))
        if f.get("replicas", 1) > 1:
            f["max_num_seqs"] = f.get("max_num_seqs", 1)
            if (parser.prog.split()[1:] == ["export"] and not hasattr(args, "replicas")
                    and getattr(args, "gpus", None) in (None, parser.get_default("gpus"))):
                # a command without --replicas (export) takes the replicas as GPUs: tp × pp × replicas, and its
                # batch over all of them (a static plan's, split over the replicas): the file's cap is per replica
                args.gpus = f["replicas"] * int(f.get("tp") or 1) * int(f.get("pp") or 1)
                f["max_num_seqs"] = int(f["max_num_seqs"]) * int(f["replicas"])
            elif parser.prog.split()[1:] == ["estimate"]:
                args.file_replicas = int(f["replicas"])   # estimate prices one; it says so, and the totals
    apply_load(args, f, parser)
    if "dp_from_world" in f and "dp" not in f:
        f.pop("dp_from_world")
    if "disaggregated" in f:                         # two pools serve under load: the estimate that prices them
        if parser.prog.split()[1:] == ["plan"]:      # plan searches the pools again (its serving search), the
            kind = f.pop("prefill_gpu", None)         # prefill pool on the file's other kind of GPU as it was asked
            if kind and hasattr(args, "prefill_gpu"):
                if args.prefill_gpu not in (None, kind):
                    raise ShardlabError(f"--prefill-gpu {args.prefill_gpu} conflicts with {args.from_file} "
                                        f"(prefill_gpu = {kind}); drop the flag or edit the file")
                args.prefill_gpu = kind
            for k in ("disaggregated", "prefill_tp", "prefill_pp"):
                f.pop(k, None)
        elif not hasattr(args, "disaggregated"):
            raise ShardlabError(f"{args.from_file} is a disaggregated prefill/decode script; read it with "
                                f"`shardlab estimate --from`")
        else:
            args.serve = True
    if serving and parser.prog.split()[1:] == ["plan"]:   # plan searches the MoE layouts again, as it does the pools
        f.pop("ep", None)
        f.pop("dp_attention", None)
    if f.get("dp_attention", 1) > 1:               # attention ranks: the flag is a switch, ep carries the GPUs
        ranks = f.pop("dp_attention")
        if hasattr(args, "dp_attention"):
            args.dp_attention = True
        if not getattr(args, "serve", False) and "max_num_seqs" in f:   # a static batch is the replica's: every
            f["max_num_seqs"] = int(f["max_num_seqs"]) * int(ranks)     # attention rank's cap (the file's) × ranks
    else:
        f.pop("dp_attention", None)
    if str(f.get("kv_cache_dtype", "auto")).startswith("fp8"):
        f["kv_cache"] = "fp8"                          # vLLM's fp8 / fp8_e4m3 / fp8_e5m2: one byte per element
    if getattr(args, "serve", False) and "max_num_seqs" in f and parser.prog.split()[1:] == ["plan"]:
        f.pop("max_num_seqs")   # a layout's cap, as its TP (plan searches the caps again; file_beside shows it)
    if getattr(args, "serve", False) and "max_num_seqs" in f and hasattr(args, "max_num_seqs"):
        # under load the file's sequence cap is the engine's (vLLM --max-num-seqs), not a static batch
        cap, cur = f.pop("max_num_seqs"), getattr(args, "max_num_seqs", None)
        if cur is not None and cur != cap:
            raise ShardlabError(f"--max-num-seqs {cur} conflicts with {args.from_file} (max_num_seqs = {cap}); drop the "
                                f"flag or edit the file")
        args.max_num_seqs = cap
    for key, dest in ARG_OF.items():
        if key not in f or not hasattr(args, dest):
            continue
        val = f[key]
        if dest in ("stage_layers", "recompute_modules", "lora_targets") and val is not None:
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
    if ("global_batch" in f and not hasattr(args, "global_batch") and hasattr(args, "microbatches")
            and getattr(args, "microbatches", None) in (None, parser.get_default("microbatches"))):
        per = max(1, int(f.get("micro_batch") or 1) * int(f.get("dp") or 1))   # memory: the micro-batches in flight
        args.microbatches = max(1, int(f["global_batch"]) // per)
    for key in ("tp_comm_overlap", "fp8_params", "ep_comm_overlap"):   # switches: a file that sets one turns it on
        if f.get(key) and hasattr(args, key):
            setattr(args, key, True)
    # a job file's modelling switches (export.job.ASSUMPTIONS), where it moved them from their defaults
    for key, dest, val in (("flash_attention", "no_flash_attention", f.get("flash_attention") is False),
                           ("dp_overlap", "no_dp_overlap", f.get("dp_overlap") is False)):
        if key in f and val and hasattr(args, dest):
            setattr(args, dest, True)
    if "attention_kernel" in f and f["attention_kernel"] not in ("flash1", "flash2", "native"):
        raise ShardlabError(f"{args.from_file}: attention_kernel = {str(f['attention_kernel'])[:20]!r} must be flash1, "
                            f"flash2 or native; fix the file")
    for key in ("compile", "attention_kernel", "fused_loss"):
        if key in f and hasattr(args, key):
            cur = getattr(args, key)
            if cur is not None and cur != f[key]:
                raise ShardlabError(f"--{key.replace('_', '-')} conflicts with {args.from_file} ({key} = {f[key]}); "
                                    f"drop the flag or edit the file")
            setattr(args, key, f[key])
    if f.get("grad_reduce_bytes") is not None and f["grad_reduce_bytes"] not in GRAD_REDUCE_ARG:
        raise ShardlabError(f"{args.from_file}: grad_reduce_bytes = {str(f['grad_reduce_bytes'])[:20]} must be 4 (fp32) "
                            f"or 2 (bf16/fp16); fix the file")
    red = GRAD_REDUCE_ARG.get(f.get("grad_reduce_bytes"))
    if red and hasattr(args, red):
        other = GRAD_REDUCE_ARG[6 - f["grad_reduce_bytes"]]
        if getattr(args, other, False):
            raise ShardlabError(f"--{other.replace('_', '-')} conflicts with {args.from_file}, which reduces gradients in "
                                f"{'fp32' if red == 'grad_reduce_fp32' else 'bf16/fp16'}; drop the flag or edit the file")
        setattr(args, red, True)
    if imp.framework and hasattr(args, "framework") and getattr(args, "framework", None) is None:
        args.framework = imp.framework
    elif imp.framework and getattr(args, "framework", None) not in (None, imp.framework):
        raise ShardlabError(f"--framework {args.framework} conflicts with {args.from_file} (framework {imp.framework}); "
                            f"drop the flag or edit the file")
    if "model" not in f and getattr(args, "model", None) is None and getattr(args, "params", None) is None:
        unknown = next((x for x in imp.ignored if "give MODEL" in x), None)
        if unknown:                     # never the command's default model in its place
            raise ShardlabError(f"{args.from_file} names a model shardlab does not know ({unknown.split(' (')[0]}); "
                                f"give MODEL: a catalog id (see `shardlab models`), hf:ORG/NAME or a config.json")
    _check_against_model(args, f, imp)
    from shardlab.export import check_batch, field_names

    check_batch(f, args.from_file, field_names(imp.source, imp.framework))


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
    names = field_names(imp.source, imp.framework)
    sets = set_keys(getattr(args, "set_fields", None))
    names = {k: f"{v} (--set)" if k in sets else v for k, v in names.items()}     # a --set value is not the file's
    check_against_model(mine, spec, args.from_file, names)
    if isinstance(fields.get("prefill_tp"), int):     # a disaggregated script's prefill servers: their own TP
        check_against_model({"tp": fields["prefill_tp"]}, spec, args.from_file,
                            {**names, "tp": f"{names.get('tp', 'tp')} of the prefill servers"})


def import_text(imp) -> str:
    from shardlab.render.table import table

    rows = [[a, b] for a, b in imp.understood]
    lines = [table(["in the file", "became"], rows, title=f"read as {imp.source} ({imp.framework or 'framework unknown'})",
                   align="ll")]
    if imp.ignored:
        lines.append("ignored (not modelled or not in the file): " + "; ".join(imp.ignored))
    return "\n".join(lines)


def with_from(parser, fn):
    """Wrap a handler (estimate, memory, plan): with --from FILE, fill the flags from the file first."""

    def handler(args):
        job_file_argument(args)
        if not getattr(args, "from_file", None):
            if getattr(args, "set_fields", None):
                from shardlab.errors import ShardlabError

                raise ShardlabError("--set overrides a field of a job file: give the file (FILE or --from FILE)")
            return fn(args)
        from shardlab.catalog import get_catalog
        from shardlab.export import read_file

        imp = apply_sets(read_file(args.from_file, get_catalog(args.catalog)), getattr(args, "set_fields", None))
        apply_import(args, imp, parser)
        with file_names(args.from_file, imp, getattr(args, "set_fields", None)):
            doc, text = fn(args)
            extra = beside_best(args, doc) if parser.prog.split()[1:] == ["plan"] else ""
        doc["imported"] = imp.to_dict()
        return doc, import_text(imp) + "\n\n" + text + (f"\n\n{extra}" if extra else "")

    return handler
