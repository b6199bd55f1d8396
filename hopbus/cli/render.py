"""Human-readable views of reports and summaries (rich). JSON output never goes through here.

Summaries are plain aligned lines, printed without wrapping, so piping them into a file or a
pager gives the same text a terminal shows.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hopbus.coord.keys import named_keys
from hopbus.models.custom import SCRIPT

INF = "∞"

#: Show the W matrix only for graphs this small, every worker's neighbours only up to this many.
MATRIX_LIMIT = 10
NEIGHBOUR_LIMIT = 32


def _escaped(obj: Any) -> Any:
    """``obj`` with every string in it (keys too) escaped for rich's markup: what the views
    below show comes from Redis, a script's error, a user's file, and a '[/x]' in it must
    print as itself, neither raise MarkupError nor style (or link) the terminal. The views'
    own styles are written in their f-strings, after this."""
    if isinstance(obj, str):
        return escape(obj)
    if isinstance(obj, dict):
        return {_escaped(k): _escaped(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_escaped(v) for v in obj)
    return obj


def _bound(v: float | None) -> str:
    return INF if v is None else str(v)


def _known(v: Any) -> str:
    """A figure that may not exist yet (no worker has a counter): '-', never Python's None."""
    return "-" if v is None else str(v)


def _line(console: Console, text: str) -> None:
    console.print(text, soft_wrap=True, highlight=False)


def topology(console: Console, rep: dict[str, Any]) -> None:
    rep = _escaped(rep)
    n = rep["workers"]
    _line(
        console,
        f"[bold]{rep['name']}[/]: {n} workers, {rep['edges']} directed edges "
        f"(self-loops not counted), diameter {rep['diameter']}",
    )
    ds = "yes" if rep["doubly_stochastic"] else "[yellow]no[/] (rows of W do not sum to 1)"
    gap = rep["spectral_gap"]
    gap_text = "not computed for this many workers" if gap is None else f"{gap:.4f}"
    _line(console, f"spectral gap |λ1|-|λ2| of W: {gap_text}; doubly stochastic: {ds}")

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
        w = [[0.0] * n for _ in range(n)]
        for i, j, x in rep["W"]:
            w[i][j] = x
        wt = Table(
            title="W (row i, column j: share of i's parameters in j's average)",
            title_justify="left",
        )
        wt.add_column("")
        for j in range(n):
            wt.add_column(str(j), justify="right")
        for i, row in enumerate(w):
            wt.add_row(str(i), *(f"{x:.2f}" if x else "·" for x in row))
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


_SCHEME_KNOBS = {
    "ps-bsp": (),
    "ps-ssp": ("staleness",),
    "ps-asp": (),
    "ps-backup": ("backup",),
    "ps-elastic": ("lookahead",),
    "wagma": ("group_size", "sync_period"),
    "allreduce": (),
}


def _describe_mode(cfg: dict[str, Any]) -> str:
    mode = cfg["mode"]
    if mode in _SCHEME_KNOBS:
        where = "parameter server" if mode.startswith("ps-") else "no server"
        knobs = ", ".join(f"{k}={cfg[k]}" for k in _SCHEME_KNOBS[mode])
        return f"{where}, {mode}" + (f" ({knobs})" if knobs else "")
    parts = []
    if mode in ("backup", "hybrid"):
        parts.append(f"N_buw={cfg['backup']}")
    if mode in ("staleness", "hybrid"):
        parts.append(f"s={cfg['staleness']}")
    parts.append(f"max_ig={cfg['max_ig']}" if cfg["max_ig"] else "no token queues")
    if cfg["skip_max"] >= 2:
        parts.append(f"skip ≤{cfg['skip_max']} when >{cfg['skip_trigger']} behind")
    return f"{mode} ({', '.join(parts)})"


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _unused(s: dict[str, Any]) -> str:
    """Why arrived updates went unused: with bounded staleness (Fig. 9 takes a sender's newest
    only) a newer one from the same sender replaces the one held, which is most of them."""
    mode = (s.get("config") or {}).get("mode")
    if mode in ("staleness", "hybrid"):
        return "superseded by a newer one from the same sender, or older than needed"
    return "older than the receiver still needed"


def summary(console: Console, s: dict[str, Any]) -> None:
    s = _escaped(s)
    cfg = s["config"]
    it = s["iter_time_s"]
    unit = "virtual s" if s["virtual"] else "s"
    _line(
        console,
        f"[bold]{s['workers']} workers[/], "
        + (f"{cfg['topology']}, " if cfg["mode"] not in _SCHEME_KNOBS else "")
        + f"{_describe_mode(cfg)}, "
        f"slowdown {cfg['slowdown']}, {cfg['iterations']} iterations",
    )
    rows: list[tuple[str, str]] = []
    status = (
        "finished"
        if s["finished"]
        else ("[red]DEADLOCKED[/]" if s.get("deadlocked") else "[yellow]stopped early[/]")
    )
    rows.append(
        (
            "status",
            f"{status} after {s['wall_s']:.2f} {unit}"
            + (f" (simulated in {s['runtime_s']:.2f} s)" if s["virtual"] else "")
            + (
                f" (resumed from iteration {s['resumed_from']}: times and traffic count from it)"
                if isinstance(s.get("resumed_from"), int)
                else ""
            ),
        )
    )
    per = [p for p in it["per_worker"] if p is not None]
    if it["mean"] is not None:
        rows.append(
            (
                "iteration time",
                f"mean {it['mean']:.3f} {unit}, p50 {it['p50']:.3f}, "
                f"slowest worker {max(per):.3f}, fastest {min(per):.3f}",
            )
        )
    rows.append(("iterations", f"min {s['iterations']['min']}, max {s['iterations']['max']}"))
    lost = [x for x in s.get("lost_workers") or [] if isinstance(x, dict)]
    if lost:
        rows.append(
            (
                "lost workers",
                "[yellow]"
                + ", ".join(
                    f"worker {x.get('worker')} in iteration {x.get('iteration')}" for x in lost
                )
                + "[/]"
                + ("; the run went on without them" if s["finished"] else ""),
            )
        )
    back = [x for x in s.get("rejoined_workers") or [] if isinstance(x, dict)]
    took = ", ".join(f"worker {x.get('worker')} from iteration {x.get('iteration')}" for x in back)
    if back:
        rows.append(("replacements", f"{took} (hopbus worker --rejoin)"))
    g, b = s["max_gap"], s["gap_bound"]
    hop = cfg["mode"] not in _SCHEME_KNOBS
    viol = s["violations"]
    vtext = "[green]0[/]" if viol == 0 else f"[red]{viol}[/]"
    rows.append(
        (
            "iteration gap",
            f"adjacent {g['adjacent']} ({'Table 1 bound' if hop else 'bound'} "
            f"{_bound(b['adjacent'])}), any pair {g['any_pair']} (bound "
            f"{_bound(b['any_pair'])}); violations {vtext}",
        )
    )
    if hop:
        qb = s.get("update_queue_bound")
        if s["messages"] is None:  # a real run whose reports Redis lost
            rows.append(("traffic", "unknown: no worker's report reached the summary"))
        else:
            rows.append(
                (
                    "update queue",
                    f"largest {s['max_update_queue']} updates held"
                    + (f" (bound {qb})" if qb is not None else ""),
                )
            )
            rows.append(
                (
                    "traffic",
                    f"{s['messages']} updates sent, {s['sends_skipped']} not sent (the "
                    f"receiver was done with them), {s['stale_dropped']} not used: " + _unused(s),
                )
            )
    else:
        counters = (s.get("scheme") or {}).get("counters") or {}
        text = ", ".join(
            f"{k} {_num(v)}" for k, v in counters.items() if k not in ("cpu_s",) and v is not None
        )
        rows.append((cfg["mode"], text or "no counters reported"))
    waiting = s.get("waiting") or {}
    if waiting.get("per_iteration_s") is not None:
        rows.append(
            ("waiting", f"{waiting['per_iteration_s']:.4f} {unit} blocked per worker-iteration")
        )
    if hop and cfg["skip_max"] >= 2:
        rows.append(("jumps", f"{s['jumps']} jumps, skipping {s['skipped_iterations']} iterations"))
    if not s["virtual"]:
        drops = s.get("dropped_frames") or {}
        if drops:
            text = ", ".join(f"{k} {v}" for k, v in sorted(drops.items()))
            rows.append(("bad frames", f"dropped and counted: {text}"))
        acc, loss = s.get("final_accuracy"), s.get("final_loss")
        if acc is not None or loss is not None:  # a regression's script reports a loss only
            # a script's numbers are whatever it evaluated on: fit's validation_data, a
            # validation_split of its training rows, or what it handed ctx.finish
            script = cfg.get("model") == SCRIPT
            what = "" if script else "test "
            said = [] if acc is None else [f"final {what}accuracy {acc:.4f}"]
            if loss is not None:
                said.append(f"{'loss' if said else f'final {what}loss'} {loss:.4f}")
            whose = ", as the scripts reported them" if script else ""
            rows.append(("model", f"{', '.join(said)} (mean over workers{whose})"))
        elif s.get("finished"):
            rows.append(
                (
                    "model",
                    "no test loss or accuracy reported (a script that evaluated nothing: give "
                    "fit validation_data, or ctx.finish(loss=..., accuracy=...))",
                )
            )
        if cfg.get("target_loss") is not None:
            ttt = s.get("time_to_target")
            rows.append(
                (
                    "time to target",
                    "not reached"
                    if ttt is None
                    else f"{ttt:.2f} s to test loss {cfg['target_loss']}",
                )
            )
    width = max(len(k) for k, _ in rows)
    for key, text in rows:
        _line(console, f"[dim]{key.ljust(width)}[/]  {text}")


def inspect(console: Console, snap: dict[str, Any]) -> None:
    snap = _escaped(snap)
    cfg = snap["config"]
    _line(
        console,
        f"[bold]run {snap['run']}[/] ({snap['status']}): {len(snap['workers'])} workers, "
        f"{cfg['topology']}, {_describe_mode(cfg)}, {cfg['iterations']} iterations",
    )
    wt = Table(box=None, pad_edge=False)
    for col in ("worker", "iteration", "state", "dropped frames", "stale"):
        wt.add_column(col, justify="right" if col in ("worker", "iteration", "stale") else "left")
    for w in snap["workers"]:
        st = w["stats"]
        drops = ", ".join(f"{k[8:]} {v}" for k, v in st.items() if k.startswith("dropped_"))
        wt.add_row(
            str(w["worker"]),
            "-" if w["iteration"] is None else str(w["iteration"]),
            w["state"],
            drops or "0",
            str(st.get("stale_dropped", 0)),
        )
    console.print(wt)
    g = snap["gaps"]
    b = g["bound"]
    dead = g.get("dead") or []
    among = f", among the live workers (dead: {', '.join(map(str, dead[:10]))}" + (
        " ...)" if len(dead) > 10 else ")"
    )
    if g.get("bound_of_whole_graph"):
        among += "; bounds of the whole graph, the dead's paths included (never looser)"
    _line(
        console,
        f"gaps now: adjacent {_known(g['max_adjacent'])} (bound {_bound(b['adjacent'])}), any "
        f"pair {_known(g['max_any_pair'])} (bound {_bound(b['any_pair'])}){among if dead else ''}",
    )
    if snap.get("misplaced"):
        _line(
            console,
            f"[yellow]{named_keys(snap['misplaced'])}[/] (something else wrote them)",
        )
    tq = snap["token_queues"]
    if tq:
        text = " ".join(f"{q['from']}->{q['to']}:{q['size']}" for q in tq[:48])
        more = f" ... ({len(tq)} queues)" if len(tq) > 48 else ""
        _line(console, f"token queues TokenQ(from->to):size  {text}{more}")
    _line(console, f"progress: {snap['progress_entries']} entries; latest first:")
    for e in snap["progress"]:
        _line(
            console,
            f"  {e['id']}  worker {e.get('worker')} -> iteration {e.get('iter')}  loss "
            f"{e.get('loss')}  waited {e.get('wait_s')} s on {e.get('blocked_on')}",
        )
    if snap["events"]:
        _line(console, "events, latest first:")
        for e in snap["events"]:
            # key=value, not a dict's repr: repr would double the escapes of the values' markup
            extra = " ".join(
                f"{k}={v}" for k, v in e.items() if k not in ("id", "kind", "worker", "t")
            )
            _line(console, f"  {e['id']}  {e.get('kind')} worker {e.get('worker')} {extra}")
