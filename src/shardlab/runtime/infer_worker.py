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
    p.add_argument("--tokens", required=True, help="comma-separated prompt token ids")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--strategy", default="tp-megatron")
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


def main(argv: list[str] | None = None) -> None:
    from shardlab.runtime.worker import rank_main

    rank_main(parse_args(argv), run)


def run(args, rr) -> dict:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from shardlab.runtime.dist import destroy, init_from_env
    from shardlab.runtime.gpt import KVCache, build_model
    from shardlab.runtime.metrics import CollectiveRecorder, storage_bytes
    from shardlab.runtime.observe.rank import RankObserver
    from shardlab.runtime.train_worker import resolve_spec

    ctx = init_from_env(device_type=args.device)
    spec = resolve_spec(args.model)
    tp = ctx.world_size
    mesh = init_device_mesh(ctx.device_type, (tp,), mesh_dim_names=("tp",))
    obs = RankObserver.from_env(ctx, strategy=args.strategy, kind="infer", model=spec.name, planned=args.max_new_tokens,
                                tokens_per_step=1)
    rr.beat("build model")
    model = build_model(spec, device=ctx.device, seed=args.seed).eval()
    model, counter = shard_for_inference(model, args.strategy, mesh.get_group(), mesh)
    prompt = torch.tensor([[int(t) for t in args.tokens.split(",")]], device=ctx.device)
    total = prompt.shape[1] + args.max_new_tokens
    def new_cache():
        return KVCache(list(range(spec.num_layers)), 1, total, kv_heads_local(spec, tp), spec.head_dim_,
                       dtype=torch.float32, device=ctx.device)

    rec = CollectiveRecorder()
    sync = torch.cuda.synchronize if ctx.device_type == "cuda" else None
    rr.beat("generate (counting collectives)")
    with rec:  # the recorder slows every op: this pass counts and times collectives, the next one is timed clean
        first, _, _ = generate(model, prompt, args.max_new_tokens, new_cache(), sync)
    megatron = {f"{op}/{ph}": n for (op, ph), n in counter.counts.items()} if counter else {}  # this pass only,
    rr.beat("generate (timed)")                                                             # as the recorder's
    cache = new_cache()
    obs.bind(mesh)  # per-token records and metrics, slowness injection: on the timed pass only
    tokens, prefill_s, lat = generate(model, prompt, args.max_new_tokens, cache, sync, obs.token)
    doc = {"tokens": tokens, "repeatable": tokens == first, "tp": tp, "strategy": args.strategy if tp > 1 else "single", "backend": ctx.backend,
           "weight_bytes": storage_bytes(list(model.parameters())), "kv_cache_bytes": cache.nbytes,
           "cached_tokens": total, "prefill_s": prefill_s, "decode_latencies_s": lat,
           "latency_per_token_s": sum(lat) / len(lat) if lat else prefill_s,
           "collectives": rec.summary(),
           "megatron_counter": megatron}
    obs.finish(barrier=False)
    rr.beat("shutdown")
    destroy()
    return doc


if __name__ == "__main__":
    main()
