"""The figures the README and docs quote from worked examples are what the commands print now.

Each claim names the doc, the command (run in process with --json) and the text the current value formats to; a
model or default that moves a figure fails here until the doc is updated (an audit found six stale figures).
"""
import json
import re
from pathlib import Path

import pytest

from conftest import cli_main

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


def _doc(name: str) -> str:
    return re.sub(r"\s+", " ", (ROOT / name).read_text(encoding="utf-8"))


def _json(*args: str) -> dict:
    code, out, err = cli_main(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def _total_gib(*args: str) -> float:
    return _json("memory", *args)["per_gpu"]["total"] / GIB


QLORA_7B = ("llama-2-7b", "--gpu", "rtx-4090", "--seq-len", "2048", "--lora-rank", "16")
V100_13B = ("llama-2-13b", "--gpu", "v100", "--zero", "2", "--precision", "fp16-mixed", "--recompute", "full",
            "--seq-len", "1024")
OFFLOAD_8B = ("llama-3.1-8b", "--gpus", "8", "--zero", "2", "--framework", "deepspeed", "--seq-len", "8192", "--global-batch", "64")


def _assert_quoted(doc: str, *claims: str) -> None:
    text = _doc(doc)
    for claim in claims:
        assert claim in text, f"{doc} should say {claim!r}"


def test_qlora_and_lora_worked_example():
    qlora, lora = _total_gib(*QLORA_7B, "--quantize-base", "nf4"), _total_gib(*QLORA_7B)
    _assert_quoted("docs/modern.md", f"{qlora:.2f} GiB: it fits a 24 GB RTX 4090",
                   f"LoRA on a bf16 base needs {lora:.2f} GiB")
    _assert_quoted("README.md", f"# QLoRA: {qlora:.2f} GiB, fits")


def test_finetune_ladder_boundaries():
    rows = {r["model"]: r for r in _json("memory", "--finetune-ladder", "--gpu", "rtx-4090", "--seq-len", "2048")["rows"]}
    q8, q13 = rows["llama-3.1-8b"]["qlora"] / GIB, rows["llama-2-13b"]["qlora"] / GIB
    _assert_quoted("docs/modern.md", f"QLoRA at Llama-3.1-8B ({q8:.1f} GiB; Llama-2-13B needs {q13:.1f} GiB)")


def test_zero_offload_headline():
    with_offload, without = _total_gib(*V100_13B, "--offload", "optimizer"), _total_gib(*V100_13B)
    _assert_quoted("docs/modern.md", f"needs {with_offload:.1f} GiB on one 32 GB V100",
                   f"without offload needs {without:.1f} GiB.")


def test_offload_step_time_example():
    off, on = _json("estimate", *OFFLOAD_8B, "--offload", "optimizer"), _json("estimate", *OFFLOAD_8B)
    claim = (f"step {off['step_time_s']:.2f} s instead of {on['step_time_s']:.2f} s, for "
             f"{off['memory']['per_gpu']['total'] / GIB:.1f} instead of {on['memory']['per_gpu']['total'] / GIB:.1f} GiB")
    _assert_quoted("docs/modern.md", claim)


@pytest.mark.parametrize("link", ["nvlink4", "pcie5", "ethernet-10g"])
def test_tp_inference_comm_table(link):
    d = _json("comm", "inference", "llama-2-7b", "--tp", "2", "--link", link)
    row = next(line for line in (ROOT / "docs/comm.md").read_text().splitlines() if line.startswith(f"| {link} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{d['decode']['comm_fraction'] * 100:.1f}%"
    assert cells[3].startswith(f"{d['prefill']['comm_fraction'] * 100:.1f}%")


def test_readme_validation_summary():
    """The README's one-line accuracy summary: runs, families and the leave-one-source-out range per family."""
    from shardlab.catalog import get_catalog
    from shardlab.validation import compare, load_runs
    from shardlab.validation.report import family_accuracy, load_folds, loso_comparisons

    runs, cat = load_runs(), get_catalog()
    fams = family_accuracy(compare(runs, cat), loso_comparisons(runs, cat, load_folds()))
    dense = [f for f in fams if " MoE " not in f.family]
    moe = {f.family.split(" × ")[1]: f for f in fams if " MoE " in f.family}
    # DeepSpeed is named apart: its 2021 ZeRO-3 rows alone decide the fit's NIC switch (docs/validation.md)
    big = [f.loso_mean * 100 for f in dense if f.target_applies and not f.family.startswith("deepspeed")]
    deepspeed = next(f.loso_mean * 100 for f in dense if f.family == "deepspeed × ampere")
    small = sorted(f"{f.loso_mean * 100:.1f}%" for f in dense if not f.target_applies)
    claim = (f"`shardlab validate` ({len(runs)} published runs, {len(fams)} framework × GPU families; leave-one-source-out "
             f"mean error {min(big):.1f}-{max(big):.1f}% per dense family of 5 or more runs except DeepSpeed "
             f"({deepspeed:.0f}%: its 2021 ZeRO-3 rows alone decide how ZeRO-3 traffic leaves a node), "
             f"{' and '.join(small)} for the two smaller ones; mixture-of-experts pre-training on Megatron-Core, predicted only, "
             f"{moe['blackwell'].loso_mean:.0%} on Blackwell and {moe['hopper'].loso_mean:.0%} on Hopper")
    _assert_quoted("README.md", claim)


def test_report_risk_examples_are_what_plan_says():
    """docs/report.md quotes risk sentences from two plans; each is one the plans print now, word for word."""
    text = (ROOT / "docs/report.md").read_text(encoding="utf-8")
    section = text.split("## The risk column", 1)[1].split("\n## ", 1)[0]
    quoted = [re.sub(r"\s+", " ", q) for q in re.findall(r"^- `([^`]+)`", section, flags=re.M)]
    quoted += [re.sub(r"\s+", " ", q) for q in re.findall(r"^- a collective: `([^`]+)`", section, flags=re.M)]
    assert len(quoted) == 5
    said = set()
    for args in ([], ["llama-3.1-405b", "--gpus", "1024", "--seq-len", "8192", "--global-batch", "2048",
                      "--fix", "tp=8", "--fix", "pp=16"]):
        d = _json("plan", *args)
        said |= {w.get("risk") for w in d["worksheet"]} | {c.get("risk") for c in d["communication"]}
    for q in quoted:
        assert q in said, f"docs/report.md quotes a risk no plan says now: {q!r}"


def test_inference_validation_summary_in_readme():
    """The README's serving accuracy line: leave-one-source-out and in-sample mean errors per target, and how many
    family targets (engine version × GPU generation, at least 5 measurements) are met."""
    from conftest import validate_inference_output

    code, out, err = validate_inference_output()
    assert code == 0, err
    d = json.loads(out)["summary"]
    ins, loso = d["in_sample"]["by_group"], d["leave_one_source_out"]["by_group"]
    f = lambda s, g: f"{s[g]['mean_abs_error'] * 100:.1f}%"  # noqa: E731
    _assert_quoted("README.md", f"Out of sample (leave-one-source-out) the mean error is {f(loso, 'tpot')} on "
                   f"per-token latency, {f(loso, 'ttft')} on TTFT and {f(loso, 'throughput')} on throughput; in sample "
                   f"{f(ins, 'tpot')}, {f(ins, 'ttft')} and {f(ins, 'throughput')}.")
    v = d["verdict"]
    targets = sum(1 for fam in d["leave_one_source_out"]["by_family"].values() for x in fam.values() if x["n"] >= v["family_min"])
    _assert_quoted("README.md", f"{targets - len(v['family_misses'])} of the {targets} family targets are met")
    rows = json.loads(out)["rows"]
    outside = [abs(r["error"]) for r in rows if r["target"] in ("load", "info") and r["error"] is not None]
    _assert_quoted("README.md", f"a mean error of about {round(100 * sum(outside) / len(outside))}% over {len(outside)} "
                   "informational measurements")
    ep, ep_loso = d["in_sample"]["expert_parallel"]["throughput"], d["leave_one_source_out"]["expert_parallel"]["throughput"]
    from shardlab.serving.moe import EP_VALIDATION       # the caveat every EP estimate and plan prints
    assert (EP_VALIDATION["values"], round(EP_VALIDATION["mean_abs_error"], 3),
            round(EP_VALIDATION["loso_mean_abs_error"], 3)) == (ep["n"], round(ep["mean_abs_error"], 3),
                                                                round(ep_loso["mean_abs_error"], 3))
    _assert_quoted("README.md", f"{ep['n']} throughput values of MoE models served with expert parallelism "
                   f"and data-parallel attention are predicted, never fitted: {f({'x': ep}, 'x')} mean error "
                   f"({f({'x': ep_loso}, 'x')} leave-one-source-out)")


def test_poisson_prompt_spread_example():
    """docs/inference.md's short-output example: evenly spaced prompts, the Poisson spread, the simulation."""
    import numpy as np

    from shardlab.catalog import get_catalog
    from shardlab.serving import cycle, steady
    from shardlab.serving.case import prepare
    from shardlab.serving.engines import get_engine
    from shardlab.serving.simulate import simulate
    from shardlab.specs.hardware import Cluster

    cat = get_catalog()
    acc = cat.accelerator("h100-sxm")
    node = Cluster(acc, 8, 8, cat.link(acc.system["intra_link"]), cat.link(acc.system["inter_link"]))
    case = prepare(cat.model("llama-3.1-70b"), node, get_engine("tensorrt-llm-0.17"), tp=4, prompt_len=467, output_len=16)
    a = steady.arrays([case])
    B = float(steady.fluid(a, [2], [16.0])["in_flight"][0])
    D, r = np.array([B * 15 / 16]), np.array([B / 16])
    even = float(cycle.step_cycle(a, D, r)["cycle_s"][0])
    spread = float(cycle.step_cycle(a, D, r, poisson=np.array([True]))["cycle_s"][0])
    life = float(steady.fluid(a, [2], [16.0])["e2e_s"][0])      # as `estimate --serve --requests 2000 --seed 0/1/2`
    sim = float(np.mean([simulate(case, arrival_rate=16.0, requests=2000, seed=s, lifetime_s=life).tpot_s.mean
                         for s in range(3)]))
    _assert_quoted("docs/inference.md", f"{even * 1e3:.1f} ms per token with evenly spaced prompts, {spread * 1e3:.1f} ms "
                   f"with the Poisson spread, {sim * 1e3:.1f} ms in the simulation below")


def test_launch_doc_names_the_main_plan_it_exports():
    """docs/launch.md's prose names the layout its generated torchtitan header states."""
    text = (ROOT / "docs/launch.md").read_text(encoding="utf-8")
    layout = re.search(r"# shardlab export --to torchtitan: train \S+ on .*?\): (.*?), micro-batch", text).group(1)
    assert f"The README's main plan ({layout}," in text


def test_fp8_validation_figures_in_modern_doc():
    """docs/modern.md's FP8 rows are the leave-one-source-out figures `validate` prints."""
    rows = {r["id"]: r for r in _json("validate")["runs"]}
    pct = lambda i: f"{rows[i]['loso_error'] * 100:+.0f}%".replace("-", "−").replace("+0%", "0%").replace("−0%", "0%")  # noqa: E731
    nemo = rows["mfsdp-8b-h100-25.09"]["loso_predicted"]
    _assert_quoted("docs/modern.md", f"predicted out of sample {round(nemo, -1):,.0f} ({pct('mfsdp-8b-h100-25.09')} and "
                   f"{pct('mfsdp-8b-h100-25.11')})",
                   f"32 and 64 GPUs): {pct('titan-8b-h200-32-float8')} and {pct('titan-8b-h200-64-float8')}.",
                   f"compiled, 8 and 128 GPUs): {pct('titan-8b-h100-8-float8')} and {pct('titan-8b-h100-128-float8')};")
    import math

    nemo_pct = sorted(round(100 * rows[i]["loso_error"]) for i in ("mfsdp-8b-h100-25.09", "mfsdp-8b-h100-25.11"))
    titan = max(abs(100 * rows[i]["loso_error"]) for i in ("titan-8b-h100-8-float8", "titan-8b-h100-128-float8",
                                                             "titan-8b-h200-32-float8", "titan-8b-h200-64-float8"))
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"predicted {nemo_pct[0]}-{nemo_pct[1]}% fast, torchtitan's Float8 runs on H100 and H200 within " \
           f"{math.ceil(titan)}%" in readme


def test_estimate_doc_quotes_the_committed_fit():
    """docs/estimate.md's fitted constants are fitted.yaml's, as the estimate prints them."""
    import yaml

    fit = yaml.safe_load((ROOT / "src/shardlab/catalog/data/fitted.yaml").read_text())
    gen, fw = fit["generations"], fit["frameworks"]
    _assert_quoted("docs/estimate.md",
                   f"Ampere {gen['ampere']['max_fraction']:.3f}, Hopper {gen['hopper']['max_fraction']:.3f}, half-size "
                   f"{fit['shared']['half_size']:.0f}",
                   f"bandwidth (Ampere {gen['ampere']['memory']:.2f}, Hopper {gen['hopper']['memory']:.2f})",
                   f"the fitted overlap share ({fit['shared']['overlap']:.2f}:",
                   f"| {fw['deepspeed']['layer_host_s'] * 1e3:.1f} ms, plus {fw['deepspeed']['pipeline_host_s'] * 1e3:.1f} ms "
                   f"per micro-batch, pass and stage under its pipeline engine | "
                   f"{fw['pytorch-fsdp']['layer_host_s'] * 1e3:.1f} ms | {fw['torchtitan']['layer_host_s'] * 1e3:.1f} ms |")


def test_planner_doc_memory_fraction_example():
    doc = _doc("docs/planner.md")
    full, capped = _json("plan", "--top", "1", "--max-memory-fraction", "1"), _json("plan", "--top", "1")
    extra = capped["rejected"]["uses more than 95% of GPU memory (--max-memory-fraction 0.95)"]
    p0, p1 = full["plans"][0], capped["plans"][0]
    delta = 100 * (p1["step_time_s"] / p0["step_time_s"] - 1)
    from shardlab.planner.report import _layout_str

    short = lambda p: " ".join(_layout_str(p["layout"]).split()[:4 if p["layout"]["cp"] > 1 else 3])
    said = " ".join(doc.split())
    assert (f"the margin rejects {extra} layouts and picks {short(p1)} at {p1['memory_bytes'] / GIB:.1f} GiB instead "
            f"of {short(p0)} at {p0['memory_bytes'] / GIB:.1f} GiB (what `--max-memory-fraction 1` picks), for "
            f"{delta:.1f}% more step time") in said


def test_inference_doc_serving_plan_block_is_what_plan_prints():
    cmd = ("plan", "llama-3.1-70b", "--inference", "--serve", "--concurrency", "64", "--ttft-slo", "0.5", "--gpus", "8",
           "--gpu", "h100-sxm")
    code, out, err = cli_main(*cmd)
    assert code == 0, err
    text = (ROOT / "docs/inference.md").read_text(encoding="utf-8")
    block = text.split("$ shardlab " + " ".join(cmd) + "\n", 1)[1].split("```", 1)[0].splitlines()
    printed = out.splitlines()
    assert block and all(line in printed for line in block), [line for line in block if line not in printed]


def test_inference_doc_preemption_example():
    args = ("estimate", "llama-3.1-70b", "--inference", "--serve", "--tp", "2", "--concurrency", "64", "--prompt-len",
            "1024", "--output-len", "256")
    d = _json(*args)
    ss, sim = d["steady_state"], d["simulation"]
    _assert_quoted("docs/inference.md",
                   f"({d['kv_blocks']['num_blocks']:,} blocks, {d['capacity']['sequences']} sequences of 1024 + 256 tokens)",
                   f"steady state {ss['tpot_s'] * 1e3:.1f} ms per token and {ss['output_tokens_per_s']:,.0f} tokens/s; the "
                   f"simulation preempts {sim['preemptions']} times over {sim['requests']} requests and gives "
                   f"{sim['tpot_s']['mean'] * 1e3:.1f} ms and {sim['output_tokens_per_s']:,.0f} tokens/s")


def test_inference_doc_run_detail_block():
    """docs/inference.md's `validate --inference --run` excerpt is what the command prints now."""
    code, out, err = cli_main("validate", "--inference", "--run", "trtllm-0.14-triton-online/h100-sxm/l70b/tp4/202-214/rate2")
    assert code == 0, err
    text = (ROOT / "docs/inference.md").read_text(encoding="utf-8")
    for name in ("ttft_s", "tpot_s"):
        printed = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert printed in text.splitlines(), printed


def test_disaggregation_figures_in_the_docs():
    """docs/inference.md §8 and docs/capacity.md quote the 70B split against the aggregated winner (shardlab explain
    disaggregation, the issue's question) and the two-pool simulation against the steady state."""
    n = _json("explain", "disaggregation")["numbers"]
    agg, dis = n["aggregated"], n["disaggregated"]
    _assert_quoted("docs/inference.md", f"give {dis['goodput_tokens_per_s_per_gpu']:,.0f} output tokens/s per GPU against "
                   f"{agg['goodput_tokens_per_s_per_gpu']:,.0f} aggregated ({n['ratio']:.2f}×): a mixed step of the "
                   f"aggregated winner takes {1e3 * agg['tpot_s']:.0f} ms where its decodes alone take "
                   f"{1e3 * agg['decode_only_step_s']:.0f} ms")
    _assert_quoted("docs/capacity.md", f"gives {n['ratio']:.2f}× the aggregated goodput")
    d = _json("estimate", "llama-3.1-8b", "--inference", "--serve", "--tp", "2", "--prefill-tp", "1", "--disaggregated",
              "4:4", "--arrival-rate", "28", "--prompt-len", "4000", "--output-len", "500", "--requests", "3000")
    s, m = d["steady_state"], d["simulation"]
    _assert_quoted("docs/inference.md", f"simulates a mean TPOT of {1e3 * m['tpot_s']['mean']:.1f} ms against the steady "
                   f"state's {1e3 * s['tpot_s']:.1f} ms, and a mean TTFT of {1e3 * m['ttft_s']['mean']:.0f} ms against "
                   f"{1e3 * s['ttft_s']:.0f} ms")


def test_inference_doc_weight_only_4_bit_limitation_figures():
    """docs/inference.md's limitation: int4 (W4A16) against bf16 decode, Llama-3.1-8B at batch 8 on an A100."""
    base = ("estimate", "llama-3.1-8b", "--inference", "--batch", "8", "--prompt-len", "512", "--output-len", "128",
            "--gpu", "a100-80gb")
    q4, bf = (_json(*base, *w)["decode_s_per_token"] for w in (("--weights", "int4"), ()))
    _assert_quoted("docs/inference.md", f"decodes in {q4 * 1e3:.1f} ms at int4 against {bf * 1e3:.1f} ms at")
