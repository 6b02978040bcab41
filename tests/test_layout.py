"""Layout validation and the rank grid (one pure function, tested up to large world sizes)."""

import pytest

from shardlab.catalog import get_catalog
from shardlab.errors import ShardlabError
from shardlab.layout import Layout, split_layers
from shardlab.layout_checks import validate
from shardlab.rank_grid import all_groups, group_nodes, group_ranks, group_span_nodes, rank_coords, coords_rank

CAT = get_catalog()


def test_docstring_example_16_gpus():
    lay = Layout(dp=4, tp=2, pp=2)
    assert group_ranks(lay, "tp", 0) == [0, 1]
    assert group_ranks(lay, "dp", 0) == [0, 2, 4, 6]
    assert group_ranks(lay, "pp", 0) == [0, 8]
    assert group_ranks(lay, "dp", 9) == [9, 11, 13, 15]


@pytest.mark.parametrize("lay", [Layout(dp=8, tp=8, pp=16), Layout(dp=6, tp=4, pp=4, cp=2, ep=3),
                                 Layout(dp=96, tp=8, pp=4), Layout(dp=2, tp=1, pp=1, cp=4)])
def test_groups_partition_the_world(lay):
    n = lay.world_size
    for axis, size in (("tp", lay.tp), ("cp", lay.cp), ("dp", lay.dp), ("pp", lay.pp), ("ep", lay.ep),
                       ("dp_shard", lay.dp * lay.cp)):
        groups = all_groups(lay, axis)
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(n)), axis
        assert all(len(g) == size for g in groups), axis
    for r in range(0, n, max(1, n // 97)):
        assert coords_rank(rank_coords(r, lay), lay) == r


def test_tp_inside_node_pp_across():
    lay = Layout(dp=8, tp=8, pp=16)  # 1024 GPUs, 128 nodes of 8
    assert group_nodes(lay, "tp", 8) == 1
    assert group_nodes(lay, "pp", 8) == 16
    assert group_nodes(lay, "dp", 8) == 8
    for axis in ("tp", "dp", "pp"):
        assert group_span_nodes(lay, axis, 8) == group_nodes(lay, axis, 8)


@pytest.mark.parametrize("lay,gpn", [(Layout(dp=4, tp=2, pp=2), 8), (Layout(dp=16, tp=2, cp=2), 8),
                                     (Layout(dp=8, tp=1, pp=2), 4), (Layout(dp=12, tp=4, ep=4), 8)])
def test_span_formula_matches_listing(lay, gpn):
    for axis in ("tp", "cp", "dp", "pp", "ep", "dp_shard"):
        assert group_span_nodes(lay, axis, gpn) == group_nodes(lay, axis, gpn), axis


def test_split_layers_gives_remainder_to_middle():
    assert split_layers(126, 16) == (7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7)
    assert split_layers(32, 4) == (8, 8, 8, 8)
    assert sum(split_layers(61, 8)) == 61
    assert split_layers(5, 2) == (3, 2)


def test_stage_layers_and_vpp_do_not_mix():
    with pytest.raises(ShardlabError, match="layout.vpp"):
        validate(Layout(pp=2, vpp=2, schedule="interleaved", stage_layers=(16, 16)))


@pytest.mark.parametrize("kw,msg", [
    (dict(tp=3), "does not divide"),
    (dict(tp=16, dp=1), None),                     # llama-2-70b: 64 heads, 8 KV heads -> replicated KV, fine
    (dict(ep=2, dp=2), "dense"),
    (dict(pp=100), "exceeds"),
    (dict(vpp=2, pp=1), "needs layout.pp"),
    (dict(vpp=2, pp=2, schedule="1f1b"), "runs one chunk per rank"),   # memory and comm plan took it silently
    (dict(zero=4), "layout.zero"),
    (dict(recompute="some"), "layout field recompute is one of none, selective, full, op"),   # the enum refuses it
    (dict(schedule="zigzag"), "layout field schedule is one of 1f1b, gpipe, interleaved, zb-h1"),
])
def test_validation_messages(kw, msg):
    if msg is None:
        validate(Layout(**kw), CAT.models["llama-2-70b"])
        return
    with pytest.raises(ShardlabError, match=msg):
        validate(Layout(**kw), CAT.models["llama-2-70b"])


def test_layout_enums_and_array_form_round_trip():
    """One Layout: names become enums, JSON gets plain names, and the search's array form is generated from the
    fields and read back whole (recompute fraction, wrap and HSDP replicas included)."""
    import json

    from shardlab.layout import ARRAY_KEYS, Recompute, Schedule, layout_from_arrays, layouts_to_arrays

    lay = Layout(dp=4, pp=2, vpp=2, schedule="interleaved", recompute="full", recompute_fraction=0.5, wrap=4,
                 dp_replicate=2, zero=3, micro_batch=2, sequence_parallel=True, tp=2)
    assert lay.recompute is Recompute.FULL and lay.schedule is Schedule.INTERLEAVED and lay.recompute == "full"
    assert json.loads(json.dumps(lay.to_dict()))["schedule"] == "interleaved"
    arrays = layouts_to_arrays([lay, Layout()])
    assert set(arrays) == set(ARRAY_KEYS.values()) and arrays["rc"].tolist() == [2, 0]
    assert layout_from_arrays(arrays, 0) == lay and layout_from_arrays(arrays, 1) == Layout()
    assert layout_from_arrays({"dp": [8], "pp": [1], "sched": [2]}, 0).schedule == "1f1b"   # no pipeline: 1F1B


def test_kv_heads_rule():
    # Qwen2.5-7B: 28 heads, 4 KV heads: tp=7 divides heads but neither divides the other for KV heads
    with pytest.raises(ShardlabError, match="KV heads"):
        validate(Layout(tp=7), CAT.models["qwen2.5-7b"])
    validate(Layout(tp=4), CAT.models["qwen2.5-7b"])


def test_ffn_rule():
    # Llama-2-7B FFN 11008 = 2^8 × 43: tp=32 divides the 32 heads but not... 11008/32 = 344 -> fine; use a YAML-free spec
    spec = CAT.models["llama-2-7b"].with_(ffn_hidden_size=11000)
    with pytest.raises(ShardlabError, match="FFN"):
        validate(Layout(tp=16), spec)


def test_world_size_mismatch():
    with pytest.raises(ShardlabError, match="product is 8"):
        validate(Layout(dp=3, tp=2), None, num_gpus=8)


def test_expert_parallel():
    spec = CAT.models["mixtral-8x7b"]
    validate(Layout(dp=8, ep=8), spec)
    with pytest.raises(ShardlabError, match="divide"):
        validate(Layout(dp=6, ep=3), spec)
    with pytest.raises(ShardlabError, match="must divide layout.dp"):
        validate(Layout(dp=4, ep=8), spec)


def test_group_span_nodes_equals_listing_the_groups_even_when_nodes_are_not_a_multiple():
    import random

    from shardlab.rank_grid import all_groups, group_span_nodes

    rng = random.Random(7)
    for _ in range(200):
        lay = Layout(dp=rng.choice([1, 2, 3, 4, 6]), tp=rng.choice([1, 2, 4, 8]), pp=rng.choice([1, 2, 3]),
                     cp=rng.choice([1, 2]))
        gpn = rng.choice([2, 4, 6, 8, 12])          # 6 per node (Summit-style): groups of 4 straddle nodes
        for ax in ("tp", "pp", "dp", "cp"):
            exact = max(len({r // gpn for r in g}) for g in all_groups(lay, ax))
            assert group_span_nodes(lay, ax, gpn) == exact, (ax, lay, gpn)
