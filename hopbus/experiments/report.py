"""results.json as Markdown: the table and the claims, for docs/results.md.

``python -m hopbus.experiments.report RESULTS_DIR [...]`` prints one section per results
folder, so the page's numbers are pasted from the command's output, never typed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hopbus.experiments.results import claim_cells
from hopbus.experiments.runner import RESULTS

#: The table's columns the page shows (results.json keeps them all).
SHOWN = ("group", "run", "spectral", "iter s", "vs ref", "acc", "target s", "wait s/it", "status")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table_markdown(results: dict[str, Any]) -> str:
    cols = results["table"]["columns"]
    keep = [cols.index(c) for c in SHOWN if c in cols]
    head = [cols[i] for i in keep]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += [
        "| " + " | ".join(_cell(row[i]) for i in keep) + " |" for row in results["table"]["rows"]
    ]
    return "\n".join(lines)


def claims_markdown(results: dict[str, Any]) -> str:
    lines = ["| held | claim | measured | needs | note |", "| --- | --- | --- | --- | --- |"]
    for c in results.get("claims") or []:
        held = {True: "yes", False: "**no**", None: "-"}[c["holds"]]
        measured, needs = claim_cells(c)
        lines.append(f"| {held} | {_cell(c['claim'])} | {measured} | {needs} | {c['note'] or ''} |")
    return "\n".join(lines)


def section(folder: Path) -> str:
    results = json.loads((folder / RESULTS).read_text())
    m = results["machine"]
    return "\n\n".join(
        [
            f"### `{results['scenario']}`",
            f"`{' '.join(results['command'])}` (hopbus {results['hopbus']}, "
            f"{results['started']} to {results['finished']}; {m['cpu_count']} CPUs, "
            f"Python {m['python']})",
            table_markdown(results),
            claims_markdown(results),
        ]
    )


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m hopbus.experiments.report RESULTS_DIR [...]", file=sys.stderr)
        return 2
    try:
        print("\n\n".join(section(Path(a)) for a in argv))
    except (OSError, ValueError, KeyError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
