"""Cost before launch: the price catalog (``prices``) and the arithmetic (``estimate``).

``shardlab cost`` turns a plan (time to train) or GPUs × hours into dollars; ``shardlab guard`` and
``shardlab ledger`` (``shardlab.guard``, ``shardlab.ledger``) enforce and record a budget.
"""

from shardlab.cost.estimate import CostEstimate, cost_estimate, fmt_hours, fmt_usd, sentence
from shardlab.cost.prices import Price, PriceEntry, price_table, resolve_price

__all__ = ["CostEstimate", "Price", "PriceEntry", "cost_estimate", "fmt_hours", "fmt_usd", "price_table",
           "resolve_price", "sentence"]
