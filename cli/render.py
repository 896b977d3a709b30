"""Rendering of the library's JSON documents: rich tables on a terminal, JSON for machines."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

import click

from planner.export.files import dumps
from planner_cli.terminal import (
    Unit,
    closing_line,
    configure,
    detail,
    err,
    number_column,
    out,
    paragraph,
    show,
    text_column,
    time_cell,
    time_unit,
    with_unit,
)

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["closing_line", "configure", "err", "out"]  # the consoles, for the commands' own views


def new_table(title: str | None = None, **options: Any) -> Table:
    """A rich table (rich is imported on first use)."""
    from rich.table import Table

    return Table(title=title, **options)


def error(line: str) -> None:
    """The one line a user sees for bad input or usage."""
    click.echo(f"planner: error: {line}", err=True)


def note(line: str, as_json: bool, error: bool = False) -> None:
    """A side remark (files written, gate results, warnings) on stderr, wrapped to the
    terminal's width as one paragraph (`terminal.paragraph`); silent in JSON mode except
    for errors, which stay one line there."""
    if as_json and not error:
        return
    click.echo(line if as_json else paragraph(line, err().width), err=True)


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


def counted(n: int, noun: str) -> str:
    """`n` and its noun, plural unless 1: ``1 step``, ``5 steps``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def bytes_text(value: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def inspect_view(document: dict[str, Any]) -> None:
    """The ranks, and the transfers and GPU steps of the first (of every rank with
    `--detail`)."""
    console = out()
    console.print(f"[bold]{document['framework']}[/bold] input: {', '.join(document['sources'])}")
    table = new_table(title="Ranks")
    for column in ("rank", "ops", "by kind", "transfers", "bytes", "steps", "resources"):
        add = number_column if column in ("ops", "transfers", "bytes") else text_column
        add(table, column)
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
    show(table, secondary=("resources", "by kind"))
    ranks = document["ranks"]
    for index, r in enumerate(ranks):
        if index and not detail(f"the transfers of {len(ranks) - 1} more rank(s)"):
            break
        if r["transfers"]:
            _transfers_table(r)
        if r.get("gpu_steps"):
            _gpu_steps_table(r)
        for stream, end in (r.get("queued_before") or {}).items():
            if end <= 0:  # it ended before the first step began: no wait
                continue
            what = "its collectives (net)" if stream == "net" else stream
            console.print(
                f"{r['rank']}: {what} ran work issued before profiling began until "
                f"{seconds_text(end)} into the first step"
            )
    if document.get("communication"):
        from planner_cli.render_communication import communication_view

        communication_view(document["communication"])
    if document.get("fsdp"):
        from planner_cli.render_communication import fsdp_view

        fsdp_view(document["fsdp"])
    if document.get("horovod"):
        from planner_cli.render_horovod import horovod_view

        horovod_view(document["horovod"])
    for line in document["notes"]:
        console.print(f"[yellow]note:[/yellow] {line}")


def _transfers_table(r: dict[str, Any]) -> None:
    """One rank's transfers: names, sizes, mean time and wait."""
    unit = time_unit(t.get(k) or None for t in r["transfers"] for k in ("time", "wait_mean"))
    time, wait = with_unit("time", unit), with_unit("wait", unit)
    table = new_table(title=f"Transfers of {r['rank']}")
    for column in ("name", "kind", "channel", "param"):
        text_column(table, column)
    for column in ("bytes", time, wait, "seen in"):
        number_column(table, column)
    for t in r["transfers"]:
        table.add_row(
            t["name"],
            t["kind"],
            t["resource"],
            t["param"] or "-",
            bytes_text(t["nbytes"]),
            time_cell(t["time"], unit),
            time_cell(t.get("wait_mean") or None, unit),
            f"{t['observed_in']}/{len(r['iterations'])}",
        )
    show(table, secondary=("seen in", "channel", "kind", wait))


def _gpu_steps_table(r: dict[str, Any]) -> None:
    """A GPU rank's steps: the CPU's and the GPU's span and the lag between them."""
    steps = r["gpu_steps"]
    unit = time_unit(s[k] for s in steps for k in ("cpu_span", "gpu_span", "lag"))
    table = new_table(title=f"GPU steps of {r['rank']} (GPU work in the step that launched it)")
    for column in ("step", "CPU span", "GPU span", "CPU-to-GPU lag"):
        number_column(table, column if column == "step" else with_unit(column, unit))
    for s in steps:
        times = (time_cell(s[k], unit) for k in ("cpu_span", "gpu_span", "lag"))
        table.add_row(str(s["iteration"]), *times)
    show(table)


def plan_view(document: dict[str, Any]) -> None:
    """Each rank's plan in order. TAC's M+ (TicTac Eq. 6: the least time of the ops a
    transfer completes, in seconds) is shown in ms, ``∞`` where the transfer completes
    none; TIC's (a count of ops, every op taking 1) and Caramel's (none) are not."""
    for entry in document["ranks"]:
        table = new_table(title=f"{entry['algorithm'].upper()} plan for {entry['rank']}")
        m_plus = entry["algorithm"] == "tac"
        number_column(table, "order")
        number_column(table, "priority")
        text_column(table, "transfer")
        text_column(table, "param")
        number_column(table, "bytes")
        if m_plus:
            number_column(table, "M+ (ms)")
        for t in entry["transfers"]:
            row = [str(t["order_index"]), str(t["priority"]), t["name"], t["param"] or "-",
                   bytes_text(t["nbytes"])]  # fmt: skip
            if m_plus:
                value = t.get("M_plus")
                row.append("∞" if value is None else f"{value * 1e3:,.3f}")
            table.add_row(*row)
        show(table, secondary=("priority",))
    if document.get("horovod"):  # a Horovod timeline's Caramel plan: the fusion advice
        from planner_cli.render_horovod import fusion_view

        fusion_view(document["horovod"])


def _ratio(value: float | None) -> str:
    """A figure to 3 decimals; ``n/a`` where it does not apply (None)."""
    return "n/a" if value is None else f"{value:.3f}"


def _queued_text(s: dict[str, Any], unit: Unit) -> str:
    """A TF step's executor queue and its share of the span ("-" where not recorded)."""
    if s.get("queued") is None:
        return "-"
    share = s["queued"] / s["makespan"] if s["makespan"] > 0 else 0.0
    return f"{time_cell(s['queued'], unit)} ({share:.0%})"


STEP_TIMES = ("makespan", "idle", "busy_makespan", "umax", "lmin")


def metrics_view(document: dict[str, Any]) -> None:
    """Efficiency per step (the per-rank summary with `--detail`), and the all-reduce
    figures of an all-reduce job."""
    console = out()
    steps = document["steps"]
    table = new_table(title="Scheduling efficiency per step (TicTac §3.2)")
    queued = any("queued" in s for s in steps)  # TF: the executor's queue
    unit = time_unit(s.get(k) for s in steps for k in (*STEP_TIMES, "queued"))
    names = ("span", "idle", "busy", "Umax", "Lmin", *("queued",) * queued)
    headers = {name: with_unit(name, unit) for name in names}
    text_column(table, "rank")
    number_column(table, "step")
    for column in (*list(headers.values())[:5], "E", "S", *list(headers.values())[5:]):
        number_column(table, column)
    for s in steps:
        table.add_row(
            s["rank"],
            step_text(s),
            *(time_cell(s[k], unit) for k in STEP_TIMES),
            _ratio(s["efficiency"]),
            _ratio(s["speedup_bound"]),
            *([_queued_text(s, unit)] if queued else []),
        )
    show(
        table, secondary=tuple(headers[n] for n in ("idle", "Lmin", "Umax", "queued")[: 3 + queued])
    )
    if queued and any(c.header == headers["queued"] for c in table.columns):
        console.print(
            "queued: time in which some op of the step had its inputs done and waited in "
            "TensorFlow's executor for a thread or a core: a sign the processes have fewer "
            "cores than they use (more cores per process, or fewer processes per core)"
        )
    if detail("the per-rank summary"):
        _per_rank_table(document["ranks"])
    if document.get("allreduce"):
        partial = {(s["rank"], s["iteration"]) for s in steps if s.get("partial")}
        allreduce_view(document["allreduce"], partial)
    if document.get("communication"):
        from planner_cli.render_communication import communication_view

        communication_view(document["communication"])
    if document.get("fsdp"):
        from planner_cli.render_communication import fsdp_view

        fsdp_view(document["fsdp"])
    if document.get("horovod"):
        from planner_cli.render_horovod import horovod_view

        horovod_view(document["horovod"], per_iteration=True)


def _per_rank_table(ranks: list[dict[str, Any]]) -> None:
    """Each rank's mean and least efficiency, mean span and oracle bound."""
    unit = time_unit(r.get(k) for r in ranks for k in ("makespan_mean", "busy_makespan_mean"))
    summary = new_table(title="Per rank")
    text_column(summary, "rank")
    for column in ("mean E", "min E", with_unit("mean span", unit), with_unit("mean busy", unit),
                   "S (oracle)", "orders seen"):  # fmt: skip
        number_column(summary, column)
    for r in ranks:
        summary.add_row(
            r["rank"],
            _ratio(r.get("efficiency_mean")),
            _ratio(r.get("efficiency_min")),
            time_cell(r.get("makespan_mean"), unit),
            time_cell(r.get("busy_makespan_mean"), unit),
            _ratio(r.get("oracle_speedup_bound")),
            str(r.get("distinct_transfer_orders", 0)),
        )
    show(summary, secondary=("orders seen",))


def allreduce_view(document: dict[str, Any], partial: Collection[tuple[str, int]] = ()) -> None:
    """Caramel §3.1 overlap figures per step and the straggler time across ranks."""
    steps = document["steps"]
    keys = ("compute", "network", "wait", "iteration_time")
    unit = time_unit(s.get(k) for s in steps for k in keys)
    table = new_table(title="Compute / network overlap per step (Caramel §3.1)")
    wait = with_unit("of N: wait", unit)
    text_column(table, "rank")
    number_column(table, "step")
    for column in (with_unit("C", unit), with_unit("N", unit), wait, with_unit("T", unit),
                   "rho", "alpha", "utilization"):  # fmt: skip
        number_column(table, column)
    for s in steps:
        table.add_row(
            s["rank"],
            step_text(s, (s["rank"], s["iteration"]) in partial),
            *(time_cell(s.get(k), unit) for k in keys),
            ratio_text(s["rho"]),
            ratio_text(s["alpha"]),
            ratio_text(s["utilization"]),
        )
    show(table, secondary=(wait, "rho"))
    if document["stragglers"]:
        stragglers = new_table(
            title="Straggler time per step (longest wait in collectives for a later rank)"
        )
        unit = time_unit(s["straggler_time"] for s in document["stragglers"])
        for column in ("step", with_unit("straggler time", unit), "waiting rank", "waited for"):
            number_column(stragglers, column)
        for s in document["stragglers"]:
            stragglers.add_row(
                str(s["iteration"]),
                time_cell(s["straggler_time"], unit),
                str(s["fastest_rank"]),
                str(s["slowest_rank"]),
            )
        show(stragglers)


def ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def analyze_view(
    report: dict[str, Any], simulation_view: Callable[..., None] | None = None
) -> None:
    """The verdict (a paragraph of its own), the plans' predicted times and the bucket
    advice; the metrics, each plan's first transfers and the replay per step with
    `--detail`. `simulation_view(document, replay=...)` renders the simulation."""
    inspect = report["inspect"]
    console = out()
    if report.get("verdict"):  # what every output opens with (planner.job.verdict)
        from rich.text import Text

        console.print(Text(report["verdict"]["text"], style="bold"))
        console.print()
    console.print(f"[bold]{inspect['framework']}[/bold] job: {len(inspect['ranks'])} rank(s)")
    if report["metrics"] is not None and detail("the metrics tables"):
        metrics_view(report["metrics"])
    if report["plans"] and detail("each plan's first transfers"):
        _first_transfers_table(report)
    if simulation_view is not None and report.get("simulation") is not None:
        simulation_view(report["simulation"], replay=detail("the replay per step"))
    if report.get("bucket_sweep"):
        bucket_sweep_view(report["bucket_sweep"])
    for line in inspect["notes"]:
        console.print(f"[yellow]note:[/yellow] {line}")


def _first_transfers_table(report: dict[str, Any]) -> None:
    """The first 10 transfers of the observed order and of each plan, per rank."""
    inspect = report["inspect"]
    table = new_table(title="Transfer order per plan (first 10)")
    for column in ("rank", "plan", "first transfers"):
        text_column(table, column)
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
    show(table)


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
        parts.append(f"worst step error {worst:.1%} over {counted(sweep['steps'], 'step')}")
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
    """Predicted step time per DDP bucket cap, with the replay error of the traced buckets;
    how the sweep modelled contention with `--detail`."""
    console = out()
    if not sweep["caps"]:
        console.print(f"DDP bucket_cap_mb sweep: {sweep['reason']}")
        return
    error = sweep["replay_error"]
    table = new_table(
        title="DDP bucket_cap_mb sweep (predicted step time; replay error of the traced "
        f"buckets {'n/a' if error is None else f'{error:+.1%}'})"
    )
    default = sweep.get("default_configuration")
    rows = sweep["caps"] + ([default] if default else [])
    unit = time_unit(row["predicted_step_time"] for row in rows)
    for column in ("bucket_cap_mb", "first bucket MB", "buckets"):
        number_column(table, column)
    number_column(table, with_unit("predicted step", unit))
    for row in rows:
        mark = " *" if row["bucket_cap_mb"] == sweep["recommended_cap_mb"] else ""
        table.add_row(
            f"{row['bucket_cap_mb']:g}{mark}" + (" (unset)" if row is default else ""),
            f"{row.get('first_bucket_cap_mb', 1):g}",
            str(row["buckets"]),
            time_cell(row["predicted_step_time"], unit),
        )
    show(table)
    if detail("how the bucket sweep models contention"):
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
    if sweep.get("process_groups"):
        console.print(f"[yellow]note:[/yellow] bucket sweep: {sweep['process_groups']['note']}")
