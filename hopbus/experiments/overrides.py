"""``--set KEY=VALUE``: one setting changed for every run of an experiment (fewer workers for a
quick look, another model), checked once before any run starts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hopbus.config import SIM_ONLY, TrainConfig, make_config
from hopbus.errors import ConfigError


def settable() -> list[str]:
    """The settings of a real run, as ``--set`` takes them."""
    return [f for f in TrainConfig.model_fields if f not in SIM_ONLY]


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["iterations=20", "max-ig=3"]`` -> ``{"iterations": 20, "max_ig": 3}``, each value
    validated as its TrainConfig field and given back in its JSON form."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set iterations=20")
        if key not in settable():
            raise ConfigError(
                f"--set {key}: not a setting of a real run; settings: {', '.join(settable())}"
            )
        cfg = make_config({key: value.strip()}, {key: "--set"}, TrainConfig)
        out[key] = cfg.public()[key]
    return out


__all__ = ["parse_overrides", "settable"]
