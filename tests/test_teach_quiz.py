"""shardlab quiz: answers from a file score 100% / 0%, a pipe and a real terminal (tmux) can take it."""

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from conftest import cli_main

from shardlab.teach.quiz import GENERATORS, PASS_MARK, make_quiz
from shardlab.teach.quiz_run import check, parse_answers


def key(seed: int, n: int, *extra) -> list[dict]:
    code, out, err = cli_main("quiz", "--seed", str(seed), "--questions", str(n), "--json", *extra)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["pass_mark"] == PASS_MARK == 0.7 and doc["score"] is None
    return doc["questions"]


def right(q: dict) -> str:
    return "abcdefgh"[int(q["answer"])] if q["kind"] == "choice" else repr(q["answer"])


def wrong(q: dict) -> str:
    if q["kind"] == "choice":
        return "abcdefgh"[(int(q["answer"]) + 1) % len(q["choices"])]
    return repr(q["answer"] * 3 + q["tolerance"] + 5)


def test_every_topic_makes_questions_whose_key_checks_out():
    qs = make_quiz(40, seed=11)
    assert {q.topic for q in qs} == set(GENERATORS)
    for q in qs:
        assert check(q, right(q.to_dict()))[0] and not check(q, wrong(q.to_dict()))[0]
        assert q.solution and q.command.startswith("shardlab explain")
        if q.kind == "choice":
            assert len(q.choices) >= 2 and 0 <= q.answer < len(q.choices)


def test_same_seed_same_quiz_and_topics_filter():
    a, b = key(5, 6), key(5, 6)
    assert [q["text"] for q in a] == [q["text"] for q in b]
    assert {q["topic"] for q in key(2, 4, "--topic", "zero")} == {"zero"}


def test_answers_file_scores_a_correct_file_100_and_a_wrong_one_0(tmp_path):
    qs = key(7, 10)
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("# my answers\n" + "\n".join(right(q) for q in qs) + "\n")
    bad.write_text("\n".join(wrong(q) for q in qs))
    code, out, _ = cli_main("quiz", "--seed", "7", "--questions", "10", "--answers", str(good), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["score"]["right"] == 10 and doc["score"]["share"] == 1.0 and doc["score"]["passed"]
    code, out, err = cli_main("quiz", "--seed", "7", "--questions", "10", "--answers", str(bad))
    assert code == 1 and "score: 0/10 = 0% (pass mark 70%)" in out and "worked solution:" in out   # a course gate
    assert "the answer is" in out and "below the pass mark" in err
    code, out, _ = cli_main("quiz", "--seed", "7", "--questions", "10", "--answers", str(bad), "--json")
    assert code == 1 and json.loads(out)["score"]["passed"] is False               # still one JSON document
    code, out, _ = cli_main("quiz", "--seed", "7", "--questions", "10", "--answers", str(good), "--pass-mark", "1")
    assert code == 0 and "(pass mark 100%): PASS" in out


def test_numbered_answers_letters_units_and_gaps():
    qs = make_quiz(3, seed=4)
    text = "\n".join(f"q{i + 1}) {right(q.to_dict())}{'' if q.kind == 'choice' else ' ' + q.unit}" for i, q in
                     reversed(list(enumerate(qs))))
    assert parse_answers(text, 3) == [f"{right(q.to_dict())}{'' if q.kind == 'choice' else ' ' + q.unit}" for q in qs]
    assert parse_answers("1\n\n# skip\n2", 3) == ["1", "2", None]
    assert check(qs[0], None) == (False, "no answer")


@pytest.mark.parametrize("args,msg", [
    (["quiz", "--topic", "zer"], "did you mean zero"),
    (["quiz", "--answers", "/no/such/file.txt"], "does not exist"),
    (["quiz", "--questions", "0"], "positive"),
])
def test_quiz_bad_input_one_line_exit_2(args, msg):
    code, out, err = cli_main(*args)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_answers_outside_the_quiz_are_refused(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("1: a\n9: b\n")
    code, _, err = cli_main("quiz", "--seed", "1", "--questions", "3", "--answers", str(f))
    assert code == 2 and "outside" in err


def _env():
    return {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")} | {"OMP_NUM_THREADS": "1"}


def test_quiz_through_a_pipe_on_standard_input():
    qs = key(9, 3)
    p = subprocess.run([sys.executable, "-m", "shardlab", "quiz", "--seed", "9", "--questions", "3"],
                       input="\n".join(right(q) for q in qs) + "\n", capture_output=True, text=True, timeout=120, env=_env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("-> correct") == 3 and "score: 3/3 = 100% (pass mark 70%): PASS" in p.stdout


def test_quiz_in_a_real_terminal_with_tmux(tmp_path):
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed here (.ci/run installs it with apt-get)")
    qs = key(3, 3)
    sock, name = f"shardlab-test-{uuid.uuid4().hex[:8]}", "quiz"
    run = lambda *a: subprocess.run([tmux, "-L", sock, *a], capture_output=True, text=True, timeout=30, env=_env())  # noqa: E731
    quiz = f"{sys.executable} -m shardlab quiz --seed 3 --questions 3; echo QUIZ-OVER; sleep 120"
    started = run("new-session", "-d", "-s", name, "-x", "160", "-y", "60", "-c", str(tmp_path), quiz)
    assert started.returncode == 0, started.stderr

    def screen() -> str:
        return run("capture-pane", "-p", "-J", "-S", "-500", "-t", name).stdout

    def wait_for(text: str, count: int = 1, limit_s: float = 90.0) -> str:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            s = screen()
            if s.count(text) >= count:
                return s
            time.sleep(0.2)
        pytest.fail(f"the terminal never showed {text!r} ×{count}:\n{screen()}")

    try:
        for i, q in enumerate(qs, 1):
            wait_for("your answer:", i)
            run("send-keys", "-t", name, right(q), "Enter")
        s = wait_for("QUIZ-OVER")
        assert s.count("-> correct") == 3 and "worked solution:" in s
        assert "score: 3/3 = 100% (pass mark 70%): PASS" in s
    finally:
        run("kill-server")


def test_endless_standard_input_is_refused_not_read(monkeypatch):
    """`quiz --answers - < /dev/zero` and a session fed an endless line: one line, exit 2, bounded memory."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("a\n" * 600_000))          # 1.2 MB: over the answers-file limit
    code, _, err = cli_main("quiz", "--seed", "1", "--answers", "-")
    assert code == 2 and err.count("\n") == 1 and "over the 1,048,576-character limit" in err
    monkeypatch.setattr(sys, "stdin", io.StringIO("\0" * 100_000))          # one line with no end
    code, _, err = cli_main("quiz", "--seed", "1", "--questions", "2")
    assert code == 2 and err.count("\n") == 1 and "answers are one short line each" in err
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n"))                      # a normal pipe still works
    code, out, _ = cli_main("quiz", "--seed", "1", "--questions", "2")
    assert code == 1 and "stopped after 1 question(s)" in out            # 1 of 2 answered: below the pass mark


def test_zero_question_asks_in_the_unit_its_solution_gives():
    """The worked solution derives GB (10^9 bytes); copying its figure must score right."""
    for q in make_quiz(6, seed=3, topics=["zero"]):
        figure = f"{q.answer:.2f} GB"
        assert q.unit == "GB" and figure in " ".join(q.solution), (figure, q.solution)
        assert check(q, f"{q.answer:.2f}")[0]


def test_letters_only_and_ctrl_d_counts_the_rest_unanswered():
    q = next(q for q in make_quiz(40, seed=11) if q.kind == "choice")
    for junk in (")", "bc", "ab)", ""):
        assert not check(q, junk)[0]
    letter = "abcdefgh"[int(q.answer)]
    assert check(q, letter + ")")[0] and check(q, letter.upper())[0]
    qs = key(1, 10)
    first = right(qs[0])
    r = subprocess.run([sys.executable, "-m", "shardlab", "quiz", "--seed", "1", "--questions", "10"], input=first + "\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "1/10" in r.stdout and "PASS" not in r.stdout.replace("pass mark", "")


def test_tmux_typing_slowly_while_a_status_clock_would_run(tmp_path):
    """The learner types half an answer, waits past the status line's delay (progress forced on), types the rest:
    nothing redraws over the typing, the answer reads whole, and a typo is asked again rather than scored."""
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed here (.ci/run installs it with apt-get)")
    q = next(q for q in key(5, 10, "--topic", "zero") if q["kind"] == "numeric")
    seed = 5
    qs = key(seed, 10, "--topic", "zero")
    n = qs.index(q) + 1
    sock, name = f"shardlab-test-{uuid.uuid4().hex[:8]}", "quiz"
    env = _env() | {"SHARDLAB_PROGRESS": "1"}
    run = lambda *a: subprocess.run([tmux, "-L", sock, *a], capture_output=True, text=True, timeout=30, env=env)  # noqa: E731
    quiz = (f"SHARDLAB_PROGRESS=1 {sys.executable} -m shardlab quiz --seed {seed} --questions {n} --topic zero; "
            f"echo QUIZ-OVER $?; sleep 120")
    assert run("new-session", "-d", "-s", name, "-x", "200", "-y", "80", "-c", str(tmp_path), quiz).returncode == 0

    def screen() -> str:
        return run("capture-pane", "-p", "-J", "-S", "-2000", "-t", name).stdout

    def wait_for(text: str, count: int = 1, limit_s: float = 90.0) -> str:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            s = screen()
            if s.count(text) >= count:
                return s
            time.sleep(0.2)
        pytest.fail(f"the terminal never showed {text!r} ×{count}:\n{screen()}")

    try:
        for i, qq in enumerate(qs[:n], 1):
            wait_for("your answer:", i + (1 if i == n else 0) * 0)
            if i < n:
                run("send-keys", "-t", name, right(qq), "Enter")
                continue
            run("send-keys", "-t", name, "-l", "abc")
            run("send-keys", "-t", name, "Enter")
            wait_for("could not read that")
            answer = right(qq)
            run("send-keys", "-t", name, "-l", answer[:1])
            time.sleep(2.5)                                   # past the status line's delay, had it been drawn
            run("send-keys", "-t", name, "-l", answer[1:])
            run("send-keys", "-t", name, "Enter")
        s = wait_for("QUIZ-OVER")
        assert f"your answer: {right(qs[n - 1])}" in s and "'abc' is not a number" in s
        assert s.count("-> correct") == n and "QUIZ-OVER 0" in s and " s" not in s.split("your answer: abc")[1][:3]
    finally:
        run("kill-server")


def test_wrong_answers_name_the_classic_mistake_and_attempts_are_kept_per_topic(tmp_path, monkeypatch):
    """ZeRO-1's figure given for ZeRO-2 is named as such; every graded attempt is recorded with per-topic scores and
    `quiz --history --json` lists it."""
    import random

    from shardlab.teach.quiz import q_zero

    rng = random.Random(0)
    q = next(q for q in (q_zero(rng) for _ in range(40)) if "ZeRO-2" in q.text)
    ok, why = check(q, str(q.mistakes[1][0]))
    assert not ok and "ZeRO-1's figure: ZeRO-2 also shards the gradients" in why
    monkeypatch.setenv("SHARDLAB_QUIZ_DB", str(tmp_path / "q.sqlite"))
    qs = key(7, 4)
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(wrong(q) for q in qs))
    assert cli_main("quiz", "--seed", "7", "--questions", "4", "--answers", str(bad))[0] == 1
    good = tmp_path / "good.txt"
    good.write_text("\n".join(right(q) for q in qs))
    assert cli_main("quiz", "--seed", "7", "--questions", "4", "--answers", str(good))[0] == 0
    code, out, _ = cli_main("quiz", "--history", "--json")
    h = json.loads(out)
    assert code == 0 and [(a["right"], a["total"], a["passed"]) for a in h["attempts"]] == [(0, 4, False), (4, 4, True)]
    topic = qs[0]["topic"]
    assert h["attempts"][1]["topics"][topic]["right"] >= 1 and h["topics"][topic]["total"] >= 2
    code, out, _ = cli_main("quiz", "--history")
    assert code == 0 and "weakest topics" in out and "quiz attempts" in out
