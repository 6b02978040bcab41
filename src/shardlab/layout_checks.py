"""Layout validation: degrees against each other, the GPU count and the model, each refusal one line naming the
fix (``validate``); the divisors the hints offer (``divisors``). The type itself is ``shardlab.layout.Layout``."""

from __future__ import annotations

from shardlab.errors import ShardlabError, field_name
from shardlab.layout import RECOMPUTE, RECOMPUTE_MODULES, SCHEDULES, Layout


def validate(layout: Layout, spec=None, num_gpus: int | None = None, seq_len: int | None = None) -> Layout:
    """Check degrees against each other, the GPU count and the model; raise ShardlabError with the fix."""
    for axis in ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch", "dp_replicate"):
        v = getattr(layout, axis)
        if not isinstance(v, int) or v < 1:
            raise ShardlabError(f"{field_name('layout.' + axis)} must be a positive integer, got {v}")
    if layout.zero not in (0, 1, 2, 3):
        raise ShardlabError(f"{field_name('layout.zero')} must be 0, 1, 2 or 3, got {layout.zero}")
    if layout.recompute not in RECOMPUTE:
        raise ShardlabError(f"{field_name('layout.recompute')} must be one of {', '.join(RECOMPUTE)}, got "
                            f"'{layout.recompute}'")
    if not isinstance(layout.wrap, int) or layout.wrap < 0:
        raise ShardlabError(f"{field_name('layout.wrap')} must be block, N-blocks or model, got {layout.wrap}")
    if not 0 < layout.recompute_fraction <= 1:
        raise ShardlabError(f"{field_name('layout.recompute_fraction')} must be in (0, 1], got "
                            f"{layout.recompute_fraction}")
    if layout.dp % layout.dp_replicate:
        raise ShardlabError(f"{field_name('layout.dp_replicate')} {layout.dp_replicate} must divide "
                            f"{field_name('layout.dp')} {layout.dp} (HSDP replicas of the sharded group)")
    if layout.dp_replicate > 1 and layout.zero == 0:
        raise ShardlabError(f"{field_name('layout.dp_replicate')} (hybrid sharding) needs {field_name('layout.zero')} "
                            "1, 2 or 3: without ZeRO every rank is a replica already")
    if layout.dp_replicate > 1 and (layout.dp // layout.dp_replicate) % layout.ep:
        raise ShardlabError(f"{field_name('layout.ep')} {layout.ep} must divide the sharded group dp/dp-replicate = "
                            f"{layout.dp // layout.dp_replicate}")
    if layout.schedule not in SCHEDULES:
        raise ShardlabError(f"{field_name('layout.schedule')} must be one of {', '.join(SCHEDULES)}, got "
                            f"'{layout.schedule}'")
    from shardlab.limits import MAX_GPUS

    if layout.world_size > MAX_GPUS:
        raise ShardlabError(f"dp×tp×pp×cp = {layout.world_size:,} GPUs is above the limit of {MAX_GPUS:,} (about 5x "
                            "the "
                            f"largest cluster built); use smaller degrees")
    if num_gpus is not None and layout.world_size != num_gpus:
        raise ShardlabError(
            f"dp×tp×pp×cp = {layout.dp}×{layout.tp}×{layout.pp}×{layout.cp} = {layout.world_size} but "
            f"{field_name('cluster.gpus')} is {num_gpus}; "
            f"choose degrees whose product is {num_gpus} (leave {field_name('layout.dp')} out to derive it)")
    if not isinstance(layout.etp, int) or layout.etp < 0 or (layout.etp and layout.tp % layout.etp):
        raise ShardlabError(f"{field_name('layout.etp')} must divide {field_name('layout.tp')} {layout.tp} (the experts "
                            f"split over a part of the TP group), or be 0 for the TP degree; got {layout.etp}")
    if layout.expert_tp < layout.tp:
        group = layout.tp * layout.cp * layout.dp
        if group % (layout.ep * layout.expert_tp):
            raise ShardlabError(f"{field_name('layout.ep')} {layout.ep} × {field_name('layout.etp')} {layout.expert_tp} "
                                f"must divide a stage's tp·cp·dp = {group} ranks (the expert grid is carved from them)")
        if layout.dp_replicate > 1:
            raise ShardlabError(f"{field_name('layout.dp_replicate')} (hybrid sharding) does not combine with "
                                f"{field_name('layout.etp')} below {field_name('layout.tp')}; drop one of them")
    elif layout.dp % layout.ep:
        raise ShardlabError(f"{field_name('layout.ep')} {layout.ep} must divide {field_name('layout.dp')} {layout.dp} "
                            "(expert parallelism borrows data-parallel ranks; with experts split over fewer ranks "
                            f"than TP, {field_name('layout.etp')}, it may span TP ranks too)")
    if layout.vpp > 1 and layout.pp == 1:
        raise ShardlabError(f"{field_name('layout.vpp')} > 1 needs {field_name('layout.pp')} > 1 (virtual stages "
                            "interleave pipeline ranks)")
    # 1F1B and GPipe run one chunk per rank (zb-h1 with v chunks is torchtitan's InterleavedZeroBubble: allowed)
    if layout.vpp > 1 and layout.schedule in ("1f1b", "gpipe"):
        raise ShardlabError(f"{field_name('layout.vpp')} {layout.vpp} does not apply to "
                            f"{field_name('layout.schedule')} {layout.schedule}, which runs one chunk "
                            f"per rank; add {field_name('layout.schedule')} interleaved")
    if layout.schedule == "interleaved" and layout.pp > 1 and layout.vpp < 2:
        raise ShardlabError(f"{field_name('layout.schedule')} interleaved needs {field_name('layout.vpp')} 2 or more")
    if layout.recompute_modules is not None:
        mods = layout.recompute_modules
        if not isinstance(mods, tuple) or not mods or any(m not in RECOMPUTE_MODULES for m in mods) \
                or len(set(mods)) != len(mods):
            raise ShardlabError(f"{field_name('layout.recompute_modules')} takes distinct names from "
                                f"{', '.join(RECOMPUTE_MODULES)}, got {','.join(map(str, mods))[:80]!r}")
        if layout.recompute != "selective":
            raise ShardlabError(f"{field_name('layout.recompute_modules')} says what selective recomputation "
                                f"re-runs; add {field_name('layout.recompute')} selective")
    if layout.stage_layers is not None:
        if len(layout.stage_layers) != layout.pp or any(n < 1 for n in layout.stage_layers):
            raise ShardlabError(f"{field_name('layout.stage_layers')} needs {layout.pp} positive counts, one per "
                                "pipeline stage")
        if layout.vpp > 1:
            raise ShardlabError(f"{field_name('layout.stage_layers')} gives one count per pipeline stage, which does "
                                f"not fit {field_name('layout.vpp')} > 1; drop one of them")
    if spec is not None:
        _validate_against_model(layout, spec)
    if seq_len is not None and seq_len % layout.cp:
        raise ShardlabError(f"{field_name('workload.seq_len')} {seq_len} is not divisible by "
                            f"{field_name('layout.cp')} {layout.cp}; pick a sequence length that is a multiple of cp")
    if seq_len is not None and layout.sequence_parallel and layout.tp > 1 and (seq_len // layout.cp) % layout.tp:
        raise ShardlabError(f"sequence parallelism splits each rank's {seq_len // layout.cp:,} tokens over "
                            f"{field_name('layout.tp')} {layout.tp}, "
                            "which does not divide them (Megatron requires it); pick a multiple of "
                            f"{layout.tp * layout.cp} "
                            f"for {field_name('workload.seq_len')}, or drop {field_name('layout.sequence_parallel')}")
    return layout


def _validate_against_model(layout: Layout, spec) -> None:
    t = layout.tp
    if spec.num_heads % t:
        raise ShardlabError(f"{field_name('layout.tp')} {t} does not divide {spec.name}'s {spec.num_heads} attention "
                            "heads; "
                            f"use a divisor of {spec.num_heads} such as {_divisors_hint(spec.num_heads, t)}")
    if spec.mla is None and spec.num_kv_heads % t and t % spec.num_kv_heads:
        raise ShardlabError(f"{field_name('layout.tp')} {t} and {spec.name}'s {spec.num_kv_heads} KV heads: one must "
                            "divide the other "
                            "(KV heads are split, or replicated when tp > KV heads); try "
                            f"{_divisors_hint(spec.num_kv_heads, t)}")
    ffns = [("FFN width", spec.ffn_hidden_size, t, "tp")] if (spec.moe is None or spec.moe.first_dense_layers) else []
    if spec.moe is not None:
        ffns.append(("expert FFN width", spec.moe.expert_ffn_hidden_size, layout.expert_tp,
                     "tp" if layout.expert_tp == t else "etp"))
    for what, f, d, axis in ffns:
        if f % d:
            raise ShardlabError(f"{field_name('layout.' + axis)} {d} does not divide {spec.name}'s {what} {f}; use a "
                                f"divisor such as {_divisors_hint(f, d)}")
    layers = sum(layout.stage_layers) if layout.stage_layers else None
    if layers is not None and layers != spec.num_layers:
        raise ShardlabError(f"{field_name('layout.stage_layers')} add up to {layers} but {spec.name} has "
                            f"{spec.num_layers} layers")
    if layout.pp * layout.vpp > spec.num_layers:
        raise ShardlabError(f"{field_name('layout.pp')} {layout.pp} × {field_name('layout.vpp')} {layout.vpp} exceeds "
                            f"{spec.name}'s {spec.num_layers} layers; "
                            f"each pipeline chunk needs at least one layer")
    if layout.etp and spec.moe is None:
        raise ShardlabError(f"{field_name('layout.etp')} splits a mixture-of-experts model's experts; {spec.name} is "
                            f"dense (leave {field_name('layout.etp')} out)")
    if layout.ep > 1:
        if spec.moe is None:
            raise ShardlabError(f"{field_name('layout.ep')} {layout.ep} needs a mixture-of-experts model; {spec.name} "
                                f"is dense (use {field_name('layout.ep')} 1)")
        if spec.moe.num_experts % layout.ep:
            raise ShardlabError(f"{field_name('layout.ep')} {layout.ep} does not divide {spec.name}'s "
                                f"{spec.moe.num_experts} experts")
    # Megatron-core refuses mla_up_proj without MLA and moe_act without grouped GEMM experts; a module the model
    # lacks would re-run nothing
    needs = {"mla_up_proj": (spec.mla is not None, "multi-head latent attention"),
             "moe_act": (spec.moe is not None, "mixture-of-experts blocks"),
             "moe": (spec.moe is not None, "mixture-of-experts blocks"),
             "shared_experts": (spec.moe is not None and spec.moe.shared_width > 0, "shared experts"),
             "mlp": (spec.moe is None or spec.moe.first_dense_layers > 0, "dense MLP blocks")}
    for mod in layout.recompute_modules or ():
        ok, what = needs.get(mod, (True, ""))
        if not ok:
            raise ShardlabError(f"{field_name('layout.recompute_modules')} {mod} needs {what}, which {spec.name} "
                                f"does not have; leave it out")


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, by trial division up to √n: 4,096 steps for a model
    dimension (≤ 2^24), 1,024 for a GPU count (≤ 2^20); above 2^32 the count is refused."""
    import math

    if not isinstance(n, int) or n < 1 or n > 2**32:
        raise ShardlabError(f"cannot list the divisors of {n}: give a whole number from 1 to {2**32:,}")
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


def _divisors_hint(n: int, near: int) -> str:
    divs = divisors(n)
    best = sorted(divs, key=lambda d: (abs(d - near), d))[:3]
    return ", ".join(str(d) for d in sorted(best))
