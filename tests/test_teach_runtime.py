"""The runtime pieces of the teaching items: the per-site Megatron counter, the T values a sweep runs, fp16 underflow."""

import pytest

torch = pytest.importorskip("torch")

from shardlab.catalog import get_catalog  # noqa: E402
from shardlab.runtime.parallel.megatron import CollectiveCounter  # noqa: E402
from shardlab.runtime.train_report import per_block_summary  # noqa: E402


def test_counter_by_site_and_per_block_summary():
    c = CollectiveCounter()
    for i in range(3):
        for site in (f"layers.{i}.attention", f"layers.{i}.mlp"):
            for phase in ("forward", "backward"):
                for _ in range(2):                      # two micro-batches
                    c.at(site).add("all_reduce", phase)
    c.at("embedding").add("all_reduce", "forward")
    c.at("head").add("all_gather", "forward")
    assert c.get("all_reduce", "forward") == 13 and c.get("all_reduce", "backward") == 12
    s = per_block_summary(c.by_site(), microbatches=2)
    assert s["attention"] == {"instances": 3, "uniform": True,
                              "per_instance_per_microbatch": {"all_reduce/forward": 1.0, "all_reduce/backward": 1.0}}
    assert s["mlp"]["per_instance_per_microbatch"] == {"all_reduce/forward": 1.0, "all_reduce/backward": 1.0}
    c.at("layers.0.mlp").add("all_reduce", "forward")   # one block issuing an extra call is flagged
    assert not per_block_summary(c.by_site(), 2)["mlp"]["uniform"]
    c.reset()
    assert not c.by_site() and not c.counts


def test_sweep_runs_only_the_t_the_devices_and_model_allow():
    from shardlab.errors import ShardlabError
    from shardlab.runtime.infer import sweep_tps

    tiny = get_catalog().model("tiny")                  # 8 heads, 4 KV heads
    tps, why = sweep_tps(tiny, "tp-megatron", "cpu", 2)
    assert tps == (1, 2) and "--max-tp 2" in why
    assert sweep_tps(tiny, "tp-megatron", "cpu", 16)[0] == (1, 2, 4)       # KV heads cap tp-megatron at 4
    assert sweep_tps(tiny, "tp", "cpu", 16)[0] == (1, 2, 4, 8)             # DTensor duplicates KV heads
    if not torch.cuda.is_available():
        with pytest.raises(ShardlabError):
            sweep_tps(tiny, "tp-megatron", "cuda", 4)                     # no GPU present: asking for 4 is refused


def test_fp16_without_scaling_loses_small_gradients_that_scaling_and_bf16_keep():
    from shardlab.runtime.data import SyntheticData
    from shardlab.runtime.precision import PrecisionRequest, underflow_sweep

    spec = get_catalog().model("tiny")
    req = PrecisionRequest(sweep=(0, 12))              # 8 × 64 tokens, as `shardlab run precision` (docs/teach.md)
    rows = underflow_sweep(req, spec, SyntheticData(spec.vocab_size, req.seq_len, req.global_batch, seed=1234))
    small = rows[1]
    assert small["fp16"]["zero_share"] > 0.5 > small["predicted_fp16_zero"] > 0.05
    assert small["fp16+scaling"]["zero_share"] < 0.01 and small["bf16"]["zero_share"] == 0.0
    assert rows[0]["fp16"]["zero_share"] < 0.01


def test_step_time_notes_name_an_instrumented_step_and_the_uncalibrated_cpu():
    from shardlab.runtime.train_report import step_time_notes

    def doc(steps, instrumented, error, gpu, device="cpu"):
        return {"workload": {"steps": steps}, "ranks": [{"device": device}] * 2,
                "step_time": {"instrumented": instrumented, "error": error, "predicted_catalog_gpu": gpu}}

    both = step_time_notes(doc(2, True, 4.9, "cpu-core"))
    assert len(both) == 2 and "--steps 2" in both[0] and "--steps 3 or more" in both[0]
    assert "run train measures this machine" in both[1] and "--no-probe" in both[1]
    assert step_time_notes(doc(6, False, 0.3, "cpu-core")) == []                    # close enough: no hint
    assert step_time_notes(doc(6, False, 4.9, None)) == []                          # a --profile: already calibrated
    assert step_time_notes(doc(6, False, 4.9, "h100-sxm", "cuda")) == []


def test_run_precision_names_its_papers():
    from shardlab.runtime.precision import PrecisionRequest, render_precision, run_precision

    text = render_precision(run_precision(PrecisionRequest(steps=2, sweep=(0,))))
    last = text.splitlines()[-1]
    assert last.startswith("sources: Micikevicius et al. 2018") and "arXiv 1710.03740" in last
    assert "loss scaling §3.2" in last and "Kalamkar et al. 2019" in last and "arXiv 1905.12322" in last
