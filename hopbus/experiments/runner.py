"""Runs a scenario: every run through ``hopbus.runtime.launcher.train`` against one private
Redis, each in its own folder, then results.json and the figures.

A run that cannot start (a setting this version does not know) or fails is recorded and the
next one runs; a run whose optional package is missing is recorded as skipped. results.json is
rewritten after every run, so whatever stops the experiment
(Ctrl-C, a bug) leaves the runs done so far on disk; Ctrl-C also draws the figures of those.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import time
import warnings
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from hopbus import __version__
from hopbus.errors import ConfigError, UserError
from hopbus.experiments.results import claims, ratios, run_record, table
from hopbus.experiments.scenarios import RunPlan, Scenario
from hopbus.jsonout import dumps

RESULTS = "results.json"

OnStart = Callable[[int, int, RunPlan], None]
OnDone = Callable[[int, int, dict[str, Any]], None]
OnUpdate = Callable[[Any], None]  # the current run's Launcher, often (hopbus.cli.live.Display)


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }


def default_out(scenario: str) -> Path:
    return Path("runs") / f"{scenario}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_id_for(scenario: str, plan: RunPlan, index: int, pid: int) -> str:
    """``schemes-ps-bsp-random-6x-4242``: readable, unique within the experiment, and a valid
    run id (hopbus/coord/keys.py); the run's position replaces its names if they are too long."""
    rid = re.sub(r"[^A-Za-z0-9._-]", "-", f"{scenario}-{plan.label}-{plan.group}-{pid}")
    if len(rid) > 64:
        rid = re.sub(r"[^A-Za-z0-9._-]", "-", f"{scenario[:40]}-{index + 1}-{pid}")
    return rid.lstrip("._-") or f"run-{index + 1}-{pid}"


def _missing_package(plan: RunPlan) -> str | None:
    """Why ``plan`` is skipped: the package it needs is not installed (None: it is, or it
    needs none)."""
    if plan.needs is None or importlib.util.find_spec(plan.needs[0]) is not None:
        return None
    return f"{plan.needs[0]} is not installed ({plan.needs[1]})"


class Experiment:
    """One scenario's runs and their results folder."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        out: Path,
        quick: bool,
        only: list[str] | None,
        overrides: dict[str, Any],
        command: list[str],
    ) -> None:
        self.scenario = scenario
        self.plans = scenario.runs(quick, only)
        self.out = out
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ConfigError(f"--out {str(out)!r} already exists and is not empty: choose another")
        self.overrides = overrides
        self._refuse_if_no_run_can_start()
        self._on_update: OnUpdate | None = None
        self.results: dict[str, Any] = {
            "scenario": scenario.name,
            "description": scenario.description,
            "quick": quick,
            "only": only,
            "overrides": overrides,
            "command": command,
            "hopbus": __version__,
            "machine": machine(),
            "started": None,
            "finished": None,
            "interrupted": False,
            "reference": scenario.reference,
            "runs": [],
            "table": None,
            "ratios": None,
            "claims": None,
        }

    def _refuse_if_no_run_can_start(self) -> None:
        """Settings that no run of the scenario can take (a ``--set workers=4`` against its
        ``machines:`` of 8) are bad input: one line and status 2 before anything runs, not a
        results folder of failed runs. One bad run among good ones is recorded as it fails."""
        from hopbus.config import TrainConfig, make_config
        from hopbus.runtime.launcher import check_inputs

        first: str | None = None
        for plan in self.plans:
            if _missing_package(plan) is not None:
                continue  # skipped, not refused
            with warnings.catch_warnings():  # each run shows its own when it runs
                warnings.simplefilter("ignore")
                try:
                    check_inputs(
                        make_config({**plan.values, **self.overrides}, cls=TrainConfig),
                        load=False,
                    )
                except UserError as exc:
                    first = first or f"{plan.group}/{plan.label}: {exc}"
                    continue
            return  # one run can start
        if first is not None:
            raise ConfigError(
                f"no run of {self.scenario.name} can take these settings; first, {first}"
            )

    @property
    def runs(self) -> list[dict[str, Any]]:
        return self.results["runs"]

    def run(
        self,
        on_start: OnStart | None = None,
        on_done: OnDone | None = None,
        on_update: OnUpdate | None = None,
    ) -> dict[str, Any]:
        """Every run in order; returns the results object (also in results.json).
        ``on_update`` is called with the current run's launcher while it runs."""
        self._on_update = on_update
        from hopbus.coord.broker import EmbeddedRedis

        self.out.mkdir(parents=True, exist_ok=True)
        self.results["started"] = _now()
        try:
            with EmbeddedRedis() as server:
                for i, plan in enumerate(self.plans):
                    if on_start is not None:
                        on_start(i, len(self.plans), plan)
                    self.runs.append(self._one(i, plan, server.url))
                    self.write()
                    if on_done is not None:
                        on_done(i, len(self.plans), self.runs[-1])
        except KeyboardInterrupt:
            self.results["interrupted"] = True
            self.finish(figures=True)
            raise
        except BaseException:
            self.finish(figures=False)  # keep what was done; the error speaks for itself
            raise
        self.finish(figures=True)
        return self.results

    def _one(self, index: int, plan: RunPlan, url: str) -> dict[str, Any]:
        """One run, recorded; a run that Ctrl-C cut short is recorded before the interrupt
        goes on."""
        from hopbus.config import TrainConfig, make_config
        from hopbus.runtime.launcher import train

        folder = self.out / plan.group / plan.label
        run_id = run_id_for(self.scenario.name, plan, index, os.getpid())
        config = summary = failure = skipped = None
        t0 = time.monotonic()

        def record(caught: list[warnings.WarningMessage]) -> dict[str, Any]:
            return run_record(
                plan,
                run_id=run_id,
                folder=folder.relative_to(self.out).as_posix(),
                config=config,
                summary=summary,
                failure=failure,
                warnings=list(dict.fromkeys(str(w.message) for w in caught)),
                elapsed_s=time.monotonic() - t0,
                skipped=skipped,
            )

        skipped = _missing_package(plan)
        if skipped is not None:
            return record([])

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                cfg = make_config({**plan.values, **self.overrides}, cls=TrainConfig)
                config = cfg.public()
                _, outcome = train(
                    cfg, run=run_id, out=folder, redis_url=url, on_update=self._on_update
                )
                summary, failure = outcome.summary, outcome.failure
            except KeyboardInterrupt:
                failure = "interrupted"
                self.runs.append(record(seen))
                raise
            except UserError as exc:
                failure = str(exc)
        return record(seen)

    def finish(self, *, figures: bool) -> None:
        """Ratios, table, the figures when asked, and results.json."""
        rat = ratios(self.runs, self.scenario.reference)
        self.results["ratios"] = rat
        self.results["table"] = table(self.runs, rat)
        self.results["claims"] = claims(self.scenario.claims, self.runs)
        self.results["finished"] = _now()
        if figures and self.runs:
            from hopbus.experiments.figures import write_figures

            self.results["figures"] = [p.name for p in write_figures(self.results, self.out)]
        self.write()

    def write(self) -> None:
        text = dumps(self.results, indent=2)
        (self.out / RESULTS).write_text(text + "\n")


__all__ = ["RESULTS", "Experiment", "default_out", "machine", "run_id_for"]
