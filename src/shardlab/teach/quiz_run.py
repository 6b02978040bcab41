"""Taking a quiz: reading answers (a terminal, a pipe or a file), checking them, the worked solutions and the score."""

from __future__ import annotations

import math
import re
import sys

from shardlab.errors import ShardlabError
from shardlab.teach.quiz import PASS_MARK, Question, make_quiz

_NUMBERED = re.compile(r"^\s*q?(\d+)\s*(?:[:)]|\.(?!\d))\s*(.*)$", re.IGNORECASE)   # '3. 12.5', not '7.69'
_GROUPED = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?$")    # '1,024' or '12,345.6': commas group thousands
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def readable(q: Question, given: str) -> str | None:
    """Why ``given`` cannot be read as an answer to ``q`` (a typo: asked again in a session), or None."""
    ok, why = check(q, given)
    if ok or not given.strip():
        return None
    return why if why.startswith("'") and ("is not" in why or "ambiguous" in why or "too large" in why) else None


def check(q: Question, given: str | None) -> tuple[bool, str]:
    """(correct?, why) for the answer text ``given`` (None: no answer)."""
    if given is None or not given.strip():
        return False, "no answer"
    g = given.strip()
    if q.kind == "choice":
        letters = "abcdefgh"[: len(q.choices)]
        if len(g) == 1 and g.lower() in letters:
            pick = letters.index(g.lower())
        elif len(g) == 2 and g[1] == ")" and g[0].lower() in letters:      # 'b)'
            pick = letters.index(g[0].lower())
        else:
            matches = [i for i, c in enumerate(q.choices) if c.lower() == g.lower()]
            if not matches:
                return False, f"'{g}' is not one of the letters {', '.join(letters)}"
            pick = matches[0]
        return pick == int(q.answer), f"you chose {letters[pick]}"
    if "," in g:
        if not _GROUPED.match(g.split()[0]):
            return False, f"'{g}' is ambiguous: write decimals with a point (17.95) and group thousands as 1,024"
        g = g.replace(",", "")
    m = _NUMBER.search(g)
    if not m:
        return False, f"'{g}' is not a number"
    x = float(m.group())
    if not math.isfinite(x):                 # '1e400' overflows: no quiz answer is that large
        return False, f"'{g}' is too large to be an answer"
    ok = abs(x - q.answer) <= q.tolerance + 1e-9 * max(1.0, abs(q.answer))
    if not ok:
        for value, mistake in q.mistakes:    # a classic mistake: say which
            if abs(x - value) <= max(q.tolerance, 1e-6 * max(1.0, abs(value))):
                return False, f"you answered {x:g}, which is {mistake}"
    return ok, f"you answered {x:g}"


def parse_answers(text: str, n: int) -> list[str | None]:
    """Answers from a file: one per line in order, or numbered ('3: 12.5', 'q3) b'); '#' starts a comment."""
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    out: list[str | None] = [None] * n
    numbered = [(_NUMBERED.match(ln), ln) for ln in lines]
    if lines and all(m for m, _ in numbered):
        for m, _ in numbered:
            k = int(m.group(1))
            if not 1 <= k <= n:
                raise ShardlabError(f"answer number {k} is outside the quiz's questions 1..{n}")
            out[k - 1] = m.group(2)
        return out
    if len(lines) > n:
        raise ShardlabError(f"the answers file has {len(lines)} answers for {n} questions; give one per line")
    for i, ln in enumerate(lines):
        out[i] = ln
    return out


def ask_text(i: int, n: int, q: Question) -> str:
    """The question as printed before an answer is read."""
    lines = [f"question {i}/{n} [{q.topic}]: {q.text}"]
    lines += [f"  {'abcdefgh'[k]}) {c}" for k, c in enumerate(q.choices)]
    lines.append(f"  ({q.tolerance_text})")
    return "\n".join(lines)


def result_text(q: Question, ok: bool, why: str) -> str:
    """What follows an answer: right or wrong, the answer, the worked solution and where to see more."""
    head = "correct" if ok else f"wrong ({why}): the answer is {q.answer_text}"
    out = [f"  -> {head}", "  worked solution:"] + [f"     {s}" for s in q.solution]
    if q.command:
        out.append(f"     more: {q.command}")
    return "\n".join(out)


def score_line(right: int, n: int, mark: float = PASS_MARK) -> str:
    share = right / n if n else 0.0
    return (f"score: {right}/{n} = {100 * share:.0f}% (pass mark {100 * mark:.0f}%): "
            f"{'PASS' if share >= mark else 'not yet: read the worked solutions and try another seed (exit 1)'}")


class QuizFailed(ShardlabError):
    """Below the pass mark: the command's output is complete, and it exits 1 so a course gate can test it."""

    exit_code = 1
    json_reported = True


def grade(questions: list[Question], answers: list[str | None], mark: float = PASS_MARK) -> dict:
    """The graded document: each question with the given answer, correct or not, and the score."""
    rows = []
    for i, (q, a) in enumerate(zip(questions, answers), 1):
        ok, why = check(q, a)
        rows.append({"number": i, **q.to_dict(), "given": a, "correct": ok, "why": why})
    right = sum(r["correct"] for r in rows)
    n = len(questions)
    return {"questions": rows, "score": {"right": right, "total": n, "share": right / n if n else 0.0,
                                         "pass_mark": mark, "passed": n > 0 and right / n >= mark}}


def run_quiz_command(args):
    """``shardlab quiz``: list, answer key (--json), a file (--answers) or a session on standard input."""
    import random

    from shardlab.teach.quiz import GENERATORS

    if args.list:
        return ({"topics": list(GENERATORS)},
                "quiz topics (`--topic T`; `shardlab explain T` derives each): " + ", ".join(GENERATORS))
    if getattr(args, "history", False):
        from shardlab.teach.quiz_history import history, render

        doc = history()
        return doc, render(doc)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    qs = make_quiz(args.questions, seed, args.topic)
    head = f"shardlab quiz: {len(qs)} questions, seed {seed} (`--seed {seed}` repeats this quiz)"
    mark = args.pass_mark if getattr(args, "pass_mark", None) is not None else PASS_MARK
    if args.answers is not None:
        text = _read_stdin() if args.answers == "-" else _read(args.answers)
        doc = {"seed": seed, **grade(qs, parse_answers(text, len(qs)), mark)}
        lines = [head, ""]
        for r, q in zip(doc["questions"], qs):
            lines += [ask_text(r["number"], len(qs), q), f"  your answer: {r['given'] if r['given'] is not None else '-'}",
                      result_text(q, r["correct"], r["why"]), ""]
        lines.append(score_line(doc["score"]["right"], len(qs), mark))
        from shardlab.teach.quiz_history import graded_of, record

        doc["attempt"] = record(seed, graded_of(doc), mark, "answers file")
        return doc, "\n".join(lines)
    if args.json:
        return {"seed": seed, "questions": [{"number": i, **q.to_dict()} for i, q in enumerate(qs, 1)],
                "pass_mark": mark, "score": None}, ""
    return _session(qs, head, mark, seed)


MAX_ANSWER_CHARS = 4096
"""Longest answer line read in a session (an answer is a number, a word or a short list)."""


def _read_stdin() -> str:
    """``--answers -``: standard input, at most the file-size limit (an endless stream is refused, not read)."""
    from shardlab.errors import ShardlabError
    from shardlab.limits import MAX_FILE_BYTES

    text = sys.stdin.read(MAX_FILE_BYTES + 1)
    if len(text) > MAX_FILE_BYTES:
        raise ShardlabError(f"--answers -: standard input is over the {MAX_FILE_BYTES:,}-character limit for an answers "
                            f"file (one answer per line); is it the right input?")
    return text


def _answer_line(prompt: str) -> str:
    """One answer: input() on a terminal (line editing); from a pipe or file, a line of at most MAX_ANSWER_CHARS
    (EOFError at the end, as input() raises)."""
    from shardlab.errors import ShardlabError

    if sys.stdin.isatty():
        return input(prompt)
    print(prompt, end="", flush=True)
    line = sys.stdin.readline(MAX_ANSWER_CHARS + 1)
    if not line:
        raise EOFError
    if len(line) > MAX_ANSWER_CHARS and not line.endswith("\n"):
        raise ShardlabError(f"an answer of over {MAX_ANSWER_CHARS:,} characters on standard input; answers are one short "
                            f"line each (is it the right input?)")
    return line.rstrip("\n")


def _read(path: str) -> str:
    from shardlab.safeio import read_text

    return read_text(path, "answers file (one answer per line)")


MAX_RETRIES = 5
"""Unreadable answers asked again before the question counts as wrong."""


def _session(qs: list[Question], head: str, mark: float = PASS_MARK, seed: int = 0) -> int:
    """Ask on standard input, one question at a time (a terminal or a pipe); an answer that cannot be read (a typo:
    'abc' for a number, 'x' for a letter) is asked again. Exit code 0 at or above the pass mark, else 1."""
    print(head, flush=True)
    print("answer each question and press Enter; Ctrl-D stops early\n", flush=True)
    right, graded = 0, []
    for i, q in enumerate(qs, 1):
        print(ask_text(i, len(qs), q), flush=True)
        try:
            given = _answer_line("your answer: ")
            for _ in range(MAX_RETRIES):
                why = readable(q, given)
                if why is None:
                    break
                print(f"  could not read that: {why}; try again", flush=True)
                given = _answer_line("your answer: ")
        except EOFError:     # the questions left unanswered count as wrong, as a missing line in --answers does
            print(f"\nstopped after {i - 1} question(s); the {len(qs) - i + 1} left count as unanswered")
            break
        ok, why = check(q, given)
        right += ok
        graded.append((q.topic, ok))
        print(result_text(q, ok, why) + "\n", flush=True)
    graded += [(q.topic, False) for q in qs[len(graded):]]      # unanswered count as wrong
    print(score_line(right, len(qs), mark), flush=True)
    from shardlab.teach.quiz_history import record

    print(f"recorded as attempt #{record(seed, graded, mark, 'session')} (`shardlab quiz --history`)", flush=True)
    return 0 if qs and right / len(qs) >= mark else 1
