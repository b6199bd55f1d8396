"""Human-readable views of reports and summaries (rich). JSON output never goes through here."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

INF = "∞"

#: Show the W matrix and every worker's neighbours only for graphs this small.
MATRIX_LIMIT = 12
NEIGHBOUR_LIMIT = 32


def _bound(v: float | None) -> str:
    return INF if v is None else str(v)


def topology(console: Console, rep: dict[str, Any]) -> None:
    n = rep["workers"]
    console.print(
        f"[bold]{rep['name']}[/]: {n} workers, {rep['edges']} directed edges (self-loops not "
        f"counted), diameter {rep['diameter']}"
    )
    ds = "yes" if rep["doubly_stochastic"] else "[yellow]no[/] (rows of W do not sum to 1)"
    console.print(
        f"spectral gap |λ1|-|λ2| of W: {rep['spectral_gap']:.4f}; doubly stochastic: {ds}"
    )

    nb = Table(title="Neighbours (self-loop not shown)", title_justify="left")
    nb.add_column("worker", justify="right")
    nb.add_column("receives from (N_in)")
    nb.add_column("sends to (N_out)")
    rows = rep["neighbours"]
    shown = rows if n <= NEIGHBOUR_LIMIT else [*rows[:8], None, *rows[-8:]]
    for r in shown:
        if r is None:
            nb.add_row("…", "…", "…")
        else:
            nb.add_row(str(r["worker"]), " ".join(map(str, r["in"])), " ".join(map(str, r["out"])))
    console.print(nb)

    if n <= MATRIX_LIMIT:
        wt = Table(
            title="W (row i, column j: share of i's parameters in j's average)",
            title_justify="left",
        )
        wt.add_column("")
        for j in range(n):
            wt.add_column(str(j), justify="right")
        for i, row in enumerate(rep["W"]):
            wt.add_row(str(i), *(f"{x:.3f}" if x else "·" for x in row))
        console.print(wt)

    bt = Table(title="Table 1: upper bounds on Iter(i) - Iter(j)", title_justify="left")
    bt.add_column("setting")
    bt.add_column("j in N_in(i)", justify="right")
    bt.add_column("j in N_out(i)", justify="right")
    bt.add_column("any pair", justify="right")
    for b in rep["bounds"]:
        bt.add_row(
            b["setting"],
            _bound(b["in_neighbour"]),
            _bound(b["out_neighbour"]),
            _bound(b["any_pair"]),
        )
    console.print(bt)


def _describe_mode(cfg: dict[str, Any]) -> str:
    mode = cfg["mode"]
    parts = []
    if mode in ("backup", "hybrid"):
        parts.append(f"N_buw={cfg['backup']}")
    if mode in ("staleness", "hybrid"):
        parts.append(f"s={cfg['staleness']}")
    parts.append(f"max_ig={cfg['max_ig']}" if cfg["max_ig"] else "no token queues")
    if cfg["skip_max"] >= 2:
        parts.append(f"skip ≤{cfg['skip_max']} when >{cfg['skip_trigger']} behind")
    return f"{mode} ({', '.join(parts)})"


def summary(console: Console, s: dict[str, Any]) -> None:
    cfg = s["config"]
    it = s["iter_time_s"]
    unit = "virtual s" if s["virtual"] else "s"
    console.print(
        f"[bold]{s['workers']} workers[/], {cfg['topology']}, {_describe_mode(cfg)}, "
        f"slowdown {cfg['slowdown']}, {cfg['iterations']} iterations"
    )
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="dim")
    t.add_column()
    status = (
        "finished"
        if s["finished"]
        else ("[red]DEADLOCKED[/]" if s.get("deadlocked") else "[yellow]stopped early[/]")
    )
    t.add_row(
        "status",
        f"{status} after {s['wall_s']:.2f} {unit}"
        + (f" (simulated in {s['runtime_s']:.2f} s)" if s["virtual"] else ""),
    )
    per = [p for p in it["per_worker"] if p is not None]
    if it["mean"] is not None:
        t.add_row(
            "iteration time",
            f"mean {it['mean']:.3f} {unit}, p50 {it['p50']:.3f}, "
            f"slowest worker {max(per):.3f}, fastest {min(per):.3f}",
        )
    t.add_row("iterations", f"min {s['iterations']['min']}, max {s['iterations']['max']}")
    g, b = s["max_gap"], s["gap_bound"]
    viol = s["violations"]
    vtext = "[green]0[/]" if viol == 0 else f"[red]{viol}[/]"
    t.add_row(
        "iteration gap",
        f"adjacent {g['adjacent']} (Table 1 bound {_bound(b['adjacent'])}), "
        f"any pair {g['any_pair']} (bound {_bound(b['any_pair'])}); violations {vtext}",
    )
    qb = s.get("update_queue_bound")
    t.add_row(
        "update queue",
        f"largest {s['max_update_queue']} updates held"
        + (f" (bound {qb})" if qb is not None else ""),
    )
    t.add_row(
        "traffic",
        f"{s['messages']} updates sent, {s['sends_skipped']} not sent (the receiver "
        f"was done with them), {s['stale_dropped']} dropped as stale",
    )
    if cfg["skip_max"] >= 2:
        t.add_row("jumps", f"{s['jumps']} jumps over {s['skipped_iterations']} iterations")
    console.print(t)
