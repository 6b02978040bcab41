"""MoE experts under FSDP2 when there are fewer experts than ranks: the runtime shards the stacked experts on
dim 1 (torchtitan's placement), and the memory model predicts the same bytes."""

import pytest

from conftest import cli_main

pytest.importorskip("torch")
pytest.importorskip("expecttest")


@pytest.mark.slow
def test_mixtral_fsdp16_experts_split_on_dim1_exact():
    code, out, err = cli_main("shard-check", "mixtral-8x7b", "--gpus", "16", "--fsdp", "16", "--json")
    assert code == 0, err
    import json

    d = json.loads(out)
    assert d["exact"] is True
