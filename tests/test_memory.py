"""Memory model: the ZeRO paper's example, Korthikanti's activation table, each sharding rule, worst rank."""

import math

import pytest

from shardlab.catalog import get_catalog
from shardlab.errors import ShardlabError
from shardlab.layout import Layout
from shardlab.memory.activations import ActivationContext, in_flight, layer_activation_bytes, layer_input_bytes
from shardlab.memory.overheads import NONE
from shardlab.memory.precision import state_bytes
from shardlab.memory.states import fsdp_shard_numel, stage_tensors, state_report
from shardlab.memory.training import training_memory

CAT = get_catalog()
H100 = CAT.accelerators["h100-sxm"]


# ---- model states -----------------------------------------------------------------------------------
@pytest.mark.parametrize("zero,gb", [(0, 120.0), (1, 31.40625), (2, 16.640625), (3, 1.875)])
def test_zero_paper_worked_example(zero, gb):
    """Rajbhandari et al. 2019 §5 / Figure 1: Ψ = 7.5B, N_d = 64 -> 120, 31.4, 16.6, 1.9 GB (1e9 bytes)."""
    rep = training_memory(Layout(dp=64, zero=zero), params=7_500_000_000)
    assert rep.worst.model_states == gb * 1e9


@pytest.mark.parametrize("precision,optimizer,per_param", [
    ("bf16-mixed", "adamw", 16), ("fp32", "adamw", 16), ("fp32", "sgd", 12), ("bf16", "adamw", 8),
    ("bf16-mixed", "adam-8bit", 10), ("fp16-mixed", "sgd", 12)])
def test_bytes_per_param(precision, optimizer, per_param):
    assert state_bytes(precision, optimizer).total == per_param


def test_master_weights_named():
    rep = training_memory(Layout(dp=8), params=1_000_000_000)
    w = rep.worst
    assert w.master_weights == 4e9 and w.moments == 8e9 and w.optimizer == 12e9


def test_tp_splits_each_matrix_and_replicates_kv_when_tp_exceeds_kv_heads():
    spec = CAT.models["llama-2-70b"]  # 64 heads, 8 KV heads, head_dim 128
    t = {x.name: x for x in stage_tensors(spec, Layout(tp=16))[0].tensors}
    assert t["layers.0.attention.wq.weight"].local_shape(spec, 16) == (8192 // 16, 8192)       # column
    assert t["layers.0.attention.wk.weight"].local_shape(spec, 16) == (128, 8192)              # 1 KV head, replicated
    assert t["layers.0.attention.wk.weight"].local_shape(spec, 4) == (2 * 128, 8192)           # 8 / 4 = 2 heads
    assert t["layers.0.attention.wo.weight"].local_shape(spec, 16) == (8192, 8192 // 16)       # row
    assert t["layers.0.mlp.w2.weight"].local_shape(spec, 16) == (8192, 28672 // 16)            # row
    assert t["layers.0.ffn_norm.weight"].local_shape(spec, 16) == (8192,)                      # replicated
    assert t["tok_embeddings.weight"].local_shape(spec, 16) == (32000 // 16, 8192)             # vocab-parallel


def test_vocab_parallel_uneven_takes_ceil():
    spec = CAT.models["gpt2"]  # vocab 50257 = prime-ish
    t = stage_tensors(spec, Layout(tp=4))[0].tensors[0]
    assert t.local_shape(spec, 4) == (math.ceil(50257 / 4), 768)


def test_row_parallel_bias_replicated_column_bias_split():
    spec = CAT.models["gpt2"]
    t = {x.name: x for x in stage_tensors(spec, Layout(tp=4))[0].tensors}
    assert t["layers.0.attention.wq.bias"].local_shape(spec, 4) == (192,)
    assert t["layers.0.attention.wo.bias"].local_shape(spec, 4) == (768,)


def test_pipeline_places_embedding_first_head_last_and_ties_copy():
    spec = CAT.models["gpt2"]  # tied embeddings
    st = stage_tensors(spec, Layout(pp=4))
    names = [{t.name for t in s.tensors} for s in st]
    assert "tok_embeddings.weight" in names[0] and "output.weight" not in names[0]
    assert "output.weight" in names[3] and "norm.weight" in names[3]   # copy of the tied embedding on the last stage
    assert [len(s.layers) for s in st] == [3, 3, 3, 3]
    assert sum(sum(t.numel for t in s.tensors) for s in st) == 124_439_808 + 50257 * 768


def test_uneven_pipeline_split():
    st = stage_tensors(CAT.models["llama-3.1-405b"], Layout(pp=16))
    assert [len(s.layers) for s in st] == [7] + [8] * 14 + [7]


def test_interleaved_chunks_round_robin():
    st = stage_tensors(CAT.models["llama-2-7b"], Layout(pp=2, vpp=2, schedule="interleaved"))
    assert st[0].layers == tuple(range(0, 8)) + tuple(range(16, 24))
    assert st[1].holds_head and not st[0].holds_head


def test_expert_parallel_splits_experts_and_zero_uses_expert_dp():
    spec = CAT.models["mixtral-8x7b"]
    sb = state_bytes("bf16-mixed", "adamw")
    tensors = stage_tensors(spec, Layout(dp=8, ep=8))[0].tensors
    full = state_report(tensors, spec, Layout(dp=8), sb)
    ep8 = state_report(tensors, spec, Layout(dp=8, ep=8), sb)
    experts = sum(t.numel for t in tensors if t.ep_dim is not None)
    assert full.params_local - ep8.params_local == experts - experts // 8
    # ZeRO-1: dense states shard over dp=8, expert states over dp/ep = 1
    z1 = state_report(tensors, spec, Layout(dp=8, ep=8, zero=1), sb)
    dense = full.params_local - experts
    assert z1.master == 4 * (math.ceil(dense / 8) + experts // 8)


def test_fsdp2_padding_per_tensor():
    assert fsdp_shard_numel((5, 3), 4) == 2 * 3
    assert fsdp_shard_numel((7,), 8) == 1
    assert fsdp_shard_numel((16, 16), 1) == 256
    spec = CAT.models["gpt2"]
    sb = state_bytes("fp32", "adamw")
    tensors = stage_tensors(spec, Layout())[0].tensors
    r = state_report(tensors, spec, Layout(dp=3, zero=3), sb)
    expect = sum(math.ceil(t.shape[0] / 3) * math.prod(t.shape[1:]) for t in tensors)
    assert r.weights == 4 * expect and r.gradients == 4 * expect and r.moments == 8 * expect


def test_more_gpus_with_zero3_never_increase_states():
    spec = CAT.models["llama-3.1-8b"]
    prev = None
    for dp in (1, 2, 4, 8, 16, 64):
        st = training_memory(Layout(dp=dp, zero=3), model=spec, seq_len=2048).worst.model_states
        assert prev is None or st < prev
        prev = st


# ---- activations (Korthikanti et al. 2022, Table 2) ----------------------------------------------------
GPT = CAT.models["gpt3-175b"]
S, B = 2048, 1
h, a = GPT.hidden_size, GPT.num_heads
CTX = ActivationContext(seq_len=S, elem_bytes=2, flash_attention=False, dropout=True)
sbh = S * B * h


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_no_sp(t):
    tot, scores = layer_activation_bytes(GPT, 0, Layout(tp=t), CTX)
    assert tot == pytest.approx(sbh * (10 + 24 / t + 5 * a * S / (h * t)) if t > 1 else sbh * (34 + 5 * a * S / h), rel=1e-12)
    assert tot - scores == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)          # selective recomputation


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_sequence_parallel(t):
    tot, scores = layer_activation_bytes(GPT, 0, Layout(tp=t, sequence_parallel=True), CTX)
    assert tot == pytest.approx(sbh * (34 / t + 5 * a * S / (h * t)), rel=1e-12)
    assert tot - scores == pytest.approx(sbh * 34 / t, rel=1e-12)


def test_korthikanti_full_recompute():
    assert layer_input_bytes(GPT, Layout(tp=8), CTX) == 2 * sbh
    assert layer_input_bytes(GPT, Layout(tp=8, sequence_parallel=True), CTX) == 2 * sbh / 8


def test_llama_block_derivation():
    """Llama block, bf16, flash attention: 12sbh + 4sb·h_kv + 8sbf + fp32 LSE 4·a·s·b (derived in activations.py)."""
    spec = CAT.models["llama-3.1-8b"]
    ctx = ActivationContext(seq_len=4096, elem_bytes=2, flash_attention=True)
    s, b, hh, f = 4096, 2, 4096, 14336
    hkv = 8 * 128
    tot, scores = layer_activation_bytes(spec, 0, Layout(micro_batch=2), ctx)
    assert tot == 12 * s * b * hh + 4 * s * b * hkv + 8 * s * b * f + 4 * 32 * s * b
    assert scores == 4 * 32 * s * b
    tot8, _ = layer_activation_bytes(spec, 0, Layout(tp=8, micro_batch=2), ctx)
    assert tot8 == 8 * s * b * hh + (4 * s * b * hh + 4 * s * b * hkv + 8 * s * b * f + 4 * 32 * s * b) / 8


def test_in_flight_per_schedule():
    assert in_flight(Layout(pp=4), 0, 16) == 4 and in_flight(Layout(pp=4), 3, 16) == 1
    assert in_flight(Layout(pp=4, schedule="gpipe"), 3, 16) == 16
    assert in_flight(Layout(pp=4), 0, 2) == 2
    p, v = 8, 4
    lay = Layout(pp=p, vpp=v, schedule="interleaved")
    assert in_flight(lay, 0, 64) == pytest.approx(p * (1 + (p - 1) / (p * v)))      # Korthikanti §4.3
    assert in_flight(Layout(), 0, 64) == 1


def test_first_stage_holds_p_microbatches_of_all_layers():
    """Korthikanti: under 1F1B the first stage stores p micro-batches of L/p layers = L layers' worth."""
    spec = GPT
    lay = Layout(tp=8, pp=16, sequence_parallel=True, recompute="selective")
    rep = training_memory(lay, model=spec, seq_len=S, microbatches=64, overheads=NONE, dropout=True, flash_attention=False)
    first = rep.stages[0]
    per_layer = sbh * 34 / 8
    emb_mask = sbh / 8 * 16
    assert first.activations == int(per_layer * 96 + emb_mask)
    assert rep.worst.stage == 0 and "embedding" in rep.worst_reason()


# ---- overheads and report ----------------------------------------------------------------------------
def test_no_overheads_means_states_plus_activations():
    rep = training_memory(Layout(dp=8, zero=3), model=CAT.models["llama-3.1-8b"], seq_len=1024, overheads=NONE)
    w = rep.worst
    assert w.other_total == w.other.get("logits_and_loss", 0)
    assert w.total == w.model_states + w.activations + w.other_total


def test_default_overheads_named():
    rep = training_memory(Layout(dp=8), model=CAT.models["llama-3.1-8b"], seq_len=1024, accelerator=H100)
    other = rep.worst.other
    for key in ("cuda_context", "library_workspace", "nccl_buffers", "ddp_buckets", "logits_and_loss", "fragmentation"):
        assert other[key] > 0, key
    assert other["ddp_buckets"] == rep.worst.gradients


def test_fits_and_json_contract():
    rep = training_memory(Layout(dp=8, zero=3), model=CAT.models["llama-3.1-8b"], seq_len=2048, accelerator=H100)
    d = rep.to_dict()
    assert d["fits"] is True and d["capacity_bytes"] == H100.memory_bytes
    assert d["model"]["params"] == 8_030_261_248 and d["model"]["active_params"] == 8_030_261_248
    assert set(d["layout"]) >= {"dp", "tp", "pp", "cp", "ep", "zero"}
    pg = d["per_gpu"]
    for k in ("weights", "gradients", "optimizer", "model_states", "activations", "other", "total"):
        assert isinstance(pg[k], int), k
    assert pg["model_states"] == pg["weights"] + pg["gradients"] + pg["optimizer"]
    assert pg["total"] == pg["model_states"] + pg["activations"] + pg["other"]
    assert isinstance(d["worst_rank"]["reason"], str) and d["worst_rank"]["rank"] == 0
    big = training_memory(Layout(dp=8), model=CAT.models["llama-3.1-70b"], seq_len=2048, accelerator=H100)
    assert big.fits is False


def test_last_stage_worst_when_head_dominates():
    """Tiny layers + huge vocabulary: the last stage (head + logits) is the worst rank, and the reason says so."""
    spec = CAT.models["llama-3.1-8b"].with_(num_layers=4, vocab_size=1_000_000)
    rep = training_memory(Layout(pp=4), model=spec, seq_len=1024, microbatches=4, accelerator=H100)
    assert rep.worst.stage == 3 and "output head" in rep.worst_reason()


def test_interleaved_needs_multiple_of_pp():
    with pytest.raises(ShardlabError, match="multiple"):
        training_memory(Layout(pp=4, vpp=2, schedule="interleaved"), model=CAT.models["llama-2-7b"], microbatches=6)


def test_uneven_vocabulary_split_follows_torch_chunk_per_rank():
    """GPT-2's 50,257 rows over tp = 2: DTensor Shard(0) (torch.chunk) gives 25,129 and 25,128 rows; over tp = 4:
    12,565 ×3 and 12,562. The worst rank (None) is the largest chunk; FSDP2 then pads each rank's own rows."""
    spec = CAT.models["gpt2"]
    emb = next(t for t in stage_tensors(spec, Layout(tp=2))[0].tensors if t.name == "tok_embeddings.weight")
    assert [emb.local_shape(spec, 2, tp_rank=r)[0] for r in (0, 1)] == [25129, 25128]
    assert [emb.local_shape(spec, 4, tp_rank=r)[0] for r in range(4)] == [12565, 12565, 12565, 12562]
    assert emb.local_shape(spec, 2)[0] == 25129
    sb = state_bytes("bf16-mixed", "adamw")
    tensors = stage_tensors(spec, Layout(tp=2))[0].tensors
    r0 = state_report(tensors, spec, Layout(dp=3, tp=2, zero=3), sb, tp_rank=0)
    r1 = state_report(tensors, spec, Layout(dp=3, tp=2, zero=3), sb, tp_rank=1)
    assert r0.weights - r1.weights == 2 * 768  # ceil(25129/3) = 8377 vs ceil(25128/3) = 8376 rows of 768, bf16


def test_fsdp_optimizer_state_is_per_owned_rows():
    """FSDP2: 64 rows over 3 ranks are padded to 22 rows each for weights and gradients, but the optimizer state
    covers the rows each rank owns: 22, 22 and 20."""
    assert [fsdp_shard_numel((64, 5), 3, r) for r in range(3)] == [110, 110, 100]
    assert fsdp_shard_numel((64, 5), 3) == 110
    assert fsdp_shard_numel((2, 5), 4, 3) == 0  # more ranks than rows: the last ranks own nothing
    from shardlab.memory.states import rank_state_report

    spec = CAT.models["gpt2"]
    lay = Layout(dp=3, zero=3)
    sb = state_bytes("fp32", "adamw")
    reps = [rank_state_report(spec, lay, sb, r) for r in range(3)]
    assert reps[0].weights == reps[2].weights and reps[0].optimizer >= reps[2].optimizer
    worst = training_memory(lay, model=spec, precision="fp32", seq_len=256, overheads=NONE).worst
    assert worst.optimizer == max(r.optimizer for r in reps)


def test_moe_zero_stages_only_ever_help():
    """Mixtral 8x7B on 16 GPUs, EP 8: one expert per rank, replicated twice. ZeRO-3 must shard those experts
    (on dim 1, as torchtitan does when experts are fewer than the ranks sharding them), never grow memory."""
    spec = CAT.models["mixtral-8x7b"]
    totals = [training_memory(Layout(dp=16, ep=8, zero=z), model=spec, seq_len=2048).worst.model_states for z in (0, 1, 2, 3)]
    assert totals == sorted(totals, reverse=True)
    from shardlab.memory.states import expert_shard_dim

    assert expert_shard_dim((1, 14336, 4096), 2) == 1 and expert_shard_dim((8, 14336, 4096), 2) == 0
