"""Real heterogeneity from CPU quotas: four worker containers train the cnn with real compute
(no --iter-time), one of them with a quarter of the others' CPU quota.

Each run is a compose stack printed by ``hopbus compose generate --class fast:3:F --class
slow:1:S`` and run as the README runs one (``docker compose -f FILE run --build --rm watch``);
its results folder is copied out of the stack's volume, and the stack is taken down with its
volumes. The runs: standard, backup (1), backup with skipping (at most 10 per jump,
--max-ig 10) and ring all-reduce (``--mode allreduce``: the image needs PyTorch, EXTRAS=tf,bench
and a CPU torch wheel in workers/wheels/), plus standard with four equal containers as the
pace without a slow worker. Writes OUT/results.json in the form of ``hopbus experiment``
(``python -m hopbus.experiments.report OUT`` prints the table) with its figures, and prints
JSON: per run the mean iteration time, the fast and the slow workers' iteration times, the
time to the target loss, accuracy and violations.

    python benchmarks/containers.py --out runs/containers

Needs a Docker engine with the compose plugin, and the images' base (BASE_IMAGE, REDIS_IMAGE
in the environment, e.g. hopbus-base:bookworm from compose/base-image.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hopbus.experiments.results import claims, ratios, run_record, table
from hopbus.experiments.runner import RESULTS, machine
from hopbus.experiments.scenarios import Claim, RunPlan

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose"
PROJECT = "hopbus-hetero"


def plans(args: argparse.Namespace) -> list[RunPlan]:
    common = {
        "model": "cnn",
        "data": "digits",
        "iterations": args.iterations,
        "lr": 0.05,
        "eval_every": 10,
        "target_loss": args.target_loss,
        "seed": 0,
    }
    quarter = f"fast:3:{args.fast_cpus}+slow:1:{args.fast_cpus / 4:g}"
    even = f"fast:4:{args.fast_cpus}"
    runs = [
        ("quarter-cpu", "standard", quarter, {"mode": "standard"}),
        ("quarter-cpu", "backup", quarter, {"mode": "backup", "backup": 1}),
        (
            "quarter-cpu",
            "backup-skip",
            quarter,
            {"mode": "backup", "backup": 1, "skip_max": 10, "max_ig": 10},
        ),
        ("quarter-cpu", "allreduce", quarter, {"mode": "allreduce"}),
        ("even-cpu", "standard", even, {"mode": "standard"}),
    ]
    return [
        RunPlan(group, label, {**common, **values, "classes": classes})
        for group, label, classes, values in runs
        if args.only is None or f"{group}/{label}" in args.only
    ]


def generate(values: dict[str, Any]) -> str:
    flags: list[str] = []
    for spec in values["classes"].split("+"):
        flags += ["--class", spec]
    for key, value in values.items():
        if key != "classes":
            flags += ["--" + key.replace("_", "-"), str(value)]
    # on this host: generating a file needs neither TensorFlow nor PyTorch (the image has them)
    p = subprocess.run(
        [sys.executable, "-m", "hopbus", "compose", "generate", *flags],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return p.stdout


def build() -> None:
    """The worker image, as the stacks build it (BASE_IMAGE, EXTRAS from the environment)."""
    compose(COMPOSE / "docker-compose.yml", "build", "init", check=True)


def compose(file: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    env = {**os.environ, "COMPOSE_PROJECT_NAME": PROJECT}
    check = kw.pop("check", False)
    return subprocess.run(
        ["docker", "compose", "-f", str(file), *args], env=env, text=True, check=check, **kw
    )


def one(plan: RunPlan, out: Path) -> dict[str, Any]:
    folder = out / plan.group / plan.label
    t0 = time.monotonic()
    file = COMPOSE / f".hetero-{os.getpid()}.yml"
    file.write_text(generate(plan.values))
    summary = failure = None
    run_id = ""
    try:
        p = compose(file, "run", "--build", "--rm", "watch", capture_output=True, timeout=1800)
        folder.mkdir(parents=True)
        (folder / "compose.log").write_text(p.stderr + compose(file, "logs").stdout)
        lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
        if lines:
            summary = json.loads(lines[-1])
        if p.returncode != 0:
            failure = f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"
        with tempfile.TemporaryDirectory() as tmp:
            compose(file, "cp", "init:/home/hopbus/runs", tmp, capture_output=True)
            for got in Path(tmp, "runs").glob("*"):
                run_id = got.name
                shutil.copytree(got, folder, dirs_exist_ok=True)
    finally:
        compose(file, "down", "--volumes", capture_output=True)
        file.unlink()
    config = (summary or {}).get("config")
    rec = run_record(
        plan, run_id=run_id, folder=folder.relative_to(out).as_posix(), config=config,
        summary=summary, failure=failure, warnings=[], elapsed_s=time.monotonic() - t0,
    )  # fmt: skip
    rec["classes"] = plan.values["classes"]
    return rec


def worker_times(out: Path, rec: dict[str, Any]) -> dict[str, Any]:
    """Seconds per iteration of each worker from metrics.jsonl (first to last entry)."""
    first: dict[int, tuple[float, int]] = {}
    last: dict[int, tuple[float, int]] = {}
    for line in (out / rec["folder"] / "metrics.jsonl").read_text().splitlines():
        e = json.loads(line)
        w, t, k = e.get("worker"), e.get("t"), e.get("iter")
        if w is None or t is None or k is None:
            continue
        first.setdefault(w, (t, k))
        last[w] = (t, k)
    return {
        str(w): round((last[w][0] - first[w][0]) / max(1, last[w][1] - first[w][1]), 4)
        for w in sorted(first)
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/containers"))
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--target-loss", type=float, default=0.2)
    ap.add_argument("--fast-cpus", type=float, default=0.4, help="CPU quota of a fast worker")
    ap.add_argument("--only", nargs="*", help="GROUP/LABEL of the runs to make")
    args = ap.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        print(f"containers.py: --out {args.out} is not empty", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    command = ["python", "benchmarks/containers.py", *sys.argv[1:]]
    results: dict[str, Any] = {
        "scenario": "containers",
        "description": "4 worker containers, cnn on digits with real compute; quarter-cpu: "
        "one container has a quarter of the others' CPU quota",
        "command": command,
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "reference": "standard",
        "runs": [],
    }
    build()
    for plan in plans(args):
        print(f"containers.py: {plan.group}/{plan.label} ...", file=sys.stderr, flush=True)
        rec = one(plan, args.out)
        if rec["failure"] is None:
            rec["worker_iter_s"] = worker_times(args.out, rec)
        results["runs"].append(rec)
        (args.out / RESULTS).write_text(json.dumps(results, indent=2) + "\n")
    rat = ratios(results["runs"], "standard")
    wanted = [
        Claim(
            "quarter CPU: backup with skipping iterates faster than standard",
            "iter", ("quarter-cpu", "backup-skip"), ("quarter-cpu", "standard"), "<", 1.0,
        ),
        Claim(
            "quarter CPU: backup with skipping iterates faster than ring all-reduce",
            "iter", ("quarter-cpu", "backup-skip"), ("quarter-cpu", "allreduce"), "<", 1.0,
        ),
    ]  # fmt: skip
    results.update(
        ratios=rat,
        table=table(results["runs"], rat),
        claims=claims(tuple(wanted), results["runs"]),
        finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        hopbus="0.1.0",
    )
    from hopbus.experiments.figures import write_figures

    results["figures"] = [p.name for p in write_figures(results, args.out)]
    (args.out / RESULTS).write_text(json.dumps(results, indent=2) + "\n")
    print(
        json.dumps(
            [
                {
                    "run": f"{r['group']}/{r['label']}",
                    "classes": r["classes"],
                    "iter_s": r["iter_time_s"]["mean"],
                    "worker_iter_s": r.get("worker_iter_s"),
                    "time_to_target_s": r["time_to_target"],
                    "final_accuracy": r["final_accuracy"],
                    "violations": r["violations"],
                    "failure": r["failure"],
                }
                for r in results["runs"]
            ],
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
