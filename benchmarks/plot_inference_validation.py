"""Draw docs/img/inference-validation.png: every target measurement of `shardlab validate --inference` against its
leave-one-source-out prediction, one colour per family (engine version × GPU generation).

    python benchmarks/plot_inference_validation.py      # about a minute (the leave-one-source-out refits)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from shardlab.catalog import get_catalog  # noqa: E402
from shardlab.render.plots import serving_predicted_vs_measured  # noqa: E402
from shardlab.validation.inference_loso import validate  # noqa: E402


def main() -> int:
    d = validate(get_catalog())
    out = serving_predicted_vs_measured(d["rows"], str(ROOT / "docs" / "img" / "inference-validation.png"))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
