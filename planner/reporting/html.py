"""One self-contained HTML page from a ``planner.report/1`` document.

The page has no script and loads nothing: styles are inline and every figure is an inline
SVG drawn by `planner.reporting.plots`, so it opens offline and can be attached to a CI job.
It computes nothing either: it shows what the document holds. It opens with advice (the
plan to apply and its predicted gain beside the replay error, or why the observed order
is already as good as any plan); a section whose data the document lacks (a graph
without timings, a PS job without all-reduce figures) is left out, with one line saying
why. Every time is in milliseconds, in tables and figures alike.

This module holds the page itself: its style, the sections in their order and the
frame around them. The sections are in
`planner.reporting.advice` (what to do), `planner.reporting.measured_sections` (what the
trace measured) and `planner.reporting.plan_sections` (what the plans predict); what
they share (units, tables, figures, document lookups) in `planner.reporting.markup`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from planner.reporting.advice import advice_section
from planner.reporting.markup import NotApplicable, esc, lookup, unavailable
from planner.reporting.measured_sections import (
    efficiency_section,
    steps_section,
    stragglers_section,
    summary_section,
)
from planner.reporting.plan_sections import (
    buckets_section,
    comparison_section,
    plans_section,
    replay_section,
    timeline_section,
    windows_section,
)
from planner.version import __version__

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;
background:#fafafa}
header{background:#243447;color:#fff;padding:16px 28px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;color:#cdd6df;font-size:13px}
main{padding:8px 28px 40px;max-width:1200px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:12px 18px;
margin:14px 0}
h2{font-size:17px;margin:4px 0 10px} h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
th,td{border-bottom:1px solid #eee;padding:3px 9px;text-align:right;white-space:nowrap}
th{background:#f3f5f7} td.l,th.l{text-align:left}
.na{color:#777;font-style:italic} .bad{color:#b00020;font-weight:600}
.headline{font-size:16px;font-weight:600;margin:4px 0 8px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #e3e3e3;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:18px} .card span{color:#666;font-size:12px}
figure{margin:8px 0} figure svg{max-width:100%;height:auto}
code{background:#f3f5f7;padding:1px 4px;border-radius:3px}
nav a{color:#cdd6df;margin-right:12px;font-size:13px}
"""


def files_section(files: Sequence[str]) -> str:
    """The files written beside the report."""
    if not files:
        return unavailable("Files")
    return "<ul>" + "".join(f"<li><code>{esc(f)}</code></li>" for f in files) + "</ul>"


SECTIONS: tuple[tuple[str, str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("advice", "What to do", advice_section),
    ("summary", "Job summary", summary_section),
    ("steps", "Iteration time per step", steps_section),
    ("efficiency", "Scheduling efficiency per step and rank", efficiency_section),
    ("timeline", "Timeline: traced step and fastest plan", timeline_section),
    ("windows", "Transfer windows per parameter", windows_section),
    ("comparison", "Plan comparison", comparison_section),
    ("replay", "Replay of the traced steps", replay_section),
    ("stragglers", "Stragglers", stragglers_section),
    ("buckets", "DDP bucket size", buckets_section),
    ("plans", "Transfer orders", plans_section),
)


def _outcome(
    build: Callable[[Mapping[str, Any]], str], report: Mapping[str, Any]
) -> tuple[bool, str]:
    """(drawn, the section's content or why it does not apply) of one section."""
    try:
        return True, build(report)
    except NotApplicable as why:
        return False, str(why)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        return True, f'<p class="bad">This section could not be drawn: {esc(repr(exc))}.</p>'


def _section(key: str, title: str, body: str) -> str:
    return f'<section id="{esc(key)}"><h2>{esc(title)}</h2>{body}</section>'


def render_html(
    report: Mapping[str, Any],
    files: Sequence[str] = (),
    title: str = "planner report",
) -> str:
    """The whole page for `report` (a ``planner.report/1`` document).

    `files`: names of the files written beside it, listed at the end. A section whose
    data is malformed says so on the page instead of failing the whole report.
    """
    schema = report.get("schema", "")
    if not str(schema).startswith("planner.report/"):
        raise ValueError(f"not a planner report document (schema {schema!r})")
    body = []
    shown = []
    left_out = []
    for key, heading, build in SECTIONS:
        drawn, content = _outcome(build, report)
        if not drawn:
            left_out.append(f"<li>{esc(heading.split(':')[0])}: {esc(content)}.</li>")
            continue
        body.append(_section(key, heading, content))
        shown.append((key, heading))
    if left_out:
        body.append(
            _section("left-out", "Not shown for this input", f"<ul>{''.join(left_out)}</ul>")
        )
    body.append(_section("files", "Files written", files_section(files)))
    nav = "".join(f'<a href="#{k}">{esc(t.split(":")[0])}</a>' for k, t in shown)
    framework = lookup(report, "inspect", "framework") or ""
    version = report.get("planner_version", __version__)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><p>{esc(framework)} job · {esc(schema)} · planner "
        f"{esc(version)}</p><nav>{nav}</nav></header>"
        f"<main>{''.join(body)}</main></body></html>\n"
    )
