"""shardlab run train | infer: real torch.distributed runs (torchrun), measured beside the predictions.

Imports stay lazy: nothing here imports torch; the handlers check for it and say how to install it.
"""

from __future__ import annotations

import argparse
import functools
import re
from contextlib import contextmanager

from shardlab.cli.common import BOUNDED, int_list, old_spelling, token_ids
from shardlab.cli.observe_args import add_observe_args, observe_options
from shardlab.cli.report_cmd import add_html_arg

TRAIN_EXAMPLES = """examples:
  shardlab run train --strategy ddp --nproc-per-node 2
  shardlab run train --strategy fsdp --nproc-per-node 2 --check-parity --json
  shardlab run train --strategy tp-megatron --nproc-per-node 2 --model tiny-gpt2
  shardlab run train --strategy pp --nproc-per-node 2 --schedule interleaved
  shardlab run train --strategy fsdp+tp --nproc-per-node 4            # 2-D: dp 2 x tp 2
  shardlab run train --strategy ddp+ep --nproc-per-node 4 --ep 2 --model tiny-moe   # experts split over 2 ranks, all-to-all
  shardlab run train --strategy fsdp --nproc-per-node 2 --steps 200 --slow-rank 1:2   # live table, straggler named
  shardlab run train --strategy ddp --nproc-per-node 2 --steps 50 --metrics-port 9510 --tensorboard tb/
  # two nodes (run on each, node-rank 0 and 1):
  shardlab run train --strategy fsdp --nproc-per-node 8 --nodes 2 --node-rank 0 --rdzv-endpoint node0:29500 --rdzv-id job1
"""

INFER_EXAMPLES = """examples:
  shardlab run infer --tp 2 --prompt "hello" --max-new-tokens 16
  shardlab run infer --model ./my-checkpoint --tp 2 --prompt-ids 1,2,3 --check-parity   # against transformers
  shardlab run infer --model hf:Qwen/Qwen3-0.6B --tp 2 --pp 2 --prompt "Hello" --check-parity
  shardlab run infer --sweep --plot tp-speedup.png --json
  shardlab run infer --tp 2 --max-new-tokens 64 --slow-rank 1:3:0.05   # p99 token latency climbs, p50 does not
"""


def _add_launch_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("launch (torchrun)")
    g.add_argument("--timeout", type=BOUNDED["timeout"], default=300.0,
                   help="stop the whole job (torchrun, every rank) after this many seconds")
    g.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when a GPU is visible (NCCL), else cpu (gloo)")
    g.add_argument("--nodes", dest="nnodes", type=nnodes_arg, default=None, metavar="N|MIN:MAX",
                   help="nodes of the job (torchrun --nnodes; multi-node)")
    old_spelling(g, "--nnodes", "--nodes", "nnodes", type=nnodes_arg)
    g.add_argument("--node-rank", type=BOUNDED["node_rank"], default=None,
                   help="this node's rank (0 .. nnodes-1): a static rendezvous that honours it (node 0 hosts the store)")
    g.add_argument("--rdzv-endpoint", type=endpoint_arg, default=None, metavar="HOST:PORT",
                   help="torchrun --rdzv-endpoint (node 0's address)")
    g.add_argument("--rdzv-id", type=rdzv_id_arg, default=None, help="torchrun --rdzv-id (same on every node)")
    g.add_argument("--rdzv-backend", choices=RDZV_BACKENDS, default=None,
                   help="torchrun --rdzv-backend (default: static with --node-rank, else c10d)")
    g.add_argument("--rdzv-bind-any", action="store_true",
                   help="let the rendezvous store listen on every interface (a wildcard endpoint or --local-addr); "
                        "by default it listens only on the address named (loopback for one node)")
    g.add_argument("--local-addr", type=endpoint_host_arg, default=None, metavar="ADDR",
                   help="torchrun --local-addr: this node's address as the other nodes reach it (default: its host "
                        "name, which must resolve to a non-loopback address)")
    g.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2", "static")
"""torchrun's rendezvous backends (torch.distributed.elastic.rendezvous)."""


def nnodes_arg(text: str) -> str:
    """torchrun's --nnodes: N, or MIN:MAX for an elastic job (1 <= MIN <= MAX <= limits.MAX_GPUS)."""
    parse = BOUNDED["gpus"]
    parts = text.split(":")
    if len(parts) > 2:
        raise argparse.ArgumentTypeError(f"'{text}' is not N or MIN:MAX (e.g. 2 or 1:4)")
    lo, hi = parse(parts[0]), parse(parts[-1])
    if lo > hi:
        raise argparse.ArgumentTypeError(f"'{text}': MIN {lo} is above MAX {hi}")
    return f"{lo}:{hi}" if len(parts) == 2 else str(lo)


def endpoint_arg(text: str) -> str:
    """HOST or HOST:PORT (port 1-65535; IPv6 hosts in brackets)."""
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]{1,253})(?::(\d{1,5}))?", text)
    if not m or (m.group(2) and not 1 <= int(m.group(2)) <= 65535):
        raise argparse.ArgumentTypeError(f"'{text[:60]}' is not HOST:PORT (e.g. node0:29500 or [::1]:29500)")
    return text


def endpoint_host_arg(text: str) -> str:
    """A host name or an IPv4/IPv6 address (no port)."""
    if not re.fullmatch(r"[0-9A-Fa-f:.]+|[A-Za-z0-9_.-]{1,253}", text):
        raise argparse.ArgumentTypeError(f"'{text[:60]}' is not a host name or address (e.g. 10.0.0.7)")
    return text


def rdzv_id_arg(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", text):
        raise argparse.ArgumentTypeError(f"'{text[:60]}' must be 1-128 letters, digits, '.', '_' or '-'")
    return text


def torchrun_args(args) -> tuple[str, ...]:
    import uuid

    from shardlab.errors import ShardlabError

    out: list[str] = []
    if not (args.nnodes or args.node_rank is not None or args.rdzv_endpoint or args.rdzv_id or args.rdzv_backend):
        import os

        from shardlab.runtime.slurm import from_environment

        slurm = from_environment(os.environ)        # inside a multi-node Slurm allocation: its nodes, no flags needed
        if slurm is not None:
            args.nnodes, args.node_rank = str(slurm.nnodes), slurm.node_rank
            args.rdzv_endpoint, args.rdzv_id = slurm.endpoint, slurm.rdzv_id
    if args.nnodes:
        out += ["--nnodes", str(args.nnodes)]
    backend = args.rdzv_backend
    if args.node_rank is not None:
        top = int(str(args.nnodes or "1").split(":")[-1])
        if args.node_rank >= top:
            raise ShardlabError(f"--node-rank {args.node_rank} is outside 0..{top - 1} (--nnodes {args.nnodes or 1})")
        if backend == "c10d":
            raise ShardlabError("--node-rank has no effect under --rdzv-backend c10d (it numbers nodes in the order they "
                                "join); drop --node-rank, or drop --rdzv-backend for a static rendezvous that keeps it")
        if ":" in str(args.nnodes or ""):
            raise ShardlabError(f"--node-rank needs a fixed node count (a static rendezvous), not --nodes {args.nnodes}")
        backend = backend or "static"              # node ranks given: torchrun's static rendezvous honours them
        out += ["--node-rank", str(args.node_rank)]
    multi = bool(args.nnodes) and int(str(args.nnodes).split(":")[-1]) > 1
    if multi and not args.rdzv_endpoint:
        raise ShardlabError(f"--nodes {args.nnodes} needs --rdzv-endpoint HOST:PORT, node 0's address and a free port, "
                            "the same on every node (without it each node would wait alone until --timeout)")
    _refuse_wildcard(args)
    if args.rdzv_endpoint:
        if multi:
            from shardlab.runtime.preflight import check_reachable_name

            check_reachable_name(args.rdzv_endpoint, getattr(args, "local_addr", None))
        if multi and not args.rdzv_id and backend != "static":
            raise ShardlabError("a multi-node job needs --rdzv-id ID, the same on every node and new for every job (the "
                                "scheduler's job id, say), or --node-rank on every node (a static rendezvous): a "
                                "fixed id lets a stray node or anyone who reaches the endpoint join the job "
                                "(torchrun's store runs what it is sent)")
        out += ["--rdzv-backend", backend or "c10d", "--rdzv-endpoint", args.rdzv_endpoint]
        if backend == "static" and multi:
            # node 0's store gives up waiting for the others before the job's --timeout, saying how many joined
            out += ["--rdzv-conf", f"timeout={max(5, int(0.6 * float(getattr(args, 'timeout', 300.0))))}"]
        # one job's own id; a static rendezvous's id only prefixes its keys, and every node must use the same one
        out += ["--rdzv-id", args.rdzv_id or ("shardlab" if backend == "static" else f"shardlab-{uuid.uuid4().hex[:12]}")]
    elif args.rdzv_backend or args.rdzv_id:
        raise ShardlabError("--rdzv-backend/--rdzv-id need --rdzv-endpoint HOST:PORT (node 0's address)")
    if getattr(args, "local_addr", None):
        out += ["--local-addr", args.local_addr]     # the launcher binds the store and the collectives to it
        if (backend or "c10d") == "c10d" and args.rdzv_endpoint and \
                args.rdzv_endpoint.rsplit(":", 1)[0].strip("[]") == args.local_addr.strip("[]"):
            # this node is the endpoint: it hosts the c10d store (torchrun matches the endpoint against the host
            # name's addresses only, which a node reached by --local-addr need not have)
            out += ["--rdzv-conf", "is_host=1"]
    return tuple(out)


def _refuse_wildcard(args) -> None:
    """Refuse a wildcard endpoint or --local-addr unless --rdzv-bind-any asks for it: the rendezvous store would listen
    on every interface (``runtime.bound_run``; the launcher sets the store's address from the flags,
    ``preflight.launch_env``)."""
    from shardlab.errors import ShardlabError
    from shardlab.runtime.preflight import is_wildcard

    named = [(flag, v) for flag, v in (("--local-addr", getattr(args, "local_addr", None)),
                                       ("--rdzv-endpoint", (args.rdzv_endpoint or "").rsplit(":", 1)[0] or None)) if v]
    wild = [flag for flag, v in named if is_wildcard(v)]
    if wild and not getattr(args, "rdzv_bind_any", False):
        raise ShardlabError(f"{wild[0]} names no single address: the rendezvous store would listen on every interface "
                            "and run what anyone who reaches it sends; name this node's address, or pass "
                            "--rdzv-bind-any to accept that")


def _need_what(args) -> int:
    from shardlab.errors import ShardlabError

    raise ShardlabError("choose what to run: train, infer or precision (see `shardlab run --help`)")


def register(sub) -> None:
    run = sub.add_parser("run", help="run a layout for real with torch.distributed (train, infer)",
                         description="Run the same layouts for real (torchrun; gloo on CPU, NCCL on GPUs) and set the "
                                     "measurements beside the predictions.")
    run.set_defaults(func=_need_what)
    rsub = run.add_subparsers(dest="run_command", metavar="{train,infer,precision}")
    t = rsub.add_parser("train", help="train a small GPT with a parallel strategy; measured vs predicted",
                        epilog=TRAIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--strategy", default="ddp",
                   help="ddp, fsdp, tp, tp+sp, tp-megatron, pp, or 2-D: fsdp+tp, ddp+pp, fsdp+pp, ddp+tp-megatron, "
                        "ddp+ep (experts split, with --model tiny-moe)")
    t.add_argument("--nproc-per-node", dest="nproc", type=BOUNDED["ranks_per_node"], default=2, help="ranks per node")
    old_spelling(t, "--nproc", "--nproc-per-node", "nproc", type=BOUNDED["ranks_per_node"])
    t.add_argument("--model", default="tiny",
                   help="tiny, small, tiny-gpt2, a catalog id / config.json / YAML (random weights), or a checkpoint "
                        "folder / hf:ORG/NAME to fine-tune from (each rank reads its own shards)")
    t.add_argument("--make-vocab-size-divisible-by", type=BOUNDED["vocab_multiple"], default=1, metavar="N",
                   help="pad the vocabulary to a multiple of N x tp, as Megatron-LM (default 1: pad only to a multiple of tp)")
    t.add_argument("--steps", type=BOUNDED["steps"], default=4,
                   help="optimizer steps (at least 1): step 0 measures memory, step 1 records the collectives, "
                        "3 or more give uninstrumented step times")
    t.add_argument("--global-batch", type=BOUNDED["batch"], default=8, help="sequences per step")
    t.add_argument("--micro-batch", type=BOUNDED["batch"], default=None, help="sequences per micro-batch per DP rank")
    t.add_argument("--seq-len", type=BOUNDED["seq_len"], default=64, help="tokens per sequence")
    t.add_argument("--tp", type=BOUNDED["gpus"], default=None, help="tensor-parallel degree (default: all ranks, 2 when combined)")
    t.add_argument("--pp", type=BOUNDED["gpus"], default=None, help="pipeline degree (default: all ranks, 2 when combined)")
    t.add_argument("--ep", type=BOUNDED["gpus"], default=None,
                   help="expert-parallel degree, out of the data-parallel ranks (ddp+ep; default: all of them)")
    t.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved"), default="1f1b", help="pipeline schedule")
    t.add_argument("--vpp", type=BOUNDED["stages"], default=1, help="model chunks per pipeline rank (interleaved: 2 by default)")
    t.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw", help="optimizer (sgd = with momentum)")
    t.add_argument("--seed", type=BOUNDED["seed"], default=0, help="model seed (data seed = 1234 + seed)")
    t.add_argument("--check-parity", action="store_true", help="compare step 0 with a single-process step")
    t.add_argument("--sweep-nproc", type=int_list, default=None, metavar="N,N,...",
                   help="run at each process count (e.g. 1,2,4): measured vs predicted step time and scaling")
    t.add_argument("--predict-gpu", default=None, help="accelerator for the step-time prediction (default cpu-core on CPU)")
    t.add_argument("--profile", default=None, metavar="FILE",
                   help="hardware profile from `shardlab calibrate` for the step-time prediction (its gpu, link, overlap)")
    t.add_argument("--no-probe", action="store_true",
                   help="on a CPU, predict from the catalog's generic core instead of this machine's probe (rates and "
                        "the runtime's host time, measured once per machine, torch version and strategy and cached; "
                        "SHARDLAB_PROBE=0 does the same)")
    t.add_argument("--reprobe", action="store_true", help="measure this machine's probe again, even if it is cached")
    _add_launch_args(t)
    add_html_arg(t, "run-train")
    add_observe_args(t)
    t.set_defaults(func=cmd_train)
    i = rsub.add_parser("infer", help="greedy generation with tensor parallelism and a KV cache",
                        epilog=INFER_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("--tp", type=BOUNDED["gpus"], default=2, help="tensor-parallel ranks (in total, over all nodes)")
    i.add_argument("--model", default="tiny",
                   help="tiny, small, tiny-gpt2, a catalog id / config.json / YAML (random weights), or a checkpoint: a "
                        "folder with config.json and safetensors weights, or hf:ORG/NAME (each rank reads its slices)")
    i.add_argument("--pp", type=BOUNDED["stages"], default=1, help="pipeline stages (tp x pp ranks)")
    i.add_argument("--prompt", default="The quick brown fox",
                   help="prompt text: the checkpoint's tokenizer when it has one, else bytes modulo the vocabulary")
    i.add_argument("--prompt-ids", type=token_ids, default=None, metavar="ID,ID,...",
                   help="prompt token ids (no tokenizer needed); replaces --prompt")
    i.add_argument("--check-parity", action="store_true",
                   help="with a checkpoint: compare the tokens with transformers' generate on it (matches_transformers)")
    i.add_argument("--make-vocab-size-divisible-by", type=BOUNDED["vocab_multiple"], default=1, metavar="N",
                   help="pad the vocabulary to a multiple of N x tp, as Megatron-LM (default 1: pad only to a multiple of tp)")
    i.add_argument("--kv-block-size", type=BOUNDED["block"], default=16, help="tokens per block of the paged KV cache")
    i.add_argument("--max-new-tokens", type=BOUNDED["seq_len"], default=16, help="tokens to generate")
    i.add_argument("--strategy", choices=("tp", "tp-megatron"), default="tp-megatron",
                   help="DTensor plan or our Megatron-style layers")
    i.add_argument("--sweep", action="store_true",
                   help="run T = 1, 2, 4, ... up to what the devices allow (GPUs present; CPU cores or --max-tp) and plot")
    i.add_argument("--max-tp", type=BOUNDED["gpus"], default=None, metavar="N",
                   help="with --sweep: the largest T to run (at most the GPUs present; on a CPU, the processes you allow)")
    i.add_argument("--plot", default=None, metavar="PNG", help="with --sweep: where to write the speedup plot")
    i.add_argument("--seed", type=BOUNDED["seed"], default=0, help="model seed")
    _add_launch_args(i)
    add_html_arg(i, "run-infer")
    add_observe_args(i)
    i.set_defaults(func=cmd_infer)
    pr = rsub.add_parser("precision", help="fp32 vs fp16 (with and without loss scaling) vs bf16 on the same model: underflow",
                         description="Train the same small GPT in fp32, fp16 without loss scaling, fp16 with dynamic loss "
                                     "scaling and bf16 (autocast, one CPU process) and measure where fp16 gradients underflow.")
    pr.add_argument("--model", default="tiny", help="tiny, small, tiny-gpt2 or a catalog id")
    pr.add_argument("--steps", type=BOUNDED["steps"], default=20, help="optimizer steps per mode")
    pr.add_argument("--grad-scale-exp", type=BOUNDED["binades"], default=12, metavar="K",
                    help="train with the loss × 2^-K: gradients K binades smaller, as in a large run (default 12)")
    pr.add_argument("--global-batch", type=BOUNDED["batch"], default=8, help="sequences per step")
    pr.add_argument("--seq-len", type=BOUNDED["seq_len"], default=64, help="tokens per sequence")
    pr.add_argument("--seed", type=BOUNDED["seed"], default=0, help="model seed")
    pr.add_argument("--json", action="store_true", help="print one JSON document")
    pr.set_defaults(func=cmd_precision)


def reports_interrupt(command: str, note: str | None = None):
    """Decorator of a command handler that runs a job or measures: :func:`interrupt_reported` around it."""
    def wrap(handler):
        @functools.wraps(handler)
        def run(args):
            with interrupt_reported(args, command, note):
                return handler(args)
        return run
    return wrap


@contextmanager
def interrupt_reported(args, command: str, note: str | None = None):
    """Around a run command: SIGTERM and SIGHUP raise ``interrupts.Interrupted`` as Ctrl-C raises KeyboardInterrupt
    (``launch`` stops the job for all three), and under --json an interrupted command still prints its one JSON
    document (``runtime.interrupted.interrupted_doc``: what the job had done, where its records are) before the
    interrupt goes on to ``main``, which writes the stderr line and exits 128 + the signal (130 for Ctrl-C).
    ``note``: what the document says when no job had reported progress (default: none had started)."""
    import signal

    from shardlab import interrupts

    try:
        # SIGINT stays Python's own handler here: launch's signals_raise takes it from there while the job runs
        with interrupts.signals_raise((signal.SIGTERM, signal.SIGHUP)):
            yield
    except KeyboardInterrupt as e:
        if getattr(args, "json", False):
            from shardlab.cli import emit
            from shardlab.errors import ShardlabError
            from shardlab.runtime.interrupted import interrupted_doc

            doc = interrupted_doc(command, getattr(e, "signum", signal.SIGINT), getattr(e, "progress", None),
                                  getattr(e, "sweep", None))
            if note and doc["progress"] is None:
                doc["note"] = note
            try:
                with interrupts.shielded():      # a second signal does not cut the document in two
                    emit(args, doc, "")
            except (ShardlabError, OSError):      # stdout gone: main's stderr line still says it
                pass
        raise


def _set_status(text: str) -> None:
    from shardlab.cli.progress import set_status

    set_status(text)


@reports_interrupt("run train")
def cmd_train(args):
    from shardlab.runtime.train import TrainRequest, run_train

    req = TrainRequest(strategy=args.strategy, nproc=args.nproc, model=args.model, steps=args.steps,
                       global_batch=args.global_batch, micro_batch=args.micro_batch, seq_len=args.seq_len, tp=args.tp,
                       pp=args.pp, ep=args.ep, schedule=args.schedule, vpp=args.vpp, optimizer=args.optimizer, seed=args.seed,
                       timeout_s=args.timeout, check_parity=args.check_parity, device=args.device,
                       predict_gpu=args.predict_gpu, profile=args.profile, torchrun_args=torchrun_args(args),
                       observe=observe_options(args), vocab_divisible_by=args.make_vocab_size_divisible_by,
                       probe=not args.no_probe, reprobe=args.reprobe, status=_set_status)
    if args.reprobe and (args.no_probe or args.profile or args.predict_gpu):
        from shardlab.errors import ShardlabError

        raise ShardlabError("--reprobe measures this machine's probe for the prediction; drop --no-probe, --profile "
                            "and --predict-gpu, which predict without it")
    if args.sweep_nproc:
        from shardlab.runtime.scaling import render_scaling, run_scaling

        doc = run_scaling(req, args.sweep_nproc)
        return doc, render_scaling(doc)
    from shardlab.runtime.train_report import render_train

    doc = run_train(req)
    if doc.get("report_elsewhere") and getattr(args, "html", None):
        doc["report"] += f"; that node writes the page (no {args.html} here)"
        args.html = None
    return doc, render_train(doc)


@reports_interrupt("run infer")
def cmd_infer(args):
    from shardlab.runtime.infer import InferRequest, run_infer, run_sweep
    from shardlab.runtime.infer_report import render_infer, render_sweep

    req = InferRequest(tp=args.tp, model=args.model, prompt=args.prompt, max_new_tokens=args.max_new_tokens,
                       strategy=args.strategy, seed=args.seed, timeout_s=args.timeout, device=args.device,
                       torchrun_args=torchrun_args(args), observe=observe_options(args), prompt_ids=args.prompt_ids,
                       pp=args.pp, vocab_divisible_by=args.make_vocab_size_divisible_by, block_size=args.kv_block_size,
                       check_parity=args.check_parity)
    from shardlab.cli.bench_cmds import check_plot_path
    from shardlab.errors import ShardlabError

    for flag, given in (("--max-tp", args.max_tp), ("--plot", args.plot)):
        if given and not args.sweep:
            raise ShardlabError(f"{flag} applies to a --sweep; add --sweep, or drop it for one run")
    check_plot_path(args.plot)                  # before the sweep runs, not after
    if args.sweep:
        doc = run_sweep(req, plot=args.plot, max_tp=args.max_tp)
        return doc, render_sweep(doc)
    doc = run_infer(req)
    return doc, render_infer(doc)


@reports_interrupt("run precision", note="interrupted while training in this process: nothing measured was kept")
def cmd_precision(args):
    from shardlab.errors import ShardlabError
    from shardlab.runtime.precision import PrecisionRequest, render_precision, run_precision

    if not 0 <= args.grad_scale_exp <= 40:
        raise ShardlabError(f"--grad-scale-exp must be between 0 and 40, got {args.grad_scale_exp}")
    doc = run_precision(PrecisionRequest(model=args.model, steps=args.steps, grad_scale_exp=args.grad_scale_exp,
                                         global_batch=args.global_batch, seq_len=args.seq_len, seed=args.seed))
    return doc, render_precision(doc)
