"""Named experiments: several real training runs back to back, one results folder.

``scenarios`` holds the registry (data only), ``runner`` runs one and writes ``results.json``,
``results`` turns summaries into records, ratios and table rows, ``curves`` reads loss curves
from ``metrics.jsonl`` and ``figures`` draws them (matplotlib, imported only when drawing).
"""

from hopbus.experiments.scenarios import SCENARIOS, RunPlan, Scenario, get_scenario

__all__ = ["SCENARIOS", "RunPlan", "Scenario", "get_scenario"]
