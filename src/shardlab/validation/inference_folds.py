"""The serving validation's committed leave-one-source-out folds (``inference_crossval.json``), as the training
validation commits its folds (``crossval.yaml``): for each source with fitted rows, the rates and engine overheads
refitted without it (``inference_loso._fold``); the values for sources with no fitted row; and the refit on every
row. ``python benchmarks/fit_engines.py`` writes them after it refits the catalog's values; ``shardlab validate
--inference`` predicts each held-out source with its committed fold instead of refitting some twenty folds (about a
minute on two cores), where the file was written from the data files it reads now (a fingerprint of the catalog's
data and the published rows) and the catalog is the built-in one. Otherwise, and for a user catalog, it refits.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

FOLDS_FILE = Path(__file__).parent / "inference_crossval.json"
"""Where fit_engines.py writes the folds."""


def fingerprint() -> str:
    """sha256 of the data the serving fit reads: every catalog data file and the published serving rows."""
    from shardlab.catalog import DATA_DIR
    from shardlab.validation.inference import RUNS_FILE

    h = hashlib.sha256()
    for p in [*sorted(DATA_DIR.glob("*.yaml")), Path(RUNS_FILE)]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def runs_key(runs) -> str:
    """sha256 of the ids of the runs a fit saw (a caller's subset must not take folds fitted on all of them)."""
    return hashlib.sha256("\n".join(sorted(r.id for r in runs)).encode()).hexdigest()


def write(folds: dict, free: dict | None, refit: dict, runs, date: str, command: str, path: Path = FOLDS_FILE) -> None:
    """Write the folds ({source: {'rates', 'engines'}}), the values for sources without fitted rows and the refit,
    fitted on ``runs``."""
    doc = {"generated_by": command, "date": date, "fingerprint": fingerprint(), "runs": runs_key(runs),
           "refit": refit, "free": free, "folds": folds}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")


def _params(d, where: str):
    """A ``Params`` from {'rates': {generation: {field: share}}, 'engines': {engine: {field: µs}}}, every value a
    finite number, shares in (0, 1] and overheads positive; ValueError otherwise."""
    from shardlab.validation.inference import Params
    from shardlab.serving.engines import FITTED
    from shardlab.serving.rates import RATE_FIELDS

    if not isinstance(d, dict) or not isinstance(d.get("rates"), dict) or not isinstance(d.get("engines"), dict):
        raise ValueError(where)
    for table, fields, ok in ((d["rates"], RATE_FIELDS, lambda v: 0.0 < v <= 1.0),
                              (d["engines"], FITTED, lambda v: v > 0.0)):
        for vals in table.values():
            if not isinstance(vals, dict) or set(vals) != set(fields):
                raise ValueError(where)
            for v in vals.values():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
                    raise ValueError(where)
    return Params(d["rates"], d["engines"])


def covers(committed: dict, values) -> bool:
    """Every committed value set has the generations and engines ``values`` (the catalog's) has."""
    sets = [committed["refit"], *committed["folds"].values(), *([committed["free"]] if committed["free"] else [])]
    return all(set(values.rates) <= set(p.rates) and set(values.engines) <= set(p.engines) for p in sets)


def load(catalog, path: Path = FOLDS_FILE) -> dict | None:
    """The committed folds as ``Params`` ({'folds': {source: Params}, 'free': Params | None, 'refit': Params,
    'date'}) when they apply: the file exists, parses, was written from today's data files, and ``catalog`` is the
    built-in one. None otherwise (the caller refits)."""
    from shardlab.catalog import get_catalog

    if catalog is not get_catalog() or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(), parse_constant=_refuse)     # no NaN / Infinity
        if not isinstance(doc, dict) or doc.get("fingerprint") != fingerprint() or not isinstance(doc.get("folds"), dict):
            return None
        return {"folds": {str(s): _params(v, s) for s, v in doc["folds"].items()},
                "free": None if doc.get("free") is None else _params(doc["free"], "free"),
                "refit": _params(doc.get("refit"), "refit"), "runs": doc.get("runs"), "date": str(doc.get("date"))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None                               # unreadable or tampered: refit, as without the file


def _refuse(token: str):
    raise ValueError(f"non-finite number {token}")
