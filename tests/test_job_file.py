"""shardlab's job file: plan --save writes the winner, every command reads it as its first argument, --set overrides a
field, and bad files or keys are one line (exit 2)."""

import json

import pytest

from conftest import cli_main


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("plan", "--save", "job.toml", "--json")
    assert code == 0, err
    return tmp_path / "job.toml", json.loads(out)


def test_plan_save_then_estimate_gives_the_winners_step_time(job):
    path, plan = job
    text = path.read_text()
    assert text.startswith("# shardlab job file") and "[layout]" in text and 'format = "job"' in text
    code, out, err = cli_main("estimate", str(path), "--json")
    assert code == 0, err
    est = json.loads(out)
    assert est["step_time_s"] == pytest.approx(plan["plans"][0]["step_time_s"], rel=1e-12)
    assert est["layout"] == {**est["layout"], **{k: v for k, v in plan["plans"][0]["layout"].items()
                                                 if k in ("dp", "tp", "pp", "cp", "zero", "micro_batch")}}
    assert plan["export"]["target"] == "shardlab"


def test_every_command_reads_it_and_set_overrides(job):
    path, plan = job
    for argv in (["memory", str(path)], ["plan", str(path)], ["export", str(path), "--to", "megatron"]):
        code, out, err = cli_main(*argv)
        assert code == 0 and "read as shardlab" in out, (argv, err)
    code, out, err = cli_main("estimate", str(path), "--set", "layout.tp=8", "--set", "layout.dp=2", "--json")
    d = json.loads(out)
    assert code == 0 and d["layout"]["tp"] == 8 and d["layout"]["dp"] == 2
    assert d["step_time_s"] != pytest.approx(plan["plans"][0]["step_time_s"])


def test_bad_keys_and_files_are_one_line(job, tmp_path):
    path, _ = job
    code, _, err = cli_main("estimate", str(path), "--set", "layout.tpp=4")
    assert code == 2 and "no field 'tpp'" in err and "\n" not in err.strip()
    code, _, err = cli_main("estimate", "llama-3.1-8b", "--set", "layout.tp=2")
    assert code == 2 and "give the file" in err
    bad = tmp_path / "bad.toml"
    bad.write_text(path.read_text().replace("[layout]", "[layout]\ntensor = 3"))
    code, _, err = cli_main("estimate", "--from", str(bad))
    assert code == 2 and "[layout] has no key 'tensor'" in err
    bad.write_text(path.read_text().replace("version = 1", "version = 9"))
    code, _, err = cli_main("estimate", "--from", str(bad))
    assert code == 2 and "version 9" in err


def test_a_serving_plan_saves_its_engine_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--prompt-len", "1000",
                            "--output-len", "200", "--ttft-slo", "1", "--tpot-slo", "0.05", "--save", "serve.toml")
    assert code == 0, err
    text = (tmp_path / "serve.toml").read_text()
    assert "[serve]" in text and 'name = "vllm"' in text and "[workload]" not in text
    # the plan's capacity within its targets travels with it: estimate prices the layout there, and the targets hold
    assert "arrival_rate = " in text and "ttft_slo = 1.0" in text and "tpot_slo = 0.05" in text
    code, out, err = cli_main("estimate", "serve.toml", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["engine"] == "vllm" and d["prompt_len"] == 1000 and d["slo"]["met"]
    code, out, err = cli_main("estimate", "serve.toml", "--concurrency", "4", "--json")   # a load given beside it wins
    assert code == 0 and json.loads(out)["load"]["concurrency"] == 4, err


def test_a_saved_aggregated_serving_plan_gives_back_its_capacity(tmp_path, monkeypatch):
    """An aggregated plan at its capacity within the SLOs, saved: estimate of the file sees one replica's share of the
    plan's request rate, and its TPOT is the plan's (the target binds there)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--prompt-len", "4000",
                              "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025", "--json")
    assert code == 0, err
    (tmp_path / "plan.json").write_text(out)
    plan = json.loads(out)
    best = plan["plans"][0]
    code, _, err = cli_main("export", "--plan", "plan.json", "--rank", "1", "--to", "shardlab", "--out", "agg.toml")
    assert code == 0, err
    code, out, err = cli_main("estimate", "agg.toml", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["load"]["arrival_rate"] == pytest.approx(best["max_request_rate"] / best["replicas"])
    assert d["steady_state"]["tpot_s"] == pytest.approx(best["tpot_s"], rel=1e-6) and d["slo"]["met"]
    assert d["replicas"]["count"] == best["replicas"]


def test_review_findings_types_sets_memory_and_serving_gpus(job, tmp_path, monkeypatch):
    """Wrong types in the file or in --set are one line; --set values get the file's checks; memory takes the job's
    micro-batches from its global batch; a saved serving plan searches the GPUs it was planned for."""
    path, plan = job
    for s, msg in (("layout.tp=abc", "must be a whole number"), ("workload.global_batch=0", "positive whole number"),
                   ("model.name=5", "must be text"), ("bogus.name=x", "no section [bogus]")):
        code, _, err = cli_main("estimate", str(path), "--set", s)
        assert code == 2 and msg in err and "\n" not in err.strip(), (s, err)
    assert cli_main("estimate", str(path), "--set", "serve.kv_cache_dtype=auto")[0] == 0
    bad = tmp_path / "t.toml"
    bad.write_text(path.read_text().replace('name = "llama-3.1-70b"', "name = 5"))
    code, _, err = cli_main("estimate", str(bad))
    assert code == 2 and "must be text" in err
    code, out, _ = cli_main("memory", str(path), "--json")
    lay = plan["plans"][0]["layout"]
    assert code == 0 and json.loads(out)["layout"]["microbatches"] == 1024 // (lay["dp"] * lay["micro_batch"])
    code, _, err = cli_main("plan", "llama-3.1-8b", "--inference", "--gpus", "16", "--save", "s16.toml")
    assert code == 0, err
    code, out, err = cli_main("plan", "s16.toml", "--json")
    assert code == 0 and json.loads(out)["gpus"] == 16, err


def test_narrow_terminals_never_break_words(monkeypatch):
    monkeypatch.delenv("SHARDLAB_WIDE")
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = cli_main("plan")
    assert code == 0 and max(len(x) for x in out.splitlines()) <= 80
    assert "all-gather" in out and "all-ga\n" not in out and "critic\n" not in out


def test_a_job_file_is_read_by_its_content_whatever_its_name(tmp_path, monkeypatch):
    """`plan --save plan.json` writes a job file (TOML) under that name; every command reads it back as one."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("plan", "--save", "plan.json", "--json")
    assert code == 0, err
    code, out, err = cli_main("estimate", "plan.json", "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] > 0


def test_estimate_of_a_file_of_several_replicas_says_it_prices_one(tmp_path, monkeypatch):
    """A serving job file of 4 replicas: estimate prices one replica (the file's load is one replica's) and says so,
    with the 4 replicas' totals in the text and in `replicas` of the JSON."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("export", "llama-3.1-8b", "--inference", "--tp", "2", "--prompt-len", "1000",
                              "--output-len", "200", "--batch", "64", "--to", "shardlab", "--out", "one.toml")
    assert code == 0, err
    text = (tmp_path / "one.toml").read_text()
    assert "replicas = 1" in text
    (tmp_path / "four.toml").write_text(text.replace("replicas = 1", "replicas = 4"))
    for serve in ([], ["--serve"]):
        code, out, err = cli_main("estimate", "one.toml", *serve, "--json")
        one = json.loads(out)
        assert code == 0 and "replicas" not in one, err
        code, out, err = cli_main("estimate", "four.toml", *serve, "--json")
        four = json.loads(out)
        assert code == 0, err
        assert four["replicas"]["count"] == 4 and four["replicas"]["gpus"] == 8
        per = four["steady_state"]["output_tokens_per_s"] if serve else four["tokens_per_s"]
        assert four["replicas"]["output_tokens_per_s"] == pytest.approx(4 * per)
        code, out, err = cli_main("estimate", "four.toml", *serve)
        assert "four.toml runs 4 replicas of this layout (8 GPUs)" in " ".join(out.split())


def test_a_saved_serving_plans_load_reads_back_checked_and_where_it_belongs(tmp_path, monkeypatch):
    """Review findings on the saved load: export keeps the per-replica cap; bad or doubled loads and statistics are
    one line; clients that do not split evenly over the replicas are dealt as a balancer deals them (estimate
    prices a busiest replica, the totals add the others); plan FILE runs a saved closed loop again; estimate FILE --slo-percentile p99 asks for the layout's capacity, not the file's load."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--prompt-len", "1000",
                            "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025", "--save", "a8.toml")
    assert code == 0, err
    text = (tmp_path / "a8.toml").read_text()
    cap = int(text.split("max_num_seqs = ", 1)[1].split()[0])
    code, out, err = cli_main("export", "a8.toml", "--to", "vllm")
    assert code == 0 and f"--max-num-seqs {cap}" in out, (err, cap)
    code, _, err = cli_main("export", "a8.toml", "--to", "shardlab", "--out", "again.toml")   # written again: kept
    again = (tmp_path / "again.toml").read_text()
    assert code == 0 and f"max_num_seqs = {cap}" in again, err
    assert [x for x in again.splitlines() if x.split(" = ")[0] in ("arrival_rate", "ttft_slo", "tpot_slo")] == \
        [x for x in text.splitlines() if x.split(" = ")[0] in ("arrival_rate", "ttft_slo", "tpot_slo")]
    for s, msg in (("serve.slo_percentile='p75'", 'must be "p50" or "p99"'), ("serve.arrival_rate=nan", "arrival_rate"),
                   ("serve.arrival_rate=1e-300", "arrival_rate = 1e-300 must be a number from 1e-06"),
                   ("serve.ttft_slo=-1", "ttft_slo"), ("serve.concurrency=80", "both arrival_rate and concurrency")):
        code, _, err = cli_main("estimate", "a8.toml", "--set", s)
        assert code == 2 and msg in err and err.count("\n") == 1, (s, err)
    code, _, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--tp", "1",
                            "--concurrency", "3", "--save", "k3.toml")
    assert code == 0, err
    code, out, err = cli_main("estimate", "k3.toml", "--json")    # 3 clients over 8 replicas: 3 × 1 + 5 × 0
    rep = json.loads(out)["replicas"]
    assert code == 0 and json.loads(out)["load"]["concurrency"] == 1, err
    assert rep["clients"] == {"total": 3, "busiest": 1, "replicas_busiest": 3, "others": 0}
    assert rep["requests_per_s"] == pytest.approx(3 * json.loads(out)["steady_state"]["requests_per_s"])
    code, out, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--tp", "4",
                              "--concurrency", "63", "--save", "k63.toml", "--json")
    assert code == 0, err
    plan = json.loads(out)["plans"][0]
    code, out, err = cli_main("estimate", "k63.toml", "--json")   # 32 + 31 clients: the totals are the plan's
    est = json.loads(out)
    assert code == 0 and est["load"]["concurrency"] == 32 and est["replicas"]["clients"]["others"] == 31, err
    assert est["replicas"]["output_tokens_per_s"] == pytest.approx(plan["output_tokens_per_s"], rel=1e-3)
    code, out, err = cli_main("estimate", "k63.toml")
    assert "its 63 clients split 1 × 32 + 1 × 31: the figures above are a replica of 32 (the busiest)" in \
        " ".join(out.split()), out
    code, _, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--concurrency", "64",
                            "--save", "c8.toml")
    assert code == 0, err
    code, out, err = cli_main("plan", "c8.toml", "--json")
    assert code == 0 and json.loads(out)["load"]["concurrency"] == 64, err
    code, out, err = cli_main("estimate", "a8.toml", "--slo-percentile", "p99", "--json")
    assert code == 0, err
    assert json.loads(out)["capacity_under_slo"]["statistic"] == "p99"


def test_a_plan_document_given_as_the_model_names_the_export(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--json")
    (tmp_path / "pj.json").write_text(out)
    code, _, err = cli_main("estimate", "pj.json")
    assert code == 2 and "export --plan pj.json --to shardlab" in err and err.count("\n") == 1, err


def test_a_load_set_on_a_training_job_file_is_named_as_such(job):
    path, _ = job
    for cmd in ("estimate", "memory"):
        code, _, err = cli_main(cmd, str(path), "--set", "serve.arrival_rate=5")
        assert code == 2 and "is a training job: [serve] arrival_rate" in err and err.count("\n") == 1, err


def test_a_lora_plan_saves_its_recipe_and_gives_its_step_time_back(tmp_path, monkeypatch):
    """QLoRA's rank and base quantization (and an offload) are written to [workload]: estimate of the file gives the
    plan's step time back (it priced full training of the base: 44.6 s against 34.8)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--lora-rank", "16", "--quantize-base", "nf4",
                              "--save", "lora.toml", "--json")
    assert code == 0, err
    text = (tmp_path / "lora.toml").read_text()
    assert "lora_rank = 16" in text and 'quantize_base = "nf4"' in text
    code, est, err = cli_main("estimate", "lora.toml", "--json")
    assert code == 0, err
    assert json.loads(est)["step_time_s"] == pytest.approx(json.loads(out)["plans"][0]["step_time_s"], rel=1e-12)
    code, out, err = cli_main("memory", "lora.toml")
    assert code == 0, err


def test_second_review_of_saved_serving_plans(tmp_path, monkeypatch):
    """A p99 plan's file is judged at the simulated p99, as it was planned; plan FILE of a wide-EP MoE file searches
    again (it refused the --ep and --dp-attention the user never typed); a launch file says it cannot carry the
    load and targets; a disaggregated file written again keeps its precision."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--prompt-len", "1000",
                            "--output-len", "500", "--ttft-slo", "0.2", "--tpot-slo", "0.025", "--slo-percentile", "p99",
                            "--save", "p99.toml")
    assert code == 0, err
    code, out, err = cli_main("estimate", "p99.toml", "--json")
    d = json.loads(out)
    assert code == 0 and d["slo"]["statistic"] == "p99", err
    sim = d["simulation"]
    assert d["slo"]["met"] == (sim["ttft_s"]["p99"] <= 0.2 and sim["tpot_s"]["p99"] <= 0.025)
    code, out, err = cli_main("export", "p99.toml", "--to", "vllm")
    assert code == 0 and "could not express ttft_slo=0.2" in out, err
    code, _, err = cli_main("export", "p99.toml", "--to", "shardlab", "--out", "again.toml")
    assert code == 0, err
    keys = ("weights", "activations", "kv_cache_dtype", "max_num_seqs", "disaggregated")
    pick = lambda t: [x for x in t.splitlines() if x.split(" = ")[0] in keys]  # noqa: E731
    assert pick((tmp_path / "again.toml").read_text()) == pick((tmp_path / "p99.toml").read_text())
    code, _, err = cli_main("plan", "deepseek-v3", "--inference", "--serve", "--gpus", "16", "--gpu", "h200",
                            "--prompt-len", "1000", "--output-len", "1000", "--ttft-slo", "1", "--tpot-slo", "0.05",
                            "--save", "moe.toml")
    assert code == 0 and "dp_attention = 16" in (tmp_path / "moe.toml").read_text(), err
    code, out, err = cli_main("plan", "moe.toml", "--json")
    assert code == 0 and json.loads(out)["capacity"]["layout"]["dp_attention"] > 1, err


@pytest.mark.parametrize("extra, written", [
    (("--lora-rank", "16", "--lora-targets", "q,v"), 'lora_targets = ["q", "v"]'),
    (("--zero", "3", "--offload", "optimizer", "--offload-device", "nvme"), 'offload_device = "nvme"'),
])
def test_the_recipes_adapted_layers_and_offload_device_travel(tmp_path, monkeypatch, extra, written):
    """--lora-targets and --offload-device were dropped: estimate of the file priced all-linear adapters (33.9 s
    against the plan's 32.5) and CPU offload (47.8 s against 51.2)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", *extra, "--save", "r.toml", "--json")
    assert code == 0, err
    assert written in (tmp_path / "r.toml").read_text()
    code, est, err = cli_main("estimate", "r.toml", "--json")
    assert code == 0, err
    assert json.loads(est)["step_time_s"] == pytest.approx(json.loads(out)["plans"][0]["step_time_s"], rel=1e-12)


def test_a_saved_wide_ep_disaggregated_plan_gives_its_figures_back(tmp_path, monkeypatch):
    """The decode pool of GPT-OSS-120B's disaggregated winner runs 8 attention ranks: the file's max_num_seqs is each
    rank's scheduler cap (vLLM's --max-num-seqs), not the replica's capacity, which read back as a per-rank cap had
    sized the activation peak for 8× the sampled rows (52,669 KV blocks for the plan's 54,125, capacity 3,072 for
    3,160). estimate FILE now gives the plan's capacity, TTFT and TPOT back."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("plan", "gpt-oss-120b", "--inference", "--serve", "--gpus", "16", "--gpu", "h100-sxm",
                              "--prompt-len", "4000", "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025",
                              "--save", "d.toml", "--json")
    assert code == 0, err
    doc = json.loads(out)
    text = (tmp_path / "d.toml").read_text()
    assert "disaggregated = " in text, "the winner is disaggregated"
    dec = doc["disaggregated"][0]["decode"]
    assert dec["dp_attention"] > 1
    assert dec["capacity_per_replica"] % dec["dp_attention"] == 0    # every attention rank holds its own sequences
    assert f"max_num_seqs = {dec['capacity_per_replica'] // dec['dp_attention']}\n" in text
    code, out, err = cli_main("export", "d.toml", "--to", "sglang")     # SGLang divides its cap over the ranks
    assert code == 0 and f"--max-running-requests {dec['capacity_per_replica']} " in out, err
    code, out, err = cli_main("estimate", "d.toml", "--json")
    assert code == 0, err
    est = json.loads(out)
    assert est["disaggregated"]["decode"]["capacity_per_replica"] == dec["capacity_per_replica"]
    assert est["steady_state"]["ttft_s"] == pytest.approx(doc["disaggregated"][0]["ttft_s"], rel=1e-9)
    assert est["steady_state"]["tpot_s"] == pytest.approx(doc["disaggregated"][0]["tpot_s"], rel=1e-9)
    assert est["slo"]["met"] is True
    # stages: the schedulers' cap keeps the replica within the capacity priced (751 sequences: 375 per stage)
    code, _, err = cli_main("export", "--to", "shardlab", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8",
                            "--disaggregated", "2:6", "--tp", "1", "--pp", "2", "--prefill-tp", "1", "--prompt-len",
                            "1100", "--output-len", "500", "--out", "pp.toml")
    assert code == 0, err
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--serve", "--disaggregated", "2:6", "--tp",
                              "1", "--pp", "2", "--prefill-tp", "1", "--prompt-len", "1100", "--output-len", "500",
                              "--json")
    flags = json.loads(out)["disaggregated"]["decode"]["capacity_per_replica"]
    code, out, err = cli_main("estimate", "pp.toml", "--json")
    assert code == 0 and flags - 2 < json.loads(out)["disaggregated"]["decode"]["capacity_per_replica"] <= flags, err


def test_a_job_files_recipe_values_are_refused_by_the_files_keys(tmp_path, monkeypatch):
    """A bad recipe value read from a job file is named by its key in the file ([workload] quantize_base in
    l.toml), not by a flag the user never typed; the same value given as a flag still names the flag."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--lora-rank", "16", "--quantize-base", "nf4",
                            "--save", "l.toml")
    assert code == 0, err
    for s, msg in (("workload.quantize_base='int3'", "[workload] quantize_base (--set) must be nf4 or none"),
                   ("workload.offload='gpu'", "[workload] offload (--set) must be one of optimizer"),
                   ("workload.lora_targets=['q','zz']", "[workload] lora_targets (--set): unknown zz"),
                   ("workload.offload_device='nvme'", "[workload] offload_device (--set) says where offloaded"),
                   ("workload.precision='fp7'", "[workload] precision (--set) must be one of")):
        code, _, err = cli_main("estimate", "l.toml", "--set", s)
        assert code == 2 and msg in err and err.count("\n") == 1, (s, err)
        assert "--quantize-base" not in err and "--lora-targets" not in err and "--precision" not in err, (s, err)
    text = (tmp_path / "l.toml").read_text()
    (tmp_path / "bad.toml").write_text(text.replace('quantize_base = "nf4"', 'quantize_base = "int3"'))
    code, _, err = cli_main("estimate", "bad.toml")
    assert code == 2 and "[workload] quantize_base in bad.toml must be nf4 or none, got 'int3'" in err, err
    code, _, err = cli_main("estimate", "l.toml", "--set", "layout.tp=3", "--set", "cluster.gpus=24")   # (--set) too
    assert code == 2 and "[layout] tp (--set) 3 and llama-3.1-8b's 8 KV heads" in err, err
    code, _, err = cli_main("estimate", "llama-3.1-8b", "--offload-device", "nvme")
    assert code == 2 and "--offload-device says where offloaded states go: add --offload" in err, err


def test_plan_of_a_saved_serving_file_asks_its_question_again_and_shows_its_layout(tmp_path, monkeypatch):
    """A --target-rate plan's file carries the rate it was asked for (as its load and as target_rate): plan FILE asks
    for the fewest GPUs again and estimate FILE prices the rate, not the capacity found; a --prefill-gpu plan's file
    searches its prefill pool on that kind again; plan FILE sets the file's own layout beside the best."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--ttft-slo", "1", "--tpot-slo",
                              "0.025", "--target-rate", "100", "--prompt-len", "1000", "--output-len", "500",
                              "--save", "t.toml", "--json")
    assert code == 0, err
    first = json.loads(out)["target"]
    text = (tmp_path / "t.toml").read_text()
    assert "target_rate = 100.0" in text and "arrival_rate = 100.0" in text
    code, out, err = cli_main("plan", "t.toml", "--json")
    again = json.loads(out)
    assert code == 0 and again["target"]["rate"] == 100 and again["target"]["gpus"] == first["gpus"], err
    code, out, err = cli_main("estimate", "t.toml", "--json")
    est = json.loads(out)
    assert code == 0 and est["load"]["arrival_rate"] == pytest.approx(100 / est["replicas"]["count"]), err
    code, _, err = cli_main("estimate", "t.toml", "--set", "serve.target_rate=-1")
    assert code == 2 and "target_rate = -1" in err and err.count("\n") == 1, err

    code, out, err = cli_main("plan", "llama-3.1-70b", "--inference", "--serve", "--gpus", "16", "--gpu", "h100-sxm",
                              "--prefill-gpu", "h200", "--prompt-len", "4000", "--output-len", "500", "--ttft-slo", "1",
                              "--tpot-slo", "0.025", "--save", "pg.toml", "--json")
    assert code == 0 and 'prefill_gpu = "h200"' in (tmp_path / "pg.toml").read_text(), err
    code, out, err = cli_main("plan", "pg.toml", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["disaggregated"][0]["prefill"]["gpu"] == "h200", err
    assert doc["imported_estimate"]["is_best"] is True
    code, _, err = cli_main("plan", "pg.toml", "--prefill-gpu", "h100-sxm")
    assert code == 2 and "conflicts with pg.toml (prefill_gpu = h200)" in err, err

    code, out, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "2", "--gpu", "h100-sxm",
                              "--prompt-len", "1000", "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025",
                              "--save", "a2.toml", "--json")
    assert code == 0 and json.loads(out)["capacity"]["layout"]["tp"] == 1, err
    code, out, err = cli_main("plan", "a2.toml", "--set", "layout.tp=2", "--set", "serve.replicas=1", "--json")
    mine = json.loads(out)["imported_estimate"]
    assert code == 0 and mine["is_best"] is False, err
    assert 0 < mine["goodput_tokens_per_s_per_gpu"] < mine["best_goodput_tokens_per_s_per_gpu"]
    code, out, err = cli_main("plan", "a2.toml", "--set", "layout.tp=2", "--set", "serve.replicas=1")
    assert "your file's layout (1 × TP 2 × PP 1):" in out and "× the best's)" in " ".join(out.split()), out


@pytest.mark.parametrize("engine", ["sglang", "tensorrt-llm-0.17"])
def test_a_saved_serving_plan_keeps_its_engine(tmp_path, monkeypatch, engine):
    """plan --engine E --save writes [framework] name = E (it wrote vllm whatever the engine), so estimate FILE
    prices the plan's winner on the engine it was planned on and gives its TTFT and TPOT back."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--gpu", "h100-sxm",
                              "--engine", engine, "--prompt-len", "1000", "--output-len", "500", "--ttft-slo", "1",
                              "--tpot-slo", "0.025", "--save", "e.toml", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert f'name = "{engine}"' in (tmp_path / "e.toml").read_text()
    win = plan["disaggregated"][0] if plan["comparison"]["winner"] == "disaggregated" else plan["capacity"]
    code, out, err = cli_main("estimate", "e.toml", "--json")
    est = json.loads(out)
    assert code == 0 and est["engine"] == engine, err
    assert est["steady_state"]["ttft_s"] == pytest.approx(win["ttft_s"], rel=1e-6)
    assert est["steady_state"]["tpot_s"] == pytest.approx(win["tpot_s"], rel=1e-6)


def test_plan_from_an_engine_launch_line_searches_the_gpus_it_runs(tmp_path, monkeypatch):
    """A vllm serve line of TP 1 × --data-parallel-size 8 runs 8 GPUs: plan --from it searches 8 (it searched 64)."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_main("export", "llama-3.1-8b", "--inference", "--gpus", "8", "--tp", "1", "--prompt-len", "1000",
                            "--output-len", "500", "--batch", "64", "--to", "vllm", "--out", "v.sh")
    assert code == 0 and "--data-parallel-size 8" in (tmp_path / "v.sh").read_text(), err
    code, out, err = cli_main("plan", "--from", "v.sh", "--json")
    assert code == 0 and json.loads(out)["gpus"] == 8, err
    code, out, err = cli_main("plan", "--from", "v.sh")
    assert "--data-parallel-size 8" in out and "8 replicas" in out


def test_second_review_of_engines_in_files(tmp_path, monkeypatch):
    """A job file written again (export FILE --to shardlab) keeps its engine; a static batch read from an SGLang line
    with data-parallel attention is the instance's total; a total SGLang cannot share over its ranks is refused; an
    unknown [framework] name in a serving file is named as such; speculation with multi-step scheduling is refused."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--engine", "tensorrt-llm", "--gpus", "8",
                            "--gpu", "h100-sxm", "--prompt-len", "1000", "--output-len", "500", "--ttft-slo", "1",
                            "--tpot-slo", "0.05", "--save", "f.toml")
    assert code == 0, err
    code, _, err = cli_main("export", "f.toml", "--to", "shardlab", "--out", "g.toml")
    assert code == 0 and 'name = "tensorrt-llm"' in (tmp_path / "g.toml").read_text(), err
    tpot = [json.loads(cli_main("estimate", f, "--json")[1])["steady_state"]["tpot_s"] for f in ("f.toml", "g.toml")]
    assert tpot[0] == pytest.approx(tpot[1], rel=1e-12)
    (tmp_path / "fb.toml").write_text((tmp_path / "f.toml").read_text().replace('name = "tensorrt-llm"', 'name = "bogus"'))
    code, _, err = cli_main("estimate", "fb.toml")
    assert code == 2 and "fb.toml: [framework] name = 'bogus' is not a serving engine" in err, err
    line = ("python -m sglang.launch_server --model-path openai/gpt-oss-120b --tp-size 8 --dp-size 8 "
            "--enable-dp-attention --ep-size 8 --context-length 8500 --max-running-requests {}\n")
    (tmp_path / "s.sh").write_text(line.format(1000))
    code, out, err = cli_main("estimate", "--from", "s.sh", "--json")
    assert code == 0 and json.loads(out)["batch"] == 1000, err
    (tmp_path / "s7.sh").write_text(line.format(7))
    code, _, err = cli_main("estimate", "--from", "s7.sh")
    assert code == 2 and "--max-running-requests 7 over --dp-size 8 leaves each attention rank none" in err, err
    code, _, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--engine", "vllm-0.6", "--serve",
                            "--concurrency", "8", "--speculative-tokens", "4", "--draft", "eagle", "--scheduler-steps", "10")
    assert code == 2 and "--speculative-tokens with --scheduler-steps above 1 is not modelled" in err, err
