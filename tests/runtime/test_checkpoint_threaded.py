"""Checkpoints under real collectives, in threads: each TP rank reads only its blocks (about 1/tp of the bytes), the
sharded model's logits equal transformers', and training from a checkpoint under TP starts at transformers' loss."""

import sys
import tempfile
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("expecttest")

from torch.testing._internal.common_distributed import MultiThreadedTestCase  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from ckpt_fixtures import build  # noqa: E402

from shardlab.runtime.checkpoint.config import CheckpointSource  # noqa: E402
from shardlab.runtime.checkpoint.load import load_into  # noqa: E402
from shardlab.runtime.checkpoint.reference import hf_loss, load_hf  # noqa: E402
from shardlab.runtime.data import SyntheticData  # noqa: E402
from shardlab.runtime.infer_worker import shard_for_inference  # noqa: E402
from shardlab.runtime.parallel.build import forward_backward, setup_rank  # noqa: E402
from shardlab.runtime.parallel.strategy import parse_strategy  # noqa: E402
from shardlab.runtime.vocab import pad_spec  # noqa: E402

_DIR = tempfile.TemporaryDirectory(prefix="shardlab-ckpt-")
_LOCK = threading.Lock()
_BUILT: dict = {}


DATA = SyntheticData(1001, 12, 2)


def checkpoint(family: str) -> Path:
    """Built, with transformers' logits and loss, in the main thread (transformers' autocast guard fails in threads)."""
    with _LOCK:
        if family not in _BUILT:
            _BUILT[family] = build(family, Path(_DIR.name) / family)
            hf = load_hf(_BUILT[family])
            x = torch.tensor([[1, 50, 700, 3, 999, 12]])
            with torch.no_grad():
                _BUILT[family, "logits"] = hf(x).logits
            _BUILT[family, "x"] = x
            _BUILT[family, "loss"] = hf_loss(_BUILT[family], *DATA.batch(0), model=hf)
        return _BUILT[family]


class TwoRanks(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        for family in ("gpt2", "qwen3_moe", "llama", "qwen2_moe"):
            checkpoint(family)
        self._spawn_threads()

    def infer_check(self, family: str, strategy: str):
        from torch.distributed.device_mesh import init_device_mesh

        from shardlab.runtime.gpt import build_model

        folder = checkpoint(family)
        src = CheckpointSource(str(folder))
        spec, cut = pad_spec(src.spec, 2)
        mesh = init_device_mesh("cpu", (2,))
        model = build_model(spec, numerics=src.numerics(cut), init=False).eval()
        model, _ = shard_for_inference(model, strategy, mesh.get_group(), mesh)
        ck = src.open()
        rep = load_into([model], ck, src.family, src.spec)
        # every matrix is split: a rank reads half of it; the replicated norms (and GPT-2's biases and positions) twice
        assert 0.49 * rep.checkpoint_bytes < rep.bytes_read < 0.56 * rep.checkpoint_bytes, rep
        with torch.no_grad():
            got = model(_BUILT[family, "x"])
        assert (got - _BUILT[family, "logits"]).abs().max().item() <= 1e-5

    def test_gpt2_vocabulary_under_megatron_tp(self):
        self.infer_check("gpt2", "tp-megatron")

    def test_gpt2_vocabulary_under_dtensor_tp(self):
        self.infer_check("gpt2", "tp")

    def test_qwen3_moe_experts_under_dtensor_tp(self):
        self.infer_check("qwen3_moe", "tp")

    def test_tp_training_starts_at_transformers_loss(self):
        self.train_check("llama")

    def test_moe_tp_training_starts_at_transformers_loss(self):
        """Routed experts split by width: partial outputs summed before the router weights (gpt.MoE.forward)."""
        self.train_check("qwen2_moe")

    def train_check(self, family: str):
        folder = checkpoint(family)
        src = CheckpointSource(str(folder))
        spec, cut = pad_spec(src.spec, 2)
        st = parse_strategy("tp", 2)
        s = setup_rank(spec, st, numerics=src.numerics(cut),
                       load=lambda modules: load_into(modules, src.open(), src.family, src.spec))
        x, y = DATA.batch(0)
        loss = forward_backward(s, x, y, 1)
        assert abs(float(loss) - _BUILT[family, "loss"]) <= 1e-5
