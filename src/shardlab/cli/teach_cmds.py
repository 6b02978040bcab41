"""shardlab explain | quiz: a concept derived with your numbers; a quiz generated from the model."""

from __future__ import annotations

import argparse

from shardlab.cli.common import BOUNDED

EXPLAIN_EXAMPLES = """examples:
  shardlab explain --list
  shardlab explain zero params=13B gpus=32 stage=2
  shardlab explain pipeline-bubble p=6 m=18
  shardlab explain decode-vs-prefill model=llama-2-7b tp=2 links=nvlink4,ethernet-10g
  shardlab explain source-map project=megatron --json
"""
QUIZ_EXAMPLES = """examples:
  shardlab quiz                                  # 10 questions on a terminal, worked solution after each
  shardlab quiz --topic zero --questions 3 --seed 7
  shardlab quiz --seed 7 --json > key.json       # the questions with their answers and solutions
  shardlab quiz --seed 7 --answers answers.txt   # score a file: one answer per line (a, b, ... or a number)
"""


def register(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("explain", help="a concept derived with your numbers, in plain words, with its sources and code",
                       description="Derive a concept the course teaches with your numbers (key=value after the topic): every "
                                   "step with its formula, a paragraph in plain words, the papers behind it and where it "
                                   "lives in Megatron-LM / PyTorch. `--list` names the topics and their keys.",
                       epilog=EXPLAIN_EXAMPLES, formatter_class=fmt)
    p.add_argument("topic", nargs="?", metavar="TOPIC", help="a topic from --list")
    p.add_argument("values", nargs="*", metavar="KEY=VALUE", help="your numbers, e.g. params=13B gpus=32")
    p.add_argument("--list", action="store_true", help="list the topics, their keys and the curriculum items they answer")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=cmd_explain)

    q = sub.add_parser("quiz", help="questions generated from the model with random numbers; worked solutions and a score",
                       description="Multiple-choice and numeric questions (with a stated tolerance) computed by shardlab's own "
                                   "models with random numbers. On a terminal each question waits for your answer and shows "
                                   "the worked solution; --answers FILE scores a file (one answer per line). Pass mark 70% (--pass-mark); below it the command exits 1.",
                       epilog=QUIZ_EXAMPLES, formatter_class=fmt)
    q.add_argument("--topic", action="append", default=[], metavar="T", help="only this topic (repeatable; see --list)")
    q.add_argument("--questions", type=BOUNDED["questions"], default=10, help="how many questions (default 10)")
    q.add_argument("--seed", type=BOUNDED["seed"], default=None, help="random seed (default: a new quiz each time)")
    q.add_argument("--answers", metavar="FILE", help="score the answers in FILE instead of asking ('-' reads standard input)")
    q.add_argument("--list", action="store_true", help="list the quiz topics")
    q.add_argument("--json", action="store_true", help="print one JSON document (questions, answers, solutions, score)")
    q.add_argument("--history", action="store_true",
                   help="list the recorded attempts with per-topic scores ($SHARDLAB_QUIZ_DB, or quiz.sqlite beside "
                        "the ledger)")
    q.add_argument("--pass-mark", type=BOUNDED["share"], default=None, metavar="SHARE",
                   help="share of right answers that passes (default 0.7); below it the command exits 1")
    q.set_defaults(func=cmd_quiz, reads_answers=True)


def cmd_explain(args):
    from shardlab.errors import ShardlabError
    from shardlab.teach.explanation import render
    from shardlab.teach.registry import explain

    if args.list:
        if args.topic:
            raise ShardlabError("give a TOPIC or --list, not both")
        return _list_topics()
    if not args.topic:
        raise ShardlabError("no topic: name one, e.g. `shardlab explain zero` (`shardlab explain --list` shows all)")
    from shardlab.render.table import OUTPUT_WIDTH

    ex = explain(args.topic, args.values)
    limit = OUTPUT_WIDTH.get()                  # wrap once, at the width the output must fit (110 without a limit)
    return ex.to_dict(), render(ex, limit or 110)


def _list_topics():
    from shardlab.render.table import table
    from shardlab.teach.params import describe
    from shardlab.teach.registry import topics

    ts = topics()
    base = {t.build: t.id for t in ts.values() if not t.presets}
    rows = [[t.id, ", ".join(map(str, t.items)), t.summary] for t in ts.values()]
    keys = [f"  {t.id}: {describe(t.params) or '(no numbers)'}" for t in ts.values() if not t.presets]
    text = "\n".join([table(["topic", "items", "what it derives"], rows, align="lll",
                            title=f"{len(ts)} topics (`shardlab explain TOPIC key=value ...`; items: docs/curriculum.md)"),
                      "", "keys and defaults:", *keys])
    doc = {"topics": [{"id": t.id, "title": t.title, "summary": t.summary, "items": list(t.items),
                       "alias_of": base.get(t.build) if t.presets else None, "presets": dict(t.presets),
                       "params": [{"name": p.name, "kind": p.kind, "default": p.default, "help": p.help,
                                   "choices": list(p.choices)} for p in t.params]} for t in ts.values()]}
    return doc, text


def cmd_quiz(args):
    from shardlab.teach.quiz_run import QuizFailed, run_quiz_command

    result = run_quiz_command(args)
    if isinstance(result, tuple) and isinstance(result[0].get("score"), dict) and not result[0]["score"]["passed"]:
        from shardlab.cli import emit

        doc, text = result          # below the pass mark: the whole result printed (text or JSON), then exit 1
        emit(args, doc, text)
        raise QuizFailed(f"quiz score {doc['score']['right']}/{doc['score']['total']} is below the pass mark "
                         f"{100 * doc['score']['pass_mark']:.0f}%")
    return result
