"""``shardlab run infer``: greedy generation with tensor parallelism and a KV cache, checked three ways:
the tokens equal a single-process (TP=1) run, and each rank's weight and KV-cache bytes equal the memory
model (``shardlab.memory.inference``, fp32). ``--sweep`` runs T = 1, 2, 4, ... as far as the GPUs present (or the
CPU cores, or ``--max-tp``) allow and plots the speedup (``runtime.infer_report`` prints and plots them)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlab.errors import ShardlabError

ELEM_BYTES = 4
"""CPU runs are float32."""
MAX_PROMPT_TOKENS = 8192
"""Most prompt tokens `run infer` takes (they are one argument of each worker: Linux caps one at 128 KiB)."""


@dataclass(frozen=True)
class InferRequest:
    """What ``shardlab run infer`` was asked to run."""

    tp: int = 2
    """Tensor-parallel ranks."""
    model: str = "tiny"
    """Preset or catalog model (random weights from the seed), or a checkpoint: a folder with config.json and
    safetensors weights, or hf:ORG/NAME."""
    prompt: str = "The quick brown fox"
    """Prompt text: with a checkpoint that has a tokenizer, its tokens; otherwise its UTF-8 bytes (mod the vocabulary)."""
    prompt_ids: tuple[int, ...] | None = None
    """Prompt token ids (no tokenizer needed); replaces ``prompt``."""
    pp: int = 1
    """Pipeline stages (the ranks are tp × pp)."""
    vocab_divisible_by: int = 1
    """Megatron-LM's --make-vocab-size-divisible-by: the vocabulary is padded to a multiple of this × tp."""
    block_size: int = 16
    """Tokens per KV-cache block (the paged cache)."""
    check_parity: bool = False
    """With a checkpoint: compare the tokens with transformers' generate on the same checkpoint."""
    max_new_tokens: int = 16
    """Tokens generated greedily."""
    strategy: str = "tp-megatron"
    """'tp-megatron' (our f/g layers) or 'tp' (DTensor plan)."""
    seed: int = 0
    """Model seed."""
    timeout_s: float = 300.0
    """The job is stopped after this long."""
    device: str | None = None
    """cpu or cuda (default: cuda when available)."""
    torchrun_args: tuple[str, ...] = ()
    """Extra torchrun flags (multi-node rendezvous)."""
    observe: object = None
    """``runtime.observe.launcher.ObserveOptions`` (metrics endpoints, live table, slowness injection), or None."""


def prompt_tokens(text: str, vocab: int) -> list[int]:
    if not text:
        raise ShardlabError("--prompt is empty; give at least one character")
    return [b % vocab for b in text.encode("utf-8")]


def prompt_ids(text: str, ids, vocab: int, folder=None) -> list[int]:
    """The prompt's token ids: ``ids`` as given (checked against the vocabulary), else the checkpoint's tokenizer
    on ``text`` when it has one, else the text's bytes modulo the vocabulary."""
    if ids is not None:
        ids = list(ids)
        if not ids:
            raise ShardlabError("--prompt-ids is empty; give at least one token id")
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ShardlabError(f"--prompt-ids: token {bad} is outside the vocabulary [0, {vocab}); fix the ids")
        return ids
    if folder is not None:
        from shardlab.runtime.checkpoint.config import tokenizer_present

        if tokenizer_present(folder):
            from shardlab.runtime.checkpoint.reference import hf_tokenize

            ids = hf_tokenize(folder, text)
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise ShardlabError(f"the checkpoint's tokenizer gives token {bad}, outside its vocabulary [0, {vocab}); "
                                    f"the tokenizer and config.json disagree: pass --prompt-ids")
            return ids
    return prompt_tokens(text, vocab)


def check_divides(spec, tp: int, pp: int, strategy: str) -> None:
    """Refuse, with the rule, a TP or PP degree the model's shapes do not allow (the vocabulary is padded instead)."""
    if spec.num_heads % tp or (spec.num_kv_heads % tp and tp % spec.num_kv_heads):
        raise ShardlabError(f"--tp {tp} must divide {spec.name}'s {spec.num_heads} heads and divide or be a multiple of "
                            f"its {spec.num_kv_heads} KV heads")
    if strategy == "tp-megatron" and spec.num_kv_heads % tp:
        raise ShardlabError(f"tp-megatron needs --tp {tp} to divide the {spec.num_kv_heads} KV heads; use --strategy tp")
    if strategy == "tp-megatron" and tp > 1 and spec.moe is not None:
        raise ShardlabError(f"tp-megatron does not split {spec.name}'s mixture-of-experts layers; use --strategy tp "
                            f"(experts split by width)")
    widths = {"FFN width": spec.ffn_hidden_size}
    if spec.moe is not None:
        widths["expert FFN width"] = spec.moe.expert_ffn_hidden_size
    for what, w in widths.items():
        if w % tp:
            raise ShardlabError(f"--tp {tp} must divide {spec.name}'s {what} {w} (column-parallel rows split evenly); "
                                f"use a TP degree that divides it")
    if pp > spec.num_layers:
        raise ShardlabError(f"--pp {pp} exceeds {spec.name}'s {spec.num_layers} layers; use at most {spec.num_layers}")


def reference_tokens(spec, tokens: list[int], max_new: int, seed: int, vocab_cut: int = 0) -> list[int]:
    """Greedy tokens of the same model in this process, no parallelism (TP = 1). ``spec`` is the ranks' (vocabulary
    padded for TP: the seed fills the same shapes, so the weights are theirs), ``vocab_cut`` its logits' cut."""
    import torch

    from shardlab.runtime.gpt import KVCache, build_model
    from shardlab.runtime.infer_worker import generate
    from shardlab.runtime.numerics import Numerics

    torch.set_num_threads(1)
    model = build_model(spec, seed=seed, numerics=Numerics(vocab_size=vocab_cut)).eval()
    cache = KVCache(list(range(spec.num_layers)), 1, len(tokens) + max_new, spec.num_kv_heads, spec.head_dim_)
    return generate(model, torch.tensor([tokens]), max_new, cache)[0]


def run_infer(req: InferRequest, check_reference: bool = True) -> dict:
    """Run, gather, compare; returns the JSON document. Interrupted (Ctrl-C, SIGTERM), the job is stopped and the
    interrupt goes on with what the job had done attached (``runtime.interrupted.note_interrupt``)."""
    from shardlab.runtime.interrupted import note_interrupt

    state: dict = {}
    try:
        return _run_infer(req, state, check_reference)
    except KeyboardInterrupt as e:
        note_interrupt(e, state.get("run_dir"), unit="token", planned=req.max_new_tokens, skip_steps=1,
                       steps_jsonl=getattr(req.observe, "steps_jsonl", None), job_done="run_dir" in state)
        raise


def _run_infer(req: InferRequest, state: dict, check_reference: bool) -> dict:
    from shardlab.memory.inference import weight_bytes_per_rank
    from shardlab.runtime import require_torch
    from shardlab.runtime.launch import launch
    from shardlab.runtime.train import RunFailed
    from shardlab.runtime.train_worker import resolve_spec

    require_torch()
    source = None
    from shardlab.runtime.checkpoint.config import CheckpointSource, is_checkpoint

    if is_checkpoint(req.model):
        source = CheckpointSource(req.model)   # hf:ORG/NAME is fetched here, once, not by every rank
        source.check()                          # refuses weights that do not match the config, first mismatch named
    elif req.check_parity:
        raise ShardlabError("--check-parity compares with transformers on a checkpoint; give --model a folder with "
                            "config.json and safetensors weights (or hf:ORG/NAME). Random-weight presets are always "
                            "compared with one process (matches_tp1)")
    spec0 = source.spec if source else resolve_spec(req.model)
    from shardlab.runtime import check_host_memory
    from shardlab.runtime.vocab import pad_spec, padding_report

    check_host_memory(spec0, 4, "inference with", req.device)
    t, pp = req.tp, req.pp
    check_divides(spec0, t, pp, req.strategy)
    spec, _ = pad_spec(spec0, t, req.vocab_divisible_by)
    toks = prompt_ids(req.prompt, req.prompt_ids, spec0.vocab_size, source.folder if source else None)
    if len(toks) > MAX_PROMPT_TOKENS:     # the tokens travel on the workers' command line (one argument: 128 KiB)
        raise ShardlabError(f"--prompt is {len(toks):,} tokens; run infer takes at most {MAX_PROMPT_TOKENS:,} (it runs "
                            f"the layout to check it, not a long-context benchmark): shorten it")
    total = len(toks) + req.max_new_tokens
    if spec.position == "learned" and total > spec.max_seq_len:     # RoPE positions are computed as they come
        raise ShardlabError(f"prompt + --max-new-tokens = {total} exceeds {spec.name}'s {spec.max_seq_len} positions")
    if spec.sliding_window and total > spec.sliding_window:
        raise ShardlabError(f"prompt + --max-new-tokens = {total} exceeds {spec.name}'s sliding window "
                            f"({spec.sliding_window}); the runtime attends to every cached token: generate fewer")
    model_arg = ["--model", str(source.folder), "--load"] if source else ["--model", req.model]
    args = [*model_arg, "--tokens", ",".join(map(str, toks)), "--max-new-tokens", str(req.max_new_tokens),
            "--strategy", req.strategy, "--seed", str(req.seed), "--pp", str(pp),
            "--vocab-divisible-by", str(req.vocab_divisible_by), "--block-size", str(req.block_size)] + \
        (["--device", req.device] if req.device else [])
    from shardlab.runtime.train import _nnodes

    nodes = _nnodes(req.torchrun_args)
    world = t * pp
    if world % nodes:
        raise ShardlabError(f"--tp {t} x --pp {pp} = {world} ranks in total over {nodes} nodes must be a multiple of "
                            f"the node count")
    from shardlab.runtime.observe.report import infer_prediction, observation_for

    obs = observation_for(req.observe, world // nodes, world, "infer", req.torchrun_args)
    res = launch("shardlab.runtime.infer_worker", world // nodes, args, timeout_s=req.timeout_s,
                 torchrun_args=list(req.torchrun_args), observer=obs)
    state["run_dir"] = res.run_dir
    if not res.ok:
        raise RunFailed(res.summary)
    ranks = res.rank_results()
    from shardlab.runtime.observe.launcher import step_records
    from shardlab.runtime.observe.summary import TIME_SPLIT_DEFINITIONS, rank_time_split, slowest_of_split, slowest_rank
    from shardlab.runtime.step_time import injected_rank

    split = rank_time_split(step_records(res.run_dir), 1)   # token 0 is the prefill
    for d in ranks:
        d["time_split"] = split.get(d["rank"])
        if d["time_split"] is not None:   # the decoded tokens' whole time: compute + collectives + waiting
            d["latency_per_token_s"] = d["time_split"]["step_s"]
    slowest = (slowest_of_split(split, injected_rank(req.observe)) if split else
               slowest_rank({d["rank"]: d["latency_per_token_s"] for d in ranks}, injected_rank(req.observe)))
    from shardlab.memory.inference import kv_cache_bytes_per_token
    from shardlab.runtime.checkpoint.load import reads_doc
    from shardlab.runtime.paged_kv import blocks_for

    w_pred = weight_bytes_per_rank(spec, t, pp, ELEM_BYTES)                  # per stage
    blocks = blocks_for(total, req.block_size)
    block_pred = [req.block_size * b for b in kv_cache_bytes_per_token(spec, t, pp, ELEM_BYTES)]  # per stage
    tokens = ranks[0]["tokens"]
    ref = (reference_tokens(spec, toks, req.max_new_tokens, req.seed, spec0.vocab_size if spec is not spec0 else 0)
           if check_reference and source is None else None)
    hf = None
    if source is not None and req.check_parity:
        from shardlab.runtime.checkpoint.reference import hf_generate

        hf = hf_generate(source.folder, toks, req.max_new_tokens)
    lat = max(d["latency_per_token_s"] for d in ranks)
    per_rank = [{"rank": d["rank"], "stage": d.get("stage", 0), "weight_bytes": d["weight_bytes"],
                 "kv_cache_bytes": d["kv_cache_bytes"], "kv_blocks": d.get("kv_blocks"),
                 "checkpoint_bytes_read": (d.get("checkpoint") or {}).get("bytes_read"),
                 "latency_per_token_s": d["latency_per_token_s"], "time_split": d["time_split"],
                 "prefill_s": d["prefill_s"], "collectives": d["collectives"], "megatron_counter": d["megatron_counter"]}
                for d in ranks]
    exact = all(r["weight_bytes"] == w_pred[r["stage"]] and r["kv_cache_bytes"] == blocks * block_pred[r["stage"]]
                and r["kv_blocks"]["bytes_per_block"] == block_pred[r["stage"]] for r in per_rank)
    doc = {
        "model": spec0.name, "tp": t, "pp": pp, "strategy": req.strategy if t > 1 else "single", "prompt_tokens": toks,
        "tokens": tokens, "generated_token_ids": tokens,
        "text": bytes(x for x in tokens if x < 256).decode("utf-8", "backslashreplace") if source is None else None,
        "matches_tp1": None if ref is None else tokens == ref,
        "matches_transformers": None if hf is None else tokens == hf, "transformers_token_ids": hf,
        "ranks_agree": all(d["tokens"] == tokens for d in ranks),
        "ranks": per_rank,
        "predicted": {"weight_bytes": w_pred[0], "weight_bytes_per_stage": w_pred, "kv_cache_bytes": blocks * block_pred[0],
                      "kv_blocks": {"block_size": req.block_size, "blocks": blocks, "bytes_per_block": block_pred[0],
                                    "bytes_per_block_per_stage": block_pred},
                      "source": "shardlab.memory.inference (fp32, batch 1, prompt + new tokens cached in "
                                f"ceil({total}/{req.block_size}) = {blocks} blocks of {req.block_size} tokens; "
                                "bytes per block = memory.inference.kv_blocks' block_size x KV bytes per token)"},
        "memory_exact": exact,
        "vocab": padding_report(spec0.vocab_size, t, req.vocab_divisible_by),
        "checkpoint": None if source is None else reads_doc(source, per_rank),
        "latency_per_token_s": lat, "cached_tokens": total, "slowest": slowest,
        "time_split_definitions": TIME_SPLIT_DEFINITIONS if split else None,
        "launch": {"duration_s": res.duration_s, "run_dir": str(res.run_dir), "warnings": res.warnings},
    }
    if obs is not None:  # step 0 is the prefill: the percentiles are of decoded tokens
        doc["observability"] = obs.finish(skip_steps=1, predicted=infer_prediction(spec, t, len(toks), req))
    return doc


def sweep_tps(spec, strategy: str, device: str | None, max_tp: int | None) -> tuple[tuple[int, ...], str]:
    """The T values a sweep runs: 1, 2, 4, ... up to what the devices present allow (the GPUs on a GPU machine; on a
    CPU the cores, or ``max_tp`` processes when given), keeping those the model's heads and KV heads allow."""
    import os

    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda":
        n = torch.cuda.device_count()
        if max_tp and max_tp > n:
            raise ShardlabError(f"--max-tp {max_tp} exceeds the {n} GPU(s) present; give at most {n}")
        limit, why = max_tp or n, f"--max-tp {max_tp}" if max_tp else f"{n} GPU(s) present"
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        limit, why = (max_tp, f"--max-tp {max_tp}") if max_tp else (cores, f"{cores} CPU core(s) available")
    kv_ok = (lambda t: spec.num_kv_heads % t == 0) if strategy == "tp-megatron" else \
        (lambda t: spec.num_kv_heads % t == 0 or t % spec.num_kv_heads == 0)
    tps = tuple(t for t in (2**k for k in range(12)) if t <= limit and spec.num_heads % t == 0 and kv_ok(t))
    return tps, f"T = {', '.join(map(str, tps))}: powers of two up to {limit} ({why}) that {spec.name}'s heads allow"


def run_sweep(req: InferRequest, plot: str | None = None, tps: tuple[int, ...] | None = None,
              max_tp: int | None = None) -> dict:
    """T = 1, 2, 4, ... as the devices allow (``sweep_tps``): latency per token, speedup over T = 1, and a PNG."""
    from shardlab.runtime.train_worker import resolve_spec

    if req.observe is not None and (req.observe.slow_rank or req.observe.slow_link):
        raise ShardlabError("--slow-rank/--slow-link apply to one run, not to --sweep; drop --sweep or the injection")
    why = "the T values asked for"
    if tps is None:
        tps, why = sweep_tps(resolve_spec(req.model), req.strategy, req.device, max_tp)
    runs = []
    for t in tps:
        try:
            runs.append(run_infer(replace(req, tp=t), check_reference=False))
        except KeyboardInterrupt as e:   # what the sweep had done, for the interrupted document
            e.sweep = {"finished": [r["tp"] for r in runs], "stopped": t, "unit": "tp"}
            raise
    base = runs[0]["latency_per_token_s"]
    points = [{"tp": r["tp"], "latency_per_token_s": r["latency_per_token_s"],
               "speedup": base / r["latency_per_token_s"], "tokens_identical_to_tp1": r["tokens"] == runs[0]["tokens"],
               "weight_bytes": r["ranks"][0]["weight_bytes"], "kv_cache_bytes": r["ranks"][0]["kv_cache_bytes"],
               "memory_exact": r["memory_exact"]} for r in runs]
    import os

    doc = {"model": runs[0]["model"], "strategy": req.strategy, "points": points, "cpu_cores": os.cpu_count(),
           "tp_values": list(tps), "tp_values_from": why, "plot": None}
    if plot:
        from shardlab.runtime.infer_report import plot_speedup

        doc["plot"] = plot_speedup(points, plot, doc["model"], os.cpu_count())
    return doc
