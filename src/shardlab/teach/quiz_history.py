"""Every graded quiz attempt, kept in SQLite with its per-topic scores: `shardlab quiz --history [--json]`.

The file is ``$SHARDLAB_QUIZ_DB``, else ``quiz.sqlite`` beside the default ledger ($XDG_DATA_HOME/shardlab or
~/.local/share/shardlab). One row per attempt (when, seed, right/total, pass mark, passed, how it was taken) and
one per attempt and topic; nothing is ever deleted. A file that is not this database is refused, not overwritten.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

from shardlab.errors import ShardlabError

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (id INTEGER PRIMARY KEY, at REAL NOT NULL, seed INTEGER NOT NULL,
  right INTEGER NOT NULL, total INTEGER NOT NULL, pass_mark REAL NOT NULL, passed INTEGER NOT NULL, mode TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS topic_scores (attempt INTEGER NOT NULL REFERENCES attempts(id), topic TEXT NOT NULL,
  right INTEGER NOT NULL, total INTEGER NOT NULL);
"""


def default_path() -> Path:
    from shardlab.ledger import default_ledger_path
    from shardlab.safeio import expand_user

    if os.environ.get("SHARDLAB_QUIZ_DB"):
        return expand_user(os.environ["SHARDLAB_QUIZ_DB"], "$SHARDLAB_QUIZ_DB")
    return default_ledger_path().parent / "quiz.sqlite"


def _connect(path: Path) -> sqlite3.Connection:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(str(path), timeout=10)
        con.executescript(SCHEMA)
        return con
    except (OSError, sqlite3.Error) as e:
        raise ShardlabError(f"quiz history {path}: {e}; set SHARDLAB_QUIZ_DB to a writable file") from None


def record(seed: int, graded: list[tuple[str, bool]], pass_mark: float, mode: str, path: Path | None = None) -> int:
    """Keep one attempt: ``graded`` is (topic, correct) per question. Returns its id."""
    path = path or default_path()
    right, total = sum(ok for _, ok in graded), len(graded)
    con = _connect(path)
    try:
        with con:
            cur = con.execute("INSERT INTO attempts (at, seed, right, total, pass_mark, passed, mode) VALUES (?,?,?,?,?,?,?)",
                              (time.time(), seed, right, total, pass_mark, int(total > 0 and right / total >= pass_mark),
                               mode))
            topics: dict[str, list[int]] = {}
            for topic, ok in graded:
                t = topics.setdefault(topic, [0, 0])
                t[0] += ok
                t[1] += 1
            con.executemany("INSERT INTO topic_scores VALUES (?,?,?,?)",
                            [(cur.lastrowid, k, r, n) for k, (r, n) in sorted(topics.items())])
            return int(cur.lastrowid)
    except sqlite3.Error as e:
        raise ShardlabError(f"quiz history {path}: {e}; set SHARDLAB_QUIZ_DB to a writable file") from None
    finally:
        con.close()


def history(path: Path | None = None) -> dict:
    """Every attempt, oldest first, with its per-topic scores, and each topic's totals over all attempts."""
    path = path or default_path()
    if not path.exists():
        return {"path": str(path), "attempts": [], "topics": {}}
    con = _connect(path)
    try:
        rows = con.execute("SELECT id, at, seed, right, total, pass_mark, passed, mode FROM attempts ORDER BY id").fetchall()
        scores = con.execute("SELECT attempt, topic, right, total FROM topic_scores ORDER BY attempt, topic").fetchall()
    except sqlite3.Error as e:
        raise ShardlabError(f"quiz history {path}: {e}; is it the quiz's database?") from None
    finally:
        con.close()
    per: dict[int, dict] = {}
    totals: dict[str, list[int]] = {}
    for a, topic, r, n in scores:
        per.setdefault(a, {})[topic] = {"right": r, "total": n}
        t = totals.setdefault(topic, [0, 0])
        t[0] += r
        t[1] += n
    attempts = [{"id": i, "at": time.strftime("%Y-%m-%d %H:%M", time.localtime(at)), "seed": seed, "right": r, "total": n,
                 "share": r / n if n else 0.0, "pass_mark": pm, "passed": bool(ok), "mode": mode, "topics": per.get(i, {})}
                for i, at, seed, r, n, pm, ok, mode in rows]
    return {"path": str(path), "attempts": attempts,
            "topics": {k: {"right": r, "total": n, "share": r / n} for k, (r, n) in sorted(totals.items())}}


def render(doc: dict) -> str:
    from shardlab.render.table import table

    if not doc["attempts"]:
        return f"no quiz attempt recorded yet ({doc['path']})"
    rows = [[a["id"], a["at"], a["seed"], f"{a['right']}/{a['total']}", f"{100 * a['share']:.0f}%",
             "PASS" if a["passed"] else "not yet", a["mode"],
             ", ".join(f"{k} {v['right']}/{v['total']}" for k, v in a["topics"].items())] for a in doc["attempts"]]
    out = [table(["#", "when", "seed", "score", "", "result", "taken", "per topic"], rows,
                 title=f"quiz attempts ({doc['path']})")]
    weak = sorted(doc["topics"].items(), key=lambda kv: kv[1]["share"])[:3]
    out.append("weakest topics over all attempts: " + ", ".join(f"{k} {100 * v['share']:.0f}% ({v['right']}/{v['total']})"
                                                               for k, v in weak)
               + " (`shardlab explain TOPIC` derives each)")
    return "\n".join(out)


def graded_of(doc: dict) -> list[tuple[str, bool]]:
    """(topic, correct) of each question of a graded quiz document."""
    return [(r["topic"], bool(r["correct"])) for r in doc["questions"]]


def dumps(doc: dict) -> str:
    return json.dumps(doc)
