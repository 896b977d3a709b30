"""One self-contained HTML page from a ``planner.report/1`` document.

The page has no script and loads nothing: styles are inline and every figure is an inline
SVG drawn by `planner.reporting.plots`, so it opens offline and can be attached to a CI job.
It computes nothing either: it shows what the document holds. It opens with advice (the
plan to apply and its predicted gain beside the replay error, or why the observed order
is already as good as any plan); a section whose data the document lacks (a graph
without timings, a PS job without all-reduce figures) is left out, with one line saying
why. Every time is in milliseconds, in tables and figures alike.

This module holds the page itself: its style, the sections in their order, drawn on
one process or several, and the frame around them. The sections are in
`planner.reporting.advice` (what to do), `planner.reporting.measured_sections` (what the
trace measured) and `planner.reporting.plan_sections` (what the plans predict); what
they share (units, tables, figures, document lookups) in `planner.reporting.markup`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from planner.reporting.advice import advice_section
from planner.reporting.markup import NotApplicable, esc, load_plots, lookup, unavailable
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


_RENDERING: dict[str, Mapping[str, Any]] = {}
"""The report whose sections `_outcome_of` draws: set for the time of one `_outcomes`,
read by the processes forked from this one (the report is not pickled for them)."""


def _outcomes(report: Mapping[str, Any], workers: int | None) -> list[tuple[bool, str]]:
    """(drawn, the content or why the section does not apply) of every section."""
    from planner.job.parallel import forked_map

    if workers != 1:
        load_plots()  # matplotlib loaded once, here, rather than in every process
    _RENDERING["report"] = report
    try:
        return forked_map(_outcome_of, range(len(SECTIONS)), workers)
    finally:
        _RENDERING.clear()


Drawer = Callable[[Mapping[str, Any]], list[tuple[bool, str]]]
"""`_outcomes` of a report, drawn in a process that loaded matplotlib ahead (`drawing`)."""


@contextmanager
def drawing(workers: int | None) -> Iterator[Drawer | None]:
    """A process forked now that imports the figures' module (matplotlib: 0.35 s of CPU)
    while this one computes the report, and draws the page's sections once handed it
    (forking its own `workers` for them, as `render_html` would here): the same page,
    with the import off the time to it where a second CPU is free. None where one worker
    is asked for or processes cannot be forked (not Linux)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if workers == 1 or "fork" not in mp.get_all_start_methods():
        yield None
        return
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("fork")) as pool:
        pool.submit(_load_figures)

        def drawn(report: Mapping[str, Any]) -> list[tuple[bool, str]]:
            from concurrent.futures.process import BrokenProcessPool

            try:
                return pool.submit(_outcomes, report, workers).result()
            except BrokenProcessPool:  # it died (a signal, memory): drawn here instead
                return _outcomes(report, workers)

        try:
            yield drawn
        except BaseException:
            pool.shutdown(cancel_futures=True)  # what it had left is not waited for
            raise


def _load_figures() -> None:
    load_plots()


def _outcome_of(index: int) -> tuple[bool, str]:
    """(drawn, content or why not) of section `index` of the report being rendered."""
    _, _, build = SECTIONS[index]
    try:
        return True, build(_RENDERING["report"])
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
    workers: int | None = 1,
    drawer: Drawer | None = None,
) -> str:
    """The whole page for `report` (a ``planner.report/1`` document).

    `files`: names of the files written beside it, listed at the end. A section whose
    data is malformed says so on the page instead of failing the whole report.
    `workers`: processes that draw the sections at once (`parallel.forked_map`; None:
    the CPUs), the same page as one process draws (about 1.5 s of figures for a job of
    many ranks, half of it on 2 cores); `drawer`: the process that draws them instead
    (`drawing`).
    """
    schema = report.get("schema", "")
    if not str(schema).startswith("planner.report/"):
        raise ValueError(f"not a planner report document (schema {schema!r})")
    body = []
    shown = []
    left_out = []
    outcomes = drawer(report) if drawer is not None else _outcomes(report, workers)
    for (key, heading, _), (drawn, content) in zip(SECTIONS, outcomes, strict=True):
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
