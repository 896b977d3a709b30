"""The report's sections of the plans: the timelines of the traced step and the best
plan, the transfer windows before and after Caramel, the plan comparison, the replay of
the traced steps, the DDP bucket advice and the transfer orders.

Apart from the sections of what the trace measured (`measured_sections`): these read
the plans and the simulation of the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.job.verdict import REFERENCE_PLANS, recommendation
from planner.reporting import plots
from planner.reporting.markup import (
    MAX_TIMELINE_RANKS,
    SAME,
    UNIT,
    NotApplicable,
    comparison_of,
    esc,
    figure,
    lookup,
    nbytes,
    noun,
    number,
    percent,
    plural,
    seconds,
    simulation_of,
    step_label,
    table,
)


def timeline_section(report: Mapping[str, Any]) -> str:
    """Gantt charts of the traced step and of the recommended (else the fastest) plan, one
    row per resource, all on one time axis so that their lengths compare."""
    sim = simulation_of(report)
    schedules = lookup(sim, "timelines") if sim else None
    if not schedules:
        raise NotApplicable("no simulated schedules in this report")
    comparison = comparison_of(report) or {}
    picks = {e["rank"]: recommendation(e) for e in comparison.get("ranks") or []}
    replayed = {
        (e["rank"], p["plan"]): p.get("replayed") or {}
        for e in comparison.get("ranks") or []
        for p in e.get("plans") or []
    }
    by_rank: dict[str, dict[str, Mapping[str, Any]]] = {}
    for schedule in schedules:
        by_rank.setdefault(schedule["rank"], {})[schedule["plan"]] = schedule
    drawn: list[tuple[str, Mapping[str, Any]]] = []
    for rank in list(by_rank)[:MAX_TIMELINE_RANKS]:
        plans = by_rank[rank]
        pick = picks.get(rank, {})
        chosen = [p for p in ("measured", pick.get("plan")) if p and p in plans]
        if len(chosen) < 2:
            others = [p for p in plans if p not in chosen and p not in REFERENCE_PLANS]
            chosen += others[: 2 - len(chosen)]
        for name in chosen:
            schedule = plans[name]
            if name == "measured":
                title = f"{rank}: traced step {schedule.get('iteration', '')}"
            else:
                title = (
                    f"{rank}: plan {name}, the comparison's schedule (mean op times, no "
                    f"waits; predicted {seconds(schedule.get('predicted'))})"
                )
                gain = replayed.get((rank, name), {}).get("gain")
                if gain is not None:
                    mode = replayed[(rank, name)].get("enforce")
                    title += f"; replayed on the traced steps {percent(gain)}" + (
                        f" ({mode})" if mode else ""
                    )
                if name == pick.get("plan") and pick.get("apply"):
                    title += ", recommended"
            drawn.append((title, schedule))
    x_max = max((_end(s["timeline"]) for _, s in drawn), default=0.0)
    parts = [f"<p>{UNIT} from each step's first op; every chart has the same time axis.</p>"] + [
        f"<h3>{esc(title)}</h3>" + figure(plots.gantt(schedule["timeline"], x_max))
        for title, schedule in drawn
    ]
    if len(by_rank) > MAX_TIMELINE_RANKS:
        parts.append(
            f'<p class="na">{plural(len(by_rank) - MAX_TIMELINE_RANKS, "more rank")}: see the '
            "Chrome trace written by <code>planner simulate --timeline</code>.</p>"
        )
    return "".join(parts)


def _end(timeline: Mapping[str, Sequence[Any]]) -> float:
    """The last end time (s) of a timeline."""
    ends = zip(timeline["start"], timeline["duration"], strict=True)
    return max((float(s) + float(d) for s, d in ends), default=0.0)


def _observed_window_rows(report: Mapping[str, Any]) -> tuple[str, int, list[dict[str, Any]]]:
    transfers = lookup(report, "metrics", "allreduce", "transfers") or []
    if not transfers:
        return "", 0, []
    rank = transfers[0]["rank"]
    iterations = sorted({t["iteration"] for t in transfers if t["rank"] == rank})
    iteration = iterations[(len(iterations) - 1) // 2]
    rows = [
        {
            "param": t.get("param") or t["name"],
            "ready": t["ready"],
            "window_end": t.get("window_end"),
            "start": t["start"],
            "duration": t["duration"],
            "slack": t.get("slack"),
        }
        for t in transfers
        if t["rank"] == rank and t["iteration"] == iteration
    ]
    return rank, iteration, rows


def windows_section(report: Mapping[str, Any]) -> str:
    """Transfer windows per parameter as traced (Before), and as Caramel plans them (After),
    both from the step start on one time axis, so that the two charts compare.

    Caramel places a group in the backward pass, after it, or in the next forward pass,
    each time counted from the start of its own pass. The planned chart draws the
    backward-side groups after the plan's forward pass (``inputs.forward_time``); the
    groups placed in the next forward pass are in the table with their pass named."""
    rank, iteration, rows = _observed_window_rows(report)
    caramel = lookup(report, "plans", "caramel", "ranks")
    if not rows and not caramel:
        raise NotApplicable("needs all-reduce collectives (per-parameter windows)")
    entry = next((r for r in caramel if r["rank"] == rank), caramel[0]) if caramel else None
    planned = _planned_rows(entry) if entry else []
    x_max = max(plots.window_end(rows), plots.window_end(planned))
    shared = {"x_max": x_max, "names": [r["param"] for r in [*rows, *planned]]}
    parts = _traced_windows(rank, iteration, rows, shared) if rows else []
    if entry:
        parts += _planned_windows(entry, planned, shared)
    return "".join(parts)


def _traced_windows(
    rank: str, iteration: int, rows: Sequence[Mapping[str, Any]], shared: Mapping[str, Any]
) -> list[str]:
    """The chart and table of the windows of `rank`'s step `iteration` as traced;
    `shared`: what its chart shares with the planned one (the x axis's end, the names)."""
    parts = [f"<h3>Before: {esc(rank)} step {iteration}, traced windows</h3>"]
    parts.append(
        figure(
            plots.transfer_windows(rows, **shared),
            f"{UNIT} from the start of step {iteration}, as in the chart below.",
        )
    )
    parts.append(
        table(
            ["parameter", "ready", "start", "transfer", "window end", "slack"],
            [
                [
                    esc(r["param"]),
                    seconds(r["ready"]),
                    seconds(r["start"]),
                    seconds(r["duration"]),
                    seconds(r["window_end"]),
                    seconds(r["slack"]),
                ]
                for r in rows
            ],
        )  # fmt: skip
    )
    return parts


_BACKWARD_SIDE = ("backward", "beyond_backward", "")


def _passes(entry: Mapping[str, Any]) -> dict[Any, str]:
    """The pass each group of a Caramel plan's rank (`entry`) is placed in."""
    return {g["group"]: g.get("pass", "") for g in lookup(entry, "inputs", "groups") or []}


def _planned_rows(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The transfers of the backward-side groups of Caramel's plan for one rank
    (`entry`), in seconds from the step start: the plan counts them from the start of
    the backward pass, which its model starts after the forward pass."""
    passes = _passes(entry)
    shift = lookup(entry, "inputs", "forward_time") or 0.0
    return [
        {
            "param": t.get("param") or t["name"],
            "ready": shift + t["ready"],
            "start": shift + t["start"],
            "duration": t["end"] - t["start"],
            "window_end": None,
            "before": shift + t["ready"] + t["start_boundary_gain"]
            if t.get("start_boundary_gain") is not None
            else None,
        }
        for t in entry["transfers"]
        if t.get("start") is not None
        and t.get("end") is not None
        and passes.get(t.get("group"), "") in _BACKWARD_SIDE
        and t["start"] >= 0
    ]


def _planned_windows(
    entry: Mapping[str, Any], planned: Sequence[Mapping[str, Any]], shared: Mapping[str, Any]
) -> list[str]:
    """The chart (`planned`: the backward-side groups, `_planned_rows`) and table (every
    transfer) of the windows of Caramel's plan for one rank (`entry`, a rank of the plan
    document); `shared`: what its chart shares with the traced one."""
    passes = _passes(entry)
    transfers = entry["transfers"]
    forward = [t for t in transfers if passes.get(t.get("group"), "") not in _BACKWARD_SIDE]
    parts = [f"<h3>After: {esc(entry['rank'])}, Caramel plan</h3>"]
    if planned:
        shift = lookup(entry, "inputs", "forward_time") or 0.0
        parts.append(
            figure(
                plots.transfer_windows(planned, planned=True, **shared),
                f"{UNIT} from the step start, as in the chart above: the plan counts from "
                f"its backward pass, drawn after the {seconds(shift)} of its forward pass. "
                "Hollow marks: when the parameter was ready under the baseline order.",
            )
        )
    if forward:
        parts.append(
            f"<p>{plural(len(forward), 'transfer')} {noun(len(forward), 'is', 'are')} placed "
            "in the next forward pass: in the table below (times from that pass's start), "
            "not in the chart.</p>"
        )
    parts.append(
        table(
            [
                "parameter",
                "bytes",
                "group",
                "pass",
                "depth",
                "ready",
                "start",
                "end",
                "start boundary gain",
            ],
            [
                [
                    esc(t.get("param") or t["name"]),
                    nbytes(t.get("nbytes")),
                    number(t.get("group"), 0),
                    esc(passes.get(t.get("group"), "").replace("_", " ")),
                    number(t.get("depth"), 0),
                    seconds(t.get("ready")),
                    _pass_time(t.get("start")),
                    _pass_time(t.get("end")),
                    seconds(t.get("start_boundary_gain")),
                ]
                for t in transfers
            ],
        )  # fmt: skip
    )
    return parts


def _pass_time(value: float | None) -> str:
    """A time from the start of a pass; one before it (a group placed ahead of the next
    forward pass) says so instead of showing a negative time."""
    if value is not None and value < 0:
        return f"{seconds(-value)} before"
    return seconds(value)


def comparison_section(report: Mapping[str, Any]) -> str:
    """Predicted iteration time of every plan beside the measured one and the replay error."""
    comparison = comparison_of(report)
    if not comparison or not comparison.get("ranks"):
        raise NotApplicable("no simulation in this report (the input has no timings)")
    replay = {r["rank"]: r for r in lookup(simulation_of(report), "replay", "ranks") or []}
    parts = []
    knobs = comparison.get("knobs") or {}
    if knobs:
        parts.append(
            "<p>"
            + esc(f"{comparison.get('samples', '?')} samples per plan, seed "
                  f"{comparison.get('seed', '?')}; ")
            + esc(", ".join(f"{k} = {v}" for k, v in knobs.items()))
            + "</p>"
        )  # fmt: skip
    for entry in comparison["ranks"]:
        parts += _rank_comparison(entry, (replay.get(entry["rank"]) or {}).get("steps") or [])
    return "".join(parts)


def _rank_comparison(entry: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> list[str]:
    """The comparison of one rank (`entry`): its replay error, warnings, chart and table of
    plans; `steps`: its replayed steps (the measured mean busy makespan)."""
    parts = []
    rank = entry["rank"]
    chosen = recommendation(entry)
    pick = chosen["plan"] if chosen["apply"] else None
    measured = sum(s["measured"] for s in steps) / len(steps) if steps else None
    rows = [
        [
            esc(p["plan"]) + (" <b>(recommended)</b>" if p["plan"] == pick else ""),
            seconds(p["predicted"]),
            seconds(p.get("p5")),
            seconds(p.get("p95")),
            percent(p.get("speedup_vs_baseline")),
            percent(p.get("speedup_vs_observed")),
            percent((p.get("replayed") or {}).get("gain")),
            number(p.get("efficiency")),
            number(p.get("alpha")),
            esc(p.get("note", "")),
        ]
        for p in entry["plans"]
    ]
    parts.append(f"<h3>{esc(rank)}</h3>")
    parts.append(
        f"<p>Replay error (predicted / measured − 1 of the traced steps): median "
        f"<b>{percent(entry.get('replay_error_median'))}</b>, worst "
        f"<b>{percent(entry.get('replay_error_max'))}</b>; against the wall-clock step: "
        f"median <b>{percent(entry.get('wall_error_median'))}</b>, worst "
        f"<b>{percent(entry.get('wall_error_max'))}</b>. Measured mean busy makespan "
        f"{seconds(measured)}.</p>"
    )
    for key in ("warning", "cpu_warning", "comparison_warning"):
        if entry.get(key):
            parts.append(f"<p><b>Warning:</b> {esc(entry[key])}</p>")
    cautions = {(p.get("replayed") or {}).get("caution") for p in entry["plans"]} - {None}
    for caution in sorted(cautions):
        parts.append(f"<p><b>Replayed:</b> {esc(caution)}.</p>")
    predicted = [p["predicted"] for p in entry["plans"]]
    if predicted and max(predicted) - min(predicted) <= SAME * max(predicted):
        parts.append(
            f"<p>Every plan, the random-order baseline included, predicts "
            f"{seconds(max(predicted))} (within {SAME:.1%}): no chart to compare.</p>"
        )
    else:
        parts.append(figure(plots.plan_comparison(entry["plans"], measured)))
    headers = ["plan", "predicted", "p5", "p95", "vs baseline", "vs observed", "replayed", "E",
               "alpha", "note"]  # fmt: skip
    parts.append(table(headers, rows))
    return parts


def replay_section(report: Mapping[str, Any]) -> str:
    """Replay of every traced step: predicted vs measured and the signed error."""
    ranks = lookup(simulation_of(report), "replay", "ranks") if simulation_of(report) else None
    if not ranks:
        raise NotApplicable("no simulation in this report (the input has no timings)")
    rows = [
        [esc(r["rank"]), step_label(s),
         seconds(s["measured"]), seconds(s["predicted"]), percent(s.get("replay_error")),
         seconds(s.get("idle"))]
        for r in ranks
        for s in r.get("steps") or []
    ]  # fmt: skip
    return table(["rank", "step", "measured m", "replayed", "replay error", "idle"], rows)


def buckets_section(report: Mapping[str, Any]) -> str:
    """DDP bucket advice: predicted step time per bucket_cap_mb, with the replay error."""
    sweep = report.get("bucket_sweep")
    if not sweep:
        raise NotApplicable("needs a PyTorch DDP job traced with record_shapes=True")
    if not sweep["caps"]:
        return f"<p>{esc(_sentence(sweep['reason']))}.</p>"
    recommended = sweep.get("recommended_cap_mb")
    head = (
        f"<p>Traced buckets: measured {seconds(sweep['measured_step_time'])}, predicted "
        f"{seconds(sweep.get('observed_predicted_step_time'))}, a replay error of "
        f"<b>{percent(sweep.get('replay_error'))}</b>.</p><p>"
        + (
            f"<b>Recommended bucket_cap_mb={recommended:g}</b>: {esc(sweep['reason'])}"
            if recommended
            else esc(_sentence(sweep["reason"]))
        )
        + ".</p>"
    )
    if sweep.get("kappa") is not None:
        head += (
            f"<p>Contention: kappa {sweep['kappa']:g} ({esc(sweep.get('kappa_source', ''))}); "
            + (
                f"the backward pass's own {sweep['kappa_backward']:g} "
                f"({esc(sweep['kappa_backward_source'])}); "
                if sweep.get("kappa_backward") not in (None, sweep["kappa"])
                else ""
            )
            + f"worst step error {percent(sweep.get('replay_error_worst'))}.</p>"
        )
    if sweep.get("network_note"):
        head += f"<p><b>Note:</b> {esc(sweep['network_note'])}</p>"
    unset = sweep.get("default_configuration")
    chart = "<h3>Predicted step time per bucket cap</h3>" + figure(
        plots.bucket_sweep(sweep["caps"], sweep["measured_step_time"], unset)
    )
    rows = [
        [f"{c['bucket_cap_mb']:g}" + (" (recommended)" if c["bucket_cap_mb"] == recommended
                                      else ""),
         f"{c.get('first_bucket_cap_mb', 1):g}", str(c["buckets"]),
         seconds(c["predicted_step_time"])]
        for c in sweep["caps"]
    ]  # fmt: skip
    if unset:  # no cap given, as traced: the CLI's "(unset)" row
        rows.append(
            [f"{unset['bucket_cap_mb']:g} (unset)", f"{unset.get('first_bucket_cap_mb', 1):g}",
             str(unset["buckets"]), seconds(unset["predicted_step_time"])]
        )  # fmt: skip
    headers = ["bucket_cap_mb", "first bucket MB", "buckets", "predicted step"]
    return head + chart + table(headers, rows)


def _sentence(text: str) -> str:
    """`text` as a sentence of its own: its first letter a capital."""
    return text[:1].upper() + text[1:]


def plans_section(report: Mapping[str, Any]) -> str:
    """The transfer order of each plan and rank (first rows)."""
    plans = report.get("plans") or {}
    parts = []
    for name, document in plans.items():
        for entry in document.get("ranks") or []:
            transfers = entry.get("transfers") or []
            if not transfers:
                parts.append(
                    f'<p class="na">{esc(name)} / {esc(entry["rank"])}: no transfers to order '
                    "(this plan orders point-to-point transfers only).</p>"
                    if name in ("tic", "tac")
                    else f'<p class="na">{esc(name)} / {esc(entry["rank"])}: no transfers.</p>'
                )
                continue
            rows = [
                [str(t["order_index"]), esc(t["name"]), esc(t.get("param") or ""),
                 esc(t.get("resource", "")), nbytes(t.get("nbytes")), str(t["priority"])]
                for t in transfers
            ]  # fmt: skip
            parts.append(
                f"<details><summary>{esc(name.upper())} — {esc(entry['rank'])}: "
                f"{plural(len(transfers), 'transfer')}</summary>"
                + table(["order", "transfer", "parameter", "resource", "bytes", "priority"], rows)
                + "</details>"
            )
    if not parts:
        raise NotApplicable("no scheduler applies to this input")
    return "".join(parts)
