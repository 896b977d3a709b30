"""What every section of the HTML report shares: its units, its tables and figures, and
its access to the ``planner.report/1`` document.

Kept apart from the sections (`advice`, `measured_sections`, `plan_sections`) and the
page (`html`) so that each of them formats a time, a size or a table the same way and
reads the document through the same lookups.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from planner.job.verdict import SAME as SAME  # one threshold for the verdict and the page

NOT_AVAILABLE = "not available for this input"
UNIT = "ms"
"""The one time unit of the page (tables and figures)."""


class NotApplicable(Exception):  # noqa: N818 - a section outcome, not an error
    """A section that does not apply to this input; the message says why (one line)."""


MAX_TIMELINE_RANKS = 4
"""Timelines of at most this many ranks are drawn (the page stays readable)."""
MAX_ROWS = 60
"""Tables longer than this are cut, saying how many rows were left out."""


# ------------------------------------------------------------------ formatting


def esc(value: Any) -> str:
    """HTML-escaped text of `value`."""
    return html.escape(str(value), quote=True)


def noun(count: int, word: str, words: str = "") -> str:
    """`word` as it agrees with `count` ("note" for 1, "notes" else); `words`: an
    irregular plural."""
    return word if count == 1 else words or word + "s"


def plural(count: int, word: str, words: str = "") -> str:
    """`count` and the noun that agrees with it: "1 note", "2 notes"."""
    return f"{count:,} {noun(count, word, words)}"


def step_label(s: Mapping[str, Any], partial: bool | None = None) -> str:
    """A step's number, marked when its records are partial (`partial`: else its own
    ``partial`` note says): such a step is left out of the gates and the figures."""
    flagged = s.get("partial") if partial is None else partial
    return str(s["iteration"]) + (" (partial)" if flagged else "")


def seconds(value: float | None) -> str:
    """A time (given in seconds) in milliseconds, the page's one unit; an em dash for none."""
    if value is None or not math.isfinite(value):
        return "—"
    ms = value * 1e3
    if abs(ms) >= 100:
        return f"{ms:,.1f} ms"
    return f"{ms:.3g} ms" if abs(ms) >= 0.01 or ms == 0 else f"{ms:.2e} ms"


def nbytes(value: float | None) -> str:
    """A size in B, KiB, MiB or GiB."""
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def number(value: float | None, digits: int = 3) -> str:
    """A plain figure with `digits` decimals; an em dash for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.{digits}f}"


def percent(value: float | None) -> str:
    """A signed fraction as a percentage."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:+.1%}"  # as the CLI's tables and the verdict print it


def table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1, limit: int = MAX_ROWS
) -> str:
    """An HTML table; the first `left` columns align left; rows past `limit` are counted."""
    cls = [' class="l"' if i < left else "" for i in range(len(headers))]
    head = "".join(f"<th{c}>{esc(h)}</th>" for c, h in zip(cls, headers, strict=True))
    body = []
    for row in rows[:limit]:
        cells = "".join(f"<td{c}>{v}</td>" for c, v in zip(cls, row, strict=True))
        body.append(f"<tr>{cells}</tr>")
    more = (
        f'<p class="na">{plural(len(rows) - limit, "more row")} not shown (see report.json).</p>'
        if len(rows) > limit
        else ""
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def figure(svg: str, caption: str = "") -> str:
    """An inline SVG figure with an optional caption."""
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure class="plot">{svg}{cap}</figure>'


def unavailable(what: str = "") -> str:
    """The placeholder of a section or part the document has no data for."""
    text = f"{what}: {NOT_AVAILABLE}" if what else NOT_AVAILABLE.capitalize()
    return f'<p class="na">{esc(text)}.</p>'


# ------------------------------------------------------------------ document access


def lookup(document: Mapping[str, Any] | None, *keys: str) -> Any:
    """Nested lookup that returns None where any level is absent or null."""
    value: Any = document
    for key in keys:
        if not isinstance(value, Mapping) or value.get(key) is None:
            return None
        value = value[key]
    return value


def simulation_of(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The simulation document of the report, whichever key it was filed under."""
    sim = report.get("simulation")
    return sim if isinstance(sim, Mapping) else None


def comparison_of(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The plan comparison of the report: its simulation, or the simulation's part."""
    sim = simulation_of(report)
    if sim is None:
        return None
    if sim.get("kind") == "comparison":
        return sim
    return lookup(sim, "comparison")
