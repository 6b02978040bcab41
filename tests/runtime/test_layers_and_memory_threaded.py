"""Each Megatron-style sharded layer against its dense reference, and measured model-state bytes per rank
against the memory model (must be equal, byte for byte), in threads.

Layer tolerance: 1e-6 relative to the largest entry (float32 carries ~7 digits; the only difference from
the dense layer is the order of a sum over tp partial products, which moves the last digit or two).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.testing._internal.common_distributed import MultiThreadedTestCase  # noqa: E402

from shardlab.memory import training_memory
from shardlab.memory.precision import state_bytes
from shardlab.memory.states import rank_state_report  # noqa: E402
from shardlab.runtime.data import SyntheticData  # noqa: E402
from shardlab.runtime.gpt import tiny_spec  # noqa: E402
from shardlab.runtime.metrics import model_state_bytes  # noqa: E402
from shardlab.runtime.parallel.build import forward_backward, setup_rank  # noqa: E402
from shardlab.runtime.parallel.megatron import (ColumnParallelLinear, CollectiveCounter,  # noqa: E402
                                                CopyToTensorParallel, RowParallelLinear, VocabParallelEmbedding,
                                                VocabParallelHead, _column_head)
from shardlab.runtime.parallel.strategy import parse_strategy  # noqa: E402

TOL = 1e-6


def close(got, want) -> bool:
    return (got - want).abs().max().item() <= TOL * max(1.0, want.abs().max().item())


def _dense(seed: int):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(16, 12)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(12, 16, generator=g) * 0.3)
        lin.bias.copy_(torch.randn(12, generator=g) * 0.3)
    x = torch.randn(2, 5, 16, generator=g)
    return lin, x


class _Ranks(MultiThreadedTestCase):
    """Threaded harness: ``world_size`` ranks as threads of this process (2 unless a subclass says otherwise)."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()


class MegatronLayers(_Ranks):

    def test_column_then_row_equals_dense_mlp(self):
        """Y = f(X) A_i (column), Z = g(Y_i B_i) (row): equals the dense two-layer product, gradients too."""
        group, counter = dist.group.WORLD, CollectiveCounter()
        a, x = _dense(0)
        b = nn.Linear(12, 16)
        with torch.no_grad():  # every rank must hold the same dense weights: explicit generators, not the global RNG
            g = torch.Generator().manual_seed(1)
            b.weight.copy_(torch.randn(16, 12, generator=g) * 0.3)
            b.bias.copy_(torch.randn(16, generator=g) * 0.3)
        col = ColumnParallelLinear(a, self.rank, 2)
        row = RowParallelLinear(b, self.rank, 2, group, counter)
        xs = x.clone().requires_grad_()
        out = row(torch.relu(col(CopyToTensorParallel.apply(xs, group, counter))))  # (2, 5, 16)
        xd = x.clone().requires_grad_()
        dense = b(torch.relu(a(xd)))
        assert close(out, dense)
        out.square().sum().backward()
        dense.square().sum().backward()
        assert close(xs.grad, xd.grad)                                  # f all-reduced dX
        assert close(col.weight.grad, a.weight.grad.chunk(2, 0)[self.rank])
        assert close(row.weight.grad, b.weight.grad.chunk(2, 1)[self.rank])
        assert counter.get("all_reduce", "forward") == 1 and counter.get("all_reduce", "backward") == 1

    def test_vocab_parallel_embedding_and_head(self):
        group, counter = dist.group.WORLD, CollectiveCounter()
        emb = nn.Embedding(10, 6)
        with torch.no_grad():
            emb.weight.copy_(torch.randn(10, 6, generator=torch.Generator().manual_seed(2)))
        tokens = torch.tensor([[0, 9, 4, 5, 3]])  # ids on both halves of the vocabulary
        vemb = VocabParallelEmbedding(emb, self.rank, 2, group, counter)
        assert (vemb(tokens) - emb(tokens)).abs().max() == 0  # exactly one rank contributes each row
        head = nn.Linear(6, 10, bias=False)
        with torch.no_grad():
            head.weight.copy_(torch.randn(10, 6, generator=torch.Generator().manual_seed(4)))
        vhead = VocabParallelHead(_column_head(head, self.rank, 2), group, counter, own=True)
        h = torch.randn(1, 5, 6, generator=torch.Generator().manual_seed(3))
        assert close(vhead(h), head(h))


class ModelStatesExact(_Ranks):
    """Weights, gradients and AdamW moments measured from storages equal shardlab.memory (fp32) on every rank."""


    def measure(self, name, optimizer="adamw", world=None):
        spec = tiny_spec()
        st = parse_strategy(name, world or self.world_size)
        s = setup_rank(spec, st, optimizer=optimizer)
        data = SyntheticData(256, 8, 6)
        x, y = data.shard(0, s.coords["dp"], st.dp)
        forward_backward(s, x, y, 1)
        s.optimizer.step()
        got = model_state_bytes(s.params, s.optimizer)
        pred = training_memory(st.layout(), model=spec, precision="fp32", optimizer=optimizer, seq_len=8).stages[0]
        own = rank_state_report(spec, st.layout(), state_bytes("fp32", optimizer), self.rank)
        worst = {"weights": pred.weights, "gradients": pred.gradients, "optimizer": pred.optimizer}
        assert all(getattr(own, k) <= v for k, v in worst.items())  # the report's figure is the worst rank's
        return got, {"weights": own.weights, "gradients": own.gradients, "optimizer": own.optimizer}

    def _assert_exact(self, name, optimizer="adamw"):
        got, pred = self.measure(name, optimizer)
        assert {k: got[k] for k in pred} == pred, f"{name} rank {self.rank}: measured {got}, predicted {pred}"

    def test_ddp_adamw(self):
        self._assert_exact("ddp")

    def test_fsdp_sgd(self):
        self._assert_exact("fsdp", "sgd")

    def test_tp_dtensor(self):
        self._assert_exact("tp")

    def test_tp_megatron(self):
        self._assert_exact("tp-megatron")


class UnevenFsdp(_Ranks):
    """FSDP2 over 3 ranks: dims of 64, 192 and 256 rows do not split evenly (22+22+20 rows, ...)."""

    @property
    def world_size(self):
        return 3

    def test_every_rank_exact_including_the_short_last_shard(self):
        """Weights and gradients live in FSDP2's padded shards (ceil(d0/3) rows on every rank); optimizer state is
        created for the rows a rank owns, so the last rank holds less: rank_state_report predicts both exactly."""
        got, pred = ModelStatesExact.measure(self, "fsdp")
        assert {k: got[k] for k in pred} == pred, f"rank {self.rank}: measured {got}, predicted {pred}"
