"""apply_tp / apply_fsdp on the meta device with a fake process group at the target world size: the per-rank
shard of every tensor equals the inventory's TP split followed by FSDP2's padded dim-0 shard, and rank 0's
weight bytes equal the memory model's (a 2-D mesh can be built once per process: one subprocess per case)."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SCRIPT = r"""
import json, sys
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from shardlab.catalog import get_catalog
from shardlab.layout import Layout
from shardlab.memory import training_memory
from shardlab.memory.states import fsdp_shard_numel
from shardlab.runtime.gpt import build_model
from shardlab.runtime.parallel.fsdp import apply_fsdp
from shardlab.runtime.parallel.tensor import apply_tp
from shardlab.specs.tensors import model_tensors

name, dp, tp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("fake", rank=0, world_size=dp * tp, store=FakeStore())
spec = get_catalog().model(name)
model = build_model(spec, device="meta")
mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
if tp > 1:
    apply_tp(model, mesh["tp"])
if dp > 1:
    apply_fsdp(model, mesh["dp"])
got = {n: p.to_local().numel() for n, p in model.named_parameters()}
want = {t.name: fsdp_shard_numel(t.local_shape(spec, tp), dp) for t in model_tensors(spec)}
pred = training_memory(Layout(dp=dp, tp=tp, zero=3 if dp > 1 else 0), model=spec, precision="fp32", seq_len=8).stages[0]
print(json.dumps({"mismatch": sorted(n for n in want if got.get(n) != want[n]), "weights": 4 * sum(got.values()),
                  "predicted": pred.weights}))
"""


@pytest.mark.parametrize("model,dp,tp", [("llama-3.1-8b", 8, 8), ("llama-3.1-70b", 4, 16)])
def test_rank0_shards_at_scale_match_the_inventory_and_memory_model(model, dp, tp):
    r = subprocess.run([sys.executable, "-c", SCRIPT, model, str(dp), str(tp)], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["mismatch"] == []
    assert doc["weights"] == doc["predicted"]
