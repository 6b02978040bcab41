"""Progress on a terminal: a live status line for any command still working after a second, and progress
bars for loops with a known length. Drawn with tqdm on stderr, only when stderr is a terminal and --json is
off (``SHARDLAB_PROGRESS=0`` turns it off, ``=1`` forces it, for recordings and tests).

The analytic core never imports this: functions with long loops take a plain callback
``progress(done: int, total: int, label: str)`` and the CLI passes ``bar(...)``'s.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Callback = Callable[[int, int, str], None]
"""progress(done, total, label): ``done`` of ``total`` units finished, ``label`` says what is running."""
DELAY_S = 1.0
"""The status line appears only for work that takes longer than this."""

_state = {"enabled": False, "label": "", "bar": None, "stop": None}
_lock = threading.Lock()


def enabled(args=None) -> bool:
    """Draw progress? Terminal on stderr, no --json, not switched off by SHARDLAB_PROGRESS=0."""
    if getattr(args, "reads_answers", False):     # a quiz waiting for typed answers: nothing may redraw over them
        return False
    env = os.environ.get("SHARDLAB_PROGRESS")
    if env in ("0", "1"):
        return env == "1" and not getattr(args, "json", False)
    return sys.stderr.isatty() and not getattr(args, "json", False)


def _noop(done: int, total: int, label: str = "") -> None:
    return None


def set_status(label: str) -> None:
    """Change what the live status line says (e.g. 'measuring collectives')."""
    _state["label"] = label


@contextmanager
def status(args, label: str) -> Iterator[None]:
    """Around a whole command: after ``DELAY_S`` a line 'label … 3.2 s' on stderr, updated 5 times a second, hidden
    while a ``bar`` is drawn, erased at the end."""
    if not enabled(args):
        yield
        return
    stop = threading.Event()
    _state.update(enabled=True, label=label, stop=stop)
    from tqdm import tqdm     # here, not in the thread: importing while the main thread imports can fail half-way

    def run() -> None:
        t0 = time.monotonic()
        if stop.wait(DELAY_S):
            return
        line = None
        while not stop.is_set():
            with _lock:
                if _state["bar"] is None:
                    if line is None:
                        line = tqdm(total=None, bar_format="{desc}", file=sys.stderr, leave=False, dynamic_ncols=True)
                    line.set_description_str(f"{_state['label']} … {time.monotonic() - t0:.1f} s")
                elif line is not None:
                    line.close()
                    line = None
            stop.wait(0.2)
        if line is not None:
            with _lock:
                line.close()

    th = threading.Thread(target=run, daemon=True)
    _state["thread"] = th
    th.start()
    try:
        yield
    finally:
        clear()
        _state.update(enabled=False, bar=None)


def clear() -> None:
    """Erase the status line now (before a command prints its own output while still inside ``status``)."""
    if _state.get("stop") is not None:
        _state["stop"].set()
        th = _state.get("thread")
        if th is not None:
            th.join(timeout=2)
        _state["stop"] = None


@contextmanager
def bar(total: int, desc: str, unit: str = "it") -> Iterator[Callback]:
    """A progress bar for a loop of ``total`` units; yields the callback to hand to the core (a no-op when
    progress is not drawn)."""
    if not _state["enabled"]:
        yield _noop
        return
    from tqdm import tqdm

    with _lock:
        b = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)
        _state["bar"] = b

    def update(done: int, total_: int, label: str = "") -> None:
        with _lock:
            if total_ != b.total:
                b.total = total_
            b.n = done
            if label:
                b.set_postfix_str(label, refresh=False)
            b.refresh()

    try:
        yield update
    finally:
        with _lock:
            b.close()
            _state["bar"] = None
