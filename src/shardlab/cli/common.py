"""Flags shared by several commands, and turning them into specs (model, layout, cluster)."""

from __future__ import annotations

import argparse

from shardlab.errors import ShardlabError


def number_arg(*, integer: bool, allow_zero: bool = False, maximum: float | None = None, reason: str = "",
               minimum: float = 0.0, smallest: float | None = None):
    """An argparse ``type`` built on the one number parser (``shardlab.numbers``): finite, no overflow, a whole
    number where one is needed, positive (or zero or more), at most ``maximum`` (a bound from ``shardlab.limits``)."""
    from shardlab import limits
    from shardlab.numbers import SMALLEST

    top = maximum if maximum is not None else (limits.MAX_INT if integer else limits.MAX_FLOAT)

    def parse(text: str):
        from shardlab.numbers import parse_number

        try:
            return parse_number(text, "value", integer=integer, minimum=minimum, allow_min=allow_zero, maximum=top,
                                reason=reason, smallest=smallest if smallest is not None else SMALLEST)
        except ShardlabError as e:
            msg = str(e)
            raise argparse.ArgumentTypeError(msg[6:] if msg.startswith("value ") else msg) from None
    parse.__name__ = "whole number" if integer else "number"
    return parse


positive_int = number_arg(integer=True)
nonneg_int = number_arg(integer=True, allow_zero=True)
positive_float = number_arg(integer=False)
nonneg_float = number_arg(integer=False, allow_zero=True)


def _bounded():
    """Types of the flags whose bounds live in ``shardlab.limits`` (with the reason shown when refused)."""
    from shardlab import limits as L

    return {
        "gpus": number_arg(integer=True, maximum=L.MAX_GPUS, reason="about 5x the largest cluster built"),
        "gpus_per_node": number_arg(integer=True, maximum=L.MAX_GPUS_PER_NODE, reason="GPUs in one scale-up domain"),
        "ranks_per_node": number_arg(integer=True, maximum=L.MAX_RANKS_PER_NODE, reason="processes on one machine"),
        "seq_len": number_arg(integer=True, maximum=L.MAX_SEQ_LEN, reason="longer than any model's context"),
        "batch": number_arg(integer=True, maximum=L.MAX_BATCH, reason="sequences per step"),
        "microbatches": number_arg(integer=True, maximum=L.MAX_MICROBATCHES, reason="micro-batches per step"),
        "hours": number_arg(integer=False, maximum=L.MAX_HOURS, reason="11 years", smallest=L.MIN_HOURS),
        "setup_hours": number_arg(integer=False, allow_zero=True, maximum=L.MAX_HOURS, reason="11 years",
                                  smallest=L.MIN_HOURS),
        "usd": number_arg(integer=False, allow_zero=True, maximum=L.MAX_USD, reason="a trillion dollars",
                          smallest=L.MIN_USD),
        "price": number_arg(integer=False, maximum=L.MAX_PRICE_USD_PER_GPU_HOUR, reason="USD per GPU-hour",
                            smallest=L.MIN_USD),
        "seconds": number_arg(integer=False, maximum=L.MAX_SECONDS, reason="31 years", smallest=L.MIN_SECONDS),
        "seconds0": number_arg(integer=False, allow_zero=True, maximum=L.MAX_SECONDS, reason="31 years",
                               smallest=L.MIN_SECONDS),
        "timeout": number_arg(integer=False, maximum=L.MAX_TIMEOUT_S, reason="a week", smallest=L.MIN_TIMEOUT_S),
        "share": number_arg(integer=False, maximum=1.0, reason="a share of the peak", smallest=L.MIN_SHARE),
        "hit_share": number_arg(integer=False, allow_zero=True, maximum=0.999, reason="a share of the prompt below 1",
                                smallest=L.MIN_SHARE),
        "stages": number_arg(integer=True, maximum=L.MAX_PIPELINE_STAGES, reason="pipeline stages or chunks per rank"),
        "seed": number_arg(integer=True, allow_zero=True, maximum=2**31 - 1, reason="a 32-bit seed"),
        "dim": number_arg(integer=True, maximum=L.MAX_MODEL_DIM, reason="a model dimension"),
        "stage_index": number_arg(integer=True, allow_zero=True, maximum=L.MAX_PIPELINE_STAGES, reason="pipeline ranks"),
        "factor": number_arg(integer=False, maximum=1e6, reason="a million times slower", smallest=L.MIN_SHARE),
        "node_rank": number_arg(integer=True, allow_zero=True, maximum=L.MAX_GPUS - 1, reason="nodes"),
        "nodes": number_arg(integer=True, maximum=L.MAX_GPUS, reason="nodes (one GPU each at the least)"),
        "gpus0": number_arg(integer=True, allow_zero=True, maximum=L.MAX_GPUS, reason="about 5x the largest cluster built"),
        "spec_tokens": number_arg(integer=True, maximum=16, reason="draft tokens per step (engines cap it lower)"),
        "share0": number_arg(integer=False, allow_zero=True, maximum=1.0, reason="a share"),
        "experts": number_arg(integer=True, allow_zero=True, maximum=4096, reason="expert slots"),
        "imbalance": number_arg(integer=False, maximum=64.0, reason="the busiest rank's share (1 = balanced)"),
        "accept_len": number_arg(integer=False, maximum=17.0, reason="tokens per verification step (k + 1 at most)"),
        "steps": number_arg(integer=True, maximum=10**6, reason="a million optimizer steps"),
        "iters": number_arg(integer=True, maximum=10**6, reason="a million iterations"),
        "gbit": number_arg(integer=False, maximum=1e6, reason="a petabit per second", smallest=L.MIN_SHARE),
        "port": number_arg(integer=True, maximum=65535 - L.MAX_RANKS_PER_NODE, reason="TCP ports, one per local rank"),
        "requests": number_arg(integer=True, maximum=L.MAX_SIM_REQUESTS, reason="requests simulated"),
        "scheduler_steps": number_arg(integer=True, maximum=1024, reason="decode steps per scheduling round"),
        "graph_batch": number_arg(integer=True, allow_zero=True, maximum=L.MAX_BATCH, reason="sequences per step"),
        "rate": number_arg(integer=False, maximum=1e9, reason="a billion per second", smallest=L.MIN_SHARE),
        "questions": number_arg(integer=True, maximum=1000, reason="questions in one quiz"),
        "block": number_arg(integer=True, maximum=4096, reason="tokens per KV-cache block"),
        "vocab_multiple": number_arg(integer=True, maximum=1 << 16, reason="a vocabulary multiple"),
        "binades": number_arg(integer=True, allow_zero=True, minimum=-100, maximum=100,
                              reason="powers of two an fp32 loss scale can take"),
    }


BOUNDED = _bounded()
"""Flag types by quantity, e.g. ``type=BOUNDED["gpus"]``."""
gpus_int = BOUNDED["gpus"]
seq_len_int = BOUNDED["seq_len"]
batch_int = BOUNDED["batch"]
microbatches_int = BOUNDED["microbatches"]


class Deprecated(argparse.Action):
    """An old spelling of a flag: it still works, stores into the new flag's destination, and the command says on
    stderr (one line, after it succeeded: an error stays the only line) what the new spelling is. Hidden from --help."""

    def __init__(self, option_strings, dest, new: str = "", **kw):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        note = f"note: {option_string} is an old spelling; use {self.new}"
        notes = getattr(namespace, "spelling_notes", None) or []
        setattr(namespace, "spelling_notes", notes + [note] if note not in notes else notes)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def old_spelling(p, old: str, new: str, dest: str, **kw) -> None:
    """Accept ``old`` for the flag ``new`` (same destination), with a one-line note (``Deprecated``)."""
    p.add_argument(old, dest=dest, action=Deprecated, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kw)


def token_ids(text: str) -> tuple[int, ...]:
    """Comma-separated token ids (whole numbers >= 0), at most 8192 of them."""
    parts = text.split(",")
    if len(parts) > 8192:
        raise argparse.ArgumentTypeError(f"at most 8192 token ids, got {len(parts)}")
    out = []
    for x in parts:
        x = x.strip()
        if not x.isdigit() or len(x) > 12:
            raise argparse.ArgumentTypeError(f"token ids are whole numbers >= 0 separated by commas, got {x[:20]!r}")
        out.append(int(x))
    return tuple(out)


def module_list(text: str) -> tuple[str, ...]:
    """--recompute-modules: Megatron-core module names separated by commas (``layout.RECOMPUTE_MODULES``)."""
    from shardlab.layout import RECOMPUTE_MODULES

    parts = tuple(x.strip() for x in text[:400].split(","))
    bad = [x for x in parts if x not in RECOMPUTE_MODULES]
    if bad or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"distinct names from {','.join(RECOMPUTE_MODULES)} separated by commas, "
                                         f"got {text[:60]!r}")
    return parts


def int_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of positive whole numbers (each checked by the one number parser)."""
    from shardlab import limits
    from shardlab.numbers import parse_number

    parts = text.split(",")
    if len(parts) > 4096:
        raise argparse.ArgumentTypeError(f"at most 4096 values, got {len(parts)}")
    try:
        return tuple(parse_number(x, "each value", integer=True, maximum=limits.MAX_MODEL_DIM) for x in parts)
    except ShardlabError as e:
        raise argparse.ArgumentTypeError(f"'{text[:60]}': {e}") from None


def wrap_policy(text: str) -> int:
    """'block' -> 1, 'N-blocks' (or N) -> N, 'model' -> 0: blocks per ZeRO-3/FSDP unit."""
    t = text.strip().lower()
    if t in ("block", "1-block", "1-blocks"):
        return 1
    if t == "model":
        return 0
    n = t.removesuffix("-blocks").removesuffix("-block")
    if n.isascii() and n.isdigit() and 1 <= int(n) <= 10_000:           # limits.MAX_LAYERS: a unit of more blocks is the model
        return int(n)
    raise argparse.ArgumentTypeError(f"'{text}' is not a wrap policy: use block, N-blocks (e.g. 4-blocks) or model")


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--catalog", action="append", default=[], metavar="FILE",
                   help="extra catalog YAML (sections models/accelerators/links/prices); repeatable")


def add_model_args(p: argparse.ArgumentParser, required: bool = False, default: str | None = None,
                   bare_count: bool = False) -> None:
    """MODEL and --params. ``bare_count``: the command works from a bare parameter count (memory's model states);
    elsewhere --params stays parsed, so that using it gets the one-line refusal naming the fix, but out of --help."""
    p.set_defaults(model_default=default)
    p.add_argument("model", nargs=None if required else "?", default=None, metavar="MODEL",
                   help="catalog id (see `shardlab models`), hf:ORG/NAME (config.json from the Hugging Face Hub, cached), "
                        "a Hugging Face config.json, or a YAML model file"
                        + (f" (default: {default})" if default else ""))
    p.add_argument("--params", type=str, default=None, metavar="N",
                   help="bare parameter count (e.g. 7.5e9 or 70B) for model-state-only estimates" if bare_count
                   else argparse.SUPPRESS)


class Given(argparse.Action):
    """Stores the value like argparse's default action and notes the flag in ``namespace.given_flags``: `plan` pins
    exactly the layout flags a user wrote, a default value (``--tp 1``, ``--zero 0``) included."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, "given_flags", set(getattr(namespace, "given_flags", None) or ()) | {self.dest})


class GivenTrue(Given):
    """``store_true`` that notes the flag like ``Given``."""

    def __init__(self, option_strings, dest, default=False, required=False, help=None):
        super().__init__(option_strings, dest, nargs=0, const=True, default=default, required=required, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, True, option_string)


def given_flags(args) -> set[str] | None:
    """The destinations of the layout flags written on the command line (None when args did not come from the
    parser, e.g. a Namespace built in code)."""
    return getattr(args, "given_flags", None)


def add_layout_args(p: argparse.ArgumentParser, gpus_default: int | None = None) -> None:
    p.set_defaults(given_flags=set())
    g = p.add_argument_group("layout")
    g.add_argument("--gpus", type=gpus_int, default=gpus_default, help="world size (default: the product of the degrees)")
    g.add_argument("--dp", type=gpus_int, default=None, help="data-parallel degree (default: gpus / (tp·pp·cp))")
    g.add_argument("--tp", action=Given, type=gpus_int, default=1, help="tensor-parallel degree")
    g.add_argument("--pp", action=Given, type=gpus_int, default=1, help="pipeline-parallel degree")
    g.add_argument("--cp", action=Given, type=gpus_int, default=1, help="context-parallel degree")
    g.add_argument("--ep", action=Given, type=gpus_int, default=1, help="expert-parallel degree (divides dp; with --etp below tp, tp·cp·dp/etp)")
    g.add_argument("--etp", action=Given, type=BOUNDED["gpus0"], default=None,
                   help="experts' tensor-parallel degree, dividing tp (Megatron-core --expert-tensor-parallel-size; "
                        "default and 0: tp); below tp the EP group spans TP ranks too")
    g.add_argument("--zero", action=Given, type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage over dp·cp (3 = FSDP full shard)")
    g.add_argument("--micro-batch", action=Given, type=batch_int, default=1, help="sequences per micro-batch per DP rank")
    g.add_argument("--seq-len", type=seq_len_int, default=None, help="sequence length (default: min(model max, 4096))")
    g.add_argument("--recompute", action=Given, choices=("none", "selective", "full", "op"), default="none",
                   help="activation recomputation: selective = attention core (Korthikanti 2022), full = whole blocks, "
                        "op = torchtitan's per-operator checkpointing")
    g.add_argument("--recompute-modules", action=Given, type=module_list, default=None, metavar="M,M,...",
                   help="with --recompute selective: what it re-runs, as Megatron-core names its modules (core_attn "
                        "(the default), layernorm, moe_act, mla_up_proj, mlp, moe, shared_experts)")
    g.add_argument("--recompute-fraction", action=Given, type=BOUNDED["share"], default=1.0, metavar="F",
                   help="share of the blocks checkpointed (torchtitan's 'every k-th layer' = 1/k; default 1)")
    g.add_argument("--wrap", action=Given, type=wrap_policy, default=1, metavar="POLICY",
                   help="ZeRO-3/FSDP wrap unit: block (default), N-blocks (e.g. 4-blocks) or model (one unit, no overlap)")
    g.add_argument("--dp-replicate", action=Given, type=gpus_int, default=1, metavar="R",
                   help="hybrid sharding (HSDP): ZeRO shards over dp·cp/R ranks and R replicas all-reduce gradients")
    g.add_argument("--sequence-parallel", action=GivenTrue, help="Megatron sequence parallelism (with --tp > 1)")
    g.add_argument("--schedule", action=Given, choices=("gpipe", "1f1b", "interleaved", "zb-h1"), default="1f1b", help="pipeline schedule")
    g.add_argument("--microbatches", type=microbatches_int, default=None, help="micro-batches per step (pipeline)")
    g.add_argument("--vpp", action=Given, type=BOUNDED["dim"], default=1, help="virtual stages per pipeline rank (interleaved)")
    g.add_argument("--stage-layers", type=int_list, default=None, metavar="N,N,...", help="layers per pipeline stage")
    g.add_argument("--precision", choices=("fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp8-mixed"), default="bf16-mixed",
                   help="fp32; bf16/fp16 mixed (fp32 master weights); pure bf16; fp8-mixed (bf16-mixed states, FP8 GEMMs "
                        "with per-tensor scaling, Transformer Engine style)")
    g.add_argument("--optimizer", choices=("adamw", "sgd", "adam-8bit"), default="adamw", help="optimizer (sgd = with momentum)")


def add_cluster_args(p: argparse.ArgumentParser, gpu_default: str = "h100-sxm") -> None:
    g = p.add_argument_group("cluster")
    p.set_defaults(gpu_default=gpu_default)
    g.add_argument("--gpu", default=None, help=f"accelerator id (see `shardlab gpus`; default {gpu_default}, or a profile's)")
    g.add_argument("--gpus-per-node", type=BOUNDED["gpus_per_node"], default=None, help="GPUs per node (default: the GPU's usual server)")
    g.add_argument("--intra-link", default=None, help="link inside a node (default: the GPU's usual server)")
    g.add_argument("--inter-link", default=None, help="link between nodes (default: the GPU's usual server)")
    g.add_argument("--inter-node-gbit", type=BOUNDED["gbit"], default=None, metavar="GBIT",
                   help="inter-node bandwidth per node in Gb/s, as clusters are often described (e.g. 1600 = 8 × 200 Gb/s); "
                        "sets the --inter-link's per-GPU rate to GBIT / 8 / GPUs per node")


def resolve_model(args, catalog):
    """(ModelSpec or None, params or None) from MODEL / --params."""
    from shardlab.units import parse_count

    if args.params is not None:
        if args.model:
            raise ShardlabError("give MODEL or --params, not both")
        from shardlab.limits import MAX_PARAMS

        return None, parse_count(args.params, "--params", maximum=MAX_PARAMS)
    if not args.model:
        args.model = getattr(args, "model_default", None)
    if not args.model:
        raise ShardlabError("no model given: name one (see `shardlab models`) or pass --params N")
    return catalog.model(args.model), None


def layout_from_args(args, num_gpus: int | None = None):
    """Layout from the layout flags; dp defaults to gpus / (tp·pp·cp)."""
    from shardlab.layout import Layout

    gpus = num_gpus if num_gpus is not None else args.gpus
    mp = args.tp * args.pp * args.cp
    dp = args.dp
    if dp is None:
        if gpus is None:
            dp = 1
        elif gpus % mp:
            raise ShardlabError(f"--gpus {gpus} is not divisible by tp×pp×cp = {args.tp}×{args.pp}×{args.cp} = {mp}; "
                                f"choose degrees whose product divides the GPU count")
        else:
            dp = gpus // mp
    etp = getattr(args, "etp", None) or 0
    return Layout(dp=dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, etp=0 if etp == args.tp else etp,
                  zero=args.zero, vpp=args.vpp,
                  micro_batch=args.micro_batch, recompute=args.recompute, sequence_parallel=args.sequence_parallel,
                  schedule=args.schedule, stage_layers=args.stage_layers,
                  recompute_modules=getattr(args, "recompute_modules", None),
                  recompute_fraction=getattr(args, "recompute_fraction", 1.0), dp_replicate=getattr(args, "dp_replicate", 1),
                  wrap=getattr(args, "wrap", 1))


def resolve_gpu(args, catalog) -> str:
    """--gpu, else the hardware profile's gpu, else the command's default."""
    return args.gpu or (catalog.profile or {}).get("gpu") or getattr(args, "gpu_default", None) or "h100-sxm"


def cluster_from_args(args, catalog, num_gpus: int):
    """Cluster from --gpu/--gpus-per-node/--intra-link/--inter-link with the GPU's usual server as default."""
    from shardlab.specs.hardware import Cluster

    from shardlab.limits import MAX_GPUS

    if num_gpus > MAX_GPUS:
        raise ShardlabError(f"{num_gpus:,} GPUs is above the limit of {MAX_GPUS:,} (about 5x the largest cluster "
                            f"built); use fewer --gpus or --nodes")
    prof = catalog.profile or {}
    acc = catalog.accelerator(resolve_gpu(args, catalog))
    gpn = args.gpus_per_node or prof.get("gpus_per_node") or acc.system["gpus_per_node"]
    intra = catalog.link(args.intra_link or prof.get("intra_link") or acc.system["intra_link"])
    inter = catalog.link(args.inter_link or prof.get("inter_link") or acc.system["inter_link"])
    if getattr(args, "inter_node_gbit", None):
        from shardlab.specs.hardware import per_node_rate

        inter = per_node_rate(inter, args.inter_node_gbit, gpn)
    return Cluster(accelerator=acc, num_gpus=num_gpus, gpus_per_node=gpn,
                   intra_link=intra, inter_link=inter)


def add_estimate_args(p: argparse.ArgumentParser, model_default: str | None = None) -> None:
    """Flags of `shardlab estimate` (training), shared by `shardlab cost` for a plan-based cost."""
    add_model_args(p, default=model_default)
    add_layout_args(p)
    add_cluster_args(p)
    g = p.add_argument_group("workload")
    g.add_argument("--global-batch", type=batch_int, default=None,
                   help="sequences per optimizer step (default: micro-batch × dp × microbatches)")
    g.add_argument("--tokens", type=str, default=None, metavar="D",
                   help="training tokens (e.g. 300e9 or 15T) for time-to-train and GPU-hours")
    g.add_argument("--profile", metavar="FILE", default=None,
                   help="hardware profile from `shardlab calibrate` (measured efficiencies and links)")
    add_framework_args(p)
    from shardlab.cli.recipe_args import add_recipe_args

    add_recipe_args(p)


def add_framework_args(p: argparse.ArgumentParser) -> None:
    """--framework and --compile (estimate, plan, cost)."""
    g = p.add_argument_group("framework")
    g.add_argument("--framework", default=None, metavar="NAME",
                   help="training framework whose mechanisms the estimate assumes: megatron-lm (default), deepspeed, "
                        "pytorch-fsdp, torchtitan, ... (catalog frameworks; add your own with --catalog)")
    g.add_argument("--compile", action="store_const", const=True, default=None,
                   help="torch.compile the model (frameworks that can: fuses the eager elementwise kernels)")


def add_grad_reduce_args(g) -> None:
    """--grad-reduce-fp32 | --grad-reduce-bf16 on an argument group (estimate, plan, cost, memory, comm plan)."""
    red = g.add_mutually_exclusive_group()
    red.add_argument("--grad-reduce-fp32", action="store_true",
                     help="reduce gradients in fp32 (Megatron-LM's default under bf16, which also holds them in fp32)")
    red.add_argument("--grad-reduce-bf16", action="store_true",
                     help="reduce gradients in bf16/fp16 (FSDP 'PURE' mixed precision, Megatron-LM --grad-reduce-in-bf16)")


def grad_reduce_choice(args) -> int | None:
    """Bytes per reduced gradient element the user asked for (4, 2), or None for the framework's default."""
    return 4 if getattr(args, "grad_reduce_fp32", False) else 2 if getattr(args, "grad_reduce_bf16", False) else None


def resolve_framework(args, catalog):
    """The Framework profile named by --framework (or the hardware profile's, or the default)."""
    from shardlab.estimate.training import DEFAULT_FRAMEWORK

    return catalog.framework(getattr(args, "framework", None) or (catalog.profile or {}).get("framework") or DEFAULT_FRAMEWORK)
