"""The experiment registry: each scenario is data, a list of runs to do back to back.

A scenario names its runs as (group, label, settings): the group is what the runs are compared
under (a slowdown, a topology), the label says which run it is inside the group (usually the
mode), and the settings are TrainConfig field values. Settings are validated only when a run
starts, so a run whose mode this version does not know fails alone, recorded in results.json.
A run that needs an optional package (``needs``) is skipped, and says so, where it is missing.

A scenario also states what it must show (``Claim``): ratios of two runs' measures against a
threshold, the paper's figures scaled to one machine. They are benchmarks: results.json and the
table say whether each held, and nothing fails because one did not.

The paper's scenarios (Sec. 7.3) share one setting (``_paper``): softmax regression on the
bundled digits, real gradients, compute emulated by ``--iter-time``, 16 workers (8 with
``--quick``), and token queues of 10 so that a worker may run up to 10 iterations ahead of a
neighbour (the paper does not state its max_ig; 10 lets a jump of 10 happen and a 6x slow
iteration be absorbed). Adding a scenario is adding an entry to ``SCENARIOS``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from hopbus.errors import ConfigError
from hopbus.models.extras import install_hint


class RunPlan(NamedTuple):
    """One run of a scenario; ``group/label`` names its results folder. ``needs``: a module the
    run cannot do without (an optional extra), with the install hint shown when it is missing."""

    group: str
    label: str
    values: dict[str, Any]
    needs: tuple[str, str] | None = None


class Claim(NamedTuple):
    """A must-show figure: ``measure`` of run ``num`` divided by that of run ``den`` (each a
    (group, label)) compared by ``op`` to ``threshold``; ``op`` None only reports the ratio.

    ``measure``: ``iter`` (mean iteration time) or ``target`` (seconds to the target loss).
    ``every-run-ok`` claims are added to every scenario by ``results.claims``."""

    text: str
    measure: str
    num: tuple[str, str]
    den: tuple[str, str]
    op: str | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class Scenario:
    """``plans(quick)`` lists the runs; ``reference`` is the label of each group's run the
    others' iteration times are divided by (None: the group's first run)."""

    name: str
    description: str
    plans: Callable[[bool], list[RunPlan]]
    reference: str | None = None
    claims: tuple[Claim, ...] = ()

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


# -- the paper's setting, scaled to one machine ---------------------------------------------------


def _paper(quick: bool) -> dict[str, Any]:
    """Settings every paper scenario shares. ``--quick``: 8 workers instead of 16, 40
    iterations of 0.05 s instead of 200 of 0.1 s, and a target loss the short runs reach."""
    return {
        "model": "softmax",
        "data": "digits",
        "workers": 8 if quick else 16,
        "iter_time": 0.05 if quick else 0.1,
        "iterations": 40 if quick else 200,
        "eval_every": 5 if quick else 10,
        "target_loss": 0.5 if quick else 0.3,
        "max_ig": 10,
        "seed": 0,
    }


HOP_RULES: list[tuple[str, dict[str, Any]]] = [
    ("standard", {"mode": "standard"}),
    ("backup", {"mode": "backup", "backup": 1}),
    ("staleness", {"mode": "staleness", "staleness": 5}),
    ("hybrid", {"mode": "hybrid", "backup": 1, "staleness": 5}),
]
RANDOM_6X = "random:6"  # every worker 6x slower in an iteration with probability 1/n (Sec. 7.3.1)


def _random_slowdown(quick: bool) -> list[RunPlan]:
    # quick: the ring-based graph only, and only standard without slowdown
    out = []
    for graph in ["ring-based"] if quick else ["ring-based", "double-ring"]:
        for slow, slowdown in (("6x", RANDOM_6X), ("none", "none")):
            for label, own in HOP_RULES:
                if quick and slow == "none" and label != "standard":
                    continue
                values = {**_paper(quick), "topology": graph, "slowdown": slowdown, **own}
                out.append(RunPlan(f"{graph}-{slow}", label, values))
    return out


def _deterministic_slowdown(quick: bool) -> list[RunPlan]:
    # skipping runs on top of backup workers (Sec. 5): the jumper's neighbours go on without it
    base = {**_paper(quick), "topology": "ring-based"}
    runs = [
        ("standard", {"mode": "standard"}),
        ("backup", {"mode": "backup", "backup": 1}),
        ("skip-2", {"mode": "backup", "backup": 1, "skip_max": 2}),
        ("skip-10", {"mode": "backup", "backup": 1, "skip_max": 10}),
    ]
    return [
        *(
            RunPlan("one-4x", label, {**base, "slowdown": "fixed:4@0", **own})
            for label, own in runs
        ),
        RunPlan("none", "standard", {**base, "slowdown": "none", "mode": "standard"}),
    ]


MACHINES = (4, 2, 2)


def _topology(quick: bool) -> list[RunPlan]:
    # Each machine's link is shared by its edges to and from other machines: a transfer takes this
    # long per message on it (heterogeneity.py), 30% of an iteration's compute.
    base = {**_paper(quick), "workers": sum(MACHINES), "mode": "standard"}
    per_message_ms = round(base["iter_time"] * 300)
    sizes = ",".join(map(str, MACHINES))
    slowdown = f"machines:{sizes}@{per_message_ms}"
    return [
        RunPlan(f"machines-{sizes}", label, {**base, "topology": graph, "slowdown": slowdown})
        for label, graph in (
            ("ring-based", "ring-based"),
            ("hierarchical", f"hierarchical:{sizes}"),
        )
    ]


TORCH = ("torch", install_hint("bench"))


def _vs_allreduce(quick: bool) -> list[RunPlan]:
    base = {**_paper(quick), "topology": "ring-based"}
    runs = [
        ("allreduce", {"mode": "allreduce"}, TORCH),
        ("standard", {"mode": "standard"}, None),
        ("backup", {"mode": "backup", "backup": 1}, None),
    ]
    slowdowns = [("random-6x", RANDOM_6X)] + ([] if quick else [("none", "none")])
    return [
        RunPlan(group, label, {**base, "slowdown": slowdown, **own}, needs)
        for group, slowdown in slowdowns
        for label, own, needs in runs
    ]


def _vs_ps(quick: bool) -> list[RunPlan]:
    base = _paper(quick)
    return [
        RunPlan(group, label, {**base, "slowdown": slowdown, **own})
        for group, slowdown in (("homogeneous", "none"), ("heterogeneous", RANDOM_6X))
        for label, own in (
            ("ring-based", {"mode": "standard", "topology": "ring-based"}),
            ("ps-bsp", {"mode": "ps-bsp"}),
        )
    ]


# -- the paper's own setting for its CNN (Sec. 7.3.1) ----------------------------------------------

VGG11_BYTES = 36_902_440  # VGG-11's float32 parameters (9.2 million) in one snapshot
PAPER_MACHINES = "4,4,4,4"  # 16 workers on 4 machines, one shared link each


def _paper_cnn(quick: bool) -> list[RunPlan]:
    """16 workers on 4 emulated machines with 1 Gbit/s links, every update charged as a
    VGG-11 snapshot, 6x random slowdown, max_ig 10: the paper's CNN setting, whose messages
    cost about as much as a Compute. The model that really trains stays softmax on digits (its
    loss is real, the link time is the VGG-11 one). Compute is 1 s per iteration, VGG-11 on a
    quarter of a CPU machine's cores. ``--quick`` runs the same setting 5 times faster (0.2 s,
    5 Gbit/s: every ratio of compute to link time kept) for 100 iterations instead of 200.
    Ring all-reduce runs beside Hop: gloo's real transfer, then its links' time
    (``heterogeneity.ring_allreduce_s``) over the same links. Fig. 13's parameter server
    (BSP) runs on the same machines without slowdown, on a fifth machine of its own whose
    link carries all 16 pushes and all 16 replies."""
    scale = 5 if quick else 1
    base = {
        **_paper(False),
        "topology": "ring-based",
        "iter_time": 1.0 / scale,
        "iterations": 100 if quick else 200,
        "eval_every": 20,
        "target_loss": 0.5,
        "message_bytes": VGG11_BYTES,
    }
    links = f"machines:{PAPER_MACHINES}@0/{scale}Gbit"
    runs = [(label, own, None) for label, own in HOP_RULES]
    runs.append(("allreduce", {"mode": "allreduce"}, TORCH))  # links charged after gloo's ring
    out = [
        RunPlan(f"{scope}-6x", label, {**base, **own, "slowdown": f"{RANDOM_6X}+{links}",
                                        "slowdown_scope": scope}, needs)
        for scope in ("iteration", "compute")
        for label, own, needs in runs
    ]  # fmt: skip
    for label, mode in (("standard", "standard"), ("ps-bsp", "ps-bsp")):
        out.append(RunPlan("links-only", label, {**base, "mode": mode, "slowdown": links}))
    return out


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


def _faster(
    text: str, group: str, fast: str, slow: str, times: float, measure: str = "iter"
) -> Claim:
    """Run ``fast`` at least ``times`` times faster than run ``slow`` (``slow``'s measure over
    ``fast``'s); ``times`` 1 means strictly faster."""
    return Claim(text, measure, (group, slow), (group, fast), ">" if times == 1 else ">=", times)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "random-slowdown",
            "Fig. 12, 14-17: every worker 6x slower with probability 1/n each iteration; Hop's "
            "standard, backup (1), staleness (5) and hybrid rules on the ring-based and "
            "double-ring graphs, with and without slowdown",
            _random_slowdown,
            reference="standard",
            claims=(
                _faster(
                    "ring-based, 6x: backup's iterations >= 1.5x faster than standard's "
                    "(paper: up to 1.81x)",
                    "ring-based-6x",
                    "backup",
                    "standard",
                    1.5,
                ),
                _faster(
                    "ring-based, 6x: staleness's iterations >= 1.5x faster than standard's",
                    "ring-based-6x",
                    "staleness",
                    "standard",
                    1.5,
                ),
                _faster(
                    "ring-based, 6x: backup reaches the target loss sooner than standard",
                    "ring-based-6x",
                    "backup",
                    "standard",
                    1.0,
                    "target",
                ),
                _faster(
                    "ring-based, 6x: staleness reaches the target loss sooner than standard",
                    "ring-based-6x",
                    "staleness",
                    "standard",
                    1.0,
                    "target",
                ),
                Claim(
                    "ring-based: standard's iteration time with 6x slowdown / without",
                    "iter",
                    ("ring-based-6x", "standard"),
                    ("ring-based-none", "standard"),
                ),
            ),
        ),
        Scenario(
            "deterministic-slowdown",
            "Fig. 18, 19: one worker 4x slower on the ring-based graph; standard, backup (1), "
            "and backup with skipping at most 2 and at most 10 iterations per jump",
            _deterministic_slowdown,
            reference="standard",
            claims=(
                Claim(
                    "skip-10's iteration time within 1.3x of the run without slowdown "
                    "(paper: about 1.1x)",
                    "iter",
                    ("one-4x", "skip-10"),
                    ("none", "standard"),
                    "<=",
                    1.3,
                ),
                Claim(
                    "standard's iteration time / the run without slowdown (paper: 3.9x)",
                    "iter",
                    ("one-4x", "standard"),
                    ("none", "standard"),
                ),
                _faster(
                    "skip-10 reaches the target loss >= 2x sooner than standard "
                    "(paper: more than 2x)",
                    "one-4x",
                    "skip-10",
                    "standard",
                    2.0,
                    "target",
                ),
            ),
        ),
        Scenario(
            "topology",
            "Fig. 20, 21: 8 workers on 3 emulated machines (4, 2, 2) whose links are slow and "
            "shared; the ring-based graph vs the hierarchical one (complete inside a machine, a "
            "ring between machines), with their spectral gaps",
            _topology,
            reference="ring-based",
            claims=(
                _faster(
                    "hierarchical's iterations faster than ring-based's despite the smaller "
                    "spectral gap",
                    "machines-4,2,2",
                    "hierarchical",
                    "ring-based",
                    1.0,
                ),
                _faster(
                    "hierarchical reaches the target loss sooner than ring-based",
                    "machines-4,2,2",
                    "hierarchical",
                    "ring-based",
                    1.0,
                    "target",
                ),
            ),
        ),
        Scenario(
            "vs-allreduce",
            "the question users ask first: ring all-reduce (torch.distributed, gloo; the bench "
            "extra) vs Hop standard and backup on the ring-based graph, same model, data, "
            "compute and 6x random slowdown",
            _vs_allreduce,
            reference="allreduce",
            claims=(
                _faster(
                    "6x: Hop backup's iterations >= 1.5x faster than ring all-reduce's",
                    "random-6x",
                    "backup",
                    "allreduce",
                    1.5,
                ),
                _faster(
                    "6x: Hop backup reaches the target loss sooner than ring all-reduce",
                    "random-6x",
                    "backup",
                    "allreduce",
                    1.0,
                    "target",
                ),
            ),
        ),
        Scenario(
            "vs-ps",
            "Fig. 13: decentralized training on the ring-based graph vs a BSP parameter server, "
            "homogeneous and with 6x random slowdown",
            _vs_ps,
            reference="ps-bsp",
            claims=(
                _faster(
                    "homogeneous: ring-based reaches the target loss sooner than ps-bsp",
                    "homogeneous",
                    "ring-based",
                    "ps-bsp",
                    1.0,
                    "target",
                ),
                _faster(
                    "6x: ring-based reaches the target loss sooner than ps-bsp",
                    "heterogeneous",
                    "ring-based",
                    "ps-bsp",
                    1.0,
                    "target",
                ),
                Claim(
                    "heterogeneous ring-based reaches the target sooner than homogeneous "
                    "ps-bsp (the paper's Fig. 13)",
                    "target",
                    ("homogeneous", "ps-bsp"),
                    ("heterogeneous", "ring-based"),
                    ">",
                    1.0,
                ),
            ),
        ),
        Scenario(
            "paper-cnn",
            "Sec. 7.3.1 in the paper's own setting: 16 workers on 4 emulated machines with "
            "1 Gbit/s links, VGG-11-sized updates, 6x random slowdown of the whole iteration "
            "(--slowdown-scope iteration) and, beside it, of Compute only; standard, backup (1), "
            "staleness (5) and hybrid on the ring-based graph, ring all-reduce, and Fig. 13's "
            "BSP parameter server on the same links without slowdown",
            _paper_cnn,
            reference="standard",
            claims=(
                _faster(
                    "iteration scope: backup's iterations >= 1.75x faster than standard's "
                    "(paper: up to 1.81x)",
                    "iteration-6x",
                    "backup",
                    "standard",
                    1.75,
                ),
                _faster(
                    "iteration scope: staleness's iterations >= 1.75x faster than standard's",
                    "iteration-6x",
                    "staleness",
                    "standard",
                    1.75,
                ),
                Claim(
                    "compute scope: standard's iteration time / backup's",
                    "iter",
                    ("compute-6x", "standard"),
                    ("compute-6x", "backup"),
                ),
                Claim(
                    "compute scope: standard's iteration time / staleness's",
                    "iter",
                    ("compute-6x", "standard"),
                    ("compute-6x", "staleness"),
                ),
                Claim(
                    "iteration scope: standard reaches the target loss sooner than a "
                    "parameter server (BSP) without slowdown (the paper's Fig. 13)",
                    "target",
                    ("links-only", "ps-bsp"),
                    ("iteration-6x", "standard"),
                    ">",
                    1.0,
                ),
                _faster(
                    "iteration scope: backup's iterations faster than ring all-reduce's",
                    "iteration-6x",
                    "backup",
                    "allreduce",
                    1.0,
                ),
                Claim(
                    "iteration scope: standard's iteration time / with the links only",
                    "iter",
                    ("iteration-6x", "standard"),
                    ("links-only", "standard"),
                ),
            ),
        ),
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


__all__ = ["SCENARIOS", "Claim", "RunPlan", "Scenario", "get_scenario"]
