"""TP inference communication: decode is latency-bound, prefill bandwidth-bound; 10 GbE loses > 40% of decode."""

import pytest

from shardlab.catalog import get_catalog
from shardlab.comm.collectives import collective_time
from shardlab.comm.inference import decode_step, prefill_step
from shardlab.memory.inference import kv_cache_bytes_per_token, weight_bytes_per_rank
from shardlab.specs.tensors import model_tensors, param_counts

CAT = get_catalog()
L7 = CAT.model("llama-2-7b")
H100 = CAT.accelerator("h100-sxm")
LINKS = ("nvlink4", "pcie5", "ethernet-10g")


def dec(link, tp=2, **kw):
    return decode_step(L7, tp=tp, batch=kw.pop("batch", 1), context_len=kw.pop("context_len", 2048), accelerator=H100,
                       link=CAT.link(link), **kw)


def pre(link, tp=2, **kw):
    return prefill_step(L7, tp=tp, batch=1, prompt_len=2048, accelerator=H100, link=CAT.link(link), **kw)


def test_decode_all_reduce_is_8kb_for_h4096():
    d = dec("nvlink4")
    assert d.comm_bytes_per_call == 8192 and d.comm_calls == 2 * 32
    assert pre("nvlink4").comm_bytes_per_call == 2048 * 4096 * 2


def test_terms_by_hand():
    eff, meff = 0.5, 0.8
    d = dec("pcie5", compute_efficiency=eff, memory_efficiency=meff)
    n_active = param_counts(L7).active
    assert d.compute_time_s == pytest.approx(2 * n_active * 1 / 2 / (989.4e12 * eff), rel=1e-12)
    moved = weight_bytes_per_rank(L7, 2)[0] + 2048 * kv_cache_bytes_per_token(L7, 2)[0]
    assert d.memory_time_s == pytest.approx(moved / (3350e9 * meff), rel=1e-12)
    ar = collective_time("all-reduce", 8192, 2, CAT.link("pcie5"))
    assert d.comm_time_s == pytest.approx(64 * ar.time_s, rel=1e-12)
    assert d.step_time_s == pytest.approx(max(d.compute_time_s, d.memory_time_s) + d.comm_time_s, rel=1e-12)
    assert d.comm_fraction == pytest.approx(d.comm_time_s / d.step_time_s)
    assert d.bound == "memory"
    assert pre("pcie5", compute_efficiency=eff).bound == "compute"


@pytest.mark.parametrize("link", LINKS)
def test_decode_latency_bound_prefill_bandwidth_bound(link):
    assert dec(link).comm_regime == "latency"
    assert pre(link).comm_regime == "bandwidth"


def test_ten_gbe_loses_more_than_40_percent_of_a_7b_decode_step():
    fr = {ln: dec(ln).comm_fraction for ln in LINKS}
    assert fr["ethernet-10g"] > 0.40
    assert fr["nvlink4"] < fr["pcie5"] < fr["ethernet-10g"]
    assert fr["nvlink4"] < 0.15                     # inside a node TP decode stays cheap


def test_no_tp_no_communication():
    d = dec("ethernet-10g", tp=1)
    assert d.comm_time_s == 0 and d.comm_fraction == 0 and d.comm_regime == "none"


def test_moe_decode_reads_only_touched_experts():
    mix = CAT.model("mixtral-8x7b")
    d1 = decode_step(mix, tp=1, batch=1, context_len=1, accelerator=H100, link=CAT.link("nvlink4"))
    d64 = decode_step(mix, tp=1, batch=64, context_len=1, accelerator=H100, link=CAT.link("nvlink4"))
    total = weight_bytes_per_rank(mix, 1)[0]
    experts = sum(t.numel for t in model_tensors(mix) if t.component == "experts") * 2
    kv1 = kv_cache_bytes_per_token(mix, 1)[0]
    # one token touches top-2 of 8 experts per layer: 1 - (6/8)^1 = 1/4 of the expert weights
    assert d1.bytes_moved == pytest.approx(total - experts + experts / 4 + kv1, rel=1e-12)
    assert d64.bytes_moved > 0.99 * total                       # a batch of 64 touches nearly all


def test_expert_parallel_all_to_alls_add_to_communication():
    mix = CAT.model("mixtral-8x7b")
    a = decode_step(mix, tp=2, batch=4, context_len=512, accelerator=H100, link=CAT.link("nvlink4"))
    b = decode_step(mix, tp=2, batch=4, context_len=512, accelerator=H100, link=CAT.link("nvlink4"), ep=4)
    a2a = collective_time("all-to-all", 4 * 2 * 4096 * 2, 4, CAT.link("nvlink4"))
    assert b.ep_comm_time_s == pytest.approx(2 * 32 * a2a.time_s)
    assert b.comm_time_s == pytest.approx(a.comm_time_s + b.ep_comm_time_s)
