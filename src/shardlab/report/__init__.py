"""Rendering helpers: text tables, plots, diagrams."""
