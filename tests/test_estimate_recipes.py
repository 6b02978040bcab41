"""Time of FP8 GEMMs and casts, offload traffic and CPU Adam, LoRA/QLoRA compute: hand-checked pure functions."""

import numpy as np
import pytest

from shardlab.catalog import get_catalog
from shardlab.errors import ShardlabError
from shardlab.rates.fp8 import all_gather_bytes_per_param, cast_time_s, fp8_gemm_time_s, linear_cast_bytes
from shardlab.rates.hardware import gemm_time_s, matmul_curve, memory_efficiency
from shardlab.estimate.lora import (adapter_flops_per_token, dequant_bytes_per_pass, lora_block_step_times,
                                    lora_training_flops_per_token)
from shardlab.estimate.offload import CPU_ADAM_PARAMS_PER_S, offload_time, traffic_bytes
from shardlab.flops import forward_flops_per_token
from shardlab.memory.lora import LoraSpec
from shardlab.memory.offload import Offload

CAT = get_catalog()
H100 = CAT.accelerator("h100-sxm")
L7 = CAT.model("llama-2-7b")


# ---- FP8 ------------------------------------------------------------------------------------------------------
def test_fp8_gemm_runs_at_the_fp8_peak_with_the_same_curve():
    curve, _ = matmul_curve(H100)
    bf16 = gemm_time_s(8192, 4096, 4096, H100.peak_flops("bf16"), curve)
    assert float(fp8_gemm_time_s(8192, 4096, 4096, H100, curve)) == pytest.approx(float(bf16) * 989.4 / 1978.9)


def test_fp8_needs_fp8_units():
    with pytest.raises(ShardlabError, match="no fp8 peak"):
        fp8_gemm_time_s(1, 1, 1, CAT.accelerator("a100-80gb"), matmul_curve(H100)[0])


def test_cast_bytes_and_time_by_hand():
    c = linear_cast_bytes(4096, 11008, 4096)          # the MLP up projection of Llama-2-7B, 4096 tokens
    assert float(c["forward"]) == 4 * 4096 * 4096 and float(c["backward"]) == 4 * 4096 * 11008
    assert float(c["weight"]) == 4 * 11008 * 4096
    t = cast_time_s(c, H100, microbatches=8)           # the weight cast is shared by the step's 8 micro-batches
    bytes_ = 4 * 4096 * 4096 + 4 * 4096 * 11008 + 4 * 11008 * 4096 / 8
    assert float(t) == pytest.approx(bytes_ / (3350e9 * memory_efficiency(H100)))


def test_fp8_all_gather_moves_one_byte_for_gemm_weights():
    f = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) / 6_738_415_616
    assert all_gather_bytes_per_param(L7, True) == pytest.approx(f + 2 * (1 - f))
    assert all_gather_bytes_per_param(L7, False) == 2.0


# ---- offload ---------------------------------------------------------------------------------------------------
P = 7.5e9 / 64


def test_zero_offload_traffic_and_cpu_adam_by_hand():
    off = Offload("optimizer")
    t = traffic_bytes(off, P, microbatches=4)
    assert (t["d2h_step"], t["h2d_step"], t["h2d_mb"]) == (2 * P, 2 * P, 0)
    link = 64e9 * 0.8                                      # PCIe 5.0 ×16 at 80%
    r = offload_time(off, partition_params=P, microbatches=4, compute_per_microbatch_s=0.5, backward_last_s=0.3,
                     link_bytes_per_s=link, gpus_per_node=8)
    cpu = P * 8 / CPU_ADAM_PARAMS_PER_S                     # 8 ranks share the node's CPUs
    assert r.cpu_adam_s == pytest.approx(cpu)
    # gradients (2P / link = 4.6 ms) hide under the 0.3 s backward; the parameter upload and the CPU step do not
    assert r.exposed_s == pytest.approx(2 * P / link + cpu)
    assert r.bandwidth_to_hide_gbps == 0.0


def test_param_offload_per_microbatch_traffic_and_bandwidth_to_hide():
    off = Offload("both")
    link = 32e9 * 0.8
    r = offload_time(off, partition_params=P, microbatches=4, compute_per_microbatch_s=0.01, backward_last_s=0.005,
                     link_bytes_per_s=link, gpus_per_node=8)
    per_mb = 2 * 2 * P                                      # weight shard uploaded for forward and backward
    assert r.per_microbatch_bytes == per_mb and r.h2d_bytes == 4 * per_mb and r.d2h_bytes == 4 * 2 * P
    assert r.bandwidth_to_hide_gbps == pytest.approx(per_mb / 0.01 / 1e9)
    assert r.exposed_s == pytest.approx(4 * (per_mb / link - 0.01) + P * 8 / CPU_ADAM_PARAMS_PER_S)


def test_nvme_adds_optimizer_state_reads_and_writes():
    t = traffic_bytes(Offload("optimizer", "nvme"), P, microbatches=1)
    assert t["nvme_step"] == 2 * 12 * P


# ---- LoRA / QLoRA ----------------------------------------------------------------------------------------------
def test_lora_flops_by_hand():
    lo = LoraSpec(16)
    f = forward_flops_per_token(L7, 2048)
    a = 2 * 39_976_960
    assert adapter_flops_per_token(L7, lo) == a
    model, hw = lora_training_flops_per_token(L7, 2048, lo, "full")
    assert model == 2 * (f["linear"] + f["logits"]) + 3 * (f["attention"] + a)
    assert hw == model + f["linear"] + f["attention"] + a


def test_frozen_block_backward_drops_weight_gradients():
    lt = {"gemm_s": np.array(10.0), "attn_s": np.array(2.0), "elem_s": np.array(1.0)}
    r = lora_block_step_times(lt, adapter_fwd_s=0.5, dequant_s=0.25, recompute="none")
    assert float(r["fwd_s"]) == 10 + 2 + 1 + 0.5 + 0.25
    assert float(r["bwd_s"]) == 10 + 2 * (2 + 1 + 0.5) + 0.25      # full training would spend 2 × 10 on GEMMs
    assert float(lora_block_step_times(lt, adapter_fwd_s=0.5, dequant_s=0.25, recompute="full")["recompute_s"]) == 13.75


def test_dequant_pass_bytes_by_hand():
    n = 4 * 4096 * 4096 + 3 * 4096 * 11008
    bits = 4 + 8 / 64 + 32 / (64 * 256)
    assert float(dequant_bytes_per_pass(L7, 0, LoraSpec(16, quantize_base="nf4"), 1)) == pytest.approx(n * (bits / 8 + 2))
    assert float(dequant_bytes_per_pass(L7, 0, LoraSpec(16, quantize_base="nf4"), 2)) == pytest.approx(n / 2 * (bits / 8 + 2))
    assert dequant_bytes_per_pass(L7, 0, LoraSpec(16), 1) == 0.0
