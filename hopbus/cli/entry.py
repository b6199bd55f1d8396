"""The console script's target. Imports nothing heavy itself, so that a Ctrl-C while typer,
numpy and networkx are still loading ends quietly like one at any later moment."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from hopbus.cli.main import main as run
    except KeyboardInterrupt:
        print("hopbus: interrupted", file=sys.stderr)
        sys.exit(130)
    run()
