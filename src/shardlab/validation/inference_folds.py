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


def write(folds: dict, free: dict | None, refit: dict, date: str, command: str, path: Path = FOLDS_FILE) -> None:
    """Write the folds ({source: {'rates', 'engines'}}), the values for sources without fitted rows and the refit."""
    doc = {"generated_by": command, "date": date, "fingerprint": fingerprint(), "refit": refit, "free": free,
           "folds": folds}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def load(catalog, path: Path = FOLDS_FILE) -> dict | None:
    """The committed folds as ``Params`` ({'folds': {source: Params}, 'free': Params | None, 'refit': Params,
    'date'}) when they apply: the file exists, parses, was written from today's data files, and ``catalog`` is the
    built-in one. None otherwise (the caller refits)."""
    from shardlab.catalog import get_catalog
    from shardlab.validation.inference import Params

    if catalog is not get_catalog() or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        if doc.get("fingerprint") != fingerprint():
            return None
        mk = lambda d: None if d is None else Params(d["rates"], d["engines"])  # noqa: E731
        return {"folds": {s: mk(v) for s, v in doc["folds"].items()}, "free": mk(doc.get("free")),
                "refit": mk(doc["refit"]), "date": doc.get("date")}
    except (OSError, ValueError, KeyError, TypeError):
        return None
