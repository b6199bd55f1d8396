"""What results.json says about the runs: one record per run, the ratios to each group's
reference run, the table rows and the scenario's claims. Pure functions of the summaries, so
``hopbus plot`` and the tests can rebuild them from a results.json alone."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from typing import Any

from hopbus.experiments.scenarios import Claim, RunPlan
from hopbus.jsonout import finite
from hopbus.modes import HOP_MODES

#: The table's columns, in order; the rows hold strings, ready to print.
COLUMNS = (
    "group",
    "run",
    "spectral",
    "iter s",
    "p50 s",
    "vs ref",
    "loss",
    "acc",
    "target s",
    "wall s",
    "wait s/it",
    "status",
    "counters",
)


def run_record(
    plan: RunPlan,
    *,
    run_id: str,
    folder: str,
    config: dict[str, Any] | None,
    summary: dict[str, Any] | None,
    failure: str | None,
    warnings: list[str],
    elapsed_s: float,
    skipped: str | None = None,
) -> dict[str, Any]:
    """One run in results.json: its settings (``config``: the full TrainConfig when it could
    be built, else the settings asked for), the summary's key figures, what went wrong, and
    why it did not run (``skipped``: an optional package missing)."""
    s = summary or {}
    times = s.get("iter_time_s") or {}
    topo = s.get("topology") or {}
    rec: dict[str, Any] = {
        "label": plan.label,
        "group": plan.group,
        "mode": (config or plan.values).get("mode"),
        "run_id": run_id,
        "folder": folder,
        "config": config if config is not None else plan.values,
        "iter_time_s": {
            "mean": times.get("mean"),
            "p50": times.get("p50"),
            "per_worker": times.get("per_worker"),
        },
        "topology": topo.get("name"),
        "spectral_gap": topo.get("spectral_gap") if _decentralized(config or plan.values) else None,
        "final_loss": s.get("final_loss"),
        "final_accuracy": s.get("final_accuracy"),
        "time_to_target": s.get("time_to_target"),
        "wall_s": s.get("wall_s"),
        "violations": s.get("violations"),
        "finished": s.get("finished", False),
        "failure": failure,
        "skipped": skipped,
        "warnings": warnings,
        "elapsed_s": elapsed_s,
    }
    for extra in ("scheme", "waiting"):  # the baselines' own counters, when they report them
        if isinstance(s.get(extra), dict):
            rec[extra] = s[extra]
    return finite(rec)


def _decentralized(config: dict[str, Any]) -> bool:
    """Whether the run averages over its graph (a Hop mode): only then is the graph's spectral
    gap the run's (the related schemes report the complete graph they are planned on)."""
    return config.get("mode", "standard") in HOP_MODES


def mean_iter_time(run: dict[str, Any]) -> float | None:
    """A run's mean iteration time, or None if it failed or has none."""
    mean = (run.get("iter_time_s") or {}).get("mean")
    ok = ran(run) and isinstance(mean, int | float) and mean > 0
    return float(mean) if ok else None


def ran(run: dict[str, Any]) -> bool:
    """Whether the run ran to its end (not failed, not skipped)."""
    return run.get("failure") is None and run.get("skipped") is None


def time_to_target(run: dict[str, Any]) -> float | None:
    """Seconds until the workers' mean test loss reached the target, None if it never did."""
    t = run.get("time_to_target")
    return float(t) if ran(run) and isinstance(t, int | float) and t >= 0 else None


def ratios(runs: list[dict[str, Any]], reference: str | None) -> dict[str, dict[str, Any]]:
    """Per group: each run's mean iteration time over the reference run's. The reference is
    the run labelled ``reference`` when it succeeded, else the group's first run that did
    (``reference`` in the answer says which); None for runs without a time, and for a run
    with nothing to be compared with (the only timed run of its group: ``--only``)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(r["group"], []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for group, members in groups.items():
        timed = [r for r in members if mean_iter_time(r) is not None]
        preferred = [r for r in timed if r["label"] == reference]
        ref = (preferred or timed or [None])[0] if len(timed) > 1 else None
        base = mean_iter_time(ref) if ref is not None else None
        out[group] = {
            "reference": ref["label"] if ref is not None else None,
            "mean_iter_time": {
                r["label"]: (t / base if (t := mean_iter_time(r)) is not None and base else None)
                for r in members
            },
        }
    return out


def _num(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _numbers(block: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in block.items():
        if isinstance(v, dict):  # the scheme's own "counters" are shown without a prefix
            out += _numbers(v, prefix if k == "counters" else f"{prefix}{k}.")
        elif isinstance(v, int | float) and not isinstance(v, bool) and v != 0:
            out.append(f"{prefix}{k}={v if isinstance(v, int) else format(v, '.3g')}")
    return out


def counters(run: dict[str, Any]) -> str:
    """The scheme's numeric counters other than 0, compactly: ``barriers=30 held=4 ...``
    (results.json keeps them all)."""
    return " ".join(_numbers(run.get("scheme") or {})) or "-"


def wait_per_iteration(run: dict[str, Any]) -> float | None:
    """Seconds a worker waited per iteration, from the summary's ``waiting`` when present."""
    v = (run.get("waiting") or {}).get("per_iteration_s")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def status(run: dict[str, Any]) -> str:
    """``ok``, ``failed``, ``skipped`` or ``N violations`` (a Table 1 bound broken: a bug)."""
    if run.get("failure") is not None:
        return "failed"
    if run.get("skipped") is not None:
        return "skipped"
    return f"{run['violations']} violations" if run.get("violations") else "ok"


def table(runs: list[dict[str, Any]], rat: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{"columns": COLUMNS, "rows": [[str, ...], ...]}``, one row per run, in run order:
    test loss and accuracy at the end, seconds to ``target_loss``, training seconds, and
    waiting per iteration."""
    rows = []
    for r in runs:
        g = rat.get(r["group"], {})
        ratio = g.get("mean_iter_time", {}).get(r["label"])
        vs = _num(ratio, ".2f") + ("x" if ratio is not None else "")
        if ratio is not None and g.get("reference") == r["label"]:
            vs += " (ref)"
        times = r.get("iter_time_s") or {}
        rows.append(
            [
                r["group"],
                r["label"],
                _num(r.get("spectral_gap"), ".3f"),
                _num(times.get("mean"), ".4f"),
                _num(times.get("p50"), ".4f"),
                vs,
                _num(r.get("final_loss"), ".4f"),
                _num(r.get("final_accuracy"), ".3f"),
                _num(r.get("time_to_target"), ".2f"),
                _num(r.get("wall_s"), ".2f"),
                _num(wait_per_iteration(r), ".4f"),
                status(r),
                counters(r),
            ]
        )
    return {"columns": list(COLUMNS), "rows": rows}


MEASURES = {
    "iter": ("mean iteration time", mean_iter_time),
    "target": ("time to target", time_to_target),
}
OPS = {">": operator.gt, ">=": operator.ge, "<=": operator.le, "<": operator.lt}


def _find(runs: list[dict[str, Any]], key: tuple[str, str]) -> dict[str, Any] | None:
    return next((r for r in runs if (r["group"], r["label"]) == key), None)


def judge(claim: Claim, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A claim's ratio and whether it held: ``holds`` None when a run it needs is missing,
    failed or skipped. A run that never reached the target loss is infinitely slow to it."""
    name, measure = MEASURES[claim.measure]
    num, den = _find(runs, claim.num), _find(runs, claim.den)
    out: dict[str, Any] = {
        "claim": claim.text,
        "measure": name,
        "ratio_of": ["/".join(claim.num), "/".join(claim.den)],
        "op": claim.op,
        "threshold": claim.threshold,
        "value": None,
        "holds": None,
        "note": None,
    }
    for key, run in ((claim.num, num), (claim.den, den)):
        if run is None or not ran(run):
            out["note"] = f"{'/'.join(key)} {'did not run' if run is None else status(run)}"
            return out
    assert num is not None and den is not None
    a, b = measure(num), measure(den)
    if b is None:
        out["note"] = f"{'/'.join(claim.den)}: no {name}"
        return out
    if a is None:  # the slower run never got there: faster by any ratio
        out["note"] = f"{'/'.join(claim.num)} never reached the target loss"
        out["value"] = math.inf
    else:
        out["value"] = a / b
    if claim.op is not None and claim.threshold is not None:
        out["holds"] = bool(OPS[claim.op](out["value"], claim.threshold))
    return out


def claim_cells(c: dict[str, Any]) -> tuple[str, str]:
    """A judged claim's "measured" and "needs" as printed: ``1.43x`` and ``>= 1.5x``. A ratio
    is shown with as many decimals as it takes for the printed number to agree with the
    verdict (1.4996 is ``1.4996x``, not a ``1.50x`` that did not hold)."""
    value, op, threshold = c["value"], c["op"], c["threshold"]
    needs = "-" if op is None else f"{op} {threshold:g}" + ("" if op == "==" else "x")
    if value is None or not math.isfinite(value):
        return ("never" if "never reached" in (c.get("note") or "") else "-"), needs
    if op == "==":
        return f"{value}", needs
    digits = 2
    if op in OPS and threshold is not None and c["holds"] is not None:
        while digits < 6 and OPS[op](round(value, digits), threshold) != c["holds"]:
            digits += 1
    return f"{value:.{digits}f}x", needs


def claims(scenario_claims: Iterable[Claim], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every claim judged, then one more every scenario makes: every run that ran broke no
    Table 1 bound (0 violations) and finished."""
    out = [judge(c, runs) for c in scenario_claims]
    done = [r for r in runs if ran(r)]
    bad = [f"{r['group']}/{r['label']}" for r in done if r.get("violations") or not r["finished"]]
    out.append(
        {
            "claim": "every run: 0 violations of the Table 1 bounds, finished",
            "measure": "violations",
            "ratio_of": None,
            "op": "==",
            "threshold": 0,
            "value": len(bad) if done else None,
            "holds": not bad if done else None,
            "note": ", ".join(bad) or (None if done else "no run ran"),
        }
    )
    return out


__all__ = [
    "COLUMNS",
    "claim_cells",
    "claims",
    "counters",
    "judge",
    "mean_iter_time",
    "ran",
    "ratios",
    "run_record",
    "status",
    "table",
    "time_to_target",
    "wait_per_iteration",
]
