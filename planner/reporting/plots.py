"""Figures of the HTML report, drawn with matplotlib (Agg) and returned as inline SVG text.

Each function takes plain rows from a report document and returns one ``<svg>`` element
(no XML prolog, no DOCTYPE) ready to be pasted into HTML. Figures only draw: every number
comes from the document. Large timelines are rasterised inside the SVG so that the page
stays small.

A figure has no title (the page's heading above it names it), both axis labels, its
legend above the plot (never over a label), and a value axis that starts at 0. Each
``<svg>`` carries what it drew in ``data-chart`` (JSON: the kind, the axis limits and
scales, and the boxes of its legend, axis labels, tick labels and plot area in the SVG's
own units, as laid out at render time), and its legend and labels carry the ids
``legend``, ``xlabel`` and ``ylabel``, so that a test checks the layout without a browser.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullLocator  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

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
RASTERIZE_ABOVE = 2000
"""Timelines with more bars than this are rasterised inside the SVG."""

_SVG_START = re.compile(r"<svg\b")
_STYLE = {
    "svg.hashsalt": "planner",
    "svg.fonttype": "none",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def to_svg(fig: Figure, kind: str = "") -> str:
    """Serialise a figure to an inline ``<svg>`` element and close it; with `kind` (what
    the chart is: "bar", "line", "gantt", "windows"), the element carries its layout in
    ``data-chart`` (`layout`), read from the very draw that writes the SVG."""
    record: dict[str, Any] = {}
    if kind:  # each draw replaces it: savefig's last draw is the one the SVG holds
        fig.canvas.mpl_connect("draw_event", lambda e: record.update(layout(fig, kind, e.renderer)))
    buffer = io.StringIO()
    with plt.rc_context({"svg.hashsalt": "planner", "svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    match = _SVG_START.search(text)
    svg = text[match.start() :] if match else text
    if not record:
        return svg
    return f"<svg data-chart='{json.dumps(record, separators=(',', ':'))}'" + svg[4:]


def layout(fig: Figure, kind: str, renderer: Any) -> dict[str, Any]:
    """What the figure's one plot drew, as `renderer` (that of the draw just done) laid it
    out: `kind`, its axis limits and scales, and the boxes ([left, top, right, bottom] in
    the renderer's units, from its top left: pt of the SVG for the SVG's draw) of its
    legend, title (none: the page's heading names it), axis labels, tick labels and plot
    area."""
    ax = fig.axes[0]

    def box(bbox: Bbox) -> list[float]:
        top, bottom = renderer.height - bbox.y1, renderer.height - bbox.y0
        return [round(v, 1) for v in (bbox.x0, top, bbox.x1, bottom)]

    boxes = {"axes": box(ax.get_window_extent(renderer))}
    legend = ax.get_legend()
    parts: dict[str, Any] = {
        "legend": [legend] if legend else [],
        "title": [ax.title],
        "xlabel": [ax.xaxis.label],
        "ylabel": [ax.yaxis.label],
        "xticks": _in_view(ax.get_xticklabels(), ax.get_xlim(), 0),
        "yticks": _in_view(ax.get_yticklabels(), ax.get_ylim(), 1),
    }
    for name, artists in parts.items():
        shown = [a.get_window_extent(renderer) for a in artists if _drawn(a)]
        if shown:
            boxes[name] = box(Bbox.union(shown))
    return {
        "kind": kind,
        "xlim": [round(float(v), 6) for v in ax.get_xlim()],
        "ylim": [round(float(v), 6) for v in ax.get_ylim()],
        "xscale": ax.get_xscale(),
        "yscale": ax.get_yscale(),
        "boxes": boxes,
    }


def _in_view(labels: Sequence[Any], limits: tuple[float, float], axis: int) -> list[Any]:
    """The tick labels drawn: those whose tick lies within the axis's `limits` (the
    locator also places ticks just outside them, which are not drawn)."""
    low, high = sorted(limits)
    slack = 1e-9 * max(abs(low), abs(high), 1.0)
    return [t for t in labels if low - slack <= t.get_position()[axis] <= high + slack]


def _drawn(artist: Any) -> bool:
    """Whether `artist` shows on the figure (visible, and text that is not empty)."""
    text = getattr(artist, "get_text", None)
    return artist.get_visible() and (text is None or bool(text()))


def _labelled(ax: Any, xlabel: str, ylabel: str) -> None:
    """Both axis labels, with the ids a test finds them by in the SVG."""
    ax.set_xlabel(xlabel, gid="xlabel")
    ax.set_ylabel(ylabel, gid="ylabel")


def _legend_above(ax: Any, ncol: int) -> None:
    """The legend in a row above the plot, where it covers neither the data nor a label
    (the page's heading names the figure: it has no title)."""
    legend = ax.legend(
        loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=ncol, fontsize=8, frameon=False
    )
    legend.set_gid("legend")


MS = 1e3
"""Figures draw times in milliseconds, the unit of the report's tables."""


def _figure(width: float, height: float) -> tuple[Figure, Any]:
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(width, height))
    return fig, ax


def _step_label(row: Mapping[str, Any], many_ranks: bool) -> str:
    return f"{row['rank']} #{row['iteration']}" if many_ranks else f"#{row['iteration']}"


def _steps_axis(ax: Any, steps: Sequence[Mapping[str, Any]]) -> None:
    """The x axis of a per-step bar chart: one tick per step (and rank), labelled."""
    many = len({s["rank"] for s in steps}) > 1
    labels = [_step_label(s, many) for s in steps]
    ax.set_xticks(
        range(len(steps)), labels, rotation=45 if many else 0, ha="right" if many else "center"
    )
    ax.set_ylim(bottom=0)
    _labelled(ax, "rank and step" if many else "step", "ms")


def step_breakdown(steps: Sequence[Mapping[str, Any]]) -> str:
    """Stacked bars per step and rank: compute only, overlap, network only, idle (seconds).

    Rows carry ``rank``, ``iteration``, ``compute``, ``network``, ``alpha`` and ``idle``
    (``planner.allreduce/1`` steps). Overlap = alpha * min(C, N) (Caramel §3.1).
    """
    overlap = [MS * (s.get("alpha") or 0.0) * min(s["compute"], s["network"]) for s in steps]
    compute_only = [MS * s["compute"] - o for s, o in zip(steps, overlap, strict=True)]
    network_only = [MS * s["network"] - o for s, o in zip(steps, overlap, strict=True)]
    idle = [MS * (s.get("idle") or 0.0) for s in steps]
    width = max(4.0, 0.45 * len(steps) + 2)
    fig, ax = _figure(width, 3.0)
    x = range(len(steps))
    bottom = [0.0] * len(steps)
    for values, color, name in (
        (compute_only, COMPUTE, "compute only"),
        (overlap, OVERLAP, "compute + communication"),
        (network_only, NETWORK, "communication only"),
        (idle, IDLE, "idle"),
    ):
        ax.bar(x, values, bottom=bottom, color=color, label=name, width=0.7)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    _steps_axis(ax, steps)
    _legend_above(ax, 4 if width >= 6 else 2)
    return to_svg(fig, "bar")


def step_times(steps: Sequence[Mapping[str, Any]]) -> str:
    """Busy makespan and idle time per step, with Lmin and Umax marks (``planner.metrics/1``)."""
    x = list(range(len(steps)))
    busy = [MS * s["busy_makespan"] for s in steps]
    idle = [MS * s["idle"] for s in steps]
    width = max(4.0, 0.45 * len(steps) + 2)
    fig, ax = _figure(width, 3.0)
    ax.bar(x, busy, color=COMPUTE, label="busy makespan m", width=0.7)
    ax.bar(x, idle, bottom=busy, color=IDLE, label="idle", width=0.7)
    ax.scatter(x, [MS * s["lmin"] for s in steps], marker="_", s=300, color="black", label="Lmin")
    ax.scatter(x, [MS * s["umax"] for s in steps], marker="_", s=300, color="#e45756", label="Umax")
    _steps_axis(ax, steps)
    _legend_above(ax, 4 if width >= 6 else 2)
    return to_svg(fig, "bar")


def efficiency(steps: Sequence[Mapping[str, Any]], threshold: float | None = None) -> str:
    """Scheduling efficiency E per step, one line per rank (TicTac §3.2)."""
    fig, ax = _figure(5.5, 2.8)
    ranks: dict[str, list[Mapping[str, Any]]] = {}
    for s in steps:
        ranks.setdefault(s["rank"], []).append(s)
    for rank, rows in ranks.items():
        ax.plot(
            [r["iteration"] for r in rows],
            [r["efficiency"] for r in rows],
            marker="o",
            label=rank,
            clip_on=False,  # a step at E = 0 shows its whole mark on the axis
        )
    if threshold is not None:
        ax.axhline(threshold, color="#e45756", linestyle="--", label=f"gate {threshold:g}")
    ax.set_ylim(0, 1.05)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _labelled(ax, "step", "efficiency E")
    _legend_above(ax, min(len(ranks) + (threshold is not None), 5))
    return to_svg(fig, "line")


def _is_network(resource: str) -> bool:
    return resource == "net" or resource.startswith("net") or "<-" in resource or "->" in resource


def gantt(timeline: Mapping[str, Sequence[Any]], x_max: float | None = None) -> str:
    """One row per resource (sub-rows per lane) of a ``timeline`` (op, resource, lane,
    start, duration in seconds), as ``planner.simulation/1`` timelines carry it, drawn in
    ms. `x_max` (s): the axis end, shared by charts that are compared."""
    resources = sorted(set(timeline["resource"]), key=lambda r: (_is_network(r), r))
    lanes: dict[str, int] = {}
    for resource, lane in zip(timeline["resource"], timeline["lane"], strict=True):
        lanes[resource] = max(lanes.get(resource, 0), int(lane) + 1)
    base: dict[str, float] = {}
    y = 0.0
    for resource in reversed(resources):
        base[resource] = y
        y += 1.0 + 0.25
    height = 1.0
    bars: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for resource, lane, start, duration in zip(
        timeline["resource"], timeline["lane"], timeline["start"], timeline["duration"], strict=True
    ):
        bars.setdefault((resource, int(lane)), []).append((MS * float(start), MS * float(duration)))
    n_bars = len(timeline["op"])
    fig, ax = _figure(9.0, max(1.6, 0.42 * len(resources) + 1.0))
    for (resource, lane), spans in bars.items():
        k = lanes[resource]
        row_h = height / k
        collection = ax.broken_barh(
            spans,
            (base[resource] + (k - 1 - lane) * row_h, row_h * 0.9),
            facecolors=NETWORK if _is_network(resource) else COMPUTE,
            edgecolor="none",
        )
        if n_bars > RASTERIZE_ABOVE:
            collection.set_rasterized(True)
    ax.set_yticks(
        [base[r] + height / 2 for r in resources],
        [_short(r) for r in resources],
    )
    ends = zip(timeline["start"], timeline["duration"], strict=True)
    end = MS * (x_max if x_max is not None else max((s + d for s, d in ends), default=0))
    ax.set_xlim(0, end * 1.01 if end > 0 else 1)
    _labelled(ax, "ms from the step's first op", "resource")
    return to_svg(fig, "gantt")


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
    fig, ax = _figure(8.0, max(1.8, 0.28 * len(rows) + 1.0))
    y = list(range(len(rows)))[::-1]
    windows = 0
    for yi, r in zip(y, rows, strict=True):
        end_of_window = r.get("window_end")
        if end_of_window is not None and end_of_window > r["ready"]:
            ax.barh(yi, end_of_window - r["ready"], left=r["ready"], color=WINDOW, height=0.8)
            windows += 1
        ax.barh(yi, max(r["duration"], 0.0), left=r["start"], color=NETWORK, height=0.5)
        if planned and r.get("before") is not None:
            ax.plot([r["before"]], [yi], marker="o", mfc="none", color="black", ms=4)
    if windows:
        ax.plot([], [], color=WINDOW, linewidth=6, label="window (ready to first read)")
    ax.plot([], [], color=NETWORK, linewidth=6, label="transfer")
    if planned and any(r.get("before") is not None for r in rows):
        ax.plot([], [], marker="o", mfc="none", color="black", ls="none", label="ready, before")
    ax.set_yticks(y, [_short(str(r["param"]), 28) for r in rows])
    ax.set_xlim(0, end * 1.01 if end > 0 else 1)
    _labelled(ax, "ms from the step start", "parameter")
    _left_margin(fig, ax, [_short(str(n), 28) for n in [*names, *(r["param"] for r in rows)]])
    _legend_above(ax, 3)
    return to_svg(fig, "windows")


def _left_margin(fig: Figure, ax: Any, labels: Sequence[str]) -> None:
    """Room left of the plot for the widest of `labels` (y tick labels) and the y label at
    a fixed place: charts given the same labels put their plots at the same x on the page."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    font = ax.yaxis.get_ticklabels()[0].get_fontproperties() if labels else None
    widest = (
        max(
            (renderer.get_text_width_height_descent(t, font, ismath=False)[0] for t in labels),
            default=0.0,
        )
        / fig.dpi
        + 0.12
    )  # inches, and the tick and its pad
    width = fig.get_figwidth()
    fig.subplots_adjust(left=(widest + 0.3) / width, right=1 - 0.2 / width)
    ax.yaxis.set_label_coords(-(widest + 0.05) / (width - widest - 0.5), 0.5)


def plan_comparison(plans: Sequence[Mapping[str, Any]], measured: float | None) -> str:
    """Predicted iteration time per plan (mean, p5-p95 whiskers), beside the measured time."""
    names = [p["plan"] for p in plans]
    means = [MS * p["predicted"] for p in plans]
    low = [MS * max(p["predicted"] - p.get("p5", p["predicted"]), 0.0) for p in plans]
    high = [MS * max(p.get("p95", p["predicted"]) - p["predicted"], 0.0) for p in plans]
    measured = MS * measured if measured is not None else None
    fig, ax = _figure(max(4.0, 0.8 * len(plans) + 2), 2.8)
    ax.bar(
        names,
        means,
        yerr=[low, high],
        capsize=4,
        color=[PLAN_COLORS.get(n, COMPUTE) for n in names],
        width=0.6,
    )
    if measured is not None and math.isfinite(measured):
        ax.axhline(measured, color="black", linestyle="--", label=f"measured {measured:.4g} ms")
        _legend_above(ax, 1)
    top = max(means + ([measured] if measured else []), default=1.0)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    _labelled(ax, "plan", "predicted iteration time (ms)")
    return to_svg(fig, "bar")


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
    fig, ax = _figure(6.0, 3.0)
    ax.plot(x, y, marker="o", color=COMPUTE, label="predicted step", clip_on=False)
    if unset is not None:
        ax.plot(
            [unset["bucket_cap_mb"]],
            [MS * unset["predicted_step_time"]],
            marker="s",
            mfc="none",
            color="#e45756",
            ls="none",
            label="unset (as traced), predicted",
        )
    if measured is not None:
        ax.axhline(MS * measured, color="black", linestyle="--", label="traced step (measured)")
    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(sorted(set(x)), [f"{v:g}" for v in sorted(set(x))])
    top = max(y + ([MS * measured] if measured is not None else []), default=1.0)
    ax.set_ylim(0, top * 1.1 if top > 0 else 1)
    _labelled(ax, "bucket_cap_mb (MB, log scale)", "predicted step time (ms)")
    _legend_above(ax, 3)
    return to_svg(fig, "line")
