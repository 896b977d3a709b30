"""The report's sections of what the trace measured: the job summary, the iteration
time and scheduling efficiency per step, and the stragglers across ranks.

Apart from the sections of the plans (`plan_sections`): these read the metrics of the
traced steps only, and draw a job of many ranks through the few ranks its timelines
show (`_plotted`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

from planner.job.verdict import plan_label, verdict
from planner.reporting import plots
from planner.reporting.markup import (
    NotApplicable,
    esc,
    figure,
    lookup,
    nbytes,
    noun,
    number,
    plural,
    seconds,
    step_label,
    table,
)


def summary_section(report: Mapping[str, Any]) -> str:
    """Job summary: framework, ranks, steps, ops, transfers, bytes."""
    inspect = report.get("inspect") or {}
    ranks = inspect.get("ranks") or []
    steps = max((len(r.get("iterations") or []) for r in ranks), default=0)
    transfers = sum(len(r.get("transfers") or []) for r in ranks)
    ops = sum(r.get("ops", 0) for r in ranks)
    cards = [
        ("framework", esc(inspect.get("framework", "—"))),
        (noun(len(ranks), "rank"), str(len(ranks))),
        (noun(steps, "step") + " traced", str(steps)),
        (noun(ops, "op"), f"{ops:,}"),
        (noun(transfers, "transfer"), f"{transfers:,}"),
        ("transfer bytes", nbytes(sum(r.get("transfer_bytes", 0) for r in ranks))),
    ]
    metrics = report.get("metrics")
    if metrics and metrics.get("ranks"):
        mean_e = [e for r in metrics["ranks"] if (e := r["efficiency_mean"]) is not None]
        if mean_e:  # E applies to ranks with transfers only
            cards.append(("mean efficiency E", number(sum(mean_e) / len(mean_e))))
        cards.append(
            (
                "mean iteration",
                seconds(median(r["makespan_mean"] for r in metrics["ranks"])),
            )
        )
    found = report.get("verdict") or verdict(report)
    cards.append(("verdict", esc(_card(found))))
    html_cards = "".join(
        f'<div class="card"><b>{v}</b><span>{esc(k)}</span></div>' for k, v in cards
    )
    rows = [
        [
            esc(r["rank"]),
            str(len(r.get("resources") or [])),
            f"{r.get('ops', 0):,}",
            ", ".join(f"{esc(k)} {v}" for k, v in (r.get("ops_by_kind") or {}).items()),
            str(len(r.get("transfers") or [])),
            nbytes(r.get("transfer_bytes")),
            esc(", ".join(str(i) for i in r.get("iterations") or [])),
        ]
        for r in ranks
    ]
    per_rank = table(
        ["rank", "resources", "ops", "by kind", "transfers", "bytes", "steps"], rows, left=1
    )
    sources = inspect.get("sources") or []
    notes = inspect.get("notes") or []
    extra = ""
    if sources:
        extra += f"<details><summary>{plural(len(sources), 'input file')}</summary><ul>"
        extra += "".join(f"<li><code>{esc(s)}</code></li>" for s in sources) + "</ul></details>"
    if notes:
        extra += f"<details><summary>{plural(len(notes), 'note')} from ingest</summary><ul>"
        extra += "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul></details>"
    return f'<div class="cards">{html_cards}</div>{per_rank}{extra}'


def _plotted(
    report: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], str]:
    """The per-step rows a plot draws, and what its caption adds: every rank's up to
    `shown_ranks.TIMELINE_RANKS` ranks; above, those of the ranks the timelines show (the
    slowest, the fastest, the most often last: `shown_ranks.timeline_ranks`), so that the
    plot of a job of 1,000 ranks stays readable and costs what a small job's does. The
    tables (up to `MAX_ROWS` rows) and report.json hold every rank."""
    ranks = list(dict.fromkeys(r["rank"] for r in rows))
    from planner.job.shown_ranks import TIMELINE_RANKS, timeline_ranks

    if len(ranks) <= TIMELINE_RANKS:
        return list(rows), ""
    shown = timeline_ranks(ranks, report.get("metrics") or {})
    names = ", ".join(r for r in ranks if r in shown)
    return [r for r in rows if r["rank"] in shown], (
        f" Drawn for {len(shown)} of {len(ranks)} ranks ({names}: the slowest, the fastest"
        " and the one most often last); the table and report.json hold every rank."
    )


def steps_section(report: Mapping[str, Any]) -> str:
    """Per-step iteration time with its compute / communication / overlap breakdown."""
    metrics = report.get("metrics")
    if not metrics:
        raise NotApplicable("the input has no timings (a GraphDef alone)")
    allreduce = lookup(metrics, "allreduce", "steps")
    partial = {(s["rank"], s["iteration"]) for s in metrics.get("steps") or [] if s.get("partial")}
    if allreduce:
        rows = [
            [
                esc(s["rank"]),
                step_label(s, (s["rank"], s["iteration"]) in partial),
                seconds(s["iteration_time"]),
                seconds(s["compute"]),
                seconds(s["network"]),
                number(s.get("alpha")),
                number(s.get("rho")),
                number(s.get("utilization")),
                seconds(s.get("idle")),
            ]
            for s in allreduce
        ]
        drawn, shown = _plotted(report, allreduce)
        return figure(
            plots.step_breakdown(drawn),
            "Compute C, communication N and their overlap alpha·min(C, N) (Caramel §3.1)."
            + shown,
        ) + table(
            ["rank", "step", "iteration T", "compute C", "network N", "alpha", "rho",
             "utilization", "idle"],
            rows,
            left=1,
        )  # fmt: skip
    steps = metrics.get("steps") or []
    queued = any("queued" in s for s in steps)  # TF: ops waiting in the executor's queue
    rows = [
        [
            esc(s["rank"]),
            step_label(s),
            seconds(s["makespan"]),
            seconds(s["busy_makespan"]),
            seconds(s["idle"]),
            seconds(s["lmin"]),
            seconds(s["umax"]),
            *([seconds(s.get("queued"))] * queued),
        ]
        for s in steps
    ]
    drawn, shown = _plotted(report, steps)
    note = (
        " Queued: time in which some op had its inputs done and waited in TensorFlow's "
        "executor for a thread or a core."
    ) * queued
    return figure(
        plots.step_times(drawn),
        "Busy makespan m, idle time, and the bounds Lmin, Umax." + shown + note,
    ) + table(
        ["rank", "step", "span", "busy m", "idle", "Lmin", "Umax"] + ["queued"] * queued,
        rows,
        left=1,
    )


def efficiency_section(report: Mapping[str, Any]) -> str:
    """Scheduling efficiency E per step and rank, and the per-rank summary."""
    metrics = report.get("metrics")
    if not metrics or not metrics.get("steps"):
        raise NotApplicable("the input has no timings (a GraphDef alone)")
    steps = metrics["steps"]
    if all(s["efficiency"] is None for s in steps):
        raise NotApplicable("no rank has transfers to order: E does not apply")
    gate = lookup(metrics, "gate", "min_efficiency")
    failed = {(f["rank"], f["iteration"]) for f in lookup(metrics, "gate", "failed") or []}
    rows = []
    for s in steps:
        e = number(s["efficiency"])
        if (s["rank"], s["iteration"]) in failed:
            e = f'<span class="bad">{e}</span>'
        rows.append(
            [esc(s["rank"]), step_label(s),
             e, number(s["speedup_bound"]), seconds(s["busy_makespan"])]
        )  # fmt: skip
    ranks = [
        [
            esc(r["rank"]),
            number(r.get("efficiency_mean")),
            number(r.get("efficiency_min")),
            number(r.get("speedup_bound_mean")),
            number(r.get("oracle_speedup_bound")),
            str(r.get("distinct_transfer_orders", "—")),
        ]
        for r in metrics.get("ranks") or []
    ]
    drawn, shown = _plotted(report, steps)
    return (
        figure(
            plots.efficiency(drawn, gate),
            "E = (Umax − m) / (Umax − Lmin): 1 = as good as the bounds allow (TicTac §3.2)."
            + shown,
        )
        + table(["rank", "step", "efficiency E", "speedup bound S", "busy m"], rows)
        + "<h3>Per rank</h3>"
        + table(
            ["rank", "mean E", "min E", "mean S", "oracle S", "distinct transfer orders"], ranks
        )
    )


def stragglers_section(report: Mapping[str, Any]) -> str:
    """Straggler time per step across ranks (all-reduce jobs)."""
    rows = lookup(report, "metrics", "allreduce", "stragglers")
    if not rows:
        raise NotApplicable("needs all-reduce collectives on several ranks")
    return (
        "<p>Per step, the longest time a rank waited in collectives for a later rank "
        "(the union of its waits), the rank that waited it, and the rank it waited for.</p>"
    ) + table(
        ["step", "straggler time", "waiting rank", "waited for"],
        [
            [str(s["iteration"]), seconds(s["straggler_time"]), esc(s.get("fastest_rank", "")),
             esc(s.get("slowest_rank", ""))]
            for s in rows
        ],
    )  # fmt: skip


def _card(found: Mapping[str, Any]) -> str:
    """The verdict in a few words, for the summary's card."""
    if found["action"] == "apply_plan":
        names = sorted({r["plan"] for r in found["ranks"] if r["apply"]})
        return "apply " + ", ".join(plan_label(n) for n in names)
    if found["action"] == "set_bucket_cap":
        return f"bucket_cap_mb={found['bucket_cap_mb']:g}"
    return "trace timings" if found["action"] == "trace_timings" else "keep what you have"
