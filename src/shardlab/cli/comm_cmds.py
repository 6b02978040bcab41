"""shardlab comm: one collective's cost, a layout's collectives (plan), tensor-parallel inference."""

from __future__ import annotations

import argparse

from shardlab.cli.common import (BOUNDED, add_cluster_args, add_layout_args, add_model_args, add_output_args,
                                  old_spelling)
from shardlab.limits import MAX_LINKS

OPS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "broadcast", "send-recv")
COMPARE_LINKS = "nvlink4,pcie5,ethernet-10g"
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}

COMM_EXAMPLES = """examples:
  shardlab comm all-reduce --size 256MiB --gpus 8 --link nvlink4
  shardlab comm all-reduce --size 1GiB --gpus 64 --nodes 8 --link ib-ndr     # hierarchical
  shardlab comm all-gather --sweep --gpus 8 --link nvlink4,ib-ndr,ethernet-100g --plot sweep.png
  shardlab comm plan llama-3.1-70b --gpus 64 --tp 8 --pp 2 --zero 1
  shardlab comm inference llama-2-7b --tp 2 --link ethernet-10g --batch 1 --prompt-len 2048
"""


def register(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    comm = sub.add_parser("comm", help="cost of collectives; a layout's communication; TP inference communication",
                          description="α–β cost of one collective on a link (nccl-tests algbw/busbw), the collectives a "
                                      "training layout issues per step, and tensor-parallel decode vs prefill.",
                          epilog=COMM_EXAMPLES, formatter_class=fmt)
    comm.set_defaults(func=lambda a: _need_op(comm))
    csub = comm.add_subparsers(dest="comm_op", metavar="OP")
    for op in OPS:
        p = csub.add_parser(op, help=f"time, algbw and busbw of one {op}", formatter_class=fmt, epilog=COMM_EXAMPLES)
        p.add_argument("--size", default=None, help="message size S, nccl-tests convention (8KB, 256MiB, 1e9; 4K = 4 KiB)")
        p.add_argument("--gpus", dest="ranks", type=BOUNDED["gpus"], default=None, help="GPUs in the group (n ≥ 2)")
        old_spelling(p, "--ranks", "--gpus", "ranks", type=BOUNDED["gpus"])
        p.add_argument("--link", default="nvlink4", help="link id (see `shardlab links`); with --sweep a comma list")
        p.add_argument("--algorithm", choices=("ring", "tree", "auto"), default="auto",
                       help="ring, tree, or auto (the faster, where NCCL has both)")
        p.add_argument("--nodes", type=BOUNDED["gpus"], default=1,
                       help="nodes the group spans: hierarchical (intra-node then inter-node) when > 1")
        p.add_argument("--intra-link", default="nvlink4", help="link inside a node when --nodes > 1 (default nvlink4)")
        p.add_argument("--sweep", action="store_true", help="a table over sizes 1 B to 1 GiB (powers of two)")
        p.add_argument("--plot", metavar="FILE", help="with --sweep: save time and busbw against size (.png or .svg)")
        add_output_args(p)
        p.set_defaults(func=cmd_collective, op=op)
    p = csub.add_parser("plan", help="every collective of one training step of a layout", formatter_class=fmt,
                        epilog=COMM_EXAMPLES)
    add_model_args(p, default="llama-3.1-8b")
    add_layout_args(p)
    add_cluster_args(p)
    p.add_argument("--framework", default=None, metavar="NAME",
                   help="training framework whose mechanisms apply (default megatron-lm; deepspeed re-gathers ZeRO-3 "
                        "weights for a recomputed forward)")
    p.add_argument("--global-batch", type=BOUNDED["batch"], default=None,
                   help="sequences per optimizer step (default: --microbatches × micro-batch × dp)")
    from shardlab.cli.common import add_grad_reduce_args
    from shardlab.cli.from_file import add_from_arg, with_from

    add_grad_reduce_args(p.add_argument_group("gradient reduction"))
    from shardlab.cli.plan_args import add_moe_dispatch_args

    add_moe_dispatch_args(p.add_argument_group("MoE token movement"), imbalance=True)
    add_from_arg(p)                      # a shardlab job file (or a framework's) as MODEL or --from FILE
    add_output_args(p)
    p.set_defaults(func=with_from(p, cmd_plan))
    p = csub.add_parser("inference", help="TP decode vs prefill: communication against compute and memory",
                        formatter_class=fmt, epilog=COMM_EXAMPLES)
    add_model_args(p, default="llama-2-7b")
    p.add_argument("--tp", type=BOUNDED["gpus"], default=2, help="tensor-parallel degree")
    p.add_argument("--ep", type=BOUNDED["gpus"], default=1, help="expert-parallel degree (MoE: all-to-alls on the same link)")
    p.add_argument("--link", default="nvlink4", help="link the TP group communicates over")
    p.add_argument("--batch", type=BOUNDED["batch"], default=1, help="sequences decoded together (b)")
    p.add_argument("--prompt-len", type=BOUNDED["seq_len"], default=2048, help="prompt tokens (s) for the prefill")
    p.add_argument("--context-len", type=BOUNDED["seq_len"], default=None, help="cached tokens at the decode step (default: prompt length)")
    p.add_argument("--gpu", default="h100-sxm", help="accelerator id (default h100-sxm)")
    p.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="bf16", help="weights, activations and KV cache dtype")
    p.add_argument("--compare", default=COMPARE_LINKS, help=f"links to price the same steps on (default {COMPARE_LINKS})")
    p.add_argument("--compute-efficiency", type=BOUNDED["share"], default=None, help="achieved share of peak FLOP/s")
    p.add_argument("--memory-efficiency", type=BOUNDED["share"], default=None, help="achieved share of HBM bandwidth")
    add_output_args(p)
    p.set_defaults(func=cmd_inference)


def _need_op(parser) -> int:
    from shardlab.errors import ShardlabError

    raise ShardlabError(f"choose what to price: a collective ({', '.join(OPS)}), plan (a training step's collectives) "
                        f"or inference (see `{parser.prog} --help`)")


def _links(cat, text: str, flag: str = "--link"):
    from shardlab.errors import ShardlabError

    names = [x.strip() for x in text.split(",") if x.strip()]
    if len(names) > MAX_LINKS:
        raise ShardlabError(f"{flag} names {len(names):,} links; give at most {MAX_LINKS} (see `shardlab links`)")
    links = [cat.link(x) for x in names]
    seen = set()
    for ln in links:
        if ln.id in seen:
            raise ShardlabError(f"{flag} names link '{ln.id}' twice; name each link once")
        seen.add(ln.id)
    return links


def cmd_collective(args):
    from shardlab.catalog import get_catalog
    from shardlab.comm.collectives import collective_time
    from shardlab.comm.report import render_cost, render_sweep
    from shardlab.errors import ShardlabError
    from shardlab.units import parse_size

    cat = get_catalog(args.catalog)
    links = _links(cat, args.link)
    if args.ranks is None:
        raise ShardlabError(f"give --gpus N: the GPUs in the {args.op} group (e.g. --gpus 8)")
    if args.ranks < 2:
        raise ShardlabError(f"--gpus must be 2 or more for a collective (one rank sends nothing), got {args.ranks}")
    if len(links) > 1 and not args.sweep:
        raise ShardlabError("several links need --sweep; price one link at a time otherwise")
    if args.plot and not args.sweep:
        raise ShardlabError("--plot draws the --sweep; add --sweep")
    if not links:
        raise ShardlabError(f"--link '{args.link}' names no link; give a link id (see `shardlab links`)")
    if args.plot:
        from shardlab.render.plots import check_picture_path

        check_picture_path(args.plot)
    intra = None
    if args.nodes > 1:
        intra = cat.link(args.intra_link)
        for ln in links:
            if ln.scope != "inter":
                raise ShardlabError(f"--link {ln.id} joins GPUs inside a node but --nodes is {args.nodes}; "
                                    f"give the link between nodes (e.g. ib-ndr) and --intra-link for inside")
    kw = dict(nodes=args.nodes, intra_link=intra)
    if not args.sweep:
        if args.size is None:
            raise ShardlabError("--size is required (e.g. --size 256MiB), or use --sweep for 1 B to 1 GiB")
        size = parse_size(args.size, "--size")
        if size < 1:
            raise ShardlabError(f"--size {args.size}: a collective of 0 bytes sends nothing (NCCL returns at once); "
                                f"give 1 B or more")
        cost = collective_time(args.op, size, args.ranks, links[0], args.algorithm, **kw)
        doc = {k: v for k, v in cost.__dict__.items() if k != "phases"}
        from shardlab.comm.collectives import bus_factor
        doc.update(link=links[0].id, intra_link=intra.id if intra else None, bus_factor=bus_factor(args.op, args.ranks),
                   phases=[p.__dict__ for p in cost.phases])
        return doc, render_cost(cost, links[0], intra)
    sizes = [2**k for k in range(31)]
    series = []
    for ln in links:
        costs = [collective_time(args.op, s, args.ranks, ln, args.algorithm, **kw) for s in sizes]
        # hierarchical: the intra-node stage cuts what crosses the node link, so the busbw over every rank tends to
        # the model's own large-message busbw, not the node link's β
        inside = intra is not None and args.ranks > args.nodes          # one rank per node: nothing inside
        series.append({"label": f"{ln.id} between nodes + {intra.id} inside" if inside else ln.id, "link": ln.id,
                       "sizes_bytes": sizes, "time_s": [c.time_s for c in costs],
                       "algbw_gbps": [c.algbw_gbps for c in costs], "busbw_gbps": [c.busbw_gbps for c in costs],
                       "regime": [c.regime for c in costs], "algorithm": [c.algorithm for c in costs],
                       "crossover_bytes": costs[-1].crossover_bytes,
                       "beta_gbps": costs[-1].busbw_gbps if inside else ln.bytes_per_s / 1e9,
                       "beta_from": ("the 1 GiB call's busbw (hierarchical: the stage inside each node changes what "
                                     "crosses the node link, so busbw over every rank is not the node link's β)"
                                     if inside else "the link's line rate × efficiency")})
    plot = None
    if args.plot:
        from shardlab.render.plots import comm_sweep

        sub = "hierarchical over " + f"{args.nodes} nodes" if args.nodes > 1 else f"algorithm {args.algorithm}"
        plot = str(comm_sweep(series, args.plot, args.op, args.ranks, subtitle=f"{sub}; shardlab comm --sweep",
                              dashed="large-message busbw" if intra and args.ranks > args.nodes
                              else "link β (line rate × efficiency)"))
    doc = {"op": args.op, "ranks": args.ranks, "nodes": args.nodes, "algorithm": args.algorithm, "sweep": series, "plot": plot}
    return doc, render_sweep(args.op, args.ranks, series, plot)


def cmd_plan(args):
    from dataclasses import asdict

    from shardlab.catalog import get_catalog
    from shardlab.cli.common import cluster_from_args, grad_reduce_choice, layout_from_args, resolve_framework, resolve_model
    from shardlab.comm.exposure import exposure
    from shardlab.comm.inventory import layout_collectives, summarize
    from shardlab.comm.moe_dispatch import MoeDispatch, overlap_applies
    from shardlab.comm.report import render_plan
    from shardlab.errors import ShardlabError
    from shardlab.estimate import estimate_training

    cat = get_catalog(args.catalog)
    spec, params = resolve_model(args, cat)
    if spec is None:
        raise ShardlabError("comm plan needs a model's shapes (give MODEL, not --params)")
    layout = layout_from_args(args)
    cluster = cluster_from_args(args, cat, layout.world_size)
    seq = args.seq_len or min(spec.max_seq_len, 4096)
    # the step model on the same layout: its overlap rules say what of each group the step waits for
    est = estimate_training(spec, layout, cluster, seq_len=seq, global_batch=args.global_batch,
                            microbatches=args.microbatches, precision=args.precision, optimizer=args.optimizer,
                            framework=resolve_framework(args, cat), grad_reduce_bytes=grad_reduce_choice(args),
                            moe=MoeDispatch(args.moe_dispatcher, args.ep_comm_overlap, args.expert_imbalance or 1.0))
    wl = est.workload
    items = layout_collectives(spec, layout, cluster, seq_len=seq, microbatches=est.microbatches, precision=wl.precision,
                               framework=wl, stage=est.slowest_stage if overlap_applies(wl, layout) else None)
    groups = exposure(items, est.breakdown, layout.zero, overlap_applies(wl, layout))
    summary = summarize(items)
    summary.update(exposed_s=sum(g.exposed_s for g in groups),
                   total_by_group_s={g.group: g.total_s for g in groups},
                   exposed_by_group_s={g.group: g.exposed_s for g in groups})
    doc = {"model": spec.name, "framework": wl.framework, "layout": layout.to_dict(), "seq_len": seq,
           "microbatches": est.microbatches, "global_batch": wl.global_batch, "precision": wl.precision,
           "grad_reduce_bytes": wl.grad_reduce_bytes,
           "cluster": {"gpu": cluster.accelerator.id, "gpus_per_node": cluster.gpus_per_node,
                       "intra_link": cluster.intra_link.id, "inter_link": cluster.inter_link.id},
           "items": [asdict(i) for i in items], "summary": summary, "exposure": [g.to_dict() for g in groups],
           "step_time_s": est.step_time_s, "overlap_efficiency": float(cluster.accelerator.overlap_efficiency or 0.0),
           "notes": est.notes}
    return doc, render_plan(doc)


def cmd_inference(args):
    from dataclasses import asdict

    from shardlab.catalog import get_catalog
    from shardlab.cli.common import resolve_model
    from shardlab.comm.inference import DEFAULT_MEMORY_EFFICIENCY, decode_step, prefill_step
    from shardlab.comm.report import render_inference
    from shardlab.errors import ShardlabError
    from shardlab.layout import Layout
    from shardlab.layout_checks import validate

    cat = get_catalog(args.catalog)
    spec, params = resolve_model(args, cat)
    if spec is None:
        raise ShardlabError("comm inference needs a model's shapes (give MODEL, not --params)")
    validate(Layout(tp=args.tp, dp=args.ep, ep=args.ep), spec)
    acc = cat.accelerator(args.gpu)
    link = cat.link(args.link)
    ctx = args.context_len or args.prompt_len
    for flag, n in (("--prompt-len", args.prompt_len), ("--context-len", ctx)):
        if spec.max_seq_len and n > spec.max_seq_len:
            raise ShardlabError(f"{flag} {n} exceeds {spec.name}'s {spec.max_seq_len} positions; use at most {spec.max_seq_len}")
    kw = dict(tp=args.tp, batch=args.batch, accelerator=acc, elem_bytes=DTYPE_BYTES[args.dtype], ep=args.ep,
              compute_efficiency=args.compute_efficiency, memory_efficiency=args.memory_efficiency or DEFAULT_MEMORY_EFFICIENCY,
              dtype=args.dtype)

    def both(ln):
        return (decode_step(spec, context_len=ctx, link=ln, **kw), prefill_step(spec, prompt_len=args.prompt_len, link=ln, **kw))
    d, p = both(link)
    others = []
    for ln in [link] + [x for x in _links(cat, args.compare, "--compare") if x.id != link.id]:
        dd, pp = both(ln)
        others.append({"link": ln.id, "decode": asdict(dd), "prefill": asdict(pp)})
    verdict = [f"decode: {d.comm_calls} all-reduces of {d.comm_bytes_per_call:,} B (b·h·{DTYPE_BYTES[args.dtype]}) are "
               f"{d.comm_regime}-bound; prefill's {p.comm_bytes_per_call:,} B (b·s·h·{DTYPE_BYTES[args.dtype]}) are {p.comm_regime}-bound."]
    for x in others:
        if x["decode"]["comm_fraction"] > 0.4:
            verdict.append(f"on {x['link']}, {100 * x['decode']['comm_fraction']:.0f}% of each decode step is communication "
                           f"(α = {cat.link(x['link']).latency_us:g} µs per step × {d.comm_calls} all-reduces): keep TP inside a node.")
    doc = {"model": spec.name, "tp": args.tp, "ep": args.ep, "batch": args.batch, "prompt_len": args.prompt_len,
           "context_len": ctx, "gpu": acc.id, "link": link.id, "dtype": args.dtype,
           "decode": asdict(d), "prefill": asdict(p), "links": others, "verdict": verdict}
    return doc, render_inference(doc)


# ---- shard ----------------------------------------------------------------------------------------
