"""The rank program of ``shardlab run infer``: greedy decoding with a KV cache on T tensor-parallel ranks.

Every rank holds its TP shard of the weights (Megatron-style layers, or the DTensor plan) and a KV cache
of its own KV heads, sized for prompt + new tokens: (1, tokens, kv_heads/T, head_dim) per block for K
and V. The logits are gathered on every rank, so every rank picks the same next token. Writes
``rank{r}.json``: generated ids, weight and KV-cache bytes (from the tensors' storages), prefill time and
the latency of each decoded token.
"""

from __future__ import annotations

import argparse
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shardlab.runtime.infer_worker")
    p.add_argument("--model", default="tiny")
    p.add_argument("--load", action="store_true", help="--model is a checkpoint folder: load its weights")
    p.add_argument("--tokens", required=True, help="comma-separated prompt token ids")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--strategy", default="tp-megatron")
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--vocab-divisible-by", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    return p.parse_args(argv)


def kv_heads_local(spec, tp: int) -> int:
    """KV heads one rank caches: kv/tp, or one (duplicated) when tp > kv heads."""
    return spec.num_kv_heads // tp if tp <= spec.num_kv_heads else 1


def shard_for_inference(model, strategy: str, group, mesh):
    """Apply the TP flavour in place; returns (model, collective counter or None)."""
    from shardlab.runtime.parallel.megatron import CollectiveCounter, apply_megatron_tp
    from shardlab.runtime.parallel.tensor import apply_tp

    if mesh.size() == 1:
        return model, None
    if strategy == "tp":
        return apply_tp(model, mesh), None
    counter = CollectiveCounter()
    return apply_megatron_tp(model, group, counter), counter


def generate(model, prompt, max_new: int, cache, sync=None, on_token=None) -> tuple[list[int], float, list[float]]:
    """Greedy decoding: (new token ids, prefill seconds, per-token decode seconds).

    ``on_token(k, t0)`` runs after token k (0: the prefill) with its start time, inside its timing."""
    import torch

    out, lat = [], []
    with torch.no_grad():
        t0 = time.perf_counter()
        logits = model(prompt, 0, cache)                        # (1, p, V)
        nxt = int(logits[0, -1].argmax())
        if on_token:
            on_token(0, t0)
        prefill_s = time.perf_counter() - t0
        out.append(nxt)
        pos = prompt.shape[1]
        for _ in range(max_new - 1):
            t0 = time.perf_counter()
            logits = model(torch.tensor([[nxt]], device=prompt.device), pos, cache)  # (1, 1, V)
            nxt = int(logits[0, -1].argmax())
            if sync:
                sync()
            if on_token:
                on_token(len(out), t0)
            lat.append(time.perf_counter() - t0)
            out.append(nxt)
            pos += 1
    return out, prefill_s, lat


def generate_pipelined(model, prompt, max_new: int, cache, stage, sync=None, on_token=None):
    """Greedy decoding through pipeline stages (batch 1, no micro-batches): stage i receives the hidden states of stage
    i - 1 (same TP coordinate), runs its blocks on its own KV cache and sends on; the last stage's token is broadcast
    to every rank. Same return as :func:`generate`. ``stage``: (is first, is last, prev rank, next rank, last-stage
    rank that broadcasts, hidden size)."""
    import torch
    import torch.distributed as dist

    first, last, prev, nxt_rank, src, hidden = stage
    out, lat, prefill_s = [], [], 0.0
    tok = torch.zeros(1, dtype=torch.long, device=prompt.device)
    pos = 0
    with torch.no_grad():
        for k in range(max_new):
            t0 = time.perf_counter()
            x = prompt if k == 0 else tok.view(1, 1)
            s = x.shape[1]
            if not first:
                x = torch.empty((1, s, hidden), device=prompt.device)
                dist.recv(x, src=prev)
            y = model(x, pos, cache)                    # (1, s, h), or logits (1, s, V) on the last stage
            if not last:
                dist.send(y.contiguous(), dst=nxt_rank)
            else:
                tok.fill_(int(y[0, -1].argmax()))
            dist.broadcast(tok, src=src)
            if sync:
                sync()
            if on_token:
                on_token(k, t0)
            (lat.append if k else (lambda v: None))(time.perf_counter() - t0)
            if k == 0:
                prefill_s = time.perf_counter() - t0
            out.append(int(tok))
            pos += s
    return out, prefill_s, lat


def build_rank_model(args, ctx, tp: int, pp: int, stage: int, tp_mesh):
    """This rank's model: the TP shard of its pipeline stage, vocabulary padded for TP, weights from the checkpoint
    (``--load``: each rank reads only its blocks) or from the seed. Returns (model, counter, spec, load report)."""
    from shardlab.layout import Layout
    from shardlab.memory.states import chunk_layers
    from shardlab.runtime.gpt import build_model
    from shardlab.runtime.numerics import Numerics
    from shardlab.runtime.parallel.pipeline import make_chunk
    from shardlab.runtime.train_worker import resolve_spec
    from shardlab.runtime.vocab import pad_spec

    source = None
    if args.load:
        from shardlab.runtime.checkpoint.config import CheckpointSource

        source = CheckpointSource(args.model)
    spec0 = source.spec if source else resolve_spec(args.model)
    spec, cut = pad_spec(spec0, tp, args.vocab_divisible_by)
    numerics = source.numerics(cut) if source else Numerics(vocab_size=cut)
    # a checkpoint's model is built and cut on the meta device, then only this rank's shards are allocated and read
    # (torchtitan's meta-device initialisation): a rank never holds the whole model
    device = "meta" if source is not None else ctx.device
    if pp == 1:
        model = build_model(spec, device=device, seed=args.seed, numerics=numerics)
    else:
        chunks = chunk_layers(spec, Layout(pp=pp))
        model = make_chunk(spec, chunks[stage], stage == 0, stage == pp - 1, args.seed, device, numerics)
    model, counter = shard_for_inference(model.eval(), args.strategy, tp_mesh.get_group(), tp_mesh)
    report = None
    if source is not None:
        from shardlab.runtime.checkpoint.load import load_into

        model = model.to_empty(device=ctx.device)
        ck = source.open()
        report = load_into([model], ck, source.family, spec0)
        ck.close()
    return model, counter, spec, report


def main(argv: list[str] | None = None) -> None:
    from shardlab.runtime.worker import rank_main

    rank_main(parse_args(argv), run)


def run(args, rr) -> dict:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from shardlab.runtime.dist import destroy, init_from_env
    from shardlab.runtime.metrics import CollectiveRecorder, storage_bytes
    from shardlab.runtime.observe.rank import RankObserver
    from shardlab.runtime.paged_kv import PagedKVCache, blocks_for

    ctx = init_from_env(device_type=args.device)
    pp = args.pp
    tp = ctx.world_size // pp
    mesh = init_device_mesh(ctx.device_type, (pp, tp), mesh_dim_names=("pp", "tp"))
    stage, tp_rank = mesh.get_local_rank("pp"), mesh.get_local_rank("tp")
    rr.beat("build model")
    model, counter, spec, load = build_rank_model(args, ctx, tp, pp, stage, mesh["tp"])
    obs = RankObserver.from_env(ctx, strategy=args.strategy, kind="infer", model=spec.name, planned=args.max_new_tokens,
                                tokens_per_step=1)
    prompt = torch.tensor([[int(t) for t in args.tokens.split(",")]], device=ctx.device)
    total = prompt.shape[1] + args.max_new_tokens
    layers = [int(k) for k in model.layers.keys()]

    def new_cache():
        return PagedKVCache(layers, blocks_for(total, args.block_size), kv_heads_local(spec, tp), spec.head_dim_,
                            args.block_size, dtype=torch.float32, device=ctx.device)

    grid = mesh.mesh  # (pp, tp) global ranks
    pipe = None if pp == 1 else (stage == 0, stage == pp - 1, int(grid[stage - 1, tp_rank]) if stage else -1,
                                 int(grid[stage + 1, tp_rank]) if stage < pp - 1 else -1, int(grid[pp - 1, 0]),
                                 spec.hidden_size)

    def decode(cache, sync=None, on_token=None):
        if pipe is None:
            return generate(model, prompt, args.max_new_tokens, cache, sync, on_token)
        return generate_pipelined(model, prompt, args.max_new_tokens, cache, pipe, sync, on_token)

    rec = CollectiveRecorder()
    sync = torch.cuda.synchronize if ctx.device_type == "cuda" else None
    rr.beat("generate (counting collectives)")
    with rec:  # the recorder slows every op: this pass counts and times collectives, the next one is timed clean
        first, _, _ = decode(new_cache(), sync)
    megatron = {f"{op}/{ph}": n for (op, ph), n in counter.counts.items()} if counter else {}  # this pass only,
    rr.beat("generate (timed)")                                                             # as the recorder's
    cache = new_cache()
    obs.bind(mesh)  # per-token records and metrics, slowness injection: on the timed pass only
    tokens, prefill_s, lat = decode(cache, sync, obs.token)
    doc = {"tokens": tokens, "repeatable": tokens == first, "tp": tp, "pp": pp, "stage": stage, "layers": layers,
           "strategy": args.strategy if tp > 1 else "single", "backend": ctx.backend,
           "weight_bytes": storage_bytes(list(model.parameters())), "kv_cache_bytes": cache.nbytes,
           "kv_blocks": {"block_size": cache.block_size, "blocks_used": cache.blocks_used,
                         "bytes_per_block": cache.bytes_per_block, "physical_blocks": list(cache.table)},
           "cached_tokens": total, "prefill_s": prefill_s, "decode_latencies_s": lat,
           "latency_per_token_s": sum(lat) / len(lat) if lat else prefill_s,
           "collectives": rec.summary(),
           "megatron_counter": megatron,
           "checkpoint": None if load is None else {"tensors": load.tensors, "bytes_read": load.bytes_read,
                                                    "checkpoint_bytes": load.checkpoint_bytes,
                                                    "dtypes": list(load.dtypes)}}
    obs.finish(barrier=False)
    rr.beat("shutdown")
    destroy()
    return doc


if __name__ == "__main__":
    main()
