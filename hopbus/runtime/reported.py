"""The figures a worker reports (losses, accuracies, an evaluation's pair), checked where
they are written, by the rule their readers apply (coord/read.accuracy): a figure a writer let
through and the progress reader refused made every later step of that worker look forged.
One place for a script's ``log``/``finish``, an ``evaluate`` it hands ``start``, and the
evaluations of hopbus's own workers (the Hop loop, a parameter server, WAGMA and PS workers)."""

from __future__ import annotations

import math
from typing import Any

from hopbus.coord import read
from hopbus.errors import UserError


class UsageError(UserError):
    """The session's calls in an order the protocol cannot follow, or figures no reader
    takes (a bug in the caller)."""


def figure(call: str, name: str, value: Any) -> float | None:
    """A loss or accuracy the caller reports, as a float (a numpy scalar too), or one line
    naming the call; an accuracy is a fraction in [0, 1] (NaN passes: it is written as null)."""
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{call}: {name} must be a number, not {type(value).__name__}") from None
    except OverflowError:  # an integer beyond any float (10**400)
        raise UsageError(f"{call}: {name} is an integer beyond any float's range") from None
    if "accuracy" in name and not read.accuracy(x):
        percent = f" (a percentage? give {x / 100:g})" if 1.0 < x <= 100.0 else ""
        raise UsageError(f"{call}: {name} {x:g} is not a fraction in [0, 1]{percent}")
    return x


def scored(got: Any) -> tuple[float | None, float | None]:
    """An evaluation's (test loss, accuracy), checked: any pair (a tuple, a list, an array or
    a tensor of two), each a number or None (not measured). An accuracy of 5 (labels of the
    wrong shape, a percentage) is one line naming evaluate()."""
    try:
        loss, accuracy = got
    except (TypeError, ValueError):
        raise UsageError(
            f"evaluate(): returned {type(got).__name__}, not (loss, accuracy)"
        ) from None
    return figure("evaluate()", "loss", loss), figure("evaluate()", "accuracy", accuracy)


def entry_figures(got: Any) -> dict[str, float]:
    """An evaluation as a progress entry's ``eval_loss`` and ``eval_accuracy`` (``scored``;
    one not measured as NaN, which the entry's readers take and show as null)."""
    loss, accuracy = scored(got)
    nan = math.nan
    return {
        "eval_loss": nan if loss is None else loss,
        "eval_accuracy": nan if accuracy is None else accuracy,
    }


__all__ = ["UsageError", "entry_figures", "figure", "scored"]
