"""Figures of the HTML report, drawn with matplotlib (Agg) and returned as inline SVG text.

Each function takes plain rows from a report document and returns one ``<svg>`` element
(no XML prolog, no DOCTYPE) ready to be pasted into HTML. Figures only draw: every number
comes from the document. Large timelines are rasterised inside the SVG so that the page
stays small.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

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


def to_svg(fig: Figure) -> str:
    """Serialise a figure to an inline ``<svg>`` element and close it."""
    buffer = io.StringIO()
    with plt.rc_context({"svg.hashsalt": "planner", "svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    match = _SVG_START.search(text)
    return text[match.start() :] if match else text


MS = 1e3
"""Figures draw times in milliseconds, the unit of the report's tables."""


def _figure(width: float, height: float) -> tuple[Figure, Any]:
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(width, height))
    return fig, ax


def _step_label(row: Mapping[str, Any], many_ranks: bool) -> str:
    return f"{row['rank']} #{row['iteration']}" if many_ranks else f"#{row['iteration']}"


def step_breakdown(steps: Sequence[Mapping[str, Any]]) -> str:
    """Stacked bars per step and rank: compute only, overlap, network only, idle (seconds).

    Rows carry ``rank``, ``iteration``, ``compute``, ``network``, ``alpha`` and ``idle``
    (``planner.allreduce/1`` steps). Overlap = alpha * min(C, N) (Caramel §3.1).
    """
    many = len({s["rank"] for s in steps}) > 1
    labels = [_step_label(s, many) for s in steps]
    overlap = [MS * (s.get("alpha") or 0.0) * min(s["compute"], s["network"]) for s in steps]
    compute_only = [MS * s["compute"] - o for s, o in zip(steps, overlap, strict=True)]
    network_only = [MS * s["network"] - o for s, o in zip(steps, overlap, strict=True)]
    idle = [MS * (s.get("idle") or 0.0) for s in steps]
    fig, ax = _figure(max(4.0, 0.45 * len(steps) + 2), 3.0)
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
    ax.set_xticks(list(x), labels, rotation=45 if many else 0, ha="right" if many else "center")
    ax.set_ylabel("ms")
    ax.set_title("Iteration time per step")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22 if many else -0.12), ncol=4)
    return to_svg(fig)


def step_times(steps: Sequence[Mapping[str, Any]]) -> str:
    """Busy makespan and idle time per step, with Lmin and Umax marks (``planner.metrics/1``)."""
    many = len({s["rank"] for s in steps}) > 1
    labels = [_step_label(s, many) for s in steps]
    x = list(range(len(steps)))
    busy = [MS * s["busy_makespan"] for s in steps]
    idle = [MS * s["idle"] for s in steps]
    fig, ax = _figure(max(4.0, 0.45 * len(steps) + 2), 3.0)
    ax.bar(x, busy, color=COMPUTE, label="busy makespan m", width=0.7)
    ax.bar(x, idle, bottom=busy, color=IDLE, label="idle", width=0.7)
    ax.scatter(x, [MS * s["lmin"] for s in steps], marker="_", s=300, color="black", label="Lmin")
    ax.scatter(x, [MS * s["umax"] for s in steps], marker="_", s=300, color="#e45756", label="Umax")
    ax.set_xticks(x, labels, rotation=45 if many else 0, ha="right" if many else "center")
    ax.set_ylabel("ms")
    ax.set_title("Iteration time per step")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22 if many else -0.12), ncol=4)
    return to_svg(fig)


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
        )
    if threshold is not None:
        ax.axhline(threshold, color="#e45756", linestyle="--", label=f"gate {threshold:g}")
    ax.set_ylim(-0.02, 1.05)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("efficiency E")
    ax.set_title("Scheduling efficiency per step and rank")
    ax.legend(loc="best", fontsize=8)
    return to_svg(fig)


def _is_network(resource: str) -> bool:
    return resource == "net" or resource.startswith("net") or "<-" in resource or "->" in resource


def gantt(timeline: Mapping[str, Sequence[Any]], title: str, x_max: float | None = None) -> str:
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
    ax.set_xlabel("ms from the step's first op")
    ax.set_title(title)
    return to_svg(fig)


def _short(text: str, limit: int = 36) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


_TIMES = ("ready", "window_end", "start", "duration", "before")


def transfer_windows(
    rows: Sequence[Mapping[str, Any]], title: str, *, planned: bool = False
) -> str:
    """Per parameter: its window (ready to end) as a light bar and its transfer as a dark one.

    Rows carry ``param``, ``ready``, ``window_end``, ``start`` and ``duration`` (seconds
    from the step start), drawn in ms. With `planned`, rows may carry ``before`` (the start
    boundary under the baseline order) drawn as a hollow mark beside the planned ``ready``.
    """
    rows = [
        {k: (MS * v if k in _TIMES and v is not None else v) for k, v in r.items()} for r in rows
    ]
    fig, ax = _figure(8.0, max(1.8, 0.28 * len(rows) + 1.0))
    y = list(range(len(rows)))[::-1]
    for yi, r in zip(y, rows, strict=True):
        end = r.get("window_end")
        if end is not None and end > r["ready"]:
            ax.barh(yi, end - r["ready"], left=r["ready"], color=WINDOW, height=0.8)
        ax.barh(yi, max(r["duration"], 0.0), left=r["start"], color=NETWORK, height=0.5)
        if planned and r.get("before") is not None:
            ax.plot([r["before"]], [yi], marker="o", mfc="none", color="black", ms=4)
    ax.plot([], [], color=WINDOW, linewidth=6, label="window (ready to first read)")
    ax.plot([], [], color=NETWORK, linewidth=6, label="transfer")
    if planned and any(r.get("before") is not None for r in rows):
        ax.plot([], [], marker="o", mfc="none", color="black", ls="none", label="ready, before")
    ax.set_yticks(y, [_short(str(r["param"]), 28) for r in rows])
    ax.set_xlabel("ms")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, fontsize=8)
    return to_svg(fig)


def plan_comparison(plans: Sequence[Mapping[str, Any]], measured: float | None, title: str) -> str:
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
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8)
    top = max(means + ([measured] if measured else []), default=1.0)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    ax.set_ylabel("predicted iteration time (ms)")
    ax.set_title(title)
    return to_svg(fig)


def bucket_sweep(caps: Sequence[Mapping[str, Any]], measured: float | None, title: str) -> str:
    """Predicted step time per DDP ``bucket_cap_mb`` (log x), the traced step as a line."""
    x = [c["bucket_cap_mb"] for c in caps]
    y = [MS * c["predicted_step_time"] for c in caps]
    fig, ax = _figure(6.0, 3.0)
    ax.plot(x, y, marker="o", color=COMPUTE, label="predicted step")
    if measured is not None:
        ax.axhline(MS * measured, color="black", linestyle="--", label="traced step (measured)")
    ax.set_xscale("log")
    ax.set_xlabel("bucket_cap_mb")
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.legend(loc="best")
    return to_svg(fig)
