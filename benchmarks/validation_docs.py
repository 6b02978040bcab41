"""Rewrite the generated tables of docs/validation.md (and the plot) from `shardlab validate`'s current results.

Run after `python benchmarks/fit_step_model.py` (which refits the efficiencies and the leave-one-source-out folds):
    python benchmarks/validation_docs.py
tests/test_validation.py fails when the committed page differs from a fresh rendering.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from shardlab.catalog import get_catalog
    from shardlab.validation import compare, load_runs
    from shardlab.validation.markdown import blocks, render_into
    from shardlab.validation.report import loso_comparisons

    cat = get_catalog()
    runs = load_runs()
    ins, loso = compare(runs, cat), loso_comparisons(runs, cat)
    page = ROOT / "docs" / "validation.md"
    page.write_text(render_into(page.read_text(), blocks(ins, loso)))
    print(f"rewrote the generated tables of {page.relative_to(ROOT)}")
    import contextlib
    import io

    from shardlab.cli import main as cli

    with contextlib.redirect_stdout(io.StringIO()):
        code = cli(["validate", "--plot", str(ROOT / "docs" / "img" / "validation.png"), "--json"])
    print("redrew docs/img/validation.png" if code == 0 else "plot not redrawn (matplotlib missing?)")


if __name__ == "__main__":
    main()
