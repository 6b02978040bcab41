"""Strategy parsing (degrees, rank placement, the predicted Layout) and the deterministic dataset."""

import pytest

from shardlab.errors import ShardlabError
from shardlab.rank_grid import rank_coords
from shardlab.runtime.parallel.strategy import parse_strategy


@pytest.mark.parametrize("text,n,kw,degrees", [
    ("ddp", 4, {}, (4, 1, 1)), ("fsdp", 2, {}, (2, 1, 1)), ("tp", 4, {}, (1, 4, 1)), ("tp+sp", 2, {}, (1, 2, 1)),
    ("tp-megatron", 2, {}, (1, 2, 1)), ("pp", 4, {}, (1, 1, 4)), ("fsdp+tp", 4, {}, (2, 2, 1)),
    ("ddp+pp", 8, {"pp": 4}, (2, 1, 4)), ("fsdp+tp+pp", 8, {}, (2, 2, 2)), ("tp+fsdp", 8, {"tp": 4}, (2, 4, 1)),
])
def test_degrees(text, n, kw, degrees):
    st = parse_strategy(text, n, **kw)
    assert (st.dp, st.tp, st.pp) == degrees and st.world_size == n


def test_layout_for_the_memory_model():
    lay = parse_strategy("fsdp+tp+sp", 4).layout(micro_batch=2)
    assert (lay.dp, lay.tp, lay.zero, lay.sequence_parallel, lay.micro_batch) == (2, 2, 3, True, 2)
    assert parse_strategy("ddp", 2).layout().zero == 0
    inter = parse_strategy("pp", 2, schedule="interleaved")
    assert (inter.vpp, inter.layout().schedule) == (2, "interleaved")


def test_expert_parallel_is_carved_out_of_data_parallelism():
    st = parse_strategy("ep+ddp", 4)
    assert (st.name, st.dp, st.ep, st.layout().ep) == ("ddp+ep", 4, 4, 4)        # default: every DP rank
    assert parse_strategy("ddp+ep", 4, ep=2).layout().ep == 2


def test_mesh_order_matches_the_rank_grid():
    """The runtime's (pp, dp, tp) row-major mesh is the analytic core's grid (tp fastest, pp slowest)."""
    st = parse_strategy("ddp+tp-megatron+pp", 8)
    lay = st.layout()
    for r in range(8):
        c = rank_coords(r, lay)
        assert r == c["pp"] * st.dp * st.tp + c["dp"] * st.tp + c["tp"]


@pytest.mark.parametrize("text,n,kw,match", [
    ("zero", 2, {}, "parts are"), ("ddp+fsdp", 2, {}, "one of ddp/fsdp"), ("sp", 2, {}, "tp\\+sp"),
    ("ddp+tp", 4, {}, "DDP cannot wrap DTensor"), ("tp", 3, {"tp": 2}, "not divisible"),
    ("tp", 4, {"tp": 2}, "no ddp/fsdp part"), ("ddp", 2, {"tp": 2}, "no tp part"),
    ("ddp", 2, {"vpp": 2}, "--vpp"), ("ddp", 2, {"ep": 2}, "no ep part"), ("ep", 2, {}, "runs as ddp\\+ep"),
    ("fsdp+ep", 2, {}, "runs as ddp\\+ep"), ("ddp+ep", 4, {"ep": 3}, "must divide the data-parallel degree 4"),
])
def test_bad_strategies_name_the_fix(text, n, kw, match):
    with pytest.raises(ShardlabError, match=match):
        parse_strategy(text, n, **kw)


def test_data_is_deterministic_and_sliced_independently_of_dp():
    torch = pytest.importorskip("torch")
    from shardlab.runtime.data import SyntheticData

    d = SyntheticData(256, 16, 8)
    x, y = d.batch(3)
    assert x.shape == (8, 16) and torch.equal(x, d.batch(3)[0]) and not torch.equal(x, d.batch(4)[0])
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    halves = [d.shard(3, r, 2)[0] for r in range(2)]
    quarters = [d.shard(3, r, 4)[0] for r in range(4)]
    assert torch.equal(torch.cat(halves), x) and torch.equal(torch.cat(quarters), x)
    # every transition is one of `branching` successors: the loss floor is ln(branching)
    table = d._table()
    assert all(int(y[i, j]) in table[int(x[i, j])].tolist() for i in range(8) for j in range(16))


def test_strategy_parts_and_schedule_are_the_layout_enums():
    """A parsed strategy holds the same enums as the Layout it predicts with (one type per concept)."""
    from shardlab.layout import Schedule
    from shardlab.runtime.parallel.strategy import PARTS, StrategyPart, parse_strategy

    s = parse_strategy("fsdp+pp", 4, pp=2, schedule="gpipe")
    assert s.data is StrategyPart.FSDP and s.schedule is Schedule.GPIPE
    assert s.layout().schedule is Schedule.GPIPE and s.layout().zero == 3
    assert PARTS == tuple(p.value for p in StrategyPart)
