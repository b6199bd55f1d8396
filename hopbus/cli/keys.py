"""``hopbus keys generate``: a run's ZeroMQ CURVE key set, for ``--curve DIR``.

Prints which files it wrote and where they must go, never a key: the output of a command ends
up in terminals' scrollback, CI logs and support tickets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hopbus.cli.commands import app

keys_app = typer.Typer(
    help="ZeroMQ CURVE keys that encrypt a run's data plane and keep out processes without "
    "them (--curve DIR); see docs/security.md.",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def generate_cmd(
    folder: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            help="Folder to write the key set to (created if missing). Refused if it already "
            "holds one: new keys would lock a running run's own workers out.",
            show_default=False,
        ),
    ],
) -> None:
    """Write a new CURVE key set for `--curve DIR`: server.key and server.key_secret (every
    worker's inbox serves with them), client.key and client.key_secret (every process sends
    with them).

    Give the same folder to `hopbus train --curve DIR` (or `hopbus create --curve DIR`), and a
    copy of it to every `hopbus worker` and `hopbus ps` of the run (--curve DIR or
    HOPBUS_CURVE): a process without these keys cannot send anything to the run's workers.
    The *_secret files are written readable by their owner only; copy them only to the
    run's machines, over a secure channel. No key is ever printed.
    """
    from hopbus.transport.curve import generate

    written = generate(folder)
    for path in written:
        print(f"hopbus: wrote {path}")
    print(
        "hopbus: copy the folder to every machine of the run only (the *_secret files are "
        f"secrets: mode 0600), then: hopbus train --curve {folder}, or hopbus worker --curve "
        "DIR / HOPBUS_CURVE=DIR on each node"
    )
