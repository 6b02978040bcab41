"""Search every valid layout for a model on a cluster, rank by an objective, and explain the choice."""
