"""Published runs: the data set, the committed fit and its cross-validation, the ZeRO-3 regime, the fitter."""

from functools import lru_cache

import numpy as np
import pytest

from shardlab.catalog import get_catalog
from shardlab.validation import compare, load_runs
from shardlab.validation.report import family_accuracy, load_folds, loso_comparisons

CAT = get_catalog()
RUNS = load_runs()


@lru_cache(maxsize=1)
def in_sample():
    return compare(RUNS, CAT)


@lru_cache(maxsize=1)
def out_of_sample():
    return loso_comparisons(RUNS, CAT)


def test_data_set_size_families_and_sources():
    target = [r for r in RUNS if not r.informational]
    families = {c.family for c in in_sample()}
    assert len(RUNS) >= 100 and len(target) >= 100
    assert len(families) >= 6
    for r in RUNS:
        assert r.citation and r.framework in CAT.frameworks
        assert not r.informational or r.config.get("assumed"), f"{r.id}: an informational run says why"
    from shardlab.catalog import load_yaml
    from shardlab.validation import RUNS_DIR

    declared = {s for f in RUNS_DIR.glob("*.yaml") for s in load_yaml(f)["sources"]}
    assert declared == {r.source for r in RUNS}, "a declared source without runs, or a run without a source"


def test_committed_folds_cover_every_in_target_source():
    """crossval.yaml (benchmarks/fit_step_model.py) holds one refit per source, each without that source's runs."""
    folds = load_folds()
    from shardlab.validation.fit import fitted_runs

    target = fitted_runs(RUNS, CAT)       # in target, on a fitted generation (Blackwell runs are predicted only)
    assert set(folds) == {r.source for r in target}
    for src, f in folds.items():
        assert f.runs == sum(1 for r in target if r.source != src)


def test_committed_fit_is_the_catalogs():
    """fitted.yaml is what the catalog applies: its recorded rms is what the in-sample predictions give."""
    from shardlab.catalog import DATA_DIR, load_yaml

    from shardlab.validation.fit import fitted_runs

    fit = load_yaml(DATA_DIR / "fitted.yaml")["fit"]
    fitted_ids = {r.id for r in fitted_runs(RUNS, CAT)}
    target = [c for c in in_sample() if c.run.id in fitted_ids]
    rms = float(np.sqrt(np.mean([np.log(1 + c.error) ** 2 for c in target])))
    assert fit["runs"] == len(target)
    assert rms == pytest.approx(fit["rms_log_error"], abs=2e-3)


def test_accuracy_by_family_in_sample_and_out_of_sample():
    """The figures docs/validation.md and the README quote (recomputed from the committed fit and folds)."""
    acc = {f.family: f for f in family_accuracy(in_sample(), out_of_sample())}
    for f in acc.values():   # a generation the fit never sees (Blackwell: the default curve) is out of sample twice
        if " MoE " in f.family:
            continue
        fitted_gen = f.family.split(" × ")[1] in CAT.generations
        assert f.in_sample_mean < (0.08 if f.target_applies and fitted_gen else 0.12), f.to_dict()
    # mixture-of-experts runs are predicted, never fitted: in sample and out of sample are the same prediction
    for fam, n in (("megatron-lm MoE × blackwell", 24), ("megatron-lm MoE × hopper", 13)):
        assert acc[fam].runs == n and acc[fam].in_sample_mean == pytest.approx(acc[fam].loso_mean), acc[fam].to_dict()
    blackwell = acc["megatron-lm × blackwell"]
    assert blackwell.runs >= 5 and blackwell.in_sample_mean == pytest.approx(blackwell.loso_mean)
    assert blackwell.loso_max <= 0.20
    for fam in ("megatron-lm × ampere", "torchtitan × ampere", "pytorch-fsdp × ampere", "pytorch-fsdp × hopper",
                "torchtitan × hopper"):
        assert acc[fam].loso_mean <= 0.07, acc[fam].to_dict()
    assert acc["megatron-lm × ampere"].loso_max <= 0.10
    # leaving a source out can only hurt on average: the out-of-sample errors are not the in-sample ones
    assert sum(f.loso_mean * f.runs for f in acc.values()) > sum(f.in_sample_mean * f.runs for f in acc.values())


def test_moe_runs_never_move_the_fit():
    """The fit sees dense runs only: adding or removing every MoE run leaves its inputs unchanged."""
    from shardlab.validation.fit import fitted_runs

    runs = load_runs()
    dense = [r for r in runs if not (isinstance(r.config.get("model"), str) and CAT.model(r.config["model"]).moe)]
    assert [r.id for r in fitted_runs(runs, CAT)] == [r.id for r in fitted_runs(dense, CAT)]
    assert any(r.id.startswith("mcore-moe-") for r in runs)


def test_zero3_throughput_collapses_at_fixed_global_batch():
    """Narayanan 2021 Table 2: ZeRO-3 on 175B at a fixed batch of 1536 measured 144 -> 88 -> 44 TFLOP/s per GPU from
    384 to 1536 GPUs (gathers and reduce-scatters stop hiding); the prediction falls the same way."""
    byid = {c.run.id: c for c in in_sample()}
    p = [byid[f"zero3-175b-{n}"].predicted for n in (384, 768, 1536)]
    assert p[0] > p[1] > p[2] and p[2] / p[0] < 0.4
    for n in (384, 768, 1536):
        assert abs(byid[f"zero3-175b-{n}"].error) < 0.10


def test_every_published_run_fits_in_memory():
    """Each of these runs really ran, so shardlab's memory estimate of it (with the framework's mechanisms: fused
    loss, compiled activations, DeepSpeed's module-wise gathers, Megatron's FP8 primary weights) must fit the GPU.
    The exceptions are informational runs whose recomputation is not published and which do not fit without some:
    NeMo's two GB200 Llama 3.1 405B rows (interleaved PP 16 × VP 4) and the final row of Megatron-LM's DeepSeek-V3
    write-up (2% over with its stated recomputation), as their ``assumed`` says; and Llama 3's two 8K rows, which
    the paper ran without recomputation on a schedule of its own that holds fewer micro-batches in flight than
    Megatron's interleaved warm-up, which shardlab counts."""
    unfit = set()
    for c in in_sample():
        mem = c.estimate.memory
        if not mem.fits:
            unfit.add(c.run.id)
            assert c.run.informational and "recomput" in c.run.config.get("assumed", ""), \
                f"{c.run.id}: {mem.worst.total / 2**30:.1f} GiB of {mem.capacity_bytes / 2**30:.1f}"
    assert unfit == {"mcore-405b-gb200-25.11", "mcore-405b-gb200-26.04", "mlm-dsv3-gb200-final", "llama3-405b-8192",
                     "llama3-405b-16384"}


def test_llama3_8k_rows_quote_shardlabs_own_figures():
    """The Llama 3 8K rows' ``assumed`` and docs/validation.md quote the memory estimate (121 GiB on the worst rank,
    no recomputation) and the errors the rows now show; a change to either must be carried into the text."""
    from pathlib import Path

    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "validation.md").read_text().split())
    rows = {c.run.id: c for c in in_sample() if c.run.id in ("llama3-405b-8192", "llama3-405b-16384")}
    quoted = {"llama3-405b-8192": "{n} micro-batches in flight on stage 1 at 8,192 GPUs ({g} GiB)",
              "llama3-405b-16384": "and {n} at 16,384 ({g} GiB)"}
    for rid, text in quoted.items():
        c, w = rows[rid], rows[rid].estimate.memory.worst
        n, g = f"{w.in_flight:.0f}", f"{w.total / 2**30:.0f}"
        assert not c.estimate.memory.fits and text.format(n=n, g=g) in c.run.config["assumed"], (rid, n, g)
        assert f"{n} micro-batches in flight and {g} GiB at 8,192" in doc if rid.endswith("8192") else \
            f"{n} and {g} GiB at 16,384" in doc, (rid, n, g)
    errors = [f"{100 * rows[i].error:+.1f}%" for i in ("llama3-405b-8192", "llama3-405b-16384")]
    assert f"the two 8K rows are {errors[0]} and {errors[1]} where full recomputation" in doc, errors


def test_gpt3_175b_megatron_readme():
    """GPT-3 175B, TP 8, PP 16, 1024 A100-80GB, batch 1536, seq 2048: 138 TFLOP/s per GPU, ~32 s per iteration."""
    c = next(c for c in in_sample() if c.run.id == "gpt3-175b-1024")
    assert abs(c.error) < 0.10
    assert abs(c.predicted_step_time_s - 32) / 32 < 0.10


def test_fitter_recovers_known_values_and_falls_back_to_priors():
    """Fit two numbers to predictions made with known values: the fit returns them. A fold that leaves out every run
    of a framework gives that framework's parameter its prior, never the value the full fit found."""
    from dataclasses import replace

    from shardlab.validation import PublishedRun, predict
    from shardlab.validation.fit import FittedParams, Param, cross_validate, fit

    runs = [r for r in RUNS if r.source in ("narayanan2021-t1", "bloom2022")]
    truth = FittedParams({"ampere.max_fraction": 0.66, "deepspeed.layer_host_s": 0.004})
    synthetic = []
    for r in runs:
        est = predict(r, CAT, truth)
        synthetic.append(replace(r, measured=float(est.hardware_tflops_per_gpu)))
    params = [Param("generation", "ampere", "max_fraction", 0.35, 0.95, 0.72)]   # every run informs it
    f = fit(synthetic, CAT, params, iterations=25)
    assert f.values["ampere.max_fraction"] == pytest.approx(0.66, abs=0.01)
    assert f.rms_log_error < 0.02                     # BLOOM's host time stays at the catalog's, not the truth
    full, folds = cross_validate(synthetic, CAT, iterations=3)
    assert folds["bloom2022"].values["deepspeed.layer_host_s"] == 0.0      # no DeepSpeed run left: the prior
    assert isinstance(synthetic[0], PublishedRun)


def test_every_run_replays_through_shardlab_estimate(tmp_path):
    """`shardlab estimate` with the flags `validate --run` prints (and the run's model file) reproduces the
    validation's prediction exactly, for every published run: any row can be rerun and varied from the CLI."""
    import contextlib
    import io
    import json

    from shardlab.cli import main as cli
    from shardlab.validation.replay import estimate_argv, metric_from_estimate_doc, run_model_yaml

    for c in in_sample():
        yml = run_model_yaml(c.run, CAT)
        path = None
        if yml:
            path = tmp_path / f"{c.run.id}.yaml"
            path.write_text(yml)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert cli(["estimate", *estimate_argv(c.run, CAT, str(path) if path else None), "--json"]) == 0, c.run.id
        got = metric_from_estimate_doc(c.run, json.loads(buf.getvalue()))
        assert got == pytest.approx(c.predicted, rel=1e-9), c.run.id


def test_validate_run_shows_one_run(tmp_path, capsys):
    from shardlab.cli import main as cli

    out = tmp_path / "m.yaml"
    assert cli(["validate", "--run", "mpt-7b-a10080gb-8", "--model-out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "shardlab estimate " + str(out) in text and "--framework pytorch-fsdp" in text and "out of sample" in text
    assert "hidden_size: 4096" in out.read_text()
    assert cli(["validate", "--run", "no-such-run"]) == 2
    assert "no published run 'no-such-run'" in capsys.readouterr().err


def test_docs_tables_are_current():
    """docs/validation.md's generated tables equal a fresh rendering (rerun benchmarks/validation_docs.py)."""
    from pathlib import Path

    from shardlab.validation.markdown import blocks, render_into

    page = Path(__file__).resolve().parents[1] / "docs" / "validation.md"
    text = page.read_text()
    assert render_into(text, blocks(in_sample(), out_of_sample())) == text, "run python benchmarks/validation_docs.py"


def test_the_zero3_nic_switch_is_refitted_by_every_fold():
    """DeepSpeed ZeRO-3's per-GPU NIC is a switch the fit chooses (validation.fit.SWITCHES), in the full fit and in
    every fold: only the 2021 ZeRO-3 runs inform it, so the fold without them keeps the prior (the node's NICs
    pooled) and predicts them far too fast, which the out-of-sample figures show instead of hiding."""
    from shardlab.catalog import DATA_DIR, load_yaml

    assert load_yaml(DATA_DIR / "fitted.yaml")["frameworks"]["deepspeed"]["zero3_comm_per_gpu_nic"] is True
    assert CAT.framework("deepspeed").zero3_comm_per_gpu_nic is True
    folds = load_folds()
    for src, f in folds.items():
        assert f.values["deepspeed.zero3_comm_per_gpu_nic"] == (0.0 if src == "narayanan2021-t2" else 1.0), src
    loso = {c.run.id: c for c in out_of_sample()}
    assert all(loso[f"zero3-175b-{n}"].error > 0.3 for n in (384, 768, 1536))
    assert all(abs(c.error) < 0.15 for c in in_sample() if c.run.id.startswith("zero3-"))   # in sample: true fits


def test_only_deepspeed_zero3_runs_move_with_the_nic_switch():
    """``switch_sensitive``: the ZeRO-3 runs' predictions change with the switch, the ZeRO-1 ones (and other
    frameworks') do not, so a fold without the ZeRO-3 runs keeps the prior without comparing objectives."""
    from shardlab.validation.fit import _prepare, _with_switch, default_params, switch_sensitive

    by_id = {r.id: r for r in RUNS}
    runs = [by_id[i] for i in ("zero3-175b-768", "zero3-530b-2240", "mtnlg-530b-2240", "bloom-176b")]
    runs += [r for r in RUNS if r.framework == "pytorch-fsdp"][:1]
    prep = [[_prepare(r, _with_switch(CAT, "zero3_comm_per_gpu_nic", v)) for r in runs] for v in (False, True)]
    assert switch_sensitive(*prep, default_params(runs, CAT)).tolist() == [True, True, False, False, False]


def test_fit_switch_keeps_its_prior_unless_the_runs_tell_the_values_apart():
    """The fitter's tie rule on real runs: DeepSpeed runs without ZeRO-3 (MT-NLG, BLOOM: ZeRO-1) cannot tell the
    NIC switch's values apart, so the prior (false) stands; the ZeRO-3 runs choose true."""
    from shardlab.validation.fit import fit

    by_id = {r.id: r for r in RUNS}
    zero1 = [by_id[i] for i in ("mtnlg-530b-2240", "mtnlg-530b-2800", "bloom-176b")]
    assert fit(zero1, CAT, iterations=2).values["deepspeed.zero3_comm_per_gpu_nic"] == 0.0
    zero3 = [by_id[f"zero3-175b-{n}"] for n in (384, 768, 1536)]
    assert fit(zero3, CAT, iterations=2).values["deepspeed.zero3_comm_per_gpu_nic"] == 1.0
    # runs of other frameworks: no switch to choose
    other = [r for r in RUNS if r.framework == "megatron-lm" and r.source == "megatron-readme"][:1]
    assert "deepspeed.zero3_comm_per_gpu_nic" not in fit(other, CAT, iterations=1).values
