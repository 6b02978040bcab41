"""Tensor-parallel topics: the column/row MLP and its one all-reduce, whole heads per rank, sequence parallelism,
and a 3-D layout mapped rank by rank."""

from __future__ import annotations

from shardlab.limits import MAX_MAP_GPUS
from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.registry import Topic
from shardlab.teach.topics._common import RUN_TRAIN_STEPS_NOTE, catalog, gib, model
from shardlab.units import fmt_bytes, fmt_time


def _shape(s) -> str:
    return "×".join(map(str, s))


def _report(v: dict):
    from shardlab.shard.rules import shard_report

    spec = catalog().model(v["model"])
    return spec, shard_report(spec, v["tp"], seq_len=v["seq"], micro_batch=v["batch"])


def tp_mlp(v: dict) -> Explanation:
    """Column-parallel then row-parallel: Y_i = X·A_i needs nothing, Z = Σ Y_i·B_i needs one all-reduce."""
    from shardlab.comm.collectives import collective_time

    spec, rep = _report(v)
    t, h, f = v["tp"], spec.hidden_size, spec.ffn_hidden_size
    mlp = [r for r in rep["rows"] if r["component"] == "mlp" and r["name"].endswith("weight")]
    ln = catalog().link(v["link"])
    colls = [c for c in rep["collectives_per_block"] if "MLP" in c["where"]]
    size = colls[0]["bytes"] if colls else 0
    ar = collective_time("all-reduce", size, t, ln)
    shapes = [f"{r['name'].split('.', 2)[-1]}: {_shape(r['full_shape'])} → {_shape(r['local_shape'])} per rank ({r['split']})"
              for r in mlp]
    return Explanation(
        "tp-mlp", "Column then row: one all-reduce per MLP",
        f"Split {spec.name}'s MLP over T = {t} ranks: which weights split how, and what must be communicated per "
        f"micro-batch of {v['batch']} × {v['seq']} tokens?",
        dict(v),
        [f"column-parallel first linear: A = [A_1 … A_{t}] split by output features, Y_i = act(X·A_i) is a complete "
         f"slice of width f/T = {f}/{t} = {f // t}: no communication (the activation is elementwise)",
         f"row-parallel second linear: B split by input features, rank i holds B_i (f/T × h) and computes Y_i·B_i, a "
         f"partial sum; Z = Σ_i Y_i·B_i needs ONE all-reduce (Megatron's g) of b·s·h = {v['batch']}·{v['seq']}·{h} "
         f"elements = {fmt_bytes(size)}",
         *shapes,
         "backward mirrors it: the input gradient of the column linear is a partial sum → one all-reduce (Megatron's f); "
         "so one all-reduce forward and one backward per MLP, the same again per attention",
         f"one all-reduce over {ln.id} on {t} ranks: {fmt_time(ar.time_s)} ({ar.regime}-bound)",
         "counted for real: `shardlab run train --strategy tp-megatron --nproc-per-node 2` reports the f/g counter per attention "
         "and per MLP, forward and backward"],
        "Split the first matrix by columns and each GPU gets whole output features, so the nonlinearity can run on its own "
        "slice without talking to anyone. Split the second matrix by rows to match and each GPU produces a partial sum of "
        "the final output; one all-reduce adds them up. Nothing is communicated between the two matmuls: the communication "
        "was designed out, not optimized out. That gives one all-reduce per MLP in forward and one in backward.",
        {"tp": t, "all_reduce_bytes": size, "all_reduce_s": ar.time_s, "forward_all_reduces_per_mlp": 1,
         "backward_all_reduces_per_mlp": 1, "rows": mlp},
        sources=["megatron", "shardlab-runtime"], code=["meg-column", "meg-row", "meg-f", "meg-g", "meg-mlp", "pt-tp", "pt-timer"],
        commands=[f"shard {spec.name} --tp {t} --seq-len {v['seq']}", "run train --strategy tp-megatron --nproc-per-node 2 --steps 1"],
        notes=[RUN_TRAIN_STEPS_NOTE])


def tp_attention(v: dict) -> Explanation:
    """Attention splits by whole heads: Q, K, V column-parallel, the output projection row-parallel."""
    spec, rep = _report(v)
    t = v["tp"]
    att = [r for r in rep["rows"] if r["component"] == "attention" and r["name"].endswith("weight")]
    cons = rep["constraints"]
    kv_local = max(1, spec.num_kv_heads // t)
    return Explanation(
        "tp-attention", "Why attention splits easily: whole heads per rank",
        f"Split {spec.name}'s attention ({spec.num_heads} query heads, {spec.num_kv_heads} KV heads, head size "
        f"{spec.head_dim_}) over T = {t}: what does each rank hold and compute?",
        dict(v),
        [f"heads are independent: softmax(Q_h K_hᵀ/√d) V_h uses only head h's columns, so rank i takes "
         f"{spec.num_heads}/{t} = {spec.num_heads // t} whole query heads and {kv_local} KV head(s) and runs attention alone",
         *[f"{r['name'].split('.', 2)[-1]}: {_shape(r['full_shape'])} → {_shape(r['local_shape'])} ({r['split']})" for r in att],
         "Q, K and V are column-parallel (output features = heads split); the output projection is row-parallel, so the "
         "heads' partial outputs are summed by one all-reduce, exactly like the MLP",
         "the caps on T: " + "; ".join(f"{c['what']} {c['value']}: {c['rule']} ({'ok' if c['ok'] else 'broken'})"
                                       for c in cons),
         f"valid T for {spec.name}: {', '.join(map(str, rep['valid_tp']))}"],
        f"Attention is already split into heads that never look at each other until the output projection. Give each GPU "
        f"whole heads ({spec.num_heads // t} of {spec.num_heads} here) and it computes its heads' attention with no "
        f"communication; the output projection, split by rows, turns the heads' results into partial sums that one "
        f"all-reduce adds. The only rule is divisibility: T must divide the number of heads (and match the KV heads), which "
        f"is what caps T at {rep['max_tp']} for this model.",
        {"heads_per_rank": spec.num_heads // t, "kv_heads_per_rank": kv_local, "valid_tp": rep["valid_tp"],
         "constraints": cons},
        sources=["megatron"], code=["meg-attention", "meg-column", "meg-row"],
        commands=[f"shard {spec.name} --tp {t} --mermaid"])


def sequence_parallel(v: dict) -> Explanation:
    """SP: all-reduce = reduce-scatter + all-gather (same bytes); norms and dropout work on s/T tokens."""
    from shardlab.comm.collectives import collective_time
    from shardlab.layout import Layout
    from shardlab.memory.activations import ActivationContext, layer_activation_bytes

    spec = catalog().model(v["model"])
    t, ln = v["tp"], catalog().link(v["link"])
    ctx = ActivationContext(seq_len=v["seq"], elem_bytes=2)
    plain = layer_activation_bytes(spec, 0, Layout(tp=t, micro_batch=v["batch"]), ctx)[0]
    sp = layer_activation_bytes(spec, 0, Layout(tp=t, micro_batch=v["batch"], sequence_parallel=True), ctx)[0]
    size = v["batch"] * v["seq"] * spec.hidden_size * 2
    ar = collective_time("all-reduce", size, t, ln)
    rs = collective_time("reduce-scatter", size, t, ln)
    ag = collective_time("all-gather", size, t, ln)
    return Explanation(
        "sequence-parallel", "Sequence parallelism: same bytes, fewer activations",
        f"{spec.name} with T = {t}, {v['batch']} × {v['seq']} tokens: what does sequence parallelism change in "
        f"communication and activation memory?",
        dict(v),
        ["without SP, norms and dropout run on the full (b, s, h) tensor on every TP rank: replicated activations",
         f"with SP they run on s/T = {v['seq'] // t} tokens; before attention/MLP an all-gather rebuilds the sequence, "
         f"after them a reduce-scatter replaces the all-reduce",
         f"ring all-reduce = reduce-scatter + all-gather: {fmt_time(ar.time_s)} vs {fmt_time(rs.time_s)} + "
         f"{fmt_time(ag.time_s)} = {fmt_time(rs.time_s + ag.time_s)} for {fmt_bytes(size)} on {t} ranks over {ln.id}: "
         f"the same bytes",
         f"activations per layer per micro-batch: {gib(plain)} without SP → {gib(sp)} with SP "
         f"({plain / sp:.2f}× less) [Korthikanti Table 2]"],
        f"Tensor parallelism splits the matmuls, but the layer norms and dropouts between them still see the whole "
        f"sequence on every rank. Sequence parallelism splits those along the sequence instead. The all-reduce that TP "
        f"needed becomes a reduce-scatter and an all-gather, which together move exactly the same bytes, so communication "
        f"stays the same while activations shrink from {gib(plain)} to {gib(sp)} per layer.",
        {"activations_bytes": plain, "activations_sp_bytes": sp, "all_reduce_s": ar.time_s,
         "reduce_scatter_plus_all_gather_s": rs.time_s + ag.time_s},
        sources=["korthikanti", "megatron"], code=["meg-sp", "pt-tp"],
        commands=[f"memory {spec.name} --gpus {t} --tp {t} --sequence-parallel", "run train --strategy tp+sp --nproc-per-node 2"])




def layout_3d(v: dict) -> Explanation:
    """A 3-D layout on a few GPUs: every rank's coordinates, layers and the groups it belongs to."""
    from shardlab.errors import ShardlabError
    from shardlab.layout import Layout
    from shardlab.layout_checks import validate
    from shardlab.rank_grid import all_groups, rank_coords
    from shardlab.memory.states import stage_tensors

    spec = catalog().model(v["model"])
    g, t, p = v["gpus"], v["tp"], v["pp"]
    if g > MAX_MAP_GPUS:
        raise ShardlabError(f"3d-layout draws one row per GPU: at most {MAX_MAP_GPUS:,}, got gpus={g:,}; for a larger "
                            f"cluster see `shardlab plan --gpus {g}` or `shardlab memory MODEL --gpus {g} --tp T --pp P`")
    if g % (t * p):
        raise ShardlabError(f"gpus={g} is not divisible by tp×pp = {t}×{p}; choose degrees whose product divides it")
    lay = validate(Layout(dp=g // (t * p), tp=t, pp=p), spec, g)
    stages = stage_tensors(spec, lay)
    rows = []
    for r in range(g):
        c = rank_coords(r, lay)
        st = stages[c["pp"]]
        holds = ", ".join(x for x, y in (("embedding", st.holds_embedding), ("head", st.holds_head)) if y)
        rows.append([r, r // v["gpus_per_node"], c["pp"], c["dp"], c["tp"], f"{st.layers[0]}-{st.layers[-1]}",
                     f"1/{t} of each matrix" if t > 1 else "whole matrices", holds or "-"])
    groups = {ax: all_groups(lay, ax) for ax in ("tp", "dp", "pp")}
    return Explanation(
        "3d-layout", "A 3-D layout, GPU by GPU",
        f"{spec.name} on {g} GPUs as DP {lay.dp} × TP {t} × PP {p}: which GPU holds which shard, and who talks to whom?",
        dict(v),
        [f"rank = tp_i + {t}·dp_i + {t * lay.dp}·pp_i (TP fastest, so TP partners are neighbours inside a node; "
         f"Megatron-LM's order)",
         f"PP splits the {spec.num_layers} layers into {p} stages: "
         + "; ".join(f"stage {s.stage} layers {s.layers[0]}-{s.layers[-1]}" for s in stages),
         f"TP groups (all-reduce per attention and MLP): {groups['tp']}",
         f"DP groups (gradient all-reduce per step): {groups['dp']}",
         f"PP groups (activations sent stage to stage): {groups['pp']}"],
        f"Read the map as three nested splits. Pipeline parallelism cuts the model's depth into {p} stages; inside a stage, "
        f"tensor parallelism cuts every matrix across {t} neighbouring GPUs that talk constantly; and data parallelism "
        f"makes {lay.dp} copies of that whole arrangement, which only exchange gradients once per step. Putting TP partners "
        f"next to each other keeps the chattiest traffic on the fastest link.",
        {"layout": lay.to_dict(), "groups": groups},
        table=(["rank", "node", "pp", "dp", "tp", "layers", "weights", "also holds"], rows),
        sources=["narayanan", "megatron"], code=["meg-ranks", "pt-mesh"],
        commands=[f"memory {spec.name} --gpus {g} --tp {t} --pp {p}"])


_TP = (model("llama-3.1-8b"), Param("tp", "int", 4, "tensor-parallel degree T"), Param("seq", "int", 4096, "tokens per sequence"),
       Param("batch", "int", 1, "sequences per micro-batch"))
TOPICS = [
    Topic("tp-mlp", "Column/row tensor parallelism", "column then row: one all-reduce per MLP forward, one backward",
          (1, 32), _TP + (Param("link", "str", "nvlink4", "link of the TP group"),), tp_mlp),
    Topic("tp-attention", "Attention under TP", "whole heads per rank; the divisibility caps on T", (1, 23), _TP, tp_attention),
    Topic("sequence-parallel", "Sequence parallelism", "all-reduce → reduce-scatter + all-gather; activations / T", (1,),
          _TP + (Param("link", "str", "nvlink4", "link of the TP group"),), sequence_parallel),
    Topic("3d-layout", "3-D layout map", "which GPU holds which shard on a small DP × TP × PP grid", (27,),
          (model("llama-3.1-8b"), Param("gpus", "int", 8, "GPUs"), Param("tp", "int", 2, "TP degree"),
           Param("pp", "int", 2, "PP degree"), Param("gpus_per_node", "int", 8, "GPUs per node")), layout_3d),
]
