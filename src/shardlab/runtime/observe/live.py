"""The launcher's live view: scrape every rank once a second, redraw one row per rank and a progress bar.

Runs in a thread of the launcher while torchrun runs. Drawn only on a terminal (stderr is a TTY) and not
under --json; without a terminal it still scrapes, so the run's document can say what the endpoints
served. Rows come from the Prometheus text each rank serves, parsed like a server would.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from shardlab.runtime.observe.scrape import Scrape, scrape

BAR_WIDTH = 30


def progress_bar(done: float, total: float, width: int = BAR_WIDTH) -> str:
    """'[#######.......]  70/100 steps (70%)'"""
    frac = min(max(done / total, 0.0), 1.0) if total else 0.0
    filled = int(round(frac * width))
    return f"[{'#' * filled}{'.' * (width - filled)}] {int(done)}/{int(total)} steps ({frac:.0%})"


def _per_step(now: Scrape, before: Scrape | None, name: str) -> float | None:
    """Average of counter ``name`` per step between two scrapes (or since the start)."""
    steps, total = now.value("shardlab_steps_total"), now.value(name)
    if steps is None or total is None:
        return None
    if before is not None and before.ok:
        s0, t0 = before.value("shardlab_steps_total") or 0.0, before.value(name) or 0.0
        if steps > s0:
            return (total - t0) / (steps - s0)
    return total / steps if steps else None


def rank_row(now: Scrape, before: Scrape | None) -> dict:
    """What one rank's live row shows (seconds per step over the last scrape interval)."""
    return {"rank": now.label("rank"), "node": now.label("node"), "steps": now.value("shardlab_steps_total"),
            "planned": now.value("shardlab_steps_planned"),
            "step_s": _per_step(now, before, "shardlab_step_seconds_sum"),
            "tokens_per_s": now.value("shardlab_tokens_per_second"), "loss": now.value("shardlab_loss"),
            "coll_s": _per_step(now, before, "shardlab_collective_seconds_total"),
            "blocked_s": _per_step(now, before, "shardlab_collective_blocked_seconds_total"),
            "wait_s": _per_step(now, before, "shardlab_step_wait_seconds_total"),
            "rss_bytes": now.value("shardlab_memory_bytes", category="process_rss"),
            "gpu_util": now.value("shardlab_gpu_utilization_ratio")}


def render(rows: list[dict], title: str) -> str:
    from shardlab.render.table import table
    from shardlab.units import fmt_bytes, fmt_time

    t = lambda v: "-" if v is None else fmt_time(v)
    body = [[r["rank"], r["node"], "-" if r["steps"] is None else int(r["steps"]), t(r["step_s"]),
             "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}",
             "-" if r["loss"] is None else f"{r['loss']:.4f}", t(r["blocked_s"]), t(r["wait_s"]),
             "-" if not r["rss_bytes"] else fmt_bytes(r["rss_bytes"]),
             "-" if r["gpu_util"] is None else f"{r['gpu_util']:.0%}"] for r in rows]
    slow = slow_rank(rows)
    for r, row in zip(rows, body):
        row.append("<- slowest" if slow is not None and r["rank"] == slow else "")
    done = min((r["steps"] or 0 for r in rows), default=0)
    planned = max((r["planned"] or 0 for r in rows), default=0)
    return "\n".join([title, progress_bar(done, planned),
                      table(["rank", "node", "step", "step time", "tokens/s", "loss", "in collectives", "waiting",
                             "RSS", "GPU", ""], body)])


def slow_rank(rows: list[dict]):
    """The rank whose own time over the last interval (step time minus waiting for others) is over the straggler
    threshold (10%) above the other ranks' median, else None: the live table marks it."""
    from shardlab.runtime.observe.summary import STRAGGLER_THRESHOLD

    own = {r["rank"]: r["step_s"] - (r["wait_s"] or 0.0) for r in rows if r["step_s"] is not None}
    if len(own) < 2:
        return None
    rank = max(own, key=own.get)
    rest = sorted(v for k, v in own.items() if k != rank)
    mid = rest[len(rest) // 2] if len(rest) % 2 else (rest[len(rest) // 2 - 1] + rest[len(rest) // 2]) / 2
    return rank if mid > 0 and own[rank] > (1 + STRAGGLER_THRESHOLD) * mid else None


class LiveView(threading.Thread):
    """Scrapes the endpoints (``endpoints.json`` when the ranks published it, else this node's ports)."""

    def __init__(self, endpoints: list[tuple[str, int]], run_dir: Path, stream=None, interval_s: float = 1.0,
                 title: str = "shardlab live"):
        super().__init__(daemon=True, name="shardlab-live")
        self.endpoints, self.run_dir, self.stream = list(endpoints), Path(run_dir), stream
        self.interval_s, self.title = interval_s, title
        self.last: dict[str, Scrape] = {}
        self.ok_scrapes: dict[str, int] = {}
        self.max_steps: dict[str, float] = {}
        self._halt = threading.Event()
        self._drawn = 0

    def _refresh_endpoints(self) -> None:
        f = self.run_dir / "endpoints.json"
        try:
            eps = json.loads(f.read_text())
            self.endpoints = [(e["host"], int(e["port"])) for e in eps if e]
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def poll(self) -> list[dict]:
        """One round of scrapes; returns the rows of the endpoints that answered."""
        self._refresh_endpoints()
        rows = []
        for host, port in self.endpoints:
            s = scrape(host, port, timeout_s=min(1.0, self.interval_s))
            if not s.ok:
                continue
            before = self.last.get(s.url)
            self.last[s.url] = s
            self.ok_scrapes[s.url] = self.ok_scrapes.get(s.url, 0) + 1
            self.max_steps[s.url] = max(self.max_steps.get(s.url, 0.0), s.value("shardlab_steps_total") or 0.0)
            rows.append(rank_row(s, before))
        return sorted(rows, key=lambda r: int(r["rank"] or 0))

    def _draw(self, text: str) -> None:
        if self.stream is None:
            return
        if self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")  # back to the first line of the last frame, clear below
        self.stream.write(text + "\n")
        self.stream.flush()
        self._drawn = text.count("\n") + 1

    def run(self) -> None:
        while not self._halt.is_set():
            rows = self.poll()
            if rows:
                self._draw(render(rows, f"{self.title} · {len(rows)} rank(s) · {time.strftime('%H:%M:%S')}"))
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        """Stop scraping and erase the last frame (the run's summary follows on stdout)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        if self._drawn and self.stream is not None:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self.stream.flush()
            self._drawn = 0

    def report(self) -> dict:
        """What the endpoints served over the run: successful scrapes and the last step count seen, per URL."""
        return {"endpoints": [f"{h}:{p}" for h, p in self.endpoints],
                "scrapes_ok": dict(self.ok_scrapes), "max_steps_seen": dict(self.max_steps)}
