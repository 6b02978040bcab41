"""shardlab bench collectives | bench matmul | calibrate: measure this machine and write a hardware profile the
estimate can use (shard-check: cli/shard_check_cmd.py)."""

from __future__ import annotations

import argparse

from shardlab.cli.common import BOUNDED, add_output_args, int_list, old_spelling
from shardlab.cli.report_cmd import add_html_arg
from shardlab.cli.runtime_cmds import reports_interrupt
from shardlab.errors import ShardlabError


def _id_suffix(text: str) -> str:
    """calibrate --name: the suffix of the catalog ids it writes (``<base>-<name>``), so a catalog id's characters;
    ids are case-insensitive (the catalog lowercases them), so the suffix is lowercased here too."""
    from shardlab.catalog import _ID

    if len(text) > 32 or not _ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an id suffix: use 1-32 letters, digits and . _ + - "
                                         f"(starting with a letter or digit), e.g. --name mybox")
    return text.lower()

_STOPPED = "stopped before it finished: nothing measured was kept"
_NO_PROFILE = "stopped before it finished: no profile was written"


EXAMPLES_BENCH = """examples:
  shardlab bench collectives --nproc-per-node 2 --sizes 1KiB:64MiB --plot busbw.png
  shardlab bench collectives --nproc-per-node 8 --ops all-reduce,all-gather --json     # NCCL on a GPU server
  shardlab bench matmul --plot matmul.png                 # fp32 on CPU, bf16 on CUDA
"""
EXAMPLES_CALIBRATE = """examples:
  shardlab calibrate --out profile.yaml                   # matmul + collectives on 2 ranks
  shardlab estimate llama-3.1-8b --gpus 8 --profile profile.yaml --precision fp32   # fp32: a CPU has no bf16 peak
  shardlab calibrate --out p.yaml --from-matmul m.json --from-collectives c.json   # reuse `bench ... --json` output
"""


def _common_device(p) -> None:
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cuda (NCCL) when a GPU is visible, else cpu (gloo); default auto")


def _coll_args(p, nproc_default: int | None = 2) -> None:
    p.add_argument("--nproc-per-node", dest="nproc", type=BOUNDED["ranks_per_node"], default=nproc_default,
                   help="ranks to launch (at least 2; default 2)")
    old_spelling(p, "--nproc", "--nproc-per-node", "nproc", type=BOUNDED["ranks_per_node"])
    p.add_argument("--ops", default="all", help="comma list of all-reduce, all-gather, reduce-scatter, all-to-all, "
                                                "send-recv, broadcast (default: all but broadcast)")
    p.add_argument("--sizes", default=None, help="START:END[:FACTOR] (doubling by default) or a comma list; "
                                                 "default 1KiB:64MiB on CPU, 1KiB:256MiB on CUDA")
    p.add_argument("--iters", type=BOUNDED["iters"], default=20, help="timed iterations per size at most (default 20)")
    p.add_argument("--warmup", type=BOUNDED["iters"], default=2, help="warm-up iterations per size (default 2)")
    p.add_argument("--min-time", type=BOUNDED["timeout"], default=0.05, help="time each size for at least this many "
                                                                         "seconds when --iters allows (default 0.05)")
    p.add_argument("--timeout", type=BOUNDED["timeout"], default=900, help="stop the benchmark after this many seconds")
    p.add_argument("--no-overlap", action="store_true", help="skip the communication/compute overlap test")


def _mm_args(p) -> None:
    p.add_argument("--dtype", choices=("fp32", "tf32", "bf16", "fp16"), default=None,
                   help="default bf16 on CUDA, fp32 on CPU (bf16 matmul is emulated on CPUs)")
    p.add_argument("--hidden", type=int_list, default=None, metavar="H,H,...",
                   help="hidden sizes (default 32..1024 on CPU, 512..8192 on CUDA)")
    p.add_argument("--tokens", type=int_list, default=None, metavar="T,T,...",
                   help="token counts M (default 128,512 on CPU; 512,4096,16384 on CUDA)")
    p.add_argument("--matmul-time", type=BOUNDED["timeout"], default=0.1, help="seconds to time each GEMM (default 0.1)")
    p.add_argument("--threads", type=BOUNDED["ranks_per_node"], default=1,
                   help="CPU threads for the matmuls (default 1: each CPU rank runs on one core)")
    p.add_argument("--gpu", default=None, help="base accelerator id (default: cpu-core on CPU, matched from the "
                                               "CUDA device name on GPUs)")


def register(sub) -> None:
    bench = sub.add_parser("bench", help="measure collectives (nccl-tests style) and matmuls on this machine",
                           description="Measure this machine: collectives (time, algbw, busbw, α–β fit) and "
                                       "matmul FLOP/s (with the fitted efficiency curve).",
                           epilog=EXAMPLES_BENCH, formatter_class=argparse.RawDescriptionHelpFormatter)
    from shardlab.cli import _Parser

    bsub = bench.add_subparsers(dest="bench_command", metavar="WHAT", parser_class=_Parser)
    c = bsub.add_parser("collectives", help="time collectives with torch.distributed (gloo on CPU, NCCL on CUDA)",
                        epilog=EXAMPLES_BENCH, formatter_class=argparse.RawDescriptionHelpFormatter)
    _coll_args(c)
    _common_device(c)
    from shardlab.cli.observe_args import add_observe_args

    add_observe_args(c, injection=False)
    c.add_argument("--plot", metavar="FILE", help="save busbw vs size with the fitted curves (PNG/SVG/PDF)")
    add_output_args(c)
    add_html_arg(c, "bench-collectives")
    c.set_defaults(func=cmd_collectives)

    m = bsub.add_parser("matmul", help="achieved matmul FLOP/s over a transformer layer's GEMMs, and its fit",
                        epilog=EXAMPLES_BENCH, formatter_class=argparse.RawDescriptionHelpFormatter)
    _mm_args(m)
    _common_device(m)
    m.add_argument("--plot", metavar="FILE", help="save achieved FLOP/s vs GEMM size with the fitted curve")
    add_output_args(m)
    m.set_defaults(func=cmd_matmul)
    bench.set_defaults(func=lambda args: _need_sub(bench))

    cal = sub.add_parser("calibrate", help="measure this machine and write a hardware profile for --profile",
                         description="Run the matmul and collectives benchmarks (or reuse their --json output) and "
                                     "write a catalog YAML with a calibrated accelerator, link and profile section.",
                         epilog=EXAMPLES_CALIBRATE, formatter_class=argparse.RawDescriptionHelpFormatter)
    cal.add_argument("--out", required=True, metavar="FILE", help="profile YAML to write")
    _coll_args(cal)
    _mm_args(cal)
    _common_device(cal)
    cal.add_argument("--link", default=None, help="base link id (default: the accelerator's intra-node link)")
    cal.add_argument("--link-fit", default="joint", help="which α–β fit becomes the link: joint (one fit over "
                                                          "every op, default) or one op, e.g. all-reduce")
    cal.add_argument("--name", default="calibrated", type=_id_suffix,
                     help="suffix of the new ids: 1-32 letters, digits and . _ + - (default: <base>-calibrated)")
    cal.add_argument("--from-matmul", metavar="FILE", help="use `shardlab bench matmul --json` output instead of measuring")
    cal.add_argument("--from-collectives", metavar="FILE",
                     help="use `shardlab bench collectives --json` output instead of measuring")
    cal.add_argument("--skip-collectives", action="store_true", help="matmul only (keep the catalog's link)")
    cal.add_argument("--from-run", nargs="+", metavar="RUN.json", default=None,
                     help="fit a framework profile instead: the host times of --framework to these `shardlab run train "
                          "--json` outputs (measured step times); writes a frameworks: entry and profile.framework")
    cal.add_argument("--framework", default=None, metavar="NAME",
                     help="with --from-run: the framework whose other mechanisms the profile keeps (default: the "
                          "hardware profile's, else megatron-lm, as `run train` predicts)")
    cal.add_argument("--profile", default=None, metavar="FILE",
                     help="with --from-run: the hardware profile the runs are predicted with (from `shardlab calibrate`)")
    add_output_args(cal)
    add_html_arg(cal, "calibrate")
    cal.set_defaults(func=cmd_calibrate)



def _need_sub(parser) -> int:
    raise ShardlabError(f"choose what to measure: collectives or matmul (see `{parser.prog} --help`)")


def _device(args) -> str:
    from shardlab.runtime import require_torch

    torch = require_torch()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ShardlabError("--device cuda asked for but no CUDA GPU is visible; use --device cpu")
    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return args.device


def check_plot_path(path: str | None) -> None:
    """Fail before a long measurement, not after it, when the plot cannot be written."""
    if path:
        from shardlab.render.plots import MEASURED_PLOT_SUFFIXES, check_picture_path

        check_picture_path(path, MEASURED_PLOT_SUFFIXES)


def _collectives(args, device: str) -> dict:
    """Run the benchmark (flags checked by ``_validate_coll_flags``), add the fits."""
    from shardlab.runtime import bench_collectives as bc

    ops = bc.parse_ops(args.ops)
    sizes = bc.parse_sizes(args.sizes or ("1KiB:256MiB" if device == "cuda" else "1KiB:64MiB"))
    if device == "cuda":
        bc.check_gpu_count(args.nproc)
    doc = bc.run_collectives(args.nproc, ops, sizes, iters=args.iters, warmup=args.warmup,
                             min_time_s=args.min_time, timeout_s=args.timeout, device=device,
                             overlap=not args.no_overlap, observe=_observe(args))
    return bc.analyse(doc)


def _observe(args):
    """Metrics options of `bench collectives` (calibrate runs the benchmark without them)."""
    from shardlab.cli.observe_args import observe_options

    return observe_options(args) if hasattr(args, "no_metrics") else None


def _validate_coll_flags(args) -> None:
    """Everything checkable before torch is imported (bad input fails fast)."""
    from shardlab.runtime import bench_collectives as bc

    if args.nproc is None or args.nproc < 2:
        raise ShardlabError(f"--nproc-per-node must be at least 2 for a collective, got {args.nproc}; e.g. "
                              f"--nproc-per-node 2")
    bc.parse_ops(args.ops)
    if args.sizes:
        bc.parse_sizes(args.sizes)


@reports_interrupt("bench collectives", note=_STOPPED)
def cmd_collectives(args):
    from shardlab.runtime import bench_collectives as bc

    _validate_coll_flags(args)
    check_plot_path(args.plot)
    doc = _collectives(args, _device(args))
    if args.plot:
        from shardlab.runtime.bench.plots import plot_collectives

        doc["plot"] = plot_collectives(doc, args.plot)
    return doc, bc.render(doc)


def _matmul(args, device: str, catalog) -> dict:
    from shardlab.runtime import bench_matmul as bm
    from shardlab.runtime.calibrate import match_accelerator

    dtype = args.dtype or ("bf16" if device == "cuda" else "fp32")
    if device == "cpu" and dtype != "fp32":
        raise ShardlabError(f"--dtype {dtype} on CPU: PyTorch emulates {dtype} matmuls on most CPUs and the CPU runtime "
                            f"trains in fp32; use --dtype fp32 (the CPU default)")
    hidden, tokens = bm.default_grid(device)
    from shardlab.runtime import check_host_bytes

    h, t = max(args.hidden or hidden), max(args.tokens or tokens)
    # the largest GEMMs (bench_matmul.GEMMS: mlp up and down) hold t·h + 4h·h + 4t·h elements
    check_host_bytes((5 * t * h + 4 * h * h) * (4 if dtype == "fp32" else 2), f"bench matmul at hidden {h:,} "
                     f"and {t:,} tokens", "give smaller --hidden/--tokens", device)
    doc = bm.bench_matmul(dtype, device, args.hidden or hidden, args.tokens or tokens,
                          min_time_s=args.matmul_time, threads=args.threads)
    acc = catalog.accelerator(args.gpu or match_accelerator(doc["device_name"], device))
    doc = bm.analyse(doc, acc)
    if device == "cpu":
        doc["note"] = (f"CPU: fp32 on {doc['threads']} thread(s) (each CPU rank runs on one core; bf16 matmul is "
                       f"emulated on CPUs and the CPU runtime trains in fp32)")
    return doc


@reports_interrupt("bench matmul", note=_STOPPED)
def cmd_matmul(args):
    from shardlab.catalog import get_catalog
    from shardlab.runtime import bench_matmul as bm

    check_plot_path(args.plot)
    cat = get_catalog(args.catalog)
    if args.gpu:
        cat.accelerator(args.gpu)
    doc = _matmul(args, _device(args), cat)
    if args.plot:
        from shardlab.runtime.bench.plots import plot_matmul

        doc["plot"] = plot_matmul(doc, args.plot)
    return doc, bm.render(doc)


@reports_interrupt("calibrate", note=_NO_PROFILE)
def cmd_calibrate(args):
    from shardlab.catalog import get_catalog
    from shardlab.runtime import bench_collectives as bc
    from shardlab.runtime import bench_matmul as bm
    from shardlab.runtime import calibrate as cal
    from shardlab.runtime.bench_files import load_bench, matmul_fit_warnings
    from shardlab.safeout import check_output_path

    check_output_path(args.out, "calibrate --out")
    for f in (args.from_matmul, args.from_collectives):
        if f:
            from shardlab.safeio import read_bytes

            read_bytes(f, "--from file")
    if args.from_run:
        return _calibrate_framework(args)
    cat = get_catalog(args.catalog)
    if args.link_fit != "joint":
        bc.parse_ops(args.link_fit)
    want_coll = not args.skip_collectives
    if want_coll and not args.from_collectives:
        _validate_coll_flags(args)
    mm = load_bench(args.from_matmul, "matmul") if args.from_matmul else None
    coll = load_bench(args.from_collectives, "collectives") if want_coll and args.from_collectives else None
    device = _device(args) if mm is None or (want_coll and coll is None) else mm["device"]
    from shardlab.cli.progress import set_status

    if mm is None:
        set_status("shardlab calibrate: measuring matmuls")
        mm = _matmul(args, device, cat)
    else:
        acc = cat.accelerator(args.gpu or cal.match_accelerator(mm["device_name"], mm["device"]))
        with _blaming(args.from_matmul, "matmul"):
            mm = bm.analyse(mm, acc)
    warnings = matmul_fit_warnings(mm, args.from_matmul)   # before the collectives: a meaningless fit stops here
    if want_coll:
        set_status("shardlab calibrate: measuring collectives")
        if coll is None:
            coll = _collectives(args, device)
        else:
            with _blaming(args.from_collectives, "collectives"):
                coll = bc.analyse(coll)
    return cal.make_profile(mm, coll, cat, out=args.out, link=args.link, link_fit=args.link_fit, suffix=args.name,
                            matmul_file=args.from_matmul, collectives_file=args.from_collectives, warnings=warnings)


class _blaming:
    """Context: a ShardlabError from fitting the rows of a saved `bench KIND --json` file names that file."""

    def __init__(self, path: str, kind: str):
        self.path, self.kind = path, kind

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb):
        if isinstance(e, ShardlabError) and not str(e).startswith(self.path):
            raise ShardlabError(f"{self.path}: {e} (remeasure with `shardlab bench {self.kind} --json`)") from None
        return False


def _calibrate_framework(args):
    """`calibrate --from-run`: fit a framework's host times to measured runs and write the profile."""
    import sys

    from shardlab.catalog import get_catalog
    from shardlab.estimate.training import DEFAULT_FRAMEWORK
    from shardlab.render.table import kv_lines
    from shardlab.runtime.calibrate import write_profile
    from shardlab.runtime.framework_fit import MAX_FIT_RUNS, calibrate_framework, check_run_count
    from shardlab.safeio import load_json

    cat = get_catalog(list(args.catalog), profile=args.profile)
    docs = []
    for path in args.from_run:
        doc = load_json(path, "--from-run (a `shardlab run train --json` document)")
        runs = doc if isinstance(doc, list) else doc.get("runs", [doc]) if isinstance(doc, dict) else [doc]
        if not isinstance(runs, list):
            raise ShardlabError(f"{path}: runs must be a list of `shardlab run train --json` documents, got "
                                f"{type(runs).__name__}; rerun the jobs with --json")
        for i, d in enumerate(runs):
            docs.append((f"{path}[{i}]" if isinstance(doc, list) else
                         f"{path}: runs[{i}]" if isinstance(doc, dict) and "runs" in doc else path, d))
        if len(docs) > MAX_FIT_RUNS:     # before any estimate, and before reading the next file
            check_run_count(len(docs), path if len(args.from_run) == 1 else "--from-run " + " ".join(args.from_run)[:200])
    base = args.framework or (cat.profile or {}).get("framework") or DEFAULT_FRAMEWORK
    command = "shardlab calibrate " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "shardlab calibrate --from-run"
    out, fit = calibrate_framework(docs, cat, base=base, gpu=args.gpu, link=args.link, suffix=args.name, command=command)
    path = write_profile(out, args.out, f"framework host times fitted to {fit.runs} measured run(s); use with the hardware "
                                        "profile they were predicted with: --catalog HW.yaml --profile THIS_FILE",
                         inputs=" and ".join(args.from_run)[:300])
    fid = next(iter(out["frameworks"]))
    pairs = [("profile", str(path)), ("framework", f"{fid} (from {base})"),
             ("host per block and pass", f"{fit.layer_host_s * 1e3:.4g} ms"),
             ("host per step", f"{fit.step_overhead_s * 1e3:.4g} ms" + ("" if fit.step_fitted else " (held: the runs cannot separate it)")),
             ("runs", fit.runs), ("relative RMS error", f"{fit.rel_rms_before:.1%} with {base} -> {fit.rel_rms_after:.1%} fitted"),
             ("use it", "shardlab estimate MODEL ... " + (f"--catalog {args.profile} " if args.profile else "") + f"--profile {path}")]
    return {"profile_path": str(path), "profile": out, "fit": fit.__dict__, "base_framework": base}, kv_lines(pairs)
