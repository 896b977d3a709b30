"""Figures of the HTML report, returned as inline SVG text (`planner.reporting.svg`).

Each function takes plain rows from a report document and returns one ``<svg>`` element
(no XML prolog, no DOCTYPE) ready to be pasted into HTML. Figures only draw: every number
comes from the document. A timeline's spans that meet on screen are drawn as one, so a
large timeline stays small on the page.

A figure has no title (the page's heading above it names it), both axis labels, its
legend above the plot (never over a label), and a value axis that starts at 0. Each
``<svg>`` carries what it drew in ``data-chart`` (JSON: the kind, the axis limits and
scales, and the boxes of its legend, axis labels, tick labels and plot area in the SVG's
own units, as laid out), and its legend and labels carry the ids ``legend``, ``xlabel``
and ``ylabel``, so that a test checks the layout without a browser.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from planner.reporting.svg import (
    Plot,
    hline,
    left_margin,
    marker,
    marks,
    nice_ticks,
    polyline,
    rect,
    spans,
    swatch_box,
    swatch_line,
    tick_labels,
    vline_segment,
)

COMPUTE = "#4c78a8"
NETWORK = "#f58518"
OVERLAP = "#54a24b"
IDLE = "#bab0ac"
WINDOW = "#fdd7a8"
PLAN_COLORS = {
    "baseline": "#bab0ac",
    "observed": "#4c78a8",
    "measured": "#4c78a8",
    "tic": "#f58518",
    "tac": "#e45756",
    "caramel": "#54a24b",
}
MS = 1e3
"""Figures draw times in milliseconds, the unit of the report's tables."""
INCH = 72.0
"""Plot sizes below are given in inches of a 72 px inch."""


def _value_axis(plot: Plot, top: float, pad: float = 1.05) -> None:
    """The y axis from 0 to `top` (and a margin), with round ticks."""
    end = top * pad if top > 0 and math.isfinite(top) else 1.0
    ticks = nice_ticks(0.0, end)
    plot.ylim = (0.0, end)
    plot.yticks = list(zip(ticks, tick_labels(ticks), strict=True))


def _time_axis(plot: Plot, end: float) -> None:
    """The x axis from 0 to `end` ms (and 1%), with round ticks."""
    end = end * 1.01 if end > 0 else 1.0
    ticks = nice_ticks(0.0, end, most=9)
    plot.xlim = (0.0, end)
    plot.xticks = list(zip(ticks, tick_labels(ticks), strict=True))


def _step_label(row: Mapping[str, Any], many_ranks: bool) -> str:
    return f"{row['rank']} #{row['iteration']}" if many_ranks else f"#{row['iteration']}"


def _steps_plot(steps: Sequence[Mapping[str, Any]]) -> Plot:
    """A per-step bar chart's plot: one labelled slot per step (and rank), value in ms."""
    many = len({s["rank"] for s in steps}) > 1
    width = max(4.0, 0.45 * len(steps) + 2)
    plot = Plot("bar", width * INCH * 0.8, 3.0 * INCH * 0.62, legend_columns=4 if width >= 6 else 2)
    plot.xlim = (-0.6, len(steps) - 0.4)
    plot.xticks = [(k, _step_label(s, many)) for k, s in enumerate(steps)]
    plot.rotate_xticks = many
    plot.xlabel, plot.ylabel = ("rank and step" if many else "step"), "ms"
    return plot


def step_breakdown(steps: Sequence[Mapping[str, Any]]) -> str:
    """Stacked bars per step and rank: compute only, overlap, network only, idle (seconds).

    Rows carry ``rank``, ``iteration``, ``compute``, ``network``, ``alpha`` and ``idle``
    (``planner.allreduce/1`` steps). Overlap = alpha * min(C, N) (Caramel §3.1).
    """
    overlap = [MS * (s.get("alpha") or 0.0) * min(s["compute"], s["network"]) for s in steps]
    parts = (
        ([MS * s["compute"] - o for s, o in zip(steps, overlap, strict=True)], COMPUTE,
         "compute only"),
        (overlap, OVERLAP, "compute + communication"),
        ([MS * s["network"] - o for s, o in zip(steps, overlap, strict=True)], NETWORK,
         "communication only"),
        ([MS * (s.get("idle") or 0.0) for s in steps], IDLE, "idle"),
    )  # fmt: skip
    plot = _steps_plot(steps)
    _value_axis(plot, max((sum(p[0][k] for p in parts) for k in range(len(steps))), default=0))
    bottom = [0.0] * len(steps)
    for values, color, name in parts:
        for k, value in enumerate(values):
            rect(plot, k - 0.35, k + 0.35, bottom[k], bottom[k] + value, color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        plot.legend.append((name, swatch_box(color)))
    return plot.svg()


def step_times(steps: Sequence[Mapping[str, Any]]) -> str:
    """Busy makespan and idle time per step, with Lmin and Umax marks (``planner.metrics/1``)."""
    busy = [MS * s["busy_makespan"] for s in steps]
    idle = [MS * s["idle"] for s in steps]
    lmin = [MS * s["lmin"] for s in steps]
    umax = [MS * s["umax"] for s in steps]
    plot = _steps_plot(steps)
    _value_axis(
        plot, max([b + i for b, i in zip(busy, idle, strict=True)] + lmin + umax, default=0)
    )
    x = range(len(steps))
    for k in x:
        rect(plot, k - 0.35, k + 0.35, 0, busy[k], COMPUTE)
        rect(plot, k - 0.35, k + 0.35, busy[k], busy[k] + idle[k], IDLE)
    dash, red = marker("_", "black", 9), marker("_", "#e45756", 9)
    marks(plot, x, lmin, dash)
    marks(plot, x, umax, red)
    plot.legend += [
        ("busy makespan", swatch_box(COMPUTE)),
        ("idle", swatch_box(IDLE)),
        ("Lmin", swatch_line("", mark=dash)),
        ("Umax", swatch_line("", mark=red)),
    ]
    return plot.svg()


LINE_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d")


def efficiency(steps: Sequence[Mapping[str, Any]], threshold: float | None = None) -> str:
    """Scheduling efficiency E per step, one line per rank (TicTac §3.2)."""
    ranks: dict[str, list[Mapping[str, Any]]] = {}
    for s in steps:
        ranks.setdefault(s["rank"], []).append(s)
    plot = Plot("line", 5.5 * INCH * 0.8, 2.8 * INCH * 0.62)
    plot.legend_columns = min(len(ranks) + (threshold is not None), 5)
    iterations = [s["iteration"] for s in steps] or [0]
    low, high = min(iterations), max(iterations)
    margin = max((high - low) * 0.05, 0.5)
    plot.xlim, plot.ylim = (low - margin, high + margin), (0.0, 1.05)
    ticks = nice_ticks(low, high, integer=True)
    plot.xticks = list(zip(ticks, tick_labels(ticks), strict=True))
    plot.yticks = [(v, f"{v:.1f}") for v in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)]
    for k, (rank, rows) in enumerate(ranks.items()):
        color = LINE_COLORS[k % len(LINE_COLORS)]
        shown = [r for r in rows if r["efficiency"] is not None]  # E: ranks with transfers
        xs, ys = [r["iteration"] for r in shown], [r["efficiency"] for r in shown]
        polyline(plot, xs, ys, color)
        dot = marker("o", color, 3)
        marks(plot, xs, ys, dot)  # a step at E = 0 shows its whole mark on the axis
        plot.legend.append((rank, swatch_line(color, mark=dot)))
    if threshold is not None:
        hline(plot, threshold, "#e45756")
        plot.legend.append((f"gate {threshold:g}", swatch_line("#e45756", dashed=True)))
    plot.xlabel, plot.ylabel = "step", "efficiency E"
    return plot.svg()


def _is_network(resource: str) -> bool:
    return resource == "net" or resource.startswith("net") or "<-" in resource or "->" in resource


def gantt(timeline: Mapping[str, Sequence[Any]], x_max: float | None = None) -> str:
    """One row per resource (sub-rows per lane) of a ``timeline`` (op, resource, lane,
    start, duration in seconds), as ``planner.simulation/1`` timelines carry it, drawn in
    ms. `x_max` (s): the axis end, shared by charts that are compared."""
    resources = sorted(set(timeline["resource"]), key=lambda r: (_is_network(r), r))
    lanes: dict[str, int] = {}
    bars: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for resource, lane, start, duration in zip(
        timeline["resource"], timeline["lane"], timeline["start"], timeline["duration"], strict=True
    ):
        lanes[resource] = max(lanes.get(resource, 0), int(lane) + 1)
        bars.setdefault((resource, int(lane)), []).append((MS * float(start), MS * float(duration)))
    base = {r: 1.25 * k for k, r in enumerate(reversed(resources))}
    plot = Plot("gantt", 9.0 * INCH * 0.8, max(0.6, 0.42 * len(resources)) * INCH * 0.9)
    plot.ylim = (-0.125, 1.25 * len(resources) - 0.125)
    ends = zip(timeline["start"], timeline["duration"], strict=True)
    _time_axis(
        plot, MS * (x_max if x_max is not None else max((s + d for s, d in ends), default=0))
    )
    for (resource, lane), pieces in bars.items():
        k = lanes[resource]
        row = 1.0 / k
        low = base[resource] + (k - 1 - lane) * row
        color = NETWORK if _is_network(resource) else COMPUTE
        spans(plot, pieces, low, low + row * 0.9, color)
    plot.yticks = [(base[r] + 0.5, _short(r)) for r in resources]
    plot.xlabel, plot.ylabel = "ms from the step's first op", "resource"
    return plot.svg()


def _short(text: str, limit: int = 36) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


_TIMES = ("ready", "window_end", "start", "duration", "before")


def window_end(rows: Sequence[Mapping[str, Any]]) -> float:
    """The last time (s) a `transfer_windows` chart of `rows` draws: charts that are
    compared share the largest as their axis end."""
    ends = [r["start"] + max(r["duration"], 0.0) for r in rows]
    ends += [r[k] for r in rows for k in ("ready", "window_end", "before") if r.get(k) is not None]
    return max(ends, default=0.0)


def transfer_windows(
    rows: Sequence[Mapping[str, Any]],
    *,
    planned: bool = False,
    x_max: float | None = None,
    names: Sequence[str] = (),
) -> str:
    """Per parameter: its window (ready to end) as a light bar and its transfer as a dark one.

    Rows carry ``param``, ``ready``, ``window_end``, ``start`` and ``duration`` (seconds
    from the step start), drawn in ms. With `planned`, rows may carry ``before`` (the start
    boundary under the baseline order) drawn as a hollow mark beside the planned ``ready``.
    `x_max` (s): the axis end, and `names` the parameters of every chart, shared by the
    charts that are compared (`window_end`): their plots then line up on the page.
    """
    end = MS * (window_end(rows) if x_max is None else x_max)
    rows = [
        {k: (MS * v if k in _TIMES and v is not None else v) for k, v in r.items()} for r in rows
    ]
    plot = Plot("windows", 8.0 * INCH * 0.8, max(0.8, 0.28 * len(rows)) * INCH, legend_columns=3)
    plot.ylim = (-0.6, len(rows) - 0.4)
    _time_axis(plot, end)
    labels = [_short(str(n), 28) for n in [*names, *(r["param"] for r in rows)]]
    # the room of the widest name: charts given the same names put their plots at one x
    plot.left = left_margin(labels)
    hollow = marker("o", "black", 3, hollow=True)
    windows = 0
    for yi, r in zip(range(len(rows) - 1, -1, -1), rows, strict=True):
        end_of_window = r.get("window_end")
        if end_of_window is not None and end_of_window > r["ready"]:
            rect(plot, r["ready"], end_of_window, yi - 0.4, yi + 0.4, WINDOW)
            windows += 1
        rect(plot, r["start"], r["start"] + max(r["duration"], 0.0), yi - 0.25, yi + 0.25, NETWORK)
        if planned and r.get("before") is not None:
            marks(plot, [r["before"]], [yi], hollow)
    if windows:
        plot.legend.append(("window (ready to first read)", swatch_box(WINDOW)))
    plot.legend.append(("transfer", swatch_box(NETWORK)))
    if planned and any(r.get("before") is not None for r in rows):
        plot.legend.append(("ready, before", swatch_line("", mark=hollow)))
    plot.yticks = [(len(rows) - 1 - k, _short(str(r["param"]), 28)) for k, r in enumerate(rows)]
    plot.xlabel, plot.ylabel = "ms from the step start", "parameter"
    return plot.svg()


def plan_comparison(plans: Sequence[Mapping[str, Any]], measured: float | None) -> str:
    """Predicted iteration time per plan (mean, p5-p95 whiskers), beside the measured time."""
    names = [p["plan"] for p in plans]
    means = [MS * p["predicted"] for p in plans]
    low = [MS * p.get("p5", p["predicted"]) for p in plans]
    high = [MS * max(p.get("p95", p["predicted"]), p["predicted"]) for p in plans]
    measured = MS * measured if measured is not None else None
    plot = Plot("bar", max(4.0, 0.8 * len(plans) + 2) * INCH * 0.8, 2.8 * INCH * 0.62)
    plot.xlim = (-0.6, len(plans) - 0.4)
    plot.xticks = list(enumerate(names))
    shown = measured if measured is not None and math.isfinite(measured) else None
    _value_axis(plot, max(high + ([shown] if shown else []), default=1.0), 1.15)
    for k, (name, mean) in enumerate(zip(names, means, strict=True)):
        rect(plot, k - 0.3, k + 0.3, 0, mean, PLAN_COLORS.get(name, COMPUTE))
        if high[k] > low[k]:
            vline_segment(plot, k, min(low[k], mean), high[k], cap=4)
    if shown is not None:
        hline(plot, shown, "black")
        plot.legend.append((f"measured {shown:.4g} ms", swatch_line("black", dashed=True)))
    plot.xlabel, plot.ylabel = "plan", "predicted iteration time (ms)"
    return plot.svg()


def bucket_sweep(
    caps: Sequence[Mapping[str, Any]],
    measured: float | None,
    unset: Mapping[str, Any] | None = None,
) -> str:
    """Predicted step time per DDP ``bucket_cap_mb`` (log x, ticks in plain MB), the
    traced step as a line, and `unset` (the configuration with no cap given, as traced:
    ``default_configuration``) as its own mark. The y axis starts at 0, so that a gap of
    a fraction of a percent looks as small as it is."""
    x = [c["bucket_cap_mb"] for c in caps]
    y = [MS * c["predicted_step_time"] for c in caps]
    plot = Plot("line", 6.0 * INCH * 0.8, 3.0 * INCH * 0.62, xscale="log", legend_columns=3)
    values = sorted({*x, *([unset["bucket_cap_mb"]] if unset else [])}) or [1.0]
    plot.xlim = (values[0] / 1.4, values[-1] * 1.4)
    plot.xticks = [(v, f"{v:g}") for v in sorted(set(x))]
    top = max(y + ([MS * measured] if measured is not None else []), default=1.0)
    _value_axis(plot, top, 1.1)
    dot = marker("o", COMPUTE, 3)
    polyline(plot, x, y, COMPUTE)
    marks(plot, x, y, dot)
    plot.legend.append(("predicted step", swatch_line(COMPUTE, mark=dot)))
    if unset is not None:
        square = marker("s", "#e45756", 3.5, hollow=True)
        marks(plot, [unset["bucket_cap_mb"]], [MS * unset["predicted_step_time"]], square)
        plot.legend.append(("unset (as traced), predicted", swatch_line("", mark=square)))
    if measured is not None:
        hline(plot, MS * measured, "black")
        plot.legend.append(("traced step (measured)", swatch_line("black", dashed=True)))
    plot.xlabel, plot.ylabel = "bucket_cap_mb (MB, log scale)", "predicted step time (ms)"
    return plot.svg()
