"""Property-based test of the whole CLI (harness in tests/cli_fuzz.py): every command found in the parser,
generated arguments and config files, in-process. A small fixed budget here (400 calls, about 20 s); the large
campaign with a report is benchmarks/fuzz_cli.py."""

import os
import sys

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

import cli_fuzz as F  # noqa: E402

COMMANDS = F.discover()
SLOW_BY_DESIGN = {("validate",)}
"""Left to the campaign (benchmarks/fuzz_cli.py): `validate` refits its models to published runs (2-13 s a call)."""


def test_every_registered_command_is_fuzzed():
    """Commands merged later are found through the parser, with their options."""
    from shardlab.cli import COMMAND_OWNERS

    tops = {c.path[0] for c in COMMANDS}
    assert tops == set(COMMAND_OWNERS)
    assert any(c.path == ("comm", "all-reduce") for c in COMMANDS) and any(c.path == ("run", "train") for c in COMMANDS)


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    files = F.Files(tmp / "files")
    with F.environment(tmp):
        yield files


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FIFOs, /dev files and SIGALRM: Linux")
def test_cli_keeps_its_contract_on_generated_input(fuzz_env):
    files = fuzz_env
    budget = int(os.environ.get("SHARDLAB_FUZZ_EXAMPLES", "400"))

    @settings(max_examples=budget, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(F.invocation([c for c in COMMANDS if c.path not in SLOW_BY_DESIGN], files))
    def call(argv):
        o = F.invoke(argv, limit_s=60.0)            # a hang detector, not a speed target
        problems = F.check(o)
        assert not problems, f"shardlab {' '.join(map(repr, argv))}: {problems}\n{o.error or o.stderr[-2000:]}"

    call()


def test_check_flags_what_the_contract_forbids():
    """The checker itself: it must notice a traceback, a bad exit code, a two-line error, non-finite JSON."""
    ok = F.Outcome(["memory"], 0, "{}", "", 0.1)
    assert F.check(ok) == []
    assert F.check(F.Outcome(["memory"], 1, "", "", 0.1, error="Traceback...\nTypeError: x"))
    assert F.check(F.Outcome(["memory"], 1, "", "", 0.1)) == ["exit code 1"]
    assert F.check(F.Outcome(["memory"], 2, "", "error: a\nb\n", 0.1))
    assert F.check(F.Outcome(["memory", "--json"], 0, '{"x": NaN}', "", 0.1))
    assert F.check(F.Outcome(["memory"], 0, "total inf GiB", "", 0.1))
    assert F.check(F.Outcome(["memory"], 0, "uses InfiniBand", "", 0.1)) == []
    assert F.check(F.Outcome(["explain"], 0, "a dynamic scaler halves on inf/NaN", "", 0.1)) == []
    assert F.check(F.Outcome(["guard"], 124, "", "", 0.1)) == [] and F.check(F.Outcome(["memory"], 124, "", "", 0.1))
    assert F.check(F.Outcome(["plan"], None, "", "", 9.0, error="timeout")) == ["hang: no answer within the time limit"]
