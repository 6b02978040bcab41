"""Cost before launch: the pure arithmetic, the price catalog (built-in and user files), `shardlab cost`."""

import json

import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.cost import cost_estimate, fmt_usd, price_table, resolve_price, sentence
from shardlab.errors import ShardlabError


# -- the arithmetic ---------------------------------------------------------------------------------

def test_cost_estimate_matches_the_worked_sentence():
    est = cost_estimate(2, 2.5, 0.35, setup_hours=0.5, budget_usd=3.0)
    assert est.usd_per_hour == pytest.approx(0.70)
    assert est.hours == pytest.approx(3.0)
    assert est.usd == pytest.approx(2.10)
    assert est.spare_usd == pytest.approx(0.90)
    assert sentence(est, "RTX 4090") == ("2 × RTX 4090 at $0.35/h each = $0.70/h; about 3.0 h including set-up = $2.10. "
                                         "Budget $3.00: $0.90 to spare.")


def test_cost_over_budget_and_estimated_price_are_said():
    est = cost_estimate(8, 100, 3.5, budget_usd=2000)
    assert est.usd == pytest.approx(2800) and est.spare_usd == pytest.approx(-800)
    s = sentence(est, "H100", price_is_estimate=True)
    assert "$800.00 OVER" in s and "about 100 h (4.2 days) = $2,800.00" in s and "estimate" in s
    assert "each" not in sentence(cost_estimate(1, 1, 2.0), "H100")


@pytest.mark.parametrize("args", [(0, 1, 1), (2, 0, 1), (2, 1, -0.5), (2, 1, 1, -1), (2, 1, 1, 0, -5), (2, float("nan"), 1)])
def test_cost_estimate_rejects_bad_numbers(args):
    with pytest.raises(ShardlabError):
        cost_estimate(*args)


def test_fmt_usd():
    assert [fmt_usd(x) for x in (0, 2.1, 1234.5, -0.1, 0.0019, 1e-7)] == \
        ["$0.00", "$2.10", "$1,234.50", "-$0.10", "$0.0019", "<$0.0001"]


# -- the price catalog ------------------------------------------------------------------------------

def test_builtin_prices_are_sourced_dated_and_defaults_flagged():
    cat = get_catalog()
    table = price_table(cat)
    assert len(table) > 40
    for (acc, provider), e in table.items():
        assert acc in cat.accelerators
        assert e.source and e.date and e.on_demand_usd_per_gpu_hour > 0
        if provider.startswith("default"):
            assert e.estimate, f"{acc}/{provider}: the defaults are inferred midpoints"
    for acc in ("h100-sxm", "a100-80gb", "a100-40gb", "h200", "b200", "l4", "l40s", "rtx-4090"):
        assert (acc, "default") in table
    assert table[("h100-sxm", "aws")].on_demand_usd_per_gpu_hour == 6.88
    assert table[("h100-sxm", "gcp")].spot_usd_per_gpu_hour == 6.57
    assert not table[("h100-sxm", "aws")].estimate


def test_l4_default_is_not_below_the_full_vm_rates_it_summarises():
    table = price_table(get_catalog())
    vms = [table[("l4", p)].on_demand_usd_per_gpu_hour for p in ("aws", "gcp")]
    assert min(vms) <= table[("l4", "default")].on_demand_usd_per_gpu_hour <= max(vms)


def test_providers_or_gpus_that_differ_only_by_case_are_refused(tmp_path):
    from conftest import cli_main

    entry = '      on_demand: 2.0\n      date: "2026-01-01"\n      source: q\n'
    f = tmp_path / "p.yaml"
    f.write_text("prices:\n  h100-sxm:\n    X:\n" + entry + "    x:\n" + entry)
    code, _, err = cli_main("cost", "--gpus", "1", "--gpu", "h100-sxm", "--hours", "1", "--catalog", str(f))
    assert code == 2 and "provider 'x' twice" in err, err


NEOCLOUDS = ("lambda", "runpod", "runpod-community", "runpod-secure", "nebius", "coreweave", "vast")


@pytest.mark.parametrize("acc", ["h100-sxm", "a100-80gb", "a100-40gb", "h200", "b200", "l40s"])
def test_default_price_is_the_median_neocloud_quote_rounded_up(acc):
    """prices.yaml's rule for `default`: the median of the neocloud quotes listed, rounded up to 5 cents."""
    import math
    import statistics

    table = price_table(get_catalog())
    quotes = [e.on_demand_usd_per_gpu_hour for (a, prov), e in table.items() if a == acc and prov in NEOCLOUDS]
    median = statistics.median(quotes)
    assert table[(acc, "default")].on_demand_usd_per_gpu_hour == pytest.approx(math.ceil(round(median * 20, 6)) / 20)


def test_resolve_price_default_provider_spot_and_given():
    cat = get_catalog()
    p = resolve_price(cat, "h100-sxm")
    assert (p.usd_per_gpu_hour, p.provider, p.kind, p.estimate) == (3.95, "default", "on-demand", True)
    assert "inferred" in p.source and "prices.yaml" in p.source
    p = resolve_price(cat, "H100-SXM", provider="gcp", spot=True)
    assert (p.usd_per_gpu_hour, p.kind) == (6.57, "spot") and "2026-09-26" in p.source
    p = resolve_price(cat, None, given_usd_per_gpu_hour=0.35)
    assert (p.usd_per_gpu_hour, p.kind, p.source) == (0.35, "given", "given with --price")


@pytest.mark.parametrize("gpu, kw, fragment", [
    ("v100", {}, "no price for 'v100'"),
    ("h100", {}, "did you mean"),
    ("l4", {"provider": "awz"}, "did you mean aws"),
    ("h100-sxm", {"spot": True, "provider": "lambda"}, "spot price for h100-sxm: gcp"),
    ("h100-sxm", {"given_usd_per_gpu_hour": -1.0}, "positive"),
    (None, {}, "cluster.gpu"),          # the library names the field (the command line says --gpu)
])
def test_resolve_price_errors_name_the_fix(gpu, kw, fragment):
    with pytest.raises(ShardlabError, match=None) as e:
        resolve_price(get_catalog(), gpu, **kw)
    assert fragment in str(e.value)


def _user_prices(tmp_path, body: str):
    f = tmp_path / "prices.yaml"
    f.write_text(body)
    return get_catalog([str(f)]), f


def test_user_price_file_overrides_and_adds(tmp_path):
    cat, f = _user_prices(tmp_path, """
prices:
  rtx-4090:
    default: {on_demand: 0.35, date: 2026-01-05, source: my quote}
  v100:
    mycloud: {on_demand: 0.5, spot: 0.2, date: "2026-02", source: invoice 17}
""")
    p = resolve_price(cat, "rtx-4090")
    assert p.usd_per_gpu_hour == 0.35 and not p.estimate and str(f) in p.source and "2026-01-05" in p.source
    p = resolve_price(cat, "v100", spot=True)          # the only provider is chosen without --provider
    assert (p.usd_per_gpu_hour, p.provider) == (0.2, "mycloud")
    assert resolve_price(cat, "rtx-4090", provider="openrelay").usd_per_gpu_hour == 0.29   # built-ins kept


@pytest.mark.parametrize("body, fragment", [
    ("prices: {rtx-4090: {default: {on_demnd: 1, date: x, source: y}}}", "unknown field(s) ['on_demnd']"),
    ("prices: {rtx-4090: {default: {on_demand: -1, date: x, source: y}}}", "must be a number of USD per GPU-hour"),
    ("prices: {rtx-4090: {default: {on_demand: 1, date: x}}}", "missing ['source']"),
    ("prices: {rtx-4099: {default: {on_demand: 1, date: x, source: y}}}", "did you mean rtx-4090"),
    ("prices: {rtx-4090: {default: 1.0}}", "must be a mapping"),
])
def test_user_price_file_strict_errors(tmp_path, body, fragment):
    cat, _ = _user_prices(tmp_path, body)
    with pytest.raises(ShardlabError) as e:
        resolve_price(cat, "rtx-4090")
    assert fragment in str(e.value)


# -- shardlab cost ----------------------------------------------------------------------------------

def test_cost_cli_json_contract_and_sentence():
    code, out, err = cli_main("cost", "--gpus", "2", "--gpu", "rtx-4090", "--price", "0.35", "--hours", "2.5",
                              "--setup-hours", "0.5", "--budget", "3", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["usd"] == pytest.approx(2.10) and d["usd_per_hour"] == pytest.approx(0.70)
    assert d["hours"] == pytest.approx(3.0) and d["gpus"] == 2 and d["price_per_gpu_hour"] == 0.35
    assert d["price_source"] == "given with --price" and d["spare_usd"] == pytest.approx(0.90)
    assert d["sentence"] == ("2 × RTX 4090 at $0.35/h each = $0.70/h; about 3.0 h including set-up = $2.10. "
                             "Budget $3.00: $0.90 to spare.")
    assert {a["provider"] for a in d["alternatives"]} >= {"default", "openrelay"}


def test_cost_cli_human_output_from_catalog():
    code, out, _ = cli_main("cost", "--gpus", "8", "--gpu", "h100-sxm", "--hours", "10", "--provider", "aws")
    assert code == 0
    assert out.startswith("8 × H100 SXM5 80GB at $6.88/h each = $55.04/h; about 10.0 h = $550.40.")
    assert "datareceipts" in out and "2026-11-09" in out and "azure" in out


@pytest.mark.parametrize("args, fragment", [
    (["--gpus", "2", "--gpu", "rtx-4090", "--price", "-1", "--hours", "1"], "--price: must be a positive number"),
    (["--gpus", "2", "--gpu", "rtx-4099", "--hours", "1"], "unknown GPU 'rtx-4099' (did you mean rtx-4090"),
    (["--gpus", "2", "--gpu", "v100", "--hours", "1"], "no price for 'v100'"),
    (["--gpus", "2", "--gpu", "a100-pcie-80gb", "--hours", "1", "--spot"], "no spot price"),
    (["--gpus", "2"], "nothing to cost"),
    (["--gpus", "2", "--hours", "1", "--tokens", "1e9", "--price", "1"], "--tokens needs MODEL"),
    (["--gpus", "2", "--hours", "-3", "--price", "1"], "--hours: must be a positive number"),
])
def test_cost_cli_bad_input_one_line_exit_2(args, fragment):
    code, out, err = cli_main("cost", *args)
    assert code == 2 and out == ""
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_cost_cli_given_price_with_unlisted_gpu_is_a_label():
    code, out, err = cli_main("cost", "--gpus", "4", "--gpu", "my-asic", "--price", "1.25", "--hours", "2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["usd"] == pytest.approx(10.0) and d["gpu"] == "my-asic" and d["alternatives"] == []
    assert "4 × my-asic at $1.25/h each" in d["sentence"]


def test_cost_cli_plan_path_uses_the_estimate_contract(monkeypatch):
    """The plan-based path against a stand-in for `training_estimate_from_args` (the real one is tested
    end to end with `shardlab estimate`): hours = train_time_s / 3600; GPUs and accelerator from the plan."""
    import types

    from shardlab.catalog import get_catalog as real_catalog

    seen = {}

    class Est:
        def __init__(self, args, cat):
            seen.update(gpu=args.gpu, model=args.model, tokens=args.tokens)
            self.train_time_s = None if args.tokens is None else 7200.0
            self.gpus, self.accelerator = 8, cat.accelerator(args.gpu)

        def to_dict(self):
            return {"train_time_s": self.train_time_s, "gpus": self.gpus}

    stub = types.ModuleType("shardlab.cli.plan_cmds")
    stub.register = lambda sub: None
    stub.training_estimate_from_args = Est
    monkeypatch.setitem(__import__("sys").modules, "shardlab.cli.plan_cmds", stub)
    code, out, err = cli_main("cost", "llama-2-7b", "--gpus", "8", "--tokens", "1e9", "--setup-hours", "0.5", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert seen == {"gpu": "h100-sxm", "model": "llama-2-7b", "tokens": "1e9"}
    assert d["hours_from"] == "plan" and d["run_hours"] == pytest.approx(2.0) and d["hours"] == pytest.approx(2.5)
    assert d["usd"] == pytest.approx(8 * 3.95 * 2.5) and d["plan"] == {"train_time_s": 7200.0, "gpus": 8}
    assert "including set-up" in d["sentence"] and real_catalog().accelerator(d["gpu"]).id == "h100-sxm"
    code, _, err = cli_main("cost", "llama-2-7b", "--gpus", "8")
    assert code == 2 and "add --tokens" in err
    code, _, err = cli_main("cost", "llama-2-7b", "--gpus", "8", "--tokens", "1e9", "--hours", "3")
    assert code == 2 and "not both" in err


def test_a_budget_met_exactly_is_not_over_and_tiny_prices_keep_their_digits():
    from shardlab.cost.estimate import cost_estimate, fmt_rate, sentence

    est = cost_estimate(1, 3.0, 0.1, budget_usd=0.3)           # 0.1 × 3 = 0.30000000000000004 in binary
    assert est.spare_usd == 0.0 and "OVER" not in sentence(est, "GPU")
    assert [fmt_rate(x) for x in (0.35, 0.375, 0.0004, 2.1)] == ["$0.35", "$0.375", "$0.0004", "$2.10"]


def test_time_to_train_counts_whole_steps_and_keeps_the_estimated_mark_with_setup():
    import json

    from conftest import cli_main

    code, out, err = cli_main("cost", "llama-2-7b", "--gpus", "8", "--zero", "1", "--micro-batch", "1",
                              "--global-batch", "512", "--tokens", "1e6", "--setup-hours", "0.5", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert plan["steps"] == 1                                  # 1e6 tokens < one 512 × 4,096-token step
    assert plan["train_time_s"] == pytest.approx(plan["step_time_s"])
    code, out, _ = cli_main("cost", "llama-2-7b", "--gpus", "8", "--zero", "1", "--tokens", "1e9", "--setup-hours", "0.5")
    assert "to train (estimated) including set-up" in out.splitlines()[0]


def test_spot_on_a_gpu_the_default_prices_on_demand_only_takes_the_cheapest_interruptible_rate():
    """The course's '2 × RTX 4090 spot' cost without --price: no spot rate is listed for the RTX 4090, so --spot takes
    the cheapest spot or community-cloud rate (RunPod Community Cloud) and says which."""
    code, out, err = cli_main("cost", "--gpus", "2", "--gpu", "rtx-4090", "--spot", "--hours", "2.5", "--setup-hours",
                              "0.5", "--budget", "3", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["price"]["usd_per_gpu_hour"] == 0.34 and d["price"]["kind"] == "community cloud"
    assert d["price"]["provider"] == "runpod-community" and "community-cloud rate" in d["price"]["source"]
    code, out, _ = cli_main("cost", "--gpus", "2", "--gpu", "rtx-4090", "--spot", "--hours", "2.5", "--setup-hours",
                            "0.5", "--budget", "3")
    assert "2 × RTX 4090 at $0.34/h each = $0.68/h; about 3.0 h including set-up = $2.04. Budget $3.00: $0.96 to spare." \
        in " ".join(out.split())
    p = resolve_price(get_catalog(), "h100-sxm", spot=True)            # RunPod's community cloud below GCP's spot
    assert (p.kind, p.provider, p.usd_per_gpu_hour) == ("community cloud", "runpod-community", 2.69)
    p = resolve_price(get_catalog(), "a100-40gb", spot=True)           # a spot rate when it is the cheapest
    assert (p.kind, p.provider) == ("spot", "gcp")
