"""The HTML report in a real browser: Debian's Chromium driven by Playwright (.ci/run installs it). Each page loads
with no console error, shows every section, the rank map has the right labels and shows a rank's memory on hover,
the Mermaid diagram renders to SVG, and a screenshot is saved (SHARDLAB_SCREENSHOTS=DIR keeps them).
Also renders the `.md` file `shardlab shard --mermaid` writes with the real mermaid package."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import cli_main
from shardlab.layout import Layout
from shardlab.rank_grid import rank_coords

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason="Chromium is not installed (apt-get install chromium; .ci/run does)")


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = os.environ.get("SHARDLAB_SCREENSHOTS")
    out = Path(d) if d else tmp_path_factory.mktemp("shots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def open_page(browser, path: Path):
    """(page, console errors): load the file, wait for Mermaid when the page has a diagram."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    if page.locator("pre.mermaid").count():
        page.wait_for_function("document.documentElement.dataset.mermaid", timeout=30_000)
        assert page.evaluate("document.documentElement.dataset.mermaid") == "rendered", errors
        assert page.locator("pre.mermaid svg").count() == page.locator("pre.mermaid").count()
    return page, errors


def check_sections(page, ids):
    for sid in ids:
        sec = page.locator(f"section#{sid}")
        assert sec.count() == 1 and sec.is_visible(), sid


def plan_doc_and_page(tmp_path, *argv):
    out = tmp_path / "plan.html"
    code, stdout, err = cli_main(*argv, "--json", "--html", str(out))
    assert code == 0, err
    return json.loads(stdout), out


def test_main_job_plan_page(browser, shots, tmp_path):
    doc, out = plan_doc_and_page(tmp_path, "plan")
    page, errors = open_page(browser, out)
    check_sections(page, ("inputs", "worksheet", "rank-map", "memory", "step", "pipeline", "plans", "diagram"))
    cells = page.locator("[data-rank]")
    assert cells.count() == 64
    lay = Layout(**{k: v for k, v in doc["plans"][0]["layout"].items() if k != "microbatches"})
    for r in range(64):
        c = rank_coords(r, lay)
        want = [f"r{r}", f"PP{c['pp']}", f"TP{c['tp']}", f"DP{c['dp']}"] + ([f"CP{c['cp']}"] if lay.cp > 1 else [])
        assert cells.nth(r).inner_text().split() == want
    cells.nth(13).hover()
    panel = page.locator("#rank-panel").inner_text()
    total = doc["detail"]["memory"]["stages"][0]["total"]
    assert "rank 13" in panel and f"{total / 2**30:,.2f} GiB" in panel and "TP group" in panel
    page.locator("input[value=tp]").check()                              # colour by TP rank: the two TP ranks differ
    assert cells.nth(0).evaluate("e => getComputedStyle(e).backgroundColor") != \
        cells.nth(1).evaluate("e => getComputedStyle(e).backgroundColor")
    page.screenshot(path=str(shots / "plan-main-job.png"), full_page=True)
    assert errors == []


def test_3d_405b_plan_page(browser, shots, tmp_path):
    doc, out = plan_doc_and_page(tmp_path, "plan", "llama-3.1-405b", "--gpus", "1024", "--seq-len", "8192",
                                 "--global-batch", "2048", "--tokens", "15e12", "--fix", "tp=8", "--fix", "pp=16",
                                 "--fix", "cp=1")
    lay = doc["plans"][0]["layout"]
    assert lay["pp"] > 1 and lay["tp"] > 1 and lay["dp"] > 1                # a 3-D layout
    page, errors = open_page(browser, out)
    check_sections(page, ("worksheet", "rank-map", "memory", "pipeline", "plans", "diagram"))
    assert page.locator("[data-rank]").count() == 1024
    assert page.locator("#pipeline svg rect").count() > lay["pp"]
    r = 1000
    page.locator(f'[data-rank="{r}"]').hover()
    c = rank_coords(r, Layout(**{k: v for k, v in lay.items() if k != "microbatches"}))
    panel = page.locator("#rank-panel").inner_text()
    stage = next(s for s in doc["detail"]["memory"]["stages"] if s["stage"] == c["pp"])
    assert f"rank {r}" in panel and f"pipeline stage {c['pp']}" in panel and f"{stage['total'] / 2**30:,.2f} GiB" in panel
    page.screenshot(path=str(shots / "plan-405b.png"), full_page=True)
    assert errors == []


def test_inference_estimate_page(browser, shots, tmp_path):
    out = tmp_path / "serve.html"
    code, _, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--tp", "2", "--batch", "16", "--html", str(out))
    assert code == 0, err
    page, errors = open_page(browser, out)
    check_sections(page, ("memory", "latency", "tp-vs-replicas"))
    page.screenshot(path=str(shots / "estimate-inference.png"), full_page=True)
    assert errors == []


@pytest.mark.parametrize("command, sections", [
    (["estimate", "llama-3.1-8b", "--inference", "--serve", "--tp", "2", "--arrival-rate", "5", "--ttft-slo", "0.05"],
     ("steady-state", "simulation", "kv-cache", "limits")),
    (["plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--concurrency", "8"], ("plans", "simulation")),
])
def test_serving_under_load_pages(browser, shots, tmp_path, command, sections):
    out = tmp_path / "load.html"
    code, _, err = cli_main(*command, "--html", str(out))
    assert code == 0, err
    page, errors = open_page(browser, out)
    check_sections(page, sections)
    assert page.locator("svg rect").count() >= 4
    page.screenshot(path=str(shots / f"serve-{command[0]}.png"), full_page=True)
    assert errors == []


@pytest.mark.slow
def test_run_train_fsdp_tp_page(browser, shots, tmp_path):
    """The real thing: 4 ranks of FSDP + TP with torchrun, then its page."""
    pytest.importorskip("torch")
    out = tmp_path / "run.html"
    code, _, err = cli_main("run", "train", "--strategy", "fsdp+tp", "--nproc-per-node", "4", "--steps", "2", "--timeout", "240",
                            "--html", str(out))
    assert code == 0, err
    page, errors = open_page(browser, out)
    check_sections(page, ("step-times", "collectives", "memory"))
    assert page.locator("#step-times svg rect").count() >= 4
    page.screenshot(path=str(shots / "run-train.png"), full_page=True)
    assert errors == []


@pytest.mark.parametrize("model, tp, sp", [("llama-3.1-8b", 4, False), ("llama-3.1-8b", 2, True),
                                           ("mixtral-8x7b", 2, False), ("gpt2", 1, False)])
def test_shard_mermaid_markdown_renders_with_real_mermaid(browser, shots, tmp_path, model, tp, sp):
    from shardlab.report.html.mermaid_js import mermaid_block, mermaid_script

    md = tmp_path / "block.md"
    code, _, err = cli_main("shard", model, "--tp", str(tp), *(["--sequence-parallel"] if sp else []), "--mermaid", str(md))
    assert code == 0, err
    blocks = re.findall(r"```mermaid\n(.*?)```", md.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1
    page_file = tmp_path / "md.html"
    page_file.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{mermaid_block(blocks[0])}"
                         f"{mermaid_script()}</body></html>", encoding="utf-8")
    page, errors = open_page(browser, page_file)
    assert page.locator("pre.mermaid svg g.node").count() > 5
    # the f operators (collectives between ranks) are drawn above the per-rank boxes, not over their top edge
    boxes = page.evaluate("""() => {
        const r = e => { const b = e.getBoundingClientRect(); return [b.top, b.bottom]; };
        return {clusters: [...document.querySelectorAll('pre.mermaid svg g.cluster rect')].map(r),
                f: [...document.querySelectorAll('pre.mermaid svg g.node')].filter(n => /_f-/.test(n.id)).map(r)};
    }""")
    assert len(boxes["clusters"]) == 2 and len(boxes["f"]) == 2
    for (f_top, f_bottom), (c_top, _) in zip(sorted(boxes["f"]), sorted(boxes["clusters"])):
        assert f_bottom <= c_top + 1, (f_bottom, c_top)
    page.screenshot(path=str(shots / f"mermaid-{model}-tp{tp}{'-sp' if sp else ''}.png"), full_page=True)
    assert errors == []


@pytest.mark.parametrize("argv", [
    ("plan",),
    ("memory", "llama-3.1-70b", "--gpus", "8", "--zero", "3"),
    ("estimate", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1"),
    ("estimate", "llama-3.1-70b", "--inference", "--serve", "--tp", "4", "--arrival-rate", "4"),
])
def test_every_page_opens_with_its_answer(browser, tmp_path, argv):
    """At 1400 × 900 the answer's figures (the winner or the estimate, its memory headroom) are on the first screen."""
    out = tmp_path / "page.html"
    code, _, err = cli_main(*argv, "--html", str(out))
    assert code == 0, err
    page, errors = open_page(browser, out)
    box = page.locator("section#answer").bounding_box()
    assert box is not None and box["y"] + box["height"] <= 900, box
    assert page.locator("section#answer .card").count() >= 3 and errors == []
