"""hopbus experiment's results table in a narrow terminal: columns are left out (and named),
a number is never cut short."""

from __future__ import annotations

import io

from rich.console import Console

from hopbus.cli.experiment import _show_table

COLUMNS = [
    "group", "run", "spectral", "iter s", "p50 s", "vs ref", "loss", "acc", "target s",
    "wall s", "wait s/it", "status", "counters",
]  # fmt: skip
ROWS = [
    ["machines-4,2,2", "ring-based", "0.500", "0.1836", "0.1839", "1.00x (ref)", "0.1700",
     "0.964", "12.85", "36.82", "0.0818", "ok", "versions=100 applied_gradients=1600"],
    ["machines-4,2,2", "hierarchical", "0.189", "0.1017", "0.1015", "0.55x", "0.1723",
     "0.962", "7.13", "20.35", "0.0000", "ok", "-"],
]  # fmt: skip


def _shown(width: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    _show_table(
        console, {"scenario": "t", "runs": ROWS, "table": {"columns": COLUMNS, "rows": ROWS}}
    )
    return out.getvalue()


def test_a_narrow_terminal_leaves_columns_out_and_cuts_no_number():
    for width in (80, 100, 140):
        text = _shown(width)
        assert max(len(line) for line in text.splitlines()) <= width
        for cell in ("0.1836", "0.1017", "1.00x (ref)", "12.85", "7.13", "status", "hierarchical"):
            assert cell in text, (width, cell)
    assert "not shown, too narrow: spectral, p50 s, loss, wall s, wait s/it, counters" in (
        " ".join(_shown(80).split())
    )
    wide = _shown(300)
    assert "not shown" not in wide and "applied_gradients=1600" in wide
