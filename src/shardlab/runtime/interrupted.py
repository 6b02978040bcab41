"""What an interrupted ``shardlab run train|infer`` says: the one JSON document ``--json`` promises, even when
Ctrl-C (SIGINT), SIGTERM or SIGHUP stops the job.

``launch`` stops the whole job and lets the interrupt go on with the run folder attached (``run_dir``); the
run command adds what it knows (:func:`note_interrupt`): the steps every rank recorded so far, each rank's
last phase, the time split of the steps measured and where the records are. The CLI prints
:func:`interrupted_doc` and exits as an interrupted command does (128 + the signal: 130 for Ctrl-C).
Pure functions over the run folder (no torch).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

KEEP_HINT = "SHARDLAB_KEEP_RUN_DIR=1 keeps the run folder; --steps-jsonl FILE keeps the per-step records"
"""How to keep what an interrupted run measured."""


def job_progress(run_dir, *, unit: str, planned: int, skip_steps: int, steps_jsonl: str | None = None,
                 job_done: bool = False) -> dict:
    """What the job had done when it was stopped, from its run folder.

    ``finished``: the {unit}s every rank recorded (a rank records a step when the next one starts, so the step
    running at the interrupt is not counted); ``ranks``: per rank its recorded {unit}s and last heartbeat phase;
    ``time_split``: per rank the mean compute / collectives / wait of the recorded {unit}s from ``skip_steps`` on
    (``observe.summary.rank_time_split``; null when none was recorded); ``logs``: the run folder, whether it goes
    when shardlab exits, and ``steps_jsonl`` (the records so far are written there when it was given)."""
    from shardlab.runtime.launch import read_rank_files, removed_at_exit
    from shardlab.runtime.observe.launcher import step_records
    from shardlab.runtime.observe.summary import rank_time_split

    records = step_records(run_dir)
    beats = {b["rank"]: b for b in read_rank_files(Path(run_dir), "heartbeat.json")} if run_dir else {}
    recorded: dict[int, int] = {}
    for r in records:
        recorded[r["rank"]] = recorded.get(r["rank"], 0) + 1
    ranks = sorted(set(recorded) | set(beats))
    timed = [r for r in records if r["step"] >= skip_steps]
    split = rank_time_split(timed, skip_steps) if timed else {}
    kept = write_records(records, steps_jsonl) if steps_jsonl and records else None
    return {"unit": unit, "planned": planned, "job_finished": job_done,
            "finished": min((recorded.get(r, 0) for r in ranks), default=0),
            "ranks": [{"rank": r, "recorded": recorded.get(r, 0), "last_phase": beats.get(r, {}).get("phase")}
                      for r in ranks],
            "time_split": {str(k): v for k, v in split.items()} or None,
            "logs": {"run_dir": str(run_dir) if run_dir else None,
                     "run_dir_removed_at_exit": bool(run_dir) and removed_at_exit(run_dir),
                     "steps_jsonl": kept, "keep": KEEP_HINT}}


def write_records(records: list[dict], path: str) -> str | None:
    """The records so far as JSON lines at ``path`` (``--steps-jsonl``); None when it cannot be written."""
    try:
        Path(path).write_text("".join(json.dumps(r) + "\n" for r in sorted(records, key=lambda r: (r["step"], r["rank"]))))
    except OSError:
        return None
    return str(path)


def note_interrupt(exc: BaseException, run_dir, **progress) -> None:
    """Attach :func:`job_progress` to the interrupt ``exc`` (as ``exc.progress``; None when no job was started) on
    its way out; the run folder is the one ``launch`` attached, else ``run_dir``. Never raises: a failure here must
    not replace the interrupt."""
    try:
        rd = getattr(exc, "run_dir", None) or run_dir
        exc.progress = job_progress(rd, **progress) if rd is not None else None
    except Exception:  # noqa: BLE001 - the interrupt matters more than the report of it
        exc.progress = getattr(exc, "progress", None)


def interrupted_doc(command: str, signum: int, progress: dict | None, sweep: dict | None = None) -> dict:
    """The JSON document of an interrupted run command: ``error`` and ``exit_code`` as every failing command's
    document has them (``cli.json_error``), ``interrupted``, the signal, and ``progress`` (:func:`job_progress`;
    null when the job had not started); ``sweep`` (a sweep's runs finished before and the one stopped) when given."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    doc = {"error": f"interrupted ({name}): stopped", "exit_code": 128 + signum, "interrupted": True, "signal": name,
           "command": command, "finished": False, "progress": progress}
    if progress is None:
        doc["note"] = "interrupted before the job started: nothing was measured"
    else:
        done = f"{progress['finished']} of {progress['planned']} {progress['unit']}(s) recorded on every rank"
        logs = progress.get("logs") or {}
        if logs.get("steps_jsonl") or not logs.get("run_dir_removed_at_exit"):
            where = f"; records: {logs.get('steps_jsonl') or logs.get('run_dir')}" if logs.get("run_dir") else ""
        else:
            where = f"; no records kept (the run folder {logs['run_dir']} is removed when shardlab exits; {KEEP_HINT})"
        doc["note"] = (("the job had finished; stopped while its results were gathered: " if progress.get("job_finished")
                        else "the job was stopped: ") + done + where)
    if sweep is not None:
        doc["sweep"] = sweep
    return doc
