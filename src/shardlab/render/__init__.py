"""Rendering primitives at the bottom of the layers: text tables that fit the terminal, Mermaid diagrams, PNG plots.
They import nothing analytic, so every package may print with them (``shardlab.report`` holds the HTML pages)."""
