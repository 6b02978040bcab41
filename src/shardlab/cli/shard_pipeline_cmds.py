"""shardlab shard (how tensor parallelism cuts a block's weights) and shardlab pipeline (a schedule simulated)."""

from __future__ import annotations

import argparse

from shardlab.cli.common import BOUNDED, add_model_args, add_output_args
from shardlab.cli.comm_cmds import DTYPE_BYTES


def register(sub) -> None:
    register_shard(sub)
    register_pipeline(sub)


def register_shard(sub) -> None:
    p = sub.add_parser("shard", help="tensor-parallel sharding of a block: per-rank shapes, collectives, limits on T",
                       description="Per-rank shape and bytes of every weight of a block under Megatron tensor "
                                   "parallelism, the collectives per block, and the divisibility rules that cap T.",
                       epilog="examples:\n  shardlab shard llama-3.1-8b --tp 4\n  shardlab shard mixtral-8x7b --tp 8 "
                              "--sequence-parallel --mermaid block.mmd", formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, default="llama-3.1-8b")
    p.add_argument("--tp", type=BOUNDED["gpus"], default=2, help="tensor-parallel degree T")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    p.add_argument("--seq-len", type=BOUNDED["seq_len"], default=None, help="sequence length for collective sizes (default min(max, 4096))")
    p.add_argument("--micro-batch", type=BOUNDED["batch"], default=1, help="sequences per micro-batch (b)")
    p.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="bf16", help="element type of weights and activations")
    p.add_argument("--mermaid", nargs="?", const="-", metavar="FILE",
                   help="write a Mermaid diagram of the sharded block to FILE (.mmd/.md), or print it when no FILE")
    add_output_args(p)
    p.set_defaults(func=cmd_shard)


def cmd_shard(args):
    from pathlib import Path

    from shardlab.catalog import get_catalog
    from shardlab.cli.common import resolve_model
    from shardlab.errors import ShardlabError
    from shardlab.shard import block_mermaid, render_shard, shard_report

    cat = get_catalog(args.catalog)
    spec, _ = resolve_model(args, cat)
    if spec is None:
        raise ShardlabError("shard needs a model's shapes (give MODEL, not --params)")
    kw = dict(seq_len=args.seq_len or min(spec.max_seq_len, 4096), micro_batch=args.micro_batch,
              sequence_parallel=args.sequence_parallel, elem_bytes=DTYPE_BYTES[args.dtype])
    if args.sequence_parallel and args.tp > 1:      # the layout rule estimate, memory and comm plan apply
        from shardlab.layout import Layout
        from shardlab.layout_checks import validate

        validate(Layout(tp=args.tp, sequence_parallel=True), seq_len=kw["seq_len"])
    doc = shard_report(spec, args.tp, **kw)
    text = render_shard(doc)
    if args.mermaid:
        diagram = block_mermaid(spec, args.tp, **kw)
        doc["mermaid"] = diagram
        if args.mermaid == "-":
            if not args.json:
                text = diagram.rstrip("\n")
        else:
            from shardlab.safeout import write_text

            out = Path(args.mermaid)
            body = f"```mermaid\n{diagram}```\n" if out.suffix.lower() == ".md" else diagram
            write_text(out, body, "--mermaid")
            doc["mermaid_file"] = str(out)
            text += f"\n\nMermaid diagram of the sharded block written to {out}"
    return doc, text


# ---- pipeline -------------------------------------------------------------------------------------
def register_pipeline(sub) -> None:
    p = sub.add_parser("pipeline", help="simulate a pipeline schedule: timeline, bubble, micro-batches in flight",
                       description="Event simulation of GPipe, 1F1B, interleaved 1F1B or ZB-H1: the timeline, the bubble "
                                   "(checked against its closed form), the peak micro-batches in flight per stage, a "
                                   "straggler's cost, and the fewest micro-batches under a bubble bound.",
                       epilog="examples:\n  shardlab pipeline --schedule 1f1b --stages 8 --microbatches 32 --plot 1f1b.png\n"
                              "  shardlab pipeline --schedule 1f1b --stages 8 --max-bubble 0.10\n"
                              "  shardlab pipeline --schedule interleaved --stages 4 --microbatches 8 --vpp 2\n"
                              "  shardlab pipeline --schedule 1f1b --stages 4 --microbatches 16 --slow-stage 2 --slowdown 1.5",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved", "zb-h1"), default="1f1b")
    p.add_argument("--stages", type=BOUNDED["stages"], default=4, help="pipeline ranks p")
    p.add_argument("--microbatches", type=BOUNDED["microbatches"], default=None, help="micro-batches per step m (default 4p)")
    p.add_argument("--vpp", type=BOUNDED["stages"], default=None, help="model chunks per rank (interleaved; default 2)")
    p.add_argument("--forward-s", type=BOUNDED["seconds"], default=1.0, help="forward of one micro-batch through one stage")
    p.add_argument("--backward-s", type=BOUNDED["seconds"], default=2.0,
                   help="whole backward, or the input-gradient part when --weight-grad-s is given")
    p.add_argument("--weight-grad-s", type=BOUNDED["seconds0"], default=None, help="weight-gradient pass W (split off for zb-h1)")
    p.add_argument("--p2p-s", type=BOUNDED["seconds0"], default=0.0, help="time of one activation transfer between stages")
    p.add_argument("--slow-stage", type=BOUNDED["stage_index"], default=None, metavar="I", help="a straggler: stage I runs --slowdown× slower")
    p.add_argument("--slowdown", type=BOUNDED["factor"], default=None, metavar="X",
                   help="straggler factor, 1 or more (default 2; needs --slow-stage)")
    p.add_argument("--max-bubble", type=BOUNDED["share"], default=None, metavar="X",
                   help="answer the inverse question: fewest micro-batches with bubble ≤ X (e.g. 0.10)")
    p.add_argument("--plot", metavar="FILE", help="save the timeline as a picture (.png or .svg)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=cmd_pipeline)


def cmd_pipeline(args):
    from shardlab.errors import ShardlabError
    from shardlab.pipeline import min_microbatches, simulate
    from shardlab.pipeline.render import pipeline_doc, render_pipeline, save_timeline

    if args.plot:
        from shardlab.render.plots import check_picture_path

        check_picture_path(args.plot)
    p = args.stages
    v = args.vpp if args.vpp is not None else (2 if args.schedule == "interleaved" else 1)
    times = dict(forward_s=args.forward_s, backward_s=args.backward_s, weight_grad_s=args.weight_grad_s)
    if args.max_bubble is not None:
        if args.microbatches is not None:
            raise ShardlabError("give --microbatches or --max-bubble (which computes it), not both")
        m = min_microbatches(args.schedule, p, args.max_bubble, v, **times)
    else:
        from shardlab.layout import default_microbatches

        m = args.microbatches or default_microbatches(p)
    slow = None
    if args.slowdown is not None and args.slow_stage is None:
        raise ShardlabError("--slowdown needs --slow-stage I (the stage that runs slower)")
    if args.slow_stage is not None:
        if not 0 <= args.slow_stage < p:
            raise ShardlabError(f"--slow-stage {args.slow_stage} is outside the pipeline (stages 0..{p - 1})")
        args.slowdown = 2.0 if args.slowdown is None else args.slowdown
        if args.slowdown < 1:
            raise ShardlabError(f"--slowdown {args.slowdown:g}: a straggler runs slower; give a factor of 1 or more "
                                f"(1.5 = 50% slower)")
        slow = {args.slow_stage: args.slowdown}
    if args.plot:
        from shardlab.limits import MAX_PLOTTED_PASSES
        from shardlab.pipeline.simulate import passes

        if passes(args.schedule, p, m, v) > MAX_PLOTTED_PASSES:
            raise ShardlabError(f"--plot draws one box per pass: p = {p}, m = {m}{f', v = {v}' if v > 1 else ''} has "
                                f"{passes(args.schedule, p, m, v):,}, over the {MAX_PLOTTED_PASSES:,} a picture can show; "
                                f"plot fewer stages or micro-batches (the bubble does not need the picture: drop --plot)")
    res = simulate(args.schedule, p, m, v, p2p_s=args.p2p_s, stage_slowdown=slow, **times)
    base = simulate(args.schedule, p, m, v, p2p_s=args.p2p_s, **times) if slow else None
    plot = save_timeline(res, args.plot, times, args.p2p_s, args.slow_stage if slow else None, args.slowdown) if args.plot else None
    doc = pipeline_doc(res, times, base=base, max_bubble=args.max_bubble, plot=plot)
    if args.max_bubble is not None and (args.p2p_s or slow):
        doc["max_bubble_caveat"] = (f"by the closed form, which has no sends and equal stages; with "
                                    f"{'--p2p-s' if args.p2p_s else '--slow-stage'} the simulated bubble at this m is "
                                    f"{100 * res.bubble_fraction:.2f}%")
    return doc, render_pipeline(res, doc)
