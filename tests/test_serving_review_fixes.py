"""Serving answers a reviewer found wrong (2026-12-07): each test fails on the code before its fix."""

import json

from conftest import cli_main


def _json(*argv) -> dict:
    code, out, err = cli_main(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


BASE = ["--inference", "--prompt-len", "1024", "--output-len", "256"]


def test_plan_inference_pins_the_tp_and_pp_written():
    d = _json("plan", "llama-3.1-8b", *BASE, "--gpus", "8", "--tp", "2", "--pp", "1", "--serve", "--arrival-rate", "10")
    assert {(p["tp"], p["pp"]) for p in d["plans"]} == {(2, 1)}
    d = _json("plan", "llama-3.1-8b", *BASE, "--gpus", "8", "--tp", "2")
    assert {p["tp"] for p in d["plans"]} == {2} and len(d["plans"]) > 1        # PP still searched
    code, out, err = cli_main("plan", "llama-3.1-8b", *BASE, "--gpus", "8", "--tp", "3")
    assert code == 2 and "--tp 3" in err and err.count("\n") == 1


def test_equal_throughputs_rank_by_latency_not_rounding_noise():
    """Every layout keeps up with 1 request/s: the fastest per request wins (TP 1 x PP 2 won on a 1e-16 difference)."""
    d = _json("plan", "llama-3.1-70b", *BASE, "--gpus", "8", "--serve", "--arrival-rate", "1")
    e2e = [p["e2e_s"] for p in d["plans"] if p["meets_slo"]]
    assert e2e == sorted(e2e)


def test_batch_is_refused_under_serve_and_a_vllm_cap_stays_a_cap(tmp_path):
    code, out, err = cli_main("estimate", "llama-3.1-8b", *BASE, "--serve", "--batch", "8")
    assert code == 2 and "--max-num-seqs" in err and err.count("\n") == 1
    script = tmp_path / "serve.sh"
    code, out, err = cli_main("export", "--to", "vllm", "llama-3.1-8b", *BASE, "--tp", "2", "--batch", "128",
                              "--out", str(script))
    assert code == 0, err
    d = _json("estimate", "--from", str(script), "--inference", "--serve")
    assert d["capacity"]["sequences"] <= 128


def test_an_unpriced_quantization_config_asks_for_weights(tmp_path):
    from pathlib import Path

    cfg = json.loads((Path(__file__).parent / "data" / "llama-3.1-8b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 3, "group_size": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, err = cli_main("estimate", str(path), *BASE)
    assert code == 2 and "gptq 3 bits" in err and "--weights" in err and err.count("\n") == 1
    d = _json("estimate", str(path), *BASE, "--weights", "int4")
    assert d["precision"]["weights"] == "int4"
    code, out, err = cli_main("estimate", str(path), "--gpus", "8")          # training ignores the block
    assert code == 0, err


def test_an_unknown_draft_is_named_before_its_acceptance():
    code, out, err = cli_main("estimate", "llama-3.1-8b", *BASE, "--serve", "--concurrency", "16",
                              "--speculative-tokens", "4", "--draft", "nosuch")
    assert code == 2 and "unknown model 'nosuch'" in err


def test_a_gpu_without_bf16_serves_in_fp16_and_a_gpu_without_any_names_no_empty_fix():
    d = _json("estimate", "llama-3.1-8b", *BASE, "--batch", "8", "--gpu", "v100", "--activations", "fp16")
    assert d["precision"]["activations"] == "fp16"
    code, out, err = cli_main("explain", "kv-cache", "gpu=v100")
    assert code == 0, err
    code, out, err = cli_main("estimate", "llama-3.1-8b", *BASE, "--gpu", "cpu-core")
    assert code == 2 and not err.rstrip().endswith("--activations")


def test_explain_kv_cache_command_prints_its_numbers():
    d = _json("explain", "kv-cache")
    cmd = next(c for c in d["commands"] if c.startswith("estimate"))
    est = _json(*cmd.split())
    assert est["max_batch"] == d["numbers"]["max_batch"]


def test_pipeline_ttft_rises_with_load():
    """A prompt rides whole in one micro-batch: under PP 2 its prefill is not halved once others decode."""
    ttft = [_json("estimate", "llama-3.1-70b", *BASE, "--serve", "--tp", "4", "--pp", "2", "--arrival-rate", str(r),
                  "--requests", "50")["steady_state"]["ttft_s"] for r in (0.05, 0.2, 1.0)]
    assert ttft == sorted(ttft)
