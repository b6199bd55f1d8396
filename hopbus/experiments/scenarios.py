"""The experiment registry: each scenario is data, a list of runs to do back to back.

A scenario names its runs as (group, label, settings): the group is what the runs are compared
under (a slowdown, a topology), the label says which run it is inside the group (usually the
mode), and the settings are TrainConfig field values. Settings are validated only when a run
starts, so a run whose mode this version does not know fails alone, recorded in results.json.
Adding a scenario is adding an entry to ``SCENARIOS``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from hopbus.errors import ConfigError


class RunPlan(NamedTuple):
    """One run of a scenario; ``group/label`` names its results folder."""

    group: str
    label: str
    values: dict[str, Any]


@dataclass(frozen=True)
class Scenario:
    """``plans(quick)`` lists the runs; ``reference`` is the label of each group's run the
    others' iteration times are divided by (None: the group's first run)."""

    name: str
    description: str
    plans: Callable[[bool], list[RunPlan]]
    reference: str | None = None

    def runs(self, quick: bool, only: Iterable[str] | None = None) -> list[RunPlan]:
        """The runs in order, restricted to the labels in ``only`` when it is given."""
        plans = self.plans(quick)
        seen = {(p.group, p.label) for p in plans}
        assert len(seen) == len(plans), f"scenario {self.name}: a group repeats a label"
        if only is None:
            return plans
        wanted = list(dict.fromkeys(only))
        labels = list(dict.fromkeys(p.label for p in plans))
        unknown = [x for x in wanted if x not in labels]
        if unknown or not wanted:
            raise ConfigError(
                f"--only {','.join(unknown) or '(empty)'}: scenario {self.name} has no such run; "
                f"its runs: {', '.join(labels)}"
            )
        return [p for p in plans if p.label in wanted]


# -- schemes ----------------------------------------------------------------------------------

SCHEME_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("standard", {"mode": "standard", "topology": "ring-based"}),
    ("backup", {"mode": "backup", "backup": 1, "topology": "ring-based"}),
    ("ps-bsp", {"mode": "ps-bsp"}),
    ("ps-ssp", {"mode": "ps-ssp", "staleness": 3}),
    ("ps-asp", {"mode": "ps-asp"}),
    ("ps-backup", {"mode": "ps-backup", "backup": 1}),
    ("ps-elastic", {"mode": "ps-elastic", "lookahead": 15}),
    ("wagma", {"mode": "wagma", "group_size": 4, "sync_period": 10}),
]
SCHEME_SLOWDOWNS = [("random-6x", "random:6"), ("straggler-4x", "fixed:4@0")]


def _schemes(quick: bool) -> list[RunPlan]:
    # Same workers and iterations everywhere, so per-iteration times compare across runs.
    common = {
        "model": "softmax",
        "data": "digits",
        "workers": 8,
        "iter_time": 0.02 if quick else 0.05,
        "iterations": 60 if quick else 200,
        "eval_every": 20,
        "target_loss": 0.5,
        "seed": 0,
    }
    return [
        RunPlan(group, label, {**common, "slowdown": slowdown, **own})
        for group, slowdown in SCHEME_SLOWDOWNS
        for label, own in SCHEME_RUNS
    ]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "schemes",
            "every synchronization scheme side by side under 6x random slowdown and under one "
            "4x deterministic straggler (8 workers, softmax on digits)",
            _schemes,
            reference="ps-bsp",
        ),
    ]
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ConfigError(
            f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)} (hopbus experiment --list)"
        ) from None


__all__ = ["SCENARIOS", "RunPlan", "Scenario", "get_scenario"]
