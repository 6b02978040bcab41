"""The command line's surface is frozen: every command's options are listed in tests/data/cli_surface.json, and a
flag added or removed without updating the list fails here (as torchtitan's test_no_new_cli_options), so that growth
is a decision. After a deliberate change: python tests/test_cli_surface.py --write, and commit the list."""

import argparse
import json
import sys
from pathlib import Path

SURFACE = Path(__file__).parent / "data" / "cli_surface.json"


def surface() -> dict[str, list[str]]:
    """{'plan': ['--batch', ...], 'run train': [...], ...}: each command's option strings, sorted."""
    from shardlab.cli import build_parser

    out: dict[str, list[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        opts = sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--"))
        if path:
            out[path] = opts
        for a in subs:
            for name, p in a.choices.items():
                walk(p, f"{path} {name}".strip())
    walk(build_parser(), "")
    return out


def test_no_option_added_or_removed_without_updating_the_list():
    want = json.loads(SURFACE.read_text(encoding="utf-8"))
    got = surface()
    diffs = []
    for cmd in sorted(set(want) | set(got)):
        added = sorted(set(got.get(cmd, [])) - set(want.get(cmd, [])))
        removed = sorted(set(want.get(cmd, [])) - set(got.get(cmd, [])))
        if added or removed or (cmd in want) != (cmd in got):
            diffs.append(f"{cmd}: added {added}, removed {removed}")
    assert not diffs, ("the command line changed; if that is deliberate run `python tests/test_cli_surface.py --write` "
                       "and commit tests/data/cli_surface.json:\n" + "\n".join(diffs))


def test_the_counts_the_structure_issue_names():
    """Where the surface stands (a record, not a goal): the largest commands' option counts."""
    got = surface()
    assert len(got["plan"]) > 30 and "--wide" in got["plan"] and "--json" in got["run infer"]


if __name__ == "__main__" and "--write" in sys.argv:
    SURFACE.write_text(json.dumps(surface(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {SURFACE}")


def test_help_shows_at_most_30_options_and_help_all_shows_every_one():
    import argparse

    from shardlab.cli import build_parser
    from shardlab.cli.help import COMMON, shown_options

    def walk(parser, path=""):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, p in a.choices.items():
                    yield from walk(p, f"{path} {name}".strip())
        if path:
            yield path, parser
    seen = dict(walk(build_parser()))
    for path, parser in seen.items():
        shown = shown_options(parser)
        assert len(shown) <= 30, (path, len(shown))
        assert len(shown_options(parser, all_flags=True)) == len([a for a in parser._actions if a.option_strings
                                                                   and a.help is not argparse.SUPPRESS])
    for path, flags in COMMON.items():
        have = set(seen[path]._option_string_actions)
        assert set(flags) <= have, (path, sorted(set(flags) - have))


def test_help_text_names_the_rest(capsys):
    from conftest import cli_main

    code, out, _ = cli_main("plan", "--help")
    assert code == 0 and "more options: `shardlab plan --help-all`" in out and "--stage-layers" not in out
    code, out, _ = cli_main("plan", "--help-all")
    assert code == 0 and "--stage-layers" in out and "more options" not in out


def test_one_name_per_concept_old_spellings_still_work_with_a_note():
    """--gpus for a GPU count, --nproc-per-node for ranks per node, --nodes for nodes, --engine for the serving engine;
    the old spellings parse to the same field and print one note on stderr."""
    from conftest import cli_main
    from shardlab.cli import build_parser

    p = build_parser()
    new = p.parse_args(["run", "train", "--nproc-per-node", "3", "--nodes", "2"])
    assert (new.nproc, new.nnodes) == (3, "2")
    assert p.parse_args(["shard-check", "tiny", "--gpus", "4"]).world_size == 4
    code, out, err = cli_main("comm", "all-reduce", "--size", "1MiB", "--ranks", "8", "--json")
    assert code == 0 and json.loads(out)["ranks"] == 8 and "--ranks is an old spelling; use --gpus" in err
    code, out, err = cli_main("comm", "all-reduce", "--size", "1MiB", "--gpus", "8", "--json")
    assert code == 0 and json.loads(out)["ranks"] == 8 and err == ""
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--framework", "sglang", "--json")
    assert code == 0 and json.loads(out)["engine"] == "sglang" and "use --engine" in err
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--engine", "sglang", "--json")
    assert code == 0 and json.loads(out)["engine"] == "sglang" and err == ""
    code, _, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--engine", "sglang", "--framework", "vllm")
    assert code == 2 and "name two engines" in err
