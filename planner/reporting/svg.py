"""A chart of the report as SVG text, laid out here: axes, ticks, labels and a legend row.

The report's figures are few and simple (bars, lines, marks, horizontal spans), and the
page must be ready within a second of the analysis: matplotlib took 0.35 s to import
and about 0.07 s per chart, more than the analysis of a 2-rank job. So a chart is put
together from SVG elements directly. Every box is placed here, so the layout record a
chart carries (`Plot.layout`) is the one drawn, not a reading of it. Text widths come
from DejaVu Sans' advance widths (the font the page asks for first), close enough to
keep labels apart in the fonts a browser falls back to.

Units are the SVG's own (its viewBox), shown as pt (4/3 of a CSS px, as matplotlib's
figures were); data coordinates map linearly (or in log10) to them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

FONT = 9.0
"""Tick labels and axis labels, px."""
LEGEND_FONT = 8.0
TICK = 3.5
"""Tick mark length, px."""
PAD = 3.5
"""Between a tick and its label, and between labels and the figure's edge."""

# DejaVu Sans advance widths (em) of the characters the charts print; others: 0.6 em
_WIDTH = {
    **dict.fromkeys("0123456789", 0.636),
    **dict.fromkeys(" ", 0.318),
    **dict.fromkeys(".,:;'!|", 0.318),
    **dict.fromkeys("()[]-/", 0.39),
    **dict.fromkeys("ijl", 0.278),
    **dict.fromkeys("frt", 0.4),
    **dict.fromkeys("mw", 0.9),
    **dict.fromkeys("#%@", 0.84),
    **dict.fromkeys("_+=<>", 0.6),
    **dict.fromkeys("abcdeghknopqsuvxyz", 0.6),
    **dict.fromkeys("ABCDEFGHKNOPQRSTUVXYZ", 0.7),
    **dict.fromkeys("IJ", 0.3),
    **dict.fromkeys("MW", 0.9),
    "·": 0.318,
    "…": 1.0,
}


def text_width(text: str, size: float = FONT) -> float:
    """The advance width of `text` at `size` px."""
    return size * sum(_WIDTH.get(c, 0.6) for c in text)


def nice_ticks(low: float, high: float, most: int = 7, integer: bool = False) -> list[float]:
    """Between 1 and `most` round values (1, 2, 2.5 or 5 times a power of ten) in [low,
    high], evenly spaced: the finest such spacing that gives no more than `most`."""
    span = high - low
    if not span > 0 or not math.isfinite(span):
        return [low]
    power = 10 ** math.floor(math.log10(span / max(most - 1, 1)))
    for m in (1, 2, 2.5, 5, 10, 20, 25, 50, 100):
        step = max(1.0, round(m * power)) if integer else m * power
        first = math.ceil(low / step - 1e-9) * step
        count = int(math.floor((high - first) / step + 1e-9)) + 1
        if 1 <= count <= most:
            return [round(first + k * step, 12) for k in range(count)]
    return [low]


def tick_labels(values: Sequence[float]) -> list[str]:
    """Labels of round tick values with as many decimals as their step needs."""
    if len(values) < 2:
        return [f"{v:g}" for v in values]
    step = abs(values[1] - values[0])
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step else 0
    if step and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1  # 2.5, 0.25: one more digit
    return [f"{v:.{decimals}f}" for v in values]


@dataclass
class Plot:
    """One chart: its plot area (`width` x `height` px), its axes in data units, what it
    draws, and the texts around it. `kind` ("bar", "line", "gantt", "windows") goes into
    the layout record."""

    kind: str
    width: float
    height: float
    xlim: tuple[float, float] = (0.0, 1.0)
    ylim: tuple[float, float] = (0.0, 1.0)
    xscale: str = "linear"
    xticks: list[tuple[float, str]] = field(default_factory=list)
    yticks: list[tuple[float, str]] = field(default_factory=list)
    rotate_xticks: bool = False
    xlabel: str = ""
    ylabel: str = ""
    legend: list[tuple[str, str]] = field(default_factory=list)
    """(label, swatch SVG at the origin, about 16 x 8 px)."""
    legend_columns: int = 4
    left: float | None = None
    """The room left of the plot area, px; None: what its y tick labels need."""
    body: list[str] = field(default_factory=list)
    """SVG elements in plot-area px (origin at its top left): `x`, `y` map data to them."""

    def x(self, value: float) -> float:
        low, high = self.xlim
        if self.xscale == "log":
            value, low, high = math.log10(value), math.log10(low), math.log10(high)
        return (value - low) / (high - low) * self.width if high != low else 0.0

    def y(self, value: float) -> float:
        low, high = self.ylim
        return self.height - ((value - low) / (high - low) * self.height if high != low else 0)

    def svg(self) -> str:
        """The chart as one ``<svg>`` element carrying its layout in ``data-chart``."""
        return _render(self)


# ------------------------------------------------------------------ what a plot draws


def rect(plot: Plot, x0: float, x1: float, y0: float, y1: float, color: str) -> None:
    """A filled box between two x and two y values (data units)."""
    left, right = sorted((plot.x(x0), plot.x(x1)))
    top, bottom = sorted((plot.y(y0), plot.y(y1)))
    plot.body.append(
        f'<rect x="{left:.2f}" y="{top:.2f}" width="{right - left:.2f}" '
        f'height="{bottom - top:.2f}" fill="{color}"/>'
    )


def spans(
    plot: Plot, pieces: Sequence[tuple[float, float]], y0: float, y1: float, color: str
) -> None:
    """Horizontal spans (start, length in data units) of one row, as one path: spans that
    meet within a tenth of a px are one, so a row of any length costs at most ten
    commands per px of width."""
    top, bottom = sorted((plot.y(y0), plot.y(y1)))
    runs: list[list[float]] = []
    for start, length in sorted(pieces):
        a, b = plot.x(start), plot.x(start + max(length, 0.0))
        a, b = round(a, 1), max(round(b, 1), round(a, 1) + 0.1)
        if runs and a <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], b)
        else:
            runs.append([a, b])
    if runs:
        path = "".join(f"M{a:g} {top:.2f}H{b:g}V{bottom:.2f}H{a:g}Z" for a, b in runs)
        plot.body.append(f'<path d="{path}" fill="{color}"/>')


def polyline(
    plot: Plot, xs: Sequence[float], ys: Sequence[float], color: str, dashed: bool = False
) -> None:
    """A line through data points."""
    points = " ".join(f"{plot.x(a):.2f},{plot.y(b):.2f}" for a, b in zip(xs, ys, strict=True))
    dash = ' stroke-dasharray="5,3"' if dashed else ""
    plot.body.append(
        f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.5"{dash}/>'
    )


def hline(plot: Plot, value: float, color: str) -> None:
    """A dashed line across the plot at y = `value`."""
    y = plot.y(value)
    plot.body.append(
        f'<line x1="0" x2="{plot.width:.2f}" y1="{y:.2f}" y2="{y:.2f}" stroke="{color}" '
        'stroke-width="1.5" stroke-dasharray="5,3"/>'
    )


def vline_segment(plot: Plot, x: float, y0: float, y1: float, cap: float = 0.0) -> None:
    """A black vertical segment at `x` from `y0` to `y1` (an error bar), capped `cap` px wide."""
    px, top, bottom = plot.x(x), plot.y(y1), plot.y(y0)
    parts = [f"M{px:.2f} {top:.2f}V{bottom:.2f}"]
    if cap:
        parts += [f"M{px - cap:.2f} {top:.2f}h{2 * cap}", f"M{px - cap:.2f} {bottom:.2f}h{2 * cap}"]
    plot.body.append(f'<path d="{"".join(parts)}" stroke="black" stroke-width="1" fill="none"/>')


def marker(shape: str, color: str, size: float = 3.0, hollow: bool = False) -> str:
    """A mark centred on the origin: "o" circle, "s" square, "_" a dash `size` px long."""
    fill = "none" if hollow else color
    if shape == "o":
        return f'<circle r="{size:g}" fill="{fill}" stroke="{color}"/>'
    if shape == "s":
        return (
            f'<rect x="{-size:g}" y="{-size:g}" width="{2 * size:g}" height="{2 * size:g}" '
            f'fill="{fill}" stroke="{color}"/>'
        )
    return f'<path d="M{-size:g} 0h{2 * size:g}" stroke="{color}" stroke-width="1.5"/>'


def marks(plot: Plot, xs: Sequence[float], ys: Sequence[float], mark: str) -> None:
    """`mark` (`marker`) at each data point, drawn over the plot's edge if it falls there."""
    for a, b in zip(xs, ys, strict=True):
        plot.body.append(f'<g transform="translate({plot.x(a):.2f},{plot.y(b):.2f})">{mark}</g>')


def swatch_box(color: str) -> str:
    return f'<rect x="0" y="-3" width="14" height="7" fill="{color}"/>'


def swatch_line(color: str, dashed: bool = False, mark: str = "") -> str:
    dash = ' stroke-dasharray="5,3"' if dashed else ""
    line = f'<path d="M0 0h16" stroke="{color}" stroke-width="1.5"{dash}/>'
    return (line if color else "") + (f'<g transform="translate(8,0)">{mark}</g>' if mark else "")


# ------------------------------------------------------------------ layout


def _text(x: float, y: float, text: str, size: float, anchor: str, rotate: float = 0.0) -> str:
    turn = f' transform="rotate({rotate:g} {x:.2f} {y:.2f})"' if rotate else ""
    return (
        f'<text x="{x:.2f}" y="{y:.2f}" font-size="{size:g}" text-anchor="{anchor}"{turn}>'
        f"{escape(text, quote=False)}</text>"
    )


def _legend_rows(plot: Plot) -> list[list[tuple[str, str, float]]]:
    """The legend's entries (label, swatch, width) in rows of `legend_columns` at most,
    fewer where a row would be wider than the plot."""
    rows: list[list[tuple[str, str, float]]] = [[]]
    used = 0.0
    for label, swatch in plot.legend:
        width = 22 + text_width(label, LEGEND_FONT) + 12
        if rows[-1] and (len(rows[-1]) >= plot.legend_columns or used + width > plot.width):
            rows.append([])
            used = 0.0
        rows[-1].append((label, swatch, width))
        used += width
    return rows if plot.legend else []


def left_margin(labels: Sequence[str]) -> float:
    """The room left of a plot area for the y label and the widest of `labels` (its y
    tick labels): charts given the same labels put their plot areas at the same x."""
    widest = max((text_width(t) for t in labels), default=0.0)
    return PAD + FONT * 1.2 + PAD + widest + PAD + TICK


def _margins(plot: Plot) -> tuple[float, float, float, float]:
    """Room (left, top, right, bottom) around the plot area for ticks, labels, legend."""
    left = plot.left if plot.left is not None else left_margin([t for _, t in plot.yticks])
    top = PAD + len(_legend_rows(plot)) * LEGEND_FONT * 1.6 + (PAD if plot.legend else FONT / 2)
    if plot.rotate_xticks:
        tall = max((text_width(t) for _, t in plot.xticks), default=0.0) * math.sqrt(0.5)
        tall += FONT * math.sqrt(0.5)
    else:
        tall = FONT * 1.2
    bottom = TICK + PAD + tall + PAD + FONT * 1.2 + PAD
    last = plot.xticks[-1] if plot.xticks else None
    overhang = text_width(last[1]) / 2 - (plot.width - plot.x(last[0])) if last else 0.0
    right = max(PAD * 3, overhang + PAD) if not plot.rotate_xticks else PAD * 3
    return left, top, right, bottom


def _ticks(plot: Plot, left: float, top: float) -> tuple[list[str], list[list[float]]]:
    """The tick marks and labels of both axes (`<g id="xtick_N">`, ``ytick_N``) and the
    boxes of their labels (x boxes first, then y), in figure px."""
    parts, xboxes, yboxes = [], [], []
    base = top + plot.height
    for k, (value, label) in enumerate(plot.xticks):
        x = left + plot.x(value)
        mark = f'<path d="M{x:.2f} {base:.2f}v{TICK}" stroke="black" stroke-width="0.8"/>'
        y = base + TICK + PAD + FONT
        width = text_width(label)
        if plot.rotate_xticks:
            tx, ty = x + FONT * 0.35, base + TICK + PAD
            text = _text(tx, ty, label, FONT, "end", -45)
            reach = (width + FONT * 0.35) * math.sqrt(0.5)
            xboxes.append([tx - reach, ty, tx + FONT * 0.5, ty + reach])
        else:
            text = _text(x, y, label, FONT, "middle")
            xboxes.append([x - width / 2, y - FONT, x + width / 2, y + FONT * 0.25])
        parts.append(f'<g id="xtick_{k}">{mark}{text}</g>')
    for k, (value, label) in enumerate(plot.yticks):
        y = top + plot.y(value)
        mark = f'<path d="M{left:.2f} {y:.2f}h{-TICK}" stroke="black" stroke-width="0.8"/>'
        x = left - TICK - PAD
        text = _text(x, y + FONT * 0.35, label, FONT, "end")
        yboxes.append([x - text_width(label), y - FONT * 0.6, x, y + FONT * 0.45])
        parts.append(f'<g id="ytick_{k}">{mark}{text}</g>')
    return parts, [_union(xboxes), _union(yboxes)]


def _union(boxes: Sequence[Sequence[float]]) -> list[float]:
    if not boxes:
        return []
    return [min(b[0] for b in boxes), min(b[1] for b in boxes),
            max(b[2] for b in boxes), max(b[3] for b in boxes)]  # fmt: skip


def _legend(plot: Plot, left: float) -> tuple[str, list[float]]:
    """The legend row(s) above the plot area, centred on it, and their box."""
    rows = _legend_rows(plot)
    if not rows:
        return "", []
    parts, boxes = [], []
    for r, row in enumerate(rows):
        y = PAD + (r + 0.5) * LEGEND_FONT * 1.6
        x = left + (plot.width - sum(w for *_, w in row)) / 2
        for label, swatch, width in row:
            parts.append(f'<g transform="translate({x:.2f},{y:.2f})">{swatch}</g>')
            parts.append(_text(x + 22, y + LEGEND_FONT * 0.35, label, LEGEND_FONT, "start"))
            boxes.append([x, y - LEGEND_FONT * 0.7, x + width - 12, y + LEGEND_FONT * 0.5])
            x += width
    return f'<g id="legend">{"".join(parts)}</g>', _union(boxes)


def _render(plot: Plot) -> str:
    left, top, right, bottom = _margins(plot)
    width, height = left + plot.width + right, top + plot.height + bottom
    ticks, (xbox, ybox) = _ticks(plot, left, top)
    legend, legend_box = _legend(plot, left)
    centre = left + plot.width / 2
    xlabel_y = height - PAD - FONT * 0.3
    ylabel_x = PAD + FONT
    axes = [left, top, left + plot.width, top + plot.height]
    boxes: dict[str, list[float]] = {"axes": axes}
    label_width = text_width(plot.xlabel)
    boxes["xlabel"] = [centre - label_width / 2, xlabel_y - FONT, centre + label_width / 2,
                       xlabel_y + FONT * 0.25]  # fmt: skip
    middle, tall = top + plot.height / 2, text_width(plot.ylabel)
    boxes["ylabel"] = [
        ylabel_x - FONT,
        middle - tall / 2,
        ylabel_x + FONT * 0.25,
        middle + tall / 2,
    ]
    for name, box in (("legend", legend_box), ("xticks", xbox), ("yticks", ybox)):
        if box:
            boxes[name] = box
    record = {
        "kind": plot.kind,
        "xlim": [round(float(v), 6) for v in plot.xlim],
        "ylim": [round(float(v), 6) for v in plot.ylim],
        "xscale": plot.xscale,
        "yscale": "linear",
        "boxes": {k: [round(v, 1) for v in b] for k, b in boxes.items()},
    }
    frame = (
        f'<path d="M{left:.2f} {top:.2f}V{top + plot.height:.2f}H{left + plot.width:.2f}" '
        'stroke="black" stroke-width="0.8" fill="none"/>'
    )
    return (
        f"<svg data-chart='{json.dumps(record, separators=(',', ':'))}' "
        f'xmlns="http://www.w3.org/2000/svg" width="{width:.0f}pt" height="{height:.0f}pt" '
        f'viewBox="0 0 {width:.2f} {height:.2f}" '
        'font-family="DejaVu Sans, Verdana, Arial, sans-serif">'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<g id="axes" transform="translate({left:.2f},{top:.2f})">{"".join(plot.body)}</g>'
        f"{frame}{''.join(ticks)}"
        f'<g id="xlabel">{_text(centre, xlabel_y, plot.xlabel, FONT, "middle")}</g>'
        f'<g id="ylabel">{_text(ylabel_x, middle, plot.ylabel, FONT, "middle", -90)}</g>'
        f"{legend}</svg>"
    )


def layout_of(svg: str) -> dict[str, Any]:
    """The layout record a chart carries (its ``data-chart``)."""
    start = svg.index("data-chart='") + len("data-chart='")
    return json.loads(svg[start : svg.index("'", start)])
