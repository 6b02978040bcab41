"""The HTML report without a browser: one self-contained file built from the --json document, every section,
one cell per GPU, no network fetches, new document keys shown; bad --html paths are one-line errors."""

import html
import json
import re
from html.parser import HTMLParser

import pytest

from conftest import DATA, cli_main, run_cli
from shardlab.layout import Layout
from shardlab.rank_grid import rank_coords
from shardlab.report.html import render_report
from shardlab.report.html.mermaid_js import MERMAID_VERSION, mermaid_info

PLAN_SECTIONS = ("inputs", "worksheet", "rank-map", "memory", "step", "pipeline", "plans", "diagram", "document")


class Scan(HTMLParser):
    """Collects ids, data-rank cells, external references and the embedded document."""

    def __init__(self):
        super().__init__()
        self.ids, self.cells, self.external, self.scripts, self._script = [], [], [], {}, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        if "data-rank" in a:
            self.cells.append(a)
        for k in ("src", "href"):
            if k in a and re.match(r"(https?:)?//", a[k] or ""):
                self.external.append(a[k])
        self._script = a.get("id") if tag == "script" else None

    def handle_data(self, data):
        if self._script:
            self.scripts[self._script] = self.scripts.get(self._script, "") + data


def scan(text: str) -> Scan:
    s = Scan()
    s.feed(text)
    return s


@pytest.fixture(scope="module")
def plan_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "plan.html"
    code, stdout, err = cli_main("plan", "--json", "--html", str(out))
    assert code == 0, err
    return json.loads(stdout), out.read_text(encoding="utf-8"), err


def test_plan_page_has_every_section_and_one_cell_per_gpu(plan_page):
    doc, text, err = plan_page
    s = scan(text)
    assert all(sec in s.ids for sec in PLAN_SECTIONS), set(PLAN_SECTIONS) - set(s.ids)
    assert len(s.cells) == doc["gpus"] == 64
    lay = Layout(**{k: v for k, v in doc["plans"][0]["layout"].items() if k != "microbatches"})
    for cell in s.cells:
        c = rank_coords(int(cell["data-rank"]), lay)
        assert (int(cell["data-stage"]), int(cell["data-tp"]), int(cell["data-dp"])) == (c["pp"], c["tp"], c["dp"])
    assert "wrote" in err and "plan.html" in err                        # stdout stays one JSON document


def test_page_is_offline_and_built_from_the_json_document(plan_page):
    doc, text, _ = plan_page
    s = scan(text)
    assert s.external == []                                             # nothing fetched: no src/href to the network
    assert json.loads(s.scripts["shardlab-doc"]) == doc                 # the page embeds exactly what --json printed
    info = mermaid_info()
    assert info["version"] == MERMAID_VERSION and len(s.scripts["mermaid-lib"].strip()) == info["inlined_bytes"]
    assert len(text) < 2_000_000                                        # mermaid (1.3 MB inlined) + the page
    # the worksheet's risks and the Mermaid source are readable without JavaScript
    assert html.escape(doc["worksheet"][0]["risk"]) in text
    assert html.escape(doc["detail"]["tp_diagram"].splitlines()[1]) in text


def test_new_breakdown_keys_and_unknown_document_keys_appear():
    doc, _ = json.loads(cli_main("plan", "--json")[1]), None
    doc["plans"][0]["breakdown"]["fp8_cast_s"] = 0.5                     # a key the page does not know yet
    doc["framework"] = {"id": "megatron-core", "overlap": "tp-comm-overlap"}
    text = render_report("plan", doc, "shardlab plan")
    assert "fp8 cast" in text and "megatron-core" in text and "tp-comm-overlap" in text


def test_run_page_shows_ranks_collectives_memory_and_extra_summaries():
    doc = json.loads((DATA / "run_train_fsdp_tp.json").read_text())
    doc["step_time_summary"] = {"p50_s": 0.55, "p99_s": 0.58, "straggler_rank": 2}   # per-rank aggregates, when present
    s = scan(render_report("run-train", doc, "shardlab run train --strategy fsdp+tp --nproc-per-node 4"))
    assert {"step-times", "collectives", "memory", "more"} <= set(s.ids)
    text = render_report("run-train", doc, "x")
    assert "straggler_rank" in text and "all_reduce backward" in text and "rank 3 measured" in text


def test_run_page_sets_the_expert_dispatch_beside_comm_plan():
    doc = json.loads((DATA / "run_train_fsdp_tp.json").read_text())
    doc["layout"]["ep"] = 2
    doc["expert_dispatch"] = [
        {"collective": "all_to_all/forward", "measured_calls": 8, "predicted_calls": 8, "measured_bytes_per_call": 131072.0,
         "predicted_bytes_per_call": 131072.0, "match": True},
        {"collective": "all_gather/forward", "measured_calls": 4, "predicted_calls": 3, "measured_bytes_per_call": 64.0,
         "predicted_bytes_per_call": 64.0, "match": False}]
    text = render_report("run-train", doc, "x")
    assert "expert-dispatch" in scan(text).ids and "(ep 2)" in text
    assert "<td>all-to-all forward</td><td>8 / 8</td><td>128.00 KiB / 128.00 KiB</td><td>yes</td>" in text
    assert "<td>4 / 3</td>" in text and "<td>NO</td>" in text


def test_run_page_splits_each_rank_into_compute_collectives_and_waiting():
    """With per-rank time splits the step-time chart stacks compute + in collectives + waiting (the bars of a rank
    held up by a slow one are mostly waiting); without them it draws whole steps."""
    doc = json.loads((DATA / "run_train_fsdp_tp.json").read_text())
    whole = render_report("run-train", doc, "x")
    for r in doc["ranks"]:
        slow = r["rank"] == 1
        r["time_split"] = {"compute_s": 0.120 if slow else 0.040, "collectives_s": 0.005, "wait_s": 0.0 if slow else 0.085,
                           "step_s": 0.125, "steps": 3}
    text = render_report("run-train", doc, "x")
    assert "waiting for other ranks" in text and "waiting for other ranks" not in whole
    assert "rank 0: waiting for other ranks 85.00 ms" in text and "rank 1: compute 120.00 ms" in text


@pytest.mark.parametrize("argv, kind", [
    (("estimate", "llama-3.1-8b", "--inference", "--tp", "2", "--batch", "16"), "latency"),
    (("memory", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1"), "memory"),
    (("report", "{out}", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1"), "pipeline"),
])
def test_other_pages(tmp_path, argv, kind):
    out = tmp_path / "p.html"
    args = [a.replace("{out}", str(out)) for a in argv] + ([] if argv[0] == "report" else ["--html", str(out)])
    code, _, err = cli_main(*args)
    assert code == 0, err
    s = scan(out.read_text(encoding="utf-8"))
    assert kind in s.ids and s.external == []


def test_bench_page_from_a_measurement():
    doc = json.loads((DATA / "bench_collectives_cpu.json").read_text())
    text = render_report("bench-collectives", doc, "shardlab bench collectives --nproc-per-node 2")
    assert "<polyline" in text and "busbw" in text and len(text) < 200_000   # no Mermaid on pages without a diagram


@pytest.mark.parametrize("path, why", [("plan.txt", "ending in .html"), ("no/such/dir/p.html", "does not exist")])
def test_bad_html_path_is_one_line_exit_2(path, why):
    r = run_cli("plan", "--html", path)
    assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1


def test_calibrate_page_from_saved_measurements(tmp_path):
    out = tmp_path / "cal.html"
    code, _, err = cli_main("calibrate", "--out", str(tmp_path / "p.yaml"), "--from-matmul", str(DATA / "bench_matmul_cpu.json"),
                            "--from-collectives", str(DATA / "bench_collectives_cpu.json"), "--html", str(out))
    assert code == 0, err
    page = out.read_text(encoding="utf-8")
    s = scan(page)
    assert {"profile", "matmul", "busbw", "fits"} <= set(s.ids) and s.external == []
    # a CPU's tens of GFLOP/s are shown as GFLOP/s (not 0.0xx TF/s), the fit in the notation calibrate prints
    assert "Matmul: achieved GFLOP/s" in page and "TF/s" not in page and "·n/(n+" in page and "n = min(M, N, K)" in page


def test_rates_are_rates_and_step_parts_keep_their_colour(tmp_path):
    """tokens_per_s is a rate (not minutes); a part of the step has one colour in the waterfall and the plans chart."""
    from shardlab.report.html.layout_sections import STEP_COLORS
    from shardlab.report.html.page import fmt_key

    assert fmt_key("tokens_per_s", 2213.2) == "2,213/s" and fmt_key("decode_s_per_token", 0.0061) == "6.10 ms/token"
    assert fmt_key("step_time_s", 90.0) == "90.00 s"
    out = tmp_path / "plan.html"
    code, _, err = cli_main("plan", "--html", str(out))
    assert code == 0, err
    page = out.read_text()
    tp = STEP_COLORS["tp_comm_s"]
    assert page.count(f'fill="{tp}"') >= 2 and "table.kv>thead" in page


def test_an_overloaded_serving_page_says_so(tmp_path):
    out = tmp_path / "serve.html"
    code, _, err = cli_main("estimate", "mixtral-8x7b", "--inference", "--serve", "--tp", "2", "--arrival-rate", "100",
                            "--html", str(out))
    assert code == 0, err
    page = out.read_text()
    assert "Overloaded: arrivals exceed" in page and page.count(">unbounded<") == 3
    assert "no targets given" in page


def test_pipeline_picture_subtitle_uses_the_simulated_pass_times(tmp_path):
    pytest.importorskip("matplotlib")
    from shardlab.pipeline import simulate
    from shardlab.pipeline.render import save_timeline

    res = simulate("zb-h1", 4, 8, forward_s=1.0, backward_s=2.0, weight_grad_s=None)   # as `shardlab pipeline` runs it
    captured = {}
    import shardlab.render.plots as plots

    real = plots.pipeline_timeline
    plots.pipeline_timeline = lambda r, path, **kw: captured.update(kw) or path
    try:
        save_timeline(res, str(tmp_path / "zb.png"), {"forward_s": 1.0, "backward_s": 2.0, "weight_grad_s": None})
    finally:
        plots.pipeline_timeline = real
    assert captured["subtitle"].startswith("per stage: F = 1 s, B = 1 s, W = 1 s"), captured["subtitle"]   # B split in two


def test_pipeline_picture_labels_two_digit_micro_batches_and_hatches_each_chunk(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes
    from matplotlib.collections import PolyCollection

    from shardlab.pipeline import simulate
    from shardlab.render.plots import CHUNK_HATCHES, pipeline_timeline

    texts, hatches = [], set()
    real_text, real_add = Axes.text, Axes.add_collection
    monkeypatch.setattr(Axes, "text", lambda ax, x, y, s, **kw: texts.append(s) or real_text(ax, x, y, s, **kw))
    monkeypatch.setattr(Axes, "add_collection", lambda ax, c, **kw: (hatches.add(c.get_hatch()) if isinstance(c, PolyCollection)
                                                                     else None) or real_add(ax, c, **kw))
    pipeline_timeline(simulate("1f1b", 8, 32, forward_s=1.0, backward_s=2.0), str(tmp_path / "a.png"))
    assert {"10", "31"} <= set(texts)          # backward boxes (2 s of a 117 s step on a 14-inch figure) hold two digits
    hatches.clear()
    pipeline_timeline(simulate("interleaved", 4, 8, vpp=4, forward_s=1.0, backward_s=2.0), str(tmp_path / "b.png"))
    assert hatches == {None, *CHUNK_HATCHES[1:4]}   # four chunks, four distinct fills (chunk 0 plain)


def test_rank_map_colours_by_ep_rank_and_serving_plan_names_its_targets(tmp_path):
    out = tmp_path / "mix.html"
    code, _, err = cli_main("plan", "mixtral-8x7b", "--gpus", "32", "--gpu", "a100-80gb", "--fix", "ep=8", "--html", str(out))
    assert code == 0, err
    page = out.read_text()
    assert "value='ep'" in page and "data-by='ep'" in page and " EP7" in page and ".by-ep .e7" in page
    out = tmp_path / "serve.html"
    code, _, err = cli_main("plan", "llama-3.1-70b", "--inference", "--serve", "--concurrency", "64", "--ttft-slo", "0.5",
                            "--gpus", "8", "--html", str(out))
    assert code == 0, err
    page = out.read_text()
    code, doc, err = cli_main("plan", "llama-3.1-70b", "--inference", "--serve", "--concurrency", "64", "--ttft-slo", "0.5",
                              "--gpus", "8", "--json")
    best = json.loads(doc)["plans"][0]
    names = f"{best['replicas']} replica{'s' if best['replicas'] > 1 else ''}: {best['output_tokens_per_s']:,.0f} tok/s"
    assert "TTFT ≤ 500.00 ms" in page and "sequences a replica holds" in page and names in page


def test_estimate_page_names_the_pipeline_engine_term_only_with_stages(tmp_path):
    """DeepSpeed's per-pass pipeline host time is listed beside its per-block host time when the layout has stages."""
    base = ("estimate", "gpt3-175b", "--gpus", "64", "--framework", "deepspeed", "--tp", "8", "--zero", "1")
    for pp, shown in (("8", True), ("1", False)):
        out = tmp_path / f"pp{pp}.html"
        code, _, err = cli_main(*base, "--pp", pp, "--html", str(out))
        assert code == 0, err
        assert ("per micro-batch, pass and stage of its pipeline engine" in out.read_text(encoding="utf-8")) is shown


def test_pages_carry_the_warnings_and_refusals_the_terminal_prints():
    doc = json.loads((DATA / "run_train_fsdp_tp.json").read_text())
    doc["launch"]["warnings"] = ["4 ranks on 2 CPU core(s): the ranks take turns on the cores"]
    assert "<p class='bad'>warning: 4 ranks on 2 CPU core(s)" in render_report("run-train", doc, "x")
    from conftest import cli_main

    code, out, err = cli_main("estimate", "llama-3.1-405b", "--inference", "--tp", "2", "--batch", "4", "--json")
    text = render_report("estimate", json.loads(out), "x")
    assert code == 0 and "DOES NOT FIT" in text and "usable" in text
    code, out, err = cli_main("estimate", "llama-3.1-405b", "--gpus", "8", "--tp", "8", "--json")
    assert code == 0 and "<p class='bad'>DOES NOT FIT" in render_report("estimate", json.loads(out), "x")


def test_bench_page_draws_the_fit_and_binary_size_ticks():
    doc = json.loads((DATA / "bench_collectives_cpu.json").read_text())
    text = render_report("bench-collectives", doc, "x")
    assert "send-recv (α–β fit)" in text and ">32 KiB<" in text and ">10.00 KB<" not in text
