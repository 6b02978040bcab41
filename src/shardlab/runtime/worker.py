"""What every rank program does around its work: heartbeats, its error file, its result file, fault injection.

A rank writes into ``$SHARDLAB_RUN_DIR`` (set by ``shardlab.runtime.launch``):
- ``rank{r}.heartbeat.json``: ``{"seq", "phase", "time"}``, rewritten at every phase (``step 2 backward``);
  after a hang, the rank with the smallest ``seq`` is the one its peers waited for;
- ``rank{r}.error.json``: the exception the rank died of (one line);
- ``rank{r}.json``: its results.

Fault injection for tests and demos: ``SHARDLAB_FAULT=RANK:KIND[:PHASE]`` makes rank RANK ``raise``,
``hang`` (sleep for ever) or ``exit`` (os._exit(3)) at the first phase starting with PHASE.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


class RankRun:
    """Context manager for one rank's work; records phases and the exception that ends it, if any."""

    def __init__(self, rank: int, run_dir: str | None = None):
        self.rank = rank
        d = run_dir or os.environ.get("SHARDLAB_RUN_DIR")
        self.run_dir = Path(d) if d else None
        self.seq = 0
        self.phase = "start"
        self.fault = _parse_fault(os.environ.get("SHARDLAB_FAULT", ""))

    def _write(self, suffix: str, doc: dict) -> None:
        if self.run_dir is None:
            return
        p = self.run_dir / f"rank{self.rank}.{suffix}"
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(doc, default=_default))
        tmp.replace(p)

    def beat(self, phase: str) -> None:
        """Record that this rank reached ``phase``; injects the configured fault there."""
        self.seq += 1
        self.phase = phase
        self._write("heartbeat.json", {"rank": self.rank, "seq": self.seq, "phase": phase, "time": time.time()})
        f = self.fault
        if f and f[0] == self.rank and phase.startswith(f[2]):
            if f[1] == "raise":
                raise RuntimeError(f"injected fault at '{phase}' (SHARDLAB_FAULT)")
            if f[1] == "exit":
                os._exit(3)
            if f[1] == "hang":
                while True:
                    time.sleep(60)

    def result(self, doc: dict) -> None:
        """Write this rank's results (``rank{r}.json``)."""
        self._write("json", {"rank": self.rank, **doc})

    def __enter__(self) -> RankRun:
        self.beat("start")
        return self

    def __exit__(self, et, ev, tb) -> bool:
        if ev is not None and not isinstance(ev, SystemExit):
            msg = f"{et.__name__}: {str(ev).strip().splitlines()[0] if str(ev).strip() else ''}"
            self._write("error.json", {"rank": self.rank, "error": msg[:400], "phase": self.phase, "time": time.time()})
        return False


def _parse_fault(text: str) -> tuple[int, str, str] | None:
    if not text:
        return None
    parts = text.split(":", 2)
    kind = parts[1] if len(parts) > 1 else "raise"
    if kind not in ("raise", "hang", "exit"):
        kind = "raise"
    return int(parts[0]), kind, parts[2] if len(parts) > 2 else ""


def _default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def rank_main(args, run) -> None:
    """Run ``run(args, rank_run)`` for this rank (RANK from torchrun) inside a RankRun: heartbeats, and the
    result or the error written where the driver collects them."""
    with RankRun(int(os.environ.get("RANK", "0"))) as rr:
        rr.beat("init process group")
        rr.result(run(args, rr))
