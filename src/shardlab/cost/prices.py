"""The price catalog: USD per GPU-hour per (accelerator, provider), each with its date and source.

Built-in prices live in ``catalog/data/prices.yaml``; a user file given with ``--catalog FILE`` adds or
overrides entries in a ``prices:`` section of the same schema (``Catalog.prices`` holds those sections
raw; this module parses them). ``--price P`` replaces the catalog altogether for one call.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from functools import lru_cache

from shardlab.errors import ShardlabError, did_you_mean, field_name

DEFAULT_PROVIDER = "default"
_REQUIRED = {"on_demand", "date", "source"}
_OPTIONAL = {"spot", "estimate", "notes"}


@dataclass(frozen=True)
class PriceEntry:
    """One catalog row: what one provider charges for one accelerator."""

    accelerator: str
    """Accelerator id (as in ``shardlab gpus``)."""
    provider: str
    """Provider id, e.g. 'aws', 'runpod-secure', or 'default'."""
    on_demand_usd_per_gpu_hour: float
    """On-demand price, USD per GPU-hour."""
    spot_usd_per_gpu_hour: float | None
    """Spot (interruptible) price, USD per GPU-hour, where known."""
    date: str
    """When the price was seen, as precisely as the source allows."""
    source: str
    """Where the price was seen."""
    estimate: bool = False
    """True when the figure is inferred (e.g. a chosen midpoint), not a quoted price."""
    notes: str = ""
    """Caveats (ranges, what the rate includes)."""
    origin: str = "prices.yaml"
    """The file the entry came from."""


@dataclass(frozen=True)
class Price:
    """The price used for one cost: a catalog entry resolved to on-demand or spot, or a given price."""

    usd_per_gpu_hour: float
    """USD per GPU-hour."""
    kind: str
    """'on-demand', 'spot', 'community cloud' (--spot where only a community cloud is listed) or 'given' (--price)."""
    provider: str | None
    """Provider id, None for a given price."""
    date: str | None
    """Date of the catalog entry, None for a given price."""
    source: str
    """One line naming where the figure comes from (file, entry, source, date)."""
    estimate: bool
    """True when the figure is inferred rather than quoted."""

    def to_dict(self) -> dict:
        return {"usd_per_gpu_hour": self.usd_per_gpu_hour, "kind": self.kind, "provider": self.provider,
                "date": self.date, "source": self.source, "estimate": self.estimate}


def _number(where: str, name: str, key: str, v: object) -> float:
    import math

    from shardlab.limits import MAX_PRICE_USD_PER_GPU_HOUR, MIN_USD

    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
            or not MIN_USD <= v <= MAX_PRICE_USD_PER_GPU_HOUR:
        raise ShardlabError(f"{where}: price '{name}' field '{key}' must be a number of USD per GPU-hour from "
                            f"{MIN_USD:g} (the --price flag's floor) to {MAX_PRICE_USD_PER_GPU_HOUR:,.0f}, got {v!r}; "
                            f"fix the file")
    return float(v)


def entry_from_dict(acc: str, provider: str, d: object, where: str) -> PriceEntry:
    """Build a PriceEntry from a catalog mapping (strict keys, positive prices, a date and a source)."""
    name = f"{acc}/{provider}"
    if not isinstance(d, dict):
        raise ShardlabError(f"{where}: price '{name}' must be a mapping with {sorted(_REQUIRED)}, got "
                            f"{type(d).__name__}")
    unknown = set(d) - _REQUIRED - _OPTIONAL
    if unknown:
        raise ShardlabError(f"{where}: price '{name}' has unknown field(s) {sorted(unknown)}; "
                            f"allowed: {sorted(_REQUIRED | _OPTIONAL)}")
    missing = _REQUIRED - set(d)
    if missing:
        raise ShardlabError(f"{where}: price '{name}' is missing {sorted(missing)}; "
                            f"every price needs on_demand (USD per GPU-hour), a date and a source")
    date = d["date"]
    if isinstance(date, (datetime.date, datetime.datetime)):
        date = date.isoformat()
    if not str(date or "").strip() or not str(d["source"] or "").strip():
        raise ShardlabError(f"{where}: price '{name}' needs a non-empty date and source")
    if not isinstance(d.get("estimate", False), bool):
        raise ShardlabError(f"{where}: price '{name}' field 'estimate' must be true or false")
    spot = d.get("spot")
    return PriceEntry(accelerator=acc, provider=provider,
                      on_demand_usd_per_gpu_hour=_number(where, name, "on_demand", d["on_demand"]),
                      spot_usd_per_gpu_hour=None if spot is None else _number(where, name, "spot", spot),
                      date=str(date), source=str(d["source"]), estimate=bool(d.get("estimate", False)),
                      notes=str(d.get("notes") or ""), origin=where)


def parse_prices(section: object, where: str, accelerator_ids) -> dict[tuple[str, str], PriceEntry]:
    """Parse one ``prices:`` mapping {accelerator: {provider: entry}}; accelerator ids must be known."""
    if not isinstance(section, dict):
        raise ShardlabError(f"{where}: 'prices' must map accelerator ids to providers")
    out: dict[tuple[str, str], PriceEntry] = {}
    known = set(accelerator_ids)
    seen_acc: set[str] = set()
    for acc, providers in section.items():
        acc = str(acc).lower()
        if acc in seen_acc:          # ids are case-insensitive: 'H100-SXM' and 'h100-sxm' would silently merge
            raise ShardlabError(f"{where}: prices list accelerator '{acc}' twice (ids ignore case); keep one")
        seen_acc.add(acc)
        if acc not in known:
            raise ShardlabError(f"{where}: prices for unknown accelerator '{acc}'{did_you_mean(acc, known)}; "
                                f"use an id from `shardlab gpus` or add the accelerator in the same file")
        if not isinstance(providers, dict) or not providers:
            raise ShardlabError(f"{where}: prices for '{acc}' must map provider ids to entries, "
                                f"e.g. {acc}: {{default: {{on_demand: 2.0, date: 2026-01-01, source: my quote}}}}")
        for provider, d in providers.items():
            provider = str(provider).lower()
            if (acc, provider) in out:
                raise ShardlabError(f"{where}: prices for '{acc}' list provider '{provider}' twice (ids ignore case); "
                                    f"keep one")
            out[(acc, provider)] = entry_from_dict(acc, provider, d, where)
    return out


@lru_cache(maxsize=2)
def _builtin_prices() -> dict[tuple[str, str], PriceEntry]:
    from shardlab.catalog import DATA_DIR, _builtin, load_yaml

    # the built-in accelerators only: prices.yaml must not depend on a user's files
    return parse_prices(load_yaml(DATA_DIR / "prices.yaml") or {}, "prices.yaml", _builtin().accelerators)


def price_table(catalog) -> dict[tuple[str, str], PriceEntry]:
    """Built-in prices overridden by the ``prices:`` sections of the user's catalog files (later wins)."""
    table = dict(_builtin_prices())
    for where, section in catalog.prices:
        table.update(parse_prices(section, where, catalog.accelerators))
    return table


def entries_for(table: dict[tuple[str, str], PriceEntry], accelerator: str) -> list[PriceEntry]:
    """The entries of one accelerator: the default first, then by on-demand price."""
    rows = [e for (a, _), e in table.items() if a == accelerator]
    return sorted(rows, key=lambda e: (e.provider != DEFAULT_PROVIDER, e.on_demand_usd_per_gpu_hour, e.provider))


def describe(entry: PriceEntry, spot: bool) -> str:
    """One line for ``price_source``: file, entry, kind, date and source."""
    kind = "spot" if spot else "on-demand"
    tag = "; an estimate (inferred, not quoted)" if entry.estimate else ""
    return f"{entry.origin}: {entry.accelerator}/{entry.provider} {kind}, {entry.date}, {entry.source}{tag}"


COMMUNITY_SUFFIX = "-community"
"""Providers whose id ends so are community clouds (hosts renting out their own machines: RunPod Community Cloud):
cheaper, less reliable capacity that --spot counts with the interruptible offers."""


def interruptible(rows: list[PriceEntry]) -> Price | None:
    """--spot without --provider, when the default lists no spot rate: the cheapest interruptible-class rate among the
    providers, a spot price or a community cloud's, named as such (None when there is neither)."""
    offers = [(e.spot_usd_per_gpu_hour, True, e) for e in rows if e.spot_usd_per_gpu_hour is not None]
    offers += [(e.on_demand_usd_per_gpu_hour, False, e) for e in rows
               if e.provider.endswith(COMMUNITY_SUFFIX) and e.on_demand_usd_per_gpu_hour is not None]
    if not offers:
        return None
    value, is_spot, e = min(offers, key=lambda o: o[0])
    kind = "spot" if is_spot else "community cloud"
    why = ("; the cheapest spot or community-cloud rate listed for this GPU (the default entry has no spot rate)")
    return Price(value, kind, e.provider, e.date, describe(e, is_spot).replace(" on-demand,", " community cloud,") + why,
                 e.estimate)


def resolve_price(catalog, gpu: str | None, *, provider: str | None = None, spot: bool = False,
                  given_usd_per_gpu_hour: float | None = None) -> Price:
    """The price for ``gpu``: ``--price`` if given, else the catalog entry for ``provider`` (default:
    'default', or the only provider listed), on-demand or ``spot``. Errors name the fix."""
    if given_usd_per_gpu_hour is not None:
        if not given_usd_per_gpu_hour > 0:
            raise ShardlabError(f"--price must be a positive number of USD per GPU-hour, got {given_usd_per_gpu_hour}")
        if provider or spot:
            raise ShardlabError("--price replaces the catalog: drop --provider/--spot, or drop --price to use the "
                                "catalog")
        return Price(given_usd_per_gpu_hour, "given", None, None, "given with --price", False)
    if not gpu:
        raise ShardlabError(f"no price: name the GPU with {field_name('cluster.gpu')} (see `shardlab gpus`) or give "
                            "--price USD_PER_GPU_HOUR")
    acc = catalog.accelerator(gpu).id
    rows = entries_for(price_table(catalog), acc)
    if not rows:
        raise ShardlabError(f"no price for '{acc}' in the price catalog; pass --price USD_PER_GPU_HOUR, "
                            f"or add a 'prices:' entry for it with --catalog FILE")
    by_provider = {e.provider: e for e in rows}
    if spot and provider is None and (DEFAULT_PROVIDER not in by_provider
                                      or by_provider[DEFAULT_PROVIDER].spot_usd_per_gpu_hour is None):
        cheap = interruptible(rows)
        if cheap is not None:
            return cheap
    if provider is None:
        if DEFAULT_PROVIDER in by_provider:
            provider = DEFAULT_PROVIDER
        elif len(rows) == 1:
            provider = rows[0].provider
        else:
            raise ShardlabError(f"several providers price '{acc}' and none is 'default'; choose one with --provider "
                                f"({', '.join(sorted(by_provider))})")
    provider = provider.lower()
    if provider not in by_provider:
        raise ShardlabError(f"no price for '{acc}' from provider '{provider}'{did_you_mean(provider, by_provider)}; "
                            f"providers for {acc}: {', '.join(sorted(by_provider))}")
    e = by_provider[provider]
    if spot and e.spot_usd_per_gpu_hour is None:
        with_spot = sorted(p for p, x in by_provider.items() if x.spot_usd_per_gpu_hour is not None)
        hint = f"providers with a spot price for {acc}: {', '.join(with_spot)}" if with_spot else f"no provider lists a spot price for {acc}"
        raise ShardlabError(f"'{provider}' lists no spot price for '{acc}' ({hint}); choose --provider, drop --spot, "
                            "or give --price")
    value = e.spot_usd_per_gpu_hour if spot else e.on_demand_usd_per_gpu_hour
    return Price(value, "spot" if spot else "on-demand", e.provider, e.date, describe(e, spot), e.estimate)
