"""Step-time model: each component against hand-computed cases, conventions, invariants, JSON contract."""

import json
import math
import numpy as np
import pytest

from shardlab.catalog import get_catalog
from shardlab.comm.collectives import collective_time
from shardlab.errors import ShardlabError
from shardlab.estimate import estimate_training
from shardlab.rates.compute import layer_times
from shardlab.rates.hardware import gemm_efficiency, group_link
from shardlab.flops import korthikanti_eq7, narayanan_eq3, training_flops_per_token
from shardlab.layout import Layout
from shardlab.specs.hardware import Cluster

CAT = get_catalog()
A100 = CAT.accelerators["a100-80gb"]
H100 = CAT.accelerators["h100-sxm"]


def cluster(acc=H100, n=8, gpn=8, intra="nvlink4", inter="ib-ndr"):
    return Cluster(acc, n, gpn, CAT.link(intra), CAT.link(inter))


def gpt(h=4096, L=8, a=32, V=51200, s=2048):
    from shardlab.validation import model_from_shorthand

    return model_from_shorthand({"gpt": [h, L, a]}, s, "t")


@pytest.mark.parametrize("h,L,s,V", [(12288, 96, 2048, 51200), (4096, 32, 4096, 50000), (20480, 105, 2048, 51200)])
def test_flops_match_narayanan_and_korthikanti(h, L, s, V):
    spec = gpt(h, L, 64, V, s).with_(vocab_size=V)
    B = 7
    model, hw_full = training_flops_per_token(spec, s, "full")
    assert model * B * s == pytest.approx(korthikanti_eq7(B, s, L, h, V), rel=1e-12)
    assert hw_full * B * s == pytest.approx(narayanan_eq3(B, s, L, h, V), rel=1e-12)


def test_gemm_time_by_hand():
    """Llama-2-7B block, tp=2, 4096 tokens: every GEMM at eff(min dim); attention core halved by causal flash."""
    spec = CAT.models["llama-2-7b"]
    curve = H100.efficiency
    lt = layer_times(spec, 0, H100, curve, "bf16", seq_len=4096, tp=2, cp=1, ep=1, micro_batch=1,
                     sequence_parallel=False, elem_bytes=2)
    peak, T, h, f = 989.4e12, 4096, 4096, 11008
    eff = lambda d: curve.max_fraction * d / (d + curve.half_size)
    gemms = [(T, h // 2, h)] * 3 + [(T, h, h // 2)] + [(T, f // 2, h)] * 2 + [(T, h, f // 2)]
    expect = sum(2 * m * n * k / (peak * eff(min(m, n, k))) for m, n, k in gemms)
    assert float(lt["gemm_s"]) == pytest.approx(expect, rel=1e-12)
    heads, d = 16, 128
    # attention core: QK^T and PV, 2·T·T·d FLOPs each per head, half of them skipped by causal flash attention,
    # at FlashAttention-2's share of peak on Hopper
    attn = 0.5 * heads * 2 * (2 * T * T * d) / (peak * H100.attention_efficiency)
    assert float(lt["attn_s"]) == pytest.approx(attn, rel=1e-12)
    # fused memory-bound bytes: 2 norms (2e·Th) + 2 residual adds (3e·Th) + RoPE on q and k (2e·T(q+kv)/tp) + SwiGLU 3e·Tf/tp
    e = 2
    nbytes = 2 * 2 * e * T * h + 2 * 3 * e * T * h + 2 * e * T * (h / 2 + h / 2) + 3 * e * T * f / 2
    assert float(lt["elem_s"]) == pytest.approx(nbytes / (3350e9 * H100.memory_efficiency), rel=1e-12)


def test_eager_and_compiled_traffic_by_hand():
    """The same block's memory-bound bytes in eager PyTorch and under torch.compile (rates/kernels.py), tp=1."""
    from shardlab.rates.kernels import block_elementwise_bytes

    spec = CAT.models["llama-3.1-8b"]                       # GQA: q = 4096, kv = 1024, f = 14336, RMSNorm, RoPE
    T, h, q, kv, f, e = 1000, 4096, 4096, 1024, 14336, 2
    kw = dict(tokens=T, tp=1, tsh=1, elem_bytes=e, dropout=False, flash_attention=True, seq_len=4096)
    eager = (2 * (2 * e + 28 + 2 * e) + 2 * 3 * e) * h + (2 * e + 16) * (q + kv) + 2 * e * q + 2 * e * (kv + q) + 5 * e * f
    compiled = 2 * 4 * e * h + 2 * e * (q + kv) + 2 * e * q + 2 * e * (kv + q) + 3 * e * f
    assert float(block_elementwise_bytes(spec, 0, "eager", **kw)) == pytest.approx(T * eager, rel=1e-12)
    assert float(block_elementwise_bytes(spec, 0, "compiled", **kw)) == pytest.approx(T * compiled, rel=1e-12)
    assert T * compiled < float(block_elementwise_bytes(spec, 0, "fused", **kw)) * 1.3 < T * eager


def test_shared_expert_traffic_uses_its_own_width():
    """Qwen2-MoE's shared expert is shared_expert_intermediate_size wide, not num_shared × the routed width."""
    from dataclasses import replace

    from shardlab.rates.kernels import block_elementwise_bytes

    spec = CAT.models["mixtral-8x7b"]
    kw = dict(tokens=1000, tp=1, tsh=1, elem_bytes=2, dropout=False, flash_attention=True, seq_len=4096)
    with_shared = {w: spec.with_(moe=replace(spec.moe, num_shared_experts=1, shared_expert_ffn_hidden_size=w))
                   for w in (5632, 11264)}
    a, b = (float(block_elementwise_bytes(m, 0, "eager", **kw)) for m in with_shared.values())
    assert b - a == pytest.approx(5 * 2 * 1000 * 5632, rel=1e-12)     # SwiGLU eager: 5 f-wide passes of 2 bytes


def test_efficiency_curve():
    c = H100.efficiency
    assert gemm_efficiency(c.half_size, c) == pytest.approx(c.max_fraction / 2)
    assert gemm_efficiency(1e9, H100.efficiency) == pytest.approx(H100.efficiency.max_fraction, rel=1e-6)


def test_group_link_rails():
    cl = cluster(n=64)
    intra = group_link(cl, 8, 1)
    assert intra.nodes == 1 and intra.beta_bytes_per_s == CAT.link("nvlink4").bytes_per_s
    dp_rail = group_link(cl, 8, 8)          # one member per node: one NIC
    assert dp_rail.nodes == 8 and dp_rail.beta_bytes_per_s == CAT.link("ib-ndr").bytes_per_s
    dp_full = group_link(cl, 64, 1)         # 8 members per node share 8 NICs, capped by the NVLink ring
    assert dp_full.beta_bytes_per_s == pytest.approx(min(8 * CAT.link("ib-ndr").bytes_per_s, CAT.link("nvlink4").bytes_per_s))
    pcie = group_link(cluster(n=64, intra="pcie4"), 64, 1)
    assert pcie.beta_bytes_per_s == pytest.approx(CAT.link("pcie4").bytes_per_s)


def test_tp_comm_equals_four_ring_all_reduces():
    spec = CAT.models["llama-3.1-8b"]
    est = estimate_training(spec, Layout(dp=1, tp=8), cluster(), seq_len=4096, global_batch=4)
    ar = collective_time("all-reduce", 4096 * 4096 * 2, 8, CAT.link("nvlink4"), "ring").time_s
    ce = collective_time("all-reduce", 3 * 4 * 4096, 8, CAT.link("nvlink4"), "ring").time_s
    blocks, m = 32, 4
    # 4 per block per micro-batch, plus the vocabulary-parallel embedding (forward) and head (backward) all-reduces
    # and the cross-entropy's (3 fp32 values per token)
    assert est.breakdown["tp_comm_s"] == pytest.approx(((4 * blocks + 2) * ar + ce) * m, rel=1e-9)


def test_pipeline_ordering_of_schedules():
    spec = gpt(4096, 16, 32)
    one = estimate_training(spec, Layout(dp=1, pp=4), cluster(n=4), seq_len=2048, global_batch=16)
    inter = estimate_training(spec, Layout(dp=1, pp=4, vpp=2, schedule="interleaved"), cluster(n=4), seq_len=2048, global_batch=16)
    zb = estimate_training(spec, Layout(dp=1, pp=4, schedule="zb-h1"), cluster(n=4), seq_len=2048, global_batch=16)
    assert inter.breakdown["pp_bubble_s"] < one.breakdown["pp_bubble_s"]
    assert zb.breakdown["pp_bubble_s"] < inter.breakdown["pp_bubble_s"]


@pytest.mark.parametrize("sched,p,m,v", [("1f1b", 4, 12, 1), ("gpipe", 4, 3, 1), ("1f1b", 8, 2, 1), ("interleaved", 4, 8, 2),
                                         ("interleaved", 4, 4, 4), ("zb-h1", 8, 2, 1), ("zb-h1", 8, 4, 1), ("zb-h1", 4, 16, 1)])
def test_bubble_share_matches_the_pipeline_closed_form(sched, p, m, v):
    """Equal stages (tiny vocabulary, so the head adds almost nothing): the estimate's bubble share equals
    pipeline.closed_form's for every schedule, including m < p for ZB-H1 (backward = 2 × forward, W = one forward)."""
    from shardlab.pipeline import bubble_fraction_closed_form

    spec = gpt(4096, 16, 32).with_(vocab_size=8)
    est = estimate_training(spec, Layout(dp=1, pp=p, vpp=v, schedule=sched), cluster(n=p), seq_len=2048, global_batch=m)
    b = est.breakdown
    pipe = est.step_time_s - b["dp_comm_s"] - b["optimizer_s"]
    kw = dict(forward_s=1.0, backward_s=1.0, weight_grad_s=1.0) if sched == "zb-h1" else dict(forward_s=1.0, backward_s=2.0)
    assert b["pp_bubble_s"] / pipe == pytest.approx(bubble_fraction_closed_form(sched, p, m, v, **kw), rel=0.03)


def test_slowest_stage_sets_the_pace():
    """A large vocabulary makes the last stage (head + loss) slowest: it is named and it paces the pipeline."""
    spec = gpt(2048, 8, 16).with_(vocab_size=400_000, tied_embeddings=False)
    est = estimate_training(spec, Layout(dp=1, pp=4), cluster(n=4), seq_len=2048, global_batch=8)
    assert est.slowest_stage == 3


def test_dp_overlap_hides_gradient_reduction():
    spec = CAT.models["llama-3.1-8b"]
    lay, cl = Layout(dp=64, zero=1), cluster(n=64)
    on = estimate_training(spec, lay, cl, seq_len=2048, global_batch=64, dp_overlap=True)
    off = estimate_training(spec, lay, cl, seq_len=2048, global_batch=64, dp_overlap=False)
    assert on.breakdown["dp_comm_s"] < off.breakdown["dp_comm_s"] == pytest.approx(off.dp_comm_total_s)


def test_mfu_hfu_and_time_to_train():
    spec = gpt(4096, 16, 32)
    est = estimate_training(spec, Layout(dp=8, recompute="full"), cluster(), seq_len=2048, global_batch=64, tokens=1e9)
    s, L, h, V = 2048, 16, 4096, 51200
    ratio = narayanan_eq3(1, s, L, h, V) / korthikanti_eq7(1, s, L, h, V)
    assert est.hfu / est.mfu == pytest.approx(ratio, rel=1e-9)
    assert est.mfu == pytest.approx(est.model_tflops_per_gpu * 1e12 / 989.4e12)
    assert est.steps == math.ceil(1e9 / (64 * 2048)) == 7630                   # whole steps
    assert est.train_time_s == pytest.approx(est.steps * est.step_time_s)
    assert est.gpu_hours == pytest.approx(est.train_time_s / 3600 * 8)
    # 6ΨD leaves out attention and logits FLOPs: it must come out shorter, but within 15% here
    six = est.six_psi_d_time_s()
    assert 0.85 < six / est.train_time_s < 1.0


def test_more_gpus_never_lower_aggregate_throughput():
    spec = CAT.models["llama-3.1-8b"]
    prev = 0.0
    for n in (8, 16, 32, 64, 128, 256):
        est = estimate_training(spec, Layout(dp=n // 8, tp=8), cluster(n=n), seq_len=4096, global_batch=256)
        assert est.tokens_per_s >= prev
        prev = est.tokens_per_s


def test_json_contract():
    spec = CAT.models["llama-3.1-70b"]
    d = estimate_training(spec, Layout(dp=4, tp=8, pp=2, zero=1), cluster(n=64), seq_len=4096, global_batch=256,
                          tokens=1e12).to_dict()
    for k in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "hfu", "breakdown", "memory", "fits",
              "train_days", "gpu_hours"):
        assert k in d, k
    for k in ("compute_s", "tp_comm_s", "pp_bubble_s", "dp_comm_s", "optimizer_s"):
        assert k in d["breakdown"]
    assert d["memory"]["per_gpu"]["total"] > 0 and isinstance(d["fits"], bool)


def test_unfused_attention_is_named_as_priced():
    """With flash attention off the output names unfused attention (priced as GEMMs), never the fused kernel."""
    from shardlab.estimate.report import render_estimate

    spec, lay = CAT.models["llama-3.1-8b"], Layout(dp=8)
    fused = estimate_training(spec, lay, cluster(), seq_len=4096, global_batch=64)
    plain = estimate_training(spec, lay, cluster(), seq_len=4096, global_batch=64, flash_attention=False)
    assert fused.to_dict()["framework"]["attention_kernel"] in ("flash2", "native")
    assert plain.to_dict()["framework"]["attention_kernel"] == "unfused"
    text = render_estimate(plain)
    assert "unfused attention" in text and "attention kernel (" not in text
    assert plain.breakdown["compute_s"] > fused.breakdown["compute_s"]


def test_bad_batch():
    spec = CAT.models["llama-3.1-8b"]
    with pytest.raises(ShardlabError, match="not divisible"):
        estimate_training(spec, Layout(dp=8), cluster(), seq_len=2048, global_batch=12)
    with pytest.raises(ShardlabError, match="multiple of layout.pp"):
        estimate_training(spec, Layout(dp=1, pp=4, vpp=2, schedule="interleaved"), cluster(n=4), seq_len=2048, global_batch=6)


@pytest.mark.parametrize("lay,gb", [
    (Layout(dp=4, tp=8, pp=2), 64),
    (Layout(dp=8, tp=4, pp=2, zero=1), 64),
    (Layout(dp=16, tp=2, pp=2, zero=2), 64),
    (Layout(dp=32, tp=2, zero=3), 64),
    (Layout(dp=8, tp=8, zero=0), 32),
])
def test_estimate_and_inventory_agree_on_communication(lay, gb):
    """One pricing: per group the inventory's calls add up to the step model's total exactly, and the critical groups
    (TP/SP, PP) are exposed in full (tests/test_comm_exposure.py covers more layouts and frameworks)."""
    from shardlab.comm.exposure import exposure
    from shardlab.comm.inventory import layout_collectives

    spec = CAT.models["llama-3.1-70b"]
    cl = cluster(n=64)
    est = estimate_training(spec, lay, cl, seq_len=4096, global_batch=gb)
    items = layout_collectives(spec, lay, cl, seq_len=4096, microbatches=est.microbatches, framework=est.workload)
    for g in exposure(items, est.breakdown, lay.zero):
        assert g.total_s == pytest.approx(est.comm_total_s[g.component], rel=1e-9), g
        if g.group in ("TP", "PP"):
            assert g.exposed_s == pytest.approx(g.total_s, rel=1e-9), g
        assert g.exposed_s <= g.total_s * (1 + 1e-9) + 1e-12, g


def test_mixtral_expert_gathers_priced_alike_by_estimate_and_inventory():
    """dp32 ep8 ZeRO-3 on 4 nodes: the experts' weights shard over the 4 ranks holding the same experts, one per node,
    so each gather crosses one NIC per rank. The estimate and `comm plan` price the same group on the same link."""
    from dataclasses import asdict

    from shardlab.comm.inventory import layout_collectives
    from shardlab.comm import pricing as ct

    spec = CAT.models["mixtral-8x7b"]
    lay = Layout(dp=32, ep=8, zero=3)
    cl = cluster(A100, n=32, intra="nvlink3", inter="ib-hdr")
    items = [asdict(i) for i in layout_collectives(spec, lay, cl, seq_len=4096, microbatches=1)]
    experts = next(i for i in items if i["op"] == "all-gather" and "experts" in i["note"])
    assert experts["group_size"] == 4 and experts["link_id"] == "ib-hdr"
    units = spec.num_layers + 1
    from shardlab.specs.tensors import model_tensors

    expert_params = sum(t.numel for t in model_tensors(spec) if t.component == "experts") // 8 // spec.num_layers
    coll = ct.zero3_collectives_s(cl, tp=1, cp=1, dp=32, ep=8, rep=1, dense_params=0, expert_params=expert_params,
                                  grad_bytes=2, weight_bytes=2)
    # the inventory splits the same bytes over blocks + the embedding unit; per block both price one NIC per rank
    per_block_inventory = experts["time_per_call_s"] * units / spec.num_layers
    assert float(coll["ag"]) == pytest.approx(per_block_inventory, rel=0.05)


def test_hsdp_shards_inside_a_node_and_all_reduces_across():
    """HSDP on 4 nodes × 8: gathers stay on NVLink; only the shard all-reduce (1/8 of the gradients) crosses nodes."""
    spec = CAT.models["llama-2-7b"]
    kw = dict(seq_len=4096, global_batch=64)
    full = estimate_training(spec, Layout(dp=32, zero=3), cluster(A100, n=32, intra="nvlink3", inter="ethernet-10g"), **kw)
    hsdp = estimate_training(spec, Layout(dp=32, zero=3, dp_replicate=4), cluster(A100, n=32, intra="nvlink3",
                                                                                   inter="ethernet-10g"), **kw)
    assert hsdp.step_time_s < full.step_time_s          # on a slow network the hybrid layout wins
    assert hsdp.memory.worst.optimizer > 3.9 * full.memory.worst.optimizer   # states shard over 8, not 32


def test_framework_capabilities_and_what_if_notes():
    from shardlab.catalog import get_catalog

    cat = get_catalog()
    spec = gpt(4096, 16, 32)
    est = estimate_training(spec, Layout(dp=1, pp=4, schedule="zb-h1"), cluster(n=4), seq_len=2048, global_batch=16,
                            framework=cat.framework("megatron-lm"))
    assert any("does not run the zb-h1" in n for n in est.notes)
    assert cat.framework("pytorch-fsdp").refusal(Layout(tp=2)) is not None
    assert cat.framework("deepspeed").refusal(Layout(pp=2, zero=3)) is not None
    assert cat.framework("torchtitan").refusal(Layout(pp=2, zero=3, schedule="interleaved", vpp=2)) is None


def test_no_overheads_reports_states_and_layer_activations_only():
    from shardlab.memory import training_memory
    from shardlab.memory.overheads import NONE as NONE_OVERHEADS

    spec = CAT.models["llama-3.1-8b"]
    lay = Layout(dp=4, tp=2, pp=2, sequence_parallel=True)
    rep = training_memory(lay, model=spec, seq_len=4096, overheads=NONE_OVERHEADS, microbatches=8)
    assert all(s.other_total == 0 for s in rep.stages)
    dflt = training_memory(lay, model=spec, seq_len=4096, microbatches=8)
    assert dflt.stages[-1].other["logits_and_loss"] > 0          # the last stage holds the head


def test_memory_and_estimate_agree_on_the_same_layout():
    """`memory` and `estimate` build the same worst rank for the same flags (dropout off in both unless asked)."""
    from shardlab.cli import main as cli

    args = ["gpt3-175b", "--gpus", "64", "--gpu", "a100-80gb", "--tp", "8", "--pp", "8", "--seq-len", "2048",
            "--microbatches", "16", "--json"]
    import contextlib
    import io
    import json

    out1, out2 = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out1):
        assert cli(["memory", *args]) == 0
    with contextlib.redirect_stdout(out2):
        assert cli(["estimate", *args]) == 0
    mem, est = json.loads(out1.getvalue()), json.loads(out2.getvalue())
    assert mem["per_gpu"]["total"] == est["memory"]["per_gpu"]["total"]
    assert "+ one block re-materialised" not in mem["explain"]["activations"]


def test_fsdp_wrap_unit_trades_memory_for_overlap():
    """Per block (the default), every 4 blocks, or the whole model as one unit: larger units gather more at once
    (memory) and hide less (the first unit's gather and the last reduce-scatter grow; one unit hides nothing)."""
    spec = CAT.models["llama-3.1-8b"]
    kw = dict(seq_len=4096, global_batch=128)
    cl = cluster(n=64)
    est = {w: estimate_training(spec, Layout(dp=64, zero=3, wrap=w), cl, **kw) for w in (1, 4, 0)}
    z3 = {w: e.breakdown["zero3_comm_s"] for w, e in est.items()}
    assert z3[1] < z3[4] < z3[0]
    buf = {w: e.memory.worst.other["fsdp_buffers"] for w, e in est.items()}
    # per block and per 4 blocks the largest unit is the root (embedding + final norm + head, 1.05B parameters,
    # more than 4 blocks of 218M): the same peak; the whole model gathers more
    assert buf[1] == buf[4] < buf[0]
    wide = {w: estimate_training(spec, Layout(dp=64, zero=3, wrap=w), cl, **kw).memory.worst.other["fsdp_buffers"]
            for w in (1, 8)}
    assert wide[1] < wide[8]                      # 8 blocks (1.74B) outgrow the root unit
    # one unit: the whole model's weights gathered once, plus its gradients (bf16-mixed under megatron-lm, the default:
    # 2-byte weights + gradients in its 4-byte fp32 main_grad buffer)
    from shardlab.memory.precision import state_bytes
    from shardlab.specs.tensors import model_tensors

    sb = state_bytes("bf16-mixed", "adamw", 4)
    params = sum(t.numel for t in model_tensors(spec))
    assert buf[0] == pytest.approx(params * (sb.weights + sb.gradients), rel=1e-6)


def test_compiled_blocks_keep_only_the_mlps_matmul_outputs():
    """torch.compile's min-cut partitioner recomputes SiLU(gate)·up in backward: a SwiGLU block saves gate and up
    (2 f-wide tensors) instead of gate, up, SiLU(gate) and the product (4)."""
    from shardlab.memory.activations import ActivationContext, layer_activation_bytes

    spec = CAT.models["llama-3.1-8b"]
    lay = Layout(micro_batch=2)
    eager = layer_activation_bytes(spec, 0, lay, ActivationContext(seq_len=4096, elem_bytes=2))[0]
    comp = layer_activation_bytes(spec, 0, lay, ActivationContext(seq_len=4096, elem_bytes=2, compiled=True))[0]
    assert eager - comp == 2 * 2 * 4096 * 2 * spec.ffn_hidden_size
    # and the estimate uses it when the framework compiles
    kw = dict(seq_len=4096, global_batch=64)
    tt = CAT.framework("torchtitan")
    e0 = estimate_training(spec, Layout(dp=8, zero=3, micro_batch=2), cluster(), framework=tt, **kw)
    e1 = estimate_training(spec, Layout(dp=8, zero=3, micro_batch=2), cluster(), framework=tt, compile=True, **kw)
    assert e0.memory.worst.activations - e1.memory.worst.activations == 32 * (eager - comp)


def test_deepspeed_zero3_gathers_module_by_module():
    """DeepSpeed keeps at most stage3_max_live_parameters (1e9) gathered, at least the largest module, and reduces
    through reduce_bucket_size (5e8) buckets; FSDP holds two whole blocks and one block's gradients."""
    from shardlab.memory.buffers import largest_module_params

    spec = gpt(20480, 8, 128)                      # a 530B-wide block: 12·h² = 5.0e9 parameters
    lay = Layout(dp=64, zero=3, recompute="full")
    kw = dict(seq_len=2048, global_batch=64)
    big = largest_module_params(spec)
    assert big == 4 * 20480 * 20480                # the MLP's up projection (above the embedding's 51200·h)
    ds = estimate_training(spec, lay, cluster(A100, 64), framework=CAT.framework("deepspeed"), precision="fp16-mixed", **kw)
    fs = estimate_training(spec, lay, cluster(A100, 64), framework=CAT.framework("pytorch-fsdp"), precision="fp16-mixed", **kw)
    assert ds.memory.worst.other["fsdp_buffers"] == pytest.approx(2 * big + 2 * big, rel=1e-9)
    block = 12 * 20480**2 + 13 * 20480             # weights, biases and norms of one block: FSDP's unit
    assert fs.memory.worst.other["fsdp_buffers"] == pytest.approx(2 * 2 * block + 2 * block, rel=1e-3)
    # the planner's vectorised memory agrees with the exact report under both frameworks
    for est in (ds, fs):
        assert est.memory.worst.total == pytest.approx(_planner_memory(spec, lay, est), rel=1e-6)


def _planner_memory(spec, lay, est):
    from shardlab.estimate.step import evaluate

    wl = est.workload
    cands = {"dp": [lay.dp], "tp": [1], "pp": [1], "cp": [1], "ep": [1], "zero": [3], "vpp": [1], "mb": [1], "rc": [2],
             "sp": [False], "sched": [0]}
    return float(evaluate(spec, est.cluster, wl, {k: np.asarray(v) for k, v in cands.items()})["memory_bytes"][0])


@pytest.mark.parametrize("extra", [["--framework", "deepspeed", "--zero", "3", "--recompute", "full"],
                                   ["--framework", "torchtitan", "--compile", "--zero", "3"],
                                   ["--framework", "pytorch-fsdp", "--zero", "3", "--dp-replicate", "2"]])
def test_memory_and_estimate_agree_under_each_framework(extra):
    import contextlib
    import io
    import json

    from shardlab.cli import main as cli

    args = ["llama-3.1-8b", "--gpus", "16", "--seq-len", "4096", "--microbatches", "2", "--json", *extra]
    outs = []
    for cmd in ("memory", "estimate"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert cli([cmd, *args]) == 0
        outs.append(json.loads(buf.getvalue()))
    mem, est = outs
    assert mem["framework"] == est["framework"]["id"] == extra[1]
    assert mem["per_gpu"]["total"] == est["memory"]["per_gpu"]["total"]


def test_comm_plan_follows_the_framework():
    """DeepSpeed's ZeRO-3 re-gathers the weights for a recomputed forward: `comm plan --framework deepspeed` lists
    that gather, as the estimate prices it."""
    from shardlab.comm.inventory import layout_collectives

    spec = CAT.models["llama-3.1-8b"]
    lay = Layout(dp=16, zero=3, recompute="full")
    kw = dict(seq_len=4096, microbatches=1)
    gathers = {fw: sum(i.calls_per_step for i in layout_collectives(spec, lay, cluster(n=16), framework=CAT.framework(fw), **kw)
                       if i.op == "all-gather") for fw in ("deepspeed", "pytorch-fsdp")}
    # 33 units: DeepSpeed gathers each for forward and backward, and the 32 blocks once more for the recomputed
    # forward (the embedding and head are not recomputed); FSDP for forward and, all but the root (kept gathered),
    # backward
    assert (gathers["deepspeed"], gathers["pytorch-fsdp"]) == (33 + 33 + 32, 33 + 32)


def test_user_framework_from_a_catalog_file(tmp_path):
    """A framework added in a catalog YAML (--catalog) is estimated with its own mechanisms; a bad field is one line."""
    import contextlib
    import io
    import json
    from dataclasses import asdict

    import yaml

    from shardlab.cli import main as cli

    base = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(CAT.framework("pytorch-fsdp")).items() if k != "id"}
    good = tmp_path / "fw.yaml"
    good.write_text(yaml.safe_dump({"frameworks": {"my-fsdp": {**base, "layer_host_s": 0.02, "source": "our own"}}}))
    args = ["llama-3.1-8b", "--gpus", "8", "--zero", "3", "--seq-len", "4096", "--global-batch", "16", "--json"]
    docs = {}
    for fw in ("pytorch-fsdp", "my-fsdp"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert cli(["estimate", *args, "--catalog", str(good), "--framework", fw]) == 0
        docs[fw] = json.loads(buf.getvalue())
    assert docs["my-fsdp"]["framework"]["id"] == "my-fsdp"
    assert docs["my-fsdp"]["breakdown"]["host_overhead_s"] > 5 * docs["pytorch-fsdp"]["breakdown"]["host_overhead_s"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"frameworks": {"x": {**base, "kernels": "magic"}}}))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli(["estimate", *args, "--catalog", str(bad), "--framework", "x"]) == 2
    assert "kernels must be one of" in err.getvalue() and err.getvalue().count("\n") == 1


@pytest.mark.parametrize("lay", [Layout(dp=16, tp=2, pp=2, ep=8, zero=1), Layout(dp=8, ep=8, zero=1)])
def test_expert_all_to_alls_priced_alike_by_estimate_and_inventory(lay):
    """Across nodes every rank's dispatch leaves through its own NIC: the estimate and `comm plan` price the same
    pairwise exchange (inside one node: the NVLink ring's figure)."""
    from shardlab.comm.inventory import layout_collectives

    spec = CAT.models["mixtral-8x7b"]
    cl = cluster(n=lay.world_size)
    est = estimate_training(spec, lay, cl, seq_len=4096, global_batch=64)
    inv = sum(i.time_per_step_s for i in layout_collectives(spec, lay, cl, seq_len=4096, microbatches=est.microbatches,
                                                             framework=est.workload) if i.axis == "EP")
    assert est.breakdown["ep_comm_s"] == pytest.approx(inv, rel=0.02)


def test_expert_dispatch_under_tp_crosses_the_ep_links_once_per_tp_group():
    """Hand-checked ep_per_moe_block_s: with TP 2 each rank's all-to-all carries half the routed copies (Megatron-core
    sends the sequence-parallel shard), plus an all-gather and a reduce-scatter of all of them over the TP group;
    each forward first gathers the E token counts over the TP × EP group."""
    from shardlab.comm.collectives import alpha_beta_time
    from shardlab.comm import pricing as ct

    cl = cluster(n=32)
    T, h, k, e = 4096, 4096, 2, 2
    one = dict(cp=1, ep=4, tokens=T, hidden=h, top_k=k, elem_bytes=e, recompute_code=0, num_experts=8)
    routed = T * k * h * e
    nv, ib = cl.intra_link, cl.inter_link
    a2a = lambda size, g: max((g - 1) / 4 * size / nv.bytes_per_s, (4 - g) / 4 * size / ib.bytes_per_s) \
        + (g - 1) * nv.latency_s + (4 - g) * ib.latency_s                        # noqa: E731
    counts = lambda n: alpha_beta_time("all-gather", n * 8 * 8, n, nv.latency_s, nv.bytes_per_s, "ring")  # noqa: E731
    t1 = float(ct.ep_per_moe_block_s(cl, tp=1, **one))
    assert t1 == pytest.approx(2 * 2 * a2a(routed, 4) + counts(4))              # EP over 4 ranks of one node
    tg = float(ct.ep_per_moe_block_s(cl, tp=2, **one))
    etp = sum(alpha_beta_time(op, routed, 2, nv.latency_s, nv.bytes_per_s, "ring") for op in ("all-gather", "reduce-scatter"))
    assert tg == pytest.approx(2 * (2 * a2a(routed / 2, 4) + etp) + counts(8))  # EP groups stride 2: 4 per node
    assert float(ct.ep_per_moe_block_s(cl, tp=2, **{**one, "recompute_code": 2})) == pytest.approx(
        3 * (2 * a2a(routed / 2, 4) + etp) + 2 * counts(8))                    # the re-run forward's too


def test_deepspeed_pipeline_engine_host_time_per_micro_batch_pass_and_stage():
    """DeepSpeed's PipelineEngine runs its schedule instruction by instruction on the host: per micro-batch and
    stage, 2 passes × pipeline_host_s on top of the per-block host time; nothing without pipeline stages, and
    nothing for Megatron-LM, whose schedule is issued asynchronously."""
    import json

    from conftest import cli_main

    def est(*extra):
        code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", "16", "--tp", "2", "--global-batch", "64",
                                  "--json", *extra)
        assert code == 0, err
        return json.loads(out)

    d = est("--pp", "4", "--framework", "deepspeed")
    fw, m, per_stage = d["framework"], 64 // 2, 32 // 4           # dp 2, 32 micro-batches; 8 of 32 layers per stage
    assert fw["pipeline_host_s"] > 0.005
    want = m * (per_stage * 2 * fw["layer_host_s"] + 2 * fw["pipeline_host_s"])
    assert abs(d["breakdown"]["host_overhead_s"] - want) < 1e-6 * want
    flat = est("--pp", "1", "--framework", "deepspeed", "--zero", "1")
    assert flat["breakdown"]["host_overhead_s"] == pytest.approx(64 // 8 * 32 * 2 * fw["layer_host_s"], rel=1e-6)
    meg = est("--pp", "4", "--framework", "megatron-lm")
    assert meg["framework"]["pipeline_host_s"] == 0 and meg["breakdown"]["host_overhead_s"] == 0


def test_a_wrap_unit_holds_at_most_a_stage():
    from conftest import cli_main

    times = []
    for w in ("32-blocks", "1000-blocks"):
        code, out, err = cli_main("estimate", "llama-3.1-8b", "--dp", "8", "--zero", "3", "--global-batch", "64",
                                  "--wrap", w, "--json")
        assert code == 0, err
        times.append(json.loads(out)["step_time_s"])
    assert times[0] == pytest.approx(times[1])           # 32 layers: both are one unit (1000-blocks was 7.5x slower)


def test_cpu_adam_is_priced_for_the_gpus_a_host_really_has():
    from conftest import cli_main

    off = []
    for g in ("1", "8"):
        code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", g, "--zero", "1", "--offload", "optimizer",
                                  "--seq-len", "4096", "--global-batch", "8", "--json")
        assert code == 0, err
        off.append(json.loads(out)["offload"]["cpu_adam_s"])
    # the whole model's Adam runs on one host either way (ZeRO-Offload Table 3 rate): 1 GPU is not charged for 8
    assert off[0] == pytest.approx(off[1], rel=0.01)


def test_zb_h1_bubble_with_recomputation_matches_the_pipeline_simulation():
    from conftest import cli_main

    code, out, err = cli_main("estimate", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "8", "--schedule",
                              "zb-h1", "--global-batch", "64", "--seq-len", "4096", "--recompute", "full", "--json")
    assert code == 0, err
    assert json.loads(out)["breakdown"]["pp_bubble_s"] == pytest.approx(0.4149, abs=2e-4)   # W was 2/3 of a forward


@pytest.mark.parametrize("args, words", [
    (["gpt3-175b", "--gpus", "1024", "--gpu", "a100-80gb", "--tp", "8", "--pp", "16", "--global-batch", "1536",
      "--seq-len", "8192"], "2,048 learned positions"),
    (["llama-3.1-8b", "--gpus", "8", "--tp", "8", "--sequence-parallel", "--seq-len", "4097"], "does not divide them"),
])
def test_sequences_the_model_or_layout_cannot_take_are_refused(args, words):
    from conftest import cli_main

    code, _, err = cli_main("estimate", *args)
    assert code == 2 and words in err, err
