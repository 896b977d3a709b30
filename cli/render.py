"""Rendering of the library's JSON documents: rich tables on a terminal, JSON for machines."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

import click

from planner.export.files import dumps

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_state: dict[str, Any] = {"no_color": False}


def configure(no_color: bool) -> None:
    """Remember the colour choice; the rich consoles are made on first output, so that
    `--version`, `--help` and `--json` never import rich."""
    _state.clear()
    _state["no_color"] = no_color


def out() -> Console:
    """The console for stdout; piped output gets wide tables, not 80 columns."""
    if "out" not in _state:
        from rich.console import Console

        width = None if sys.stdout.isatty() else 160
        _state["out"] = Console(
            no_color=_state["no_color"], highlight=False, soft_wrap=False, width=width
        )
    return _state["out"]


def err() -> Console:
    """The console for stderr (progress bars)."""
    if "err" not in _state:
        from rich.console import Console

        _state["err"] = Console(stderr=True, no_color=_state["no_color"], highlight=False)
    return _state["err"]


def new_table(title: str | None = None, **options: Any) -> Table:
    """A rich table (rich is imported on first use)."""
    from rich.table import Table

    return Table(title=title, **options)


def error(line: str) -> None:
    """The one line a user sees for bad input or usage."""
    click.echo(f"planner: error: {line}", err=True)


def note(line: str, as_json: bool, error: bool = False) -> None:
    """A side remark (files written, gate results) on stderr; silent in JSON mode
    except for errors."""
    if as_json and not error:
        return
    click.echo(line, err=True)


def emit(document: dict[str, Any], as_json: bool, view: Callable[[dict[str, Any]], None]) -> None:
    if as_json:
        click.echo(dumps(document), nl=False)
    else:
        view(document)


@contextlib.contextmanager
def progress(enabled: bool, what: str) -> Iterator[Callable[[str], None]]:
    """A spinner/bar on stderr when it is a terminal; a no-op callback otherwise."""
    if not enabled or not sys.stderr.isatty():
        yield lambda _item: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=err(),
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=None)

        def advance(item: str) -> None:
            bar.update(task, description=f"{what} {item}", advance=1)

        yield advance


def step_text(s: dict[str, Any], partial: bool | None = None) -> str:
    """A step's number for a table cell, marked when its records are partial (`partial`:
    else its own ``partial`` note says): left out of the gates and the figures."""
    flagged = s.get("partial") if partial is None else partial
    return str(s["iteration"]) + (" (partial)" if flagged else "")


def seconds_text(value: float | None) -> str:
    """A duration for a table cell: s, ms or µs; "-" when unknown."""
    if value is None:
        return "-"
    if value >= 1:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.1f} µs"


def bytes_text(value: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def inspect_view(document: dict[str, Any]) -> None:
    console = out()
    console.print(f"[bold]{document['framework']}[/bold] input: {', '.join(document['sources'])}")
    table = new_table(title="Ranks")
    for column in ("rank", "ops", "by kind", "transfers", "bytes", "steps", "resources"):
        table.add_column(column)
    for r in document["ranks"]:
        kinds = ", ".join(f"{k} {v}" for k, v in r["ops_by_kind"].items())
        table.add_row(
            r["rank"],
            str(r["ops"]),
            kinds,
            str(len(r["transfers"])),
            bytes_text(r["transfer_bytes"]),
            ",".join(map(str, r["iterations"])) or "-",
            ", ".join(r["resources"]),
        )
    console.print(table)
    for r in document["ranks"]:
        transfers = new_table(title=f"Transfers of {r['rank']}")
        for column in ("name", "kind", "channel", "param", "bytes", "time", "wait", "seen in"):
            transfers.add_column(column)
        for t in r["transfers"]:
            transfers.add_row(
                t["name"],
                t["kind"],
                t["resource"],
                t["param"] or "-",
                bytes_text(t["nbytes"]),
                seconds_text(t["time"]),
                seconds_text(t.get("wait_mean") or None),
                f"{t['observed_in']}/{len(r['iterations'])}",
            )
        console.print(transfers)
        if r.get("gpu_steps"):
            steps = new_table(
                title=f"GPU steps of {r['rank']} (GPU work in the step that launched it)"
            )
            for column in ("step", "CPU span", "GPU span", "CPU-to-GPU lag"):
                steps.add_column(column, justify="right")
            for s in r["gpu_steps"]:
                steps.add_row(
                    str(s["iteration"]), seconds_text(s["cpu_span"]),
                    seconds_text(s["gpu_span"]), seconds_text(s["lag"]),
                )  # fmt: skip
            console.print(steps)
        for stream, end in (r.get("queued_before") or {}).items():
            if end <= 0:  # it ended before the first step began: no wait
                continue
            what = "its collectives (net)" if stream == "net" else stream
            console.print(
                f"{r['rank']}: {what} ran work issued before profiling began until "
                f"{seconds_text(end)} into the first step"
            )
    if document.get("horovod"):
        from planner_cli.render_horovod import horovod_view

        horovod_view(document["horovod"])
    for line in document["notes"]:
        console.print(f"[yellow]note:[/yellow] {line}")


def plan_view(document: dict[str, Any]) -> None:
    """Each rank's plan in order. TAC's M+ (TicTac Eq. 6: the least time of the ops a
    transfer completes, in seconds) is shown in ms, ``∞`` where the transfer completes
    none; TIC's (a count of ops, every op taking 1) and Caramel's (none) are not."""
    console = out()
    for entry in document["ranks"]:
        table = new_table(title=f"{entry['algorithm'].upper()} plan for {entry['rank']}")
        m_plus = entry["algorithm"] == "tac"
        for column in ("order", "priority", "transfer", "param", "bytes"):
            table.add_column(column, justify="right" if column == "bytes" else "left")
        if m_plus:
            table.add_column("M+ (ms)", justify="right")
        for t in entry["transfers"]:
            row = [str(t["order_index"]), str(t["priority"]), t["name"], t["param"] or "-",
                   bytes_text(t["nbytes"])]  # fmt: skip
            if m_plus:
                value = t.get("M_plus")
                row.append("∞" if value is None else f"{value * 1e3:,.3f}")
            table.add_row(*row)
        console.print(table)
    if document.get("horovod"):  # a Horovod timeline's Caramel plan: the fusion advice
        from planner_cli.render_horovod import fusion_view

        fusion_view(document["horovod"])


def _ratio(value: float | None) -> str:
    """A figure to 3 decimals; ``n/a`` where it does not apply (None)."""
    return "n/a" if value is None else f"{value:.3f}"


def _queued_text(s: dict[str, Any]) -> str:
    """A TF step's executor queue and its share of the span ("-" where not recorded)."""
    if s.get("queued") is None:
        return "-"
    share = s["queued"] / s["makespan"] if s["makespan"] > 0 else 0.0
    return f"{seconds_text(s['queued'])} ({share:.0%})"


def metrics_view(document: dict[str, Any]) -> None:
    console = out()
    table = new_table(title="Scheduling efficiency per step (TicTac §3.2)")
    queued = any("queued" in s for s in document["steps"])  # TF: the executor's queue
    columns = ("rank", "step", "span", "idle", "busy makespan m", "Umax", "Lmin", "E", "S")
    for column in columns + ("queued",) * queued:
        table.add_column(column, justify="right")
    for s in document["steps"]:
        table.add_row(
            s["rank"],
            step_text(s),
            seconds_text(s["makespan"]),
            seconds_text(s["idle"]),
            seconds_text(s["busy_makespan"]),
            seconds_text(s["umax"]),
            seconds_text(s["lmin"]),
            _ratio(s["efficiency"]),
            _ratio(s["speedup_bound"]),
            *([_queued_text(s)] if queued else []),
        )
    console.print(table)
    if queued:
        console.print(
            "queued: time in which some op of the step had its inputs done and waited in "
            "TensorFlow's executor for a thread or a core: a sign the processes have fewer "
            "cores than they use (more cores per process, or fewer processes per core)"
        )
    summary = new_table(title="Per rank")
    columns = ("rank", "mean E", "min E", "mean span", "mean busy m", "S (oracle)", "orders seen")
    for column in columns:
        summary.add_column(column, justify="right")
    for r in document["ranks"]:
        summary.add_row(
            r["rank"],
            _ratio(r.get("efficiency_mean")),
            _ratio(r.get("efficiency_min")),
            seconds_text(r.get("makespan_mean")),
            seconds_text(r.get("busy_makespan_mean")),
            _ratio(r.get("oracle_speedup_bound")),
            str(r.get("distinct_transfer_orders", 0)),
        )
    console.print(summary)
    if document.get("allreduce"):
        partial = {(s["rank"], s["iteration"]) for s in document["steps"] if s.get("partial")}
        allreduce_view(document["allreduce"], partial)
    if document.get("horovod"):
        from planner_cli.render_horovod import horovod_view

        horovod_view(document["horovod"], per_iteration=True)


def allreduce_view(document: dict[str, Any], partial: Collection[tuple[str, int]] = ()) -> None:
    """Caramel §3.1 overlap figures per step and the straggler time across ranks."""
    console = out()
    table = new_table(title="Compute / network overlap per step (Caramel §3.1)")
    columns = ("rank", "step", "C", "N", "of N: wait", "T", "rho", "alpha", "utilization")
    for column in columns:
        table.add_column(column, justify="right")
    for s in document["steps"]:
        table.add_row(
            s["rank"],
            step_text(s, (s["rank"], s["iteration"]) in partial),
            seconds_text(s["compute"]),
            seconds_text(s["network"]),
            seconds_text(s.get("wait")),
            seconds_text(s["iteration_time"]),
            ratio_text(s["rho"]),
            ratio_text(s["alpha"]),
            ratio_text(s["utilization"]),
        )
    console.print(table)
    if document["stragglers"]:
        stragglers = new_table(
            title="Straggler time per step (longest wait in collectives for a later rank)"
        )
        for column in ("step", "straggler time", "waiting rank", "waited for"):
            stragglers.add_column(column, justify="right")
        for s in document["stragglers"]:
            stragglers.add_row(
                str(s["iteration"]),
                seconds_text(s["straggler_time"]),
                str(s["fastest_rank"]),
                str(s["slowest_rank"]),
            )
        console.print(stragglers)


def ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def analyze_view(report: dict[str, Any]) -> None:
    inspect = report["inspect"]
    console = out()
    if report.get("verdict"):  # the one line every output opens with (planner.job.verdict)
        from rich.text import Text

        console.print(Text(report["verdict"]["text"], style="bold"), soft_wrap=True)
    console.print(f"[bold]{inspect['framework']}[/bold] job: {len(inspect['ranks'])} rank(s)")
    if report["metrics"] is not None:
        metrics_view(report["metrics"])
    table = new_table(title="Transfer order per plan (first 10)")
    table.add_column("rank")
    table.add_column("plan")
    table.add_column("first transfers")
    params = {
        r["rank"]: {t["name"]: t["param"] or t["name"] for t in r["transfers"]}
        for r in inspect["ranks"]
    }
    for entry in report.get("observed_orders", []):
        names = [params[entry["rank"]].get(n, n) for n in entry["order"][:10]]
        table.add_row(entry["rank"], f"observed (step {entry['iteration']})", ", ".join(names))
    for name, document in report["plans"].items():
        for entry in document["ranks"]:
            first = ", ".join(t["param"] or t["name"] for t in entry["transfers"][:10])
            table.add_row(entry["rank"], name.upper(), first)
    console.print(table)
    if report.get("bucket_sweep"):
        bucket_sweep_view(report["bucket_sweep"])
    for line in inspect["notes"]:
        console.print(f"[yellow]note:[/yellow] {line}")


def sweep_model_line(sweep: dict[str, Any]) -> str:
    """How the bucket sweep modelled contention, and the replay errors it left."""
    kappa, worst = sweep.get("kappa"), sweep.get("replay_error_worst")
    parts = [
        f"contention kappa={kappa:g} ({sweep.get('kappa_source', '')})"
        if kappa is not None
        else "contention unknown",
    ]
    backward = sweep.get("kappa_backward")
    if backward is not None and backward != kappa:
        parts.append(f"the backward pass's own {backward:g} ({sweep['kappa_backward_source']})")
    if sweep.get("uncalibrated_replay_error") is not None and kappa not in (None, 1.0):
        parts.append(
            f"without it the traced buckets replay {sweep['uncalibrated_replay_error']:+.1%}"
        )
    if worst is not None:
        parts.append(f"worst step error {worst:.1%} over {sweep.get('steps')} steps")
    rule = sweep.get("first_bucket_rule")
    parts.append(
        "an explicit cap also limits the first bucket (as in the trace)"
        if rule == "cap"
        else "the first bucket stays 1 MiB with an explicit cap (as in the trace)"
        if rule == "1 MiB"
        else "traced with bucket_cap_mb unset: an explicit cap is taken to limit the first "
        "bucket too (PyTorch 2.13)"
        if rule == "unset"
        else "the trace cannot tell the first bucket's limit: taken as the cap (PyTorch 2.13)"
    )
    return "; ".join(parts)


def bucket_sweep_view(sweep: dict[str, Any]) -> None:
    """Predicted step time per DDP bucket cap, with the replay error of the traced buckets."""
    console = out()
    if not sweep["caps"]:
        console.print(f"DDP bucket_cap_mb sweep: {sweep['reason']}")
        return
    error = sweep["replay_error"]
    table = new_table(
        title="DDP bucket_cap_mb sweep (predicted step time; replay error of the traced "
        f"buckets {'n/a' if error is None else f'{error:+.1%}'})"
    )
    for column in ("bucket_cap_mb", "first bucket MB", "buckets", "predicted step"):
        table.add_column(column, justify="right")
    default = sweep.get("default_configuration")
    for row in sweep["caps"] + ([default] if default else []):
        mark = " *" if row["bucket_cap_mb"] == sweep["recommended_cap_mb"] else ""
        table.add_row(
            f"{row['bucket_cap_mb']:g}{mark}" + (" (unset)" if row is default else ""),
            f"{row.get('first_bucket_cap_mb', 1):g}",
            str(row["buckets"]),
            seconds_text(row["predicted_step_time"]),
        )
    console.print(table)
    console.print(sweep_model_line(sweep))
    if sweep.get("profiler_cost") is not None:
        console.print(
            f"profiler's cost taken out: the traced steps took "
            f"{seconds_text(sweep['traced_step_time'])}, "
            f"{sweep['profiler_cost']:+.1%} of the untraced "
            f"{seconds_text(sweep['untraced_step_time'])}"
        )
    console.print(
        f"traced buckets: measured {seconds_text(sweep['measured_step_time'])}, predicted "
        f"{seconds_text(sweep['observed_predicted_step_time'])}; "
        + (
            f"recommended bucket_cap_mb={sweep['recommended_cap_mb']:g}: "
            if sweep["recommended_cap_mb"] is not None
            else ""
        )
        + sweep["reason"]
    )
    if sweep.get("network_note"):
        console.print(f"[yellow]note:[/yellow] {sweep['network_note']}")
