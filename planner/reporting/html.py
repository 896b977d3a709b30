"""One self-contained HTML page from a ``planner.report/1`` document.

The page has no script and loads nothing: styles are inline and every figure is an inline
SVG drawn by `planner.reporting.plots`, so it opens offline and can be attached to a CI job.
It computes nothing either: it shows what the document holds. It opens with advice (the
plan to apply and its predicted gain beside the replay error, or why the observed order
is already as good as any plan); a section whose data the document lacks (a graph
without timings, a PS job without all-reduce figures) is left out, with one line saying
why. Every time is in milliseconds, in tables and figures alike.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from statistics import median
from typing import TYPE_CHECKING, Any

from planner.prediction import enforced
from planner.version import __version__

if TYPE_CHECKING:
    from types import ModuleType


def _plots() -> ModuleType:
    """The figure module, imported on first use (it loads matplotlib)."""
    from planner.reporting import plots

    return plots


NOT_AVAILABLE = "not available for this input"
UNIT = "ms"
"""The one time unit of the page (tables and figures)."""
SAME = 0.001
"""Plans whose predictions differ by less than this fraction predict the same time."""


class NotApplicable(Exception):  # noqa: N818 - a section outcome, not an error
    """A section that does not apply to this input; the message says why (one line)."""


MAX_TIMELINE_RANKS = 4
"""Timelines of at most this many ranks are drawn (the page stays readable)."""
MAX_ROWS = 60
"""Tables longer than this are cut, saying how many rows were left out."""

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


# ------------------------------------------------------------------ formatting


def esc(value: Any) -> str:
    """HTML-escaped text of `value`."""
    return html.escape(str(value), quote=True)


def _step(s: Mapping[str, Any], partial: bool | None = None) -> str:
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
    return f"{value * 100:+.2f}%"


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
        f'<p class="na">{len(rows) - limit} more rows not shown (see report.json).</p>'
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


def _get(document: Mapping[str, Any] | None, *keys: str) -> Any:
    """Nested lookup that returns None where any level is absent or null."""
    value: Any = document
    for key in keys:
        if not isinstance(value, Mapping) or value.get(key) is None:
            return None
        value = value[key]
    return value


def _simulation(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The simulation document of the report, whichever key it was filed under."""
    sim = report.get("simulation")
    return sim if isinstance(sim, Mapping) else None


def _comparison(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    sim = _simulation(report)
    if sim is None:
        return None
    if sim.get("kind") == "comparison":
        return sim
    return _get(sim, "comparison")


# ------------------------------------------------------------------ advice

REFERENCE_PLANS = ("baseline", "observed")


def recommendation(entry: Mapping[str, Any]) -> dict[str, Any]:
    """What to do on one rank of a comparison: the plan (never the random-order baseline
    nor the observed order) predicted fastest, its gain over the observed order, the
    replay error beside it, and whether the gain is worth applying: larger than the
    replay error and than `SAME`, in the comparison and, where the plan was replayed on
    the traced steps (``replayed``, the model the replay error measures), there too."""
    plans = {p["plan"]: p for p in entry.get("plans") or []}
    observed = plans.get("observed")
    candidates = [p for name, p in plans.items() if name not in REFERENCE_PLANS]
    best = min(candidates, key=lambda p: p["predicted"], default=None)
    error = entry.get("replay_error_median")
    gain = None
    if best is not None and observed is not None and observed["predicted"] > 0:
        gain = 1.0 - best["predicted"] / observed["predicted"]
    margin = max(abs(error) if error is not None else 0.0, SAME)
    replayed = (best or {}).get("replayed") or {}
    replayed_gain = replayed.get("gain")
    same = bool(candidates) and all(
        observed is not None
        and abs(p["predicted"] - observed["predicted"]) <= SAME * observed["predicted"]
        for p in candidates
    )
    return {
        "rank": entry.get("rank"),
        "plan": best["plan"] if best else None,
        "predicted": best["predicted"] if best else None,
        "observed": observed["predicted"] if observed else None,
        "gain": gain,
        "replay_error": error,
        "replayed_gain": replayed_gain,
        "enforce": replayed.get("enforce"),
        "caution": replayed.get("caution"),
        "apply": gain is not None
        and gain > margin
        and (
            replayed_gain is None
            # a plan's replay as enforced misses by more than the observed order's, where known
            or replayed_gain > max(margin, enforced.UNCERTAINTY.get(replayed.get("enforce"), 0.0))
        ),
        "same": same,
        "plans": len(candidates),
    }


def advice_section(report: Mapping[str, Any]) -> str:
    """The headline: the plan to apply with its predicted gain and the replay error beside
    it, or why the observed order is already as good as any plan."""
    comparison = _comparison(report)
    if not comparison or not comparison.get("ranks"):
        if _get(report, "plans", "tic"):
            return (
                '<p class="headline">No timings in this input, so no gain can be predicted. '
                "Apply the TIC order (<code>priorities_tic.json</code>) and trace a few "
                "steps (RunMetadata) to measure it.</p>"
            )
        raise NotApplicable("no simulation in this report (the input has no timings)")
    picks = [recommendation(e) for e in comparison["ranks"]]
    worth = [r for r in picks if r["apply"]]
    lines = []
    if worth:
        names = sorted({r["plan"] for r in worth})
        files = ", ".join(f"<code>priorities_{esc(n)}.json</code>" for n in names)
        lead = f"Apply the {esc(' / '.join(n.upper() for n in names))} order ({files})"
        if "caramel" in names and _get(report, "exports", "bucket_plan"):
            lead += " and Caramel's bucket plan (<code>bucket_plan.json</code>)"
        lines.append(f'<p class="headline">{lead}.</p>')
        for r in worth:
            lines.append(
                f"<p>{esc(r['rank'])}: {esc(r['plan'].upper())} predicts "
                f"<b>{seconds(r['predicted'])}</b> per step against {seconds(r['observed'])} "
                f"with the observed order: <b>{r['gain'] * 100:.1f}% faster</b>"
                + (
                    f" ({percent(r['replayed_gain'])} replayed on the traced steps)"
                    if r["replayed_gain"] is not None
                    else ""
                )
                + f", replay error of the traced steps {percent(r['replay_error'])} (median)."
                + (f" Replayed: {esc(r['caution'])}." if r.get("caution") else "")
                + "</p>"
            )
    else:
        lines.append('<p class="headline">The observed order is already as good as any plan.</p>')
    for r in picks:
        if r["apply"]:
            continue
        if r["plans"] == 0:
            why = "no scheduler applies to this rank"
        elif r["same"]:
            which = "the one plan that applies" if r["plans"] == 1 else f"all {r['plans']} plans"
            why = (
                f"{which} ({esc(str(r['plan']).upper())}) predicts the same step time as the "
                f"observed order, {seconds(r['observed'])}: the order of its transfers does "
                "not change the step"
            )
        elif r["gain"] is not None and r["gain"] > SAME and r["replayed_gain"] is not None:
            applied = (
                f", applied as <code>planner export --enforce {esc(r['enforce'])}</code> does,"
                if r.get("enforce")
                else ""
            )
            why = (
                f"the comparison credits the best plan, {esc(str(r['plan']).upper())}, with "
                f"{percent(r['gain'])} (mean op times, no waits), but replayed on the traced "
                f"steps (their op times and waits; replay error {percent(r['replay_error'])}, "
                f"median){applied} it gains {percent(r['replayed_gain'])}: "
                + (
                    "enforcing its order costs more than the order gains"
                    if r["replayed_gain"] < -SAME
                    else "the order of its transfers does not decide the step as it ran"
                )
            )
        else:
            why = (
                f"the best plan, {esc(str(r['plan']).upper())}, predicts "
                f"{seconds(r['predicted'])} against {seconds(r['observed'])} observed "
                f"({percent(r['gain'])}), within the replay error of the traced steps "
                f"({percent(r['replay_error'])})"
            )
        lines.append(f"<p>{esc(r['rank'])}: nothing to gain, because {why}.</p>")
    sweep = report.get("bucket_sweep")
    if sweep and sweep.get("recommended_cap_mb") is not None:
        lines.append(
            f'<p class="headline">Set DDP\'s <code>bucket_cap_mb={sweep["recommended_cap_mb"]:g}'
            f"</code>: {esc(sweep['reason'])} (see DDP bucket size).</p>"
        )
    elif sweep:
        lines.append(f"<p>DDP bucket size: {esc(sweep['reason'])}.</p>")
    return "".join(lines)


# ------------------------------------------------------------------ sections


def summary_section(report: Mapping[str, Any]) -> str:
    """Job summary: framework, ranks, steps, ops, transfers, bytes."""
    inspect = report.get("inspect") or {}
    ranks = inspect.get("ranks") or []
    steps = max((len(r.get("iterations") or []) for r in ranks), default=0)
    cards = [
        ("framework", esc(inspect.get("framework", "—"))),
        ("ranks", str(len(ranks))),
        ("steps traced", str(steps)),
        ("ops", f"{sum(r.get('ops', 0) for r in ranks):,}"),
        ("transfers", f"{sum(len(r.get('transfers') or []) for r in ranks):,}"),
        ("transfer bytes", nbytes(sum(r.get("transfer_bytes", 0) for r in ranks))),
    ]
    metrics = report.get("metrics")
    if metrics and metrics.get("ranks"):
        mean_e = [r["efficiency_mean"] for r in metrics["ranks"]]
        cards.append(("mean efficiency E", number(sum(mean_e) / len(mean_e))))
        cards.append(
            (
                "mean iteration",
                seconds(median(r["makespan_mean"] for r in metrics["ranks"])),
            )
        )
    comparison = _comparison(report)
    if comparison and comparison.get("ranks"):
        picks = [recommendation(e) for e in comparison["ranks"]]
        chosen = sorted({r["plan"].upper() for r in picks if r["apply"]}) or ["observed order"]
        cards.append(("recommended", esc(", ".join(chosen))))
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
        extra += f"<details><summary>{len(sources)} input files</summary><ul>"
        extra += "".join(f"<li><code>{esc(s)}</code></li>" for s in sources) + "</ul></details>"
    if notes:
        extra += f"<details><summary>{len(notes)} notes from ingest</summary><ul>"
        extra += "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul></details>"
    return f'<div class="cards">{html_cards}</div>{per_rank}{extra}'


def _plotted(
    report: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], str]:
    """The per-step rows a plot draws, and what its caption adds: every rank's up to
    `analysis.TIMELINE_RANKS` ranks; above, those of the ranks the timelines show (the
    slowest, the fastest, the most often last: `analysis.timeline_ranks`), so that the
    plot of a job of 1,000 ranks stays readable and costs what a small job's does. The
    tables (up to `MAX_ROWS` rows) and report.json hold every rank."""
    ranks = list(dict.fromkeys(r["rank"] for r in rows))
    from planner.job.analysis import TIMELINE_RANKS, timeline_ranks

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
    allreduce = _get(metrics, "allreduce", "steps")
    partial = {(s["rank"], s["iteration"]) for s in metrics.get("steps") or [] if s.get("partial")}
    if allreduce:
        rows = [
            [
                esc(s["rank"]),
                _step(s, (s["rank"], s["iteration"]) in partial),
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
            _plots().step_breakdown(drawn),
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
            _step(s),
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
        _plots().step_times(drawn),
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
    gate = _get(metrics, "gate", "min_efficiency")
    failed = {(f["rank"], f["iteration"]) for f in _get(metrics, "gate", "failed") or []}
    rows = []
    for s in steps:
        e = number(s["efficiency"])
        if (s["rank"], s["iteration"]) in failed:
            e = f'<span class="bad">{e}</span>'
        rows.append(
            [esc(s["rank"]), _step(s),
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
            _plots().efficiency(drawn, gate),
            "E = (Umax − m) / (Umax − Lmin): 1 = as good as the bounds allow (TicTac §3.2)."
            + shown,
        )
        + table(["rank", "step", "efficiency E", "speedup bound S", "busy m"], rows)
        + "<h3>Per rank</h3>"
        + table(
            ["rank", "mean E", "min E", "mean S", "oracle S", "distinct transfer orders"], ranks
        )
    )


def timeline_section(report: Mapping[str, Any]) -> str:
    """Gantt charts of the traced step and of the recommended (else the fastest) plan, one
    row per resource, all on one time axis so that their lengths compare."""
    sim = _simulation(report)
    schedules = _get(sim, "timelines") if sim else None
    if not schedules:
        raise NotApplicable("no simulated schedules in this report")
    comparison = _comparison(report) or {}
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
        f"<h3>{esc(title)}</h3>" + figure(_plots().gantt(schedule["timeline"], title, x_max))
        for title, schedule in drawn
    ]
    if len(by_rank) > MAX_TIMELINE_RANKS:
        parts.append(
            f'<p class="na">{len(by_rank) - MAX_TIMELINE_RANKS} more ranks: see the Chrome '
            "trace written by <code>planner simulate --timeline</code>.</p>"
        )
    return "".join(parts)


def _end(timeline: Mapping[str, Sequence[Any]]) -> float:
    """The last end time (s) of a timeline."""
    ends = zip(timeline["start"], timeline["duration"], strict=True)
    return max((float(s) + float(d) for s, d in ends), default=0.0)


def _observed_window_rows(report: Mapping[str, Any]) -> tuple[str, int, list[dict[str, Any]]]:
    transfers = _get(report, "metrics", "allreduce", "transfers") or []
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
    """Transfer windows per parameter as traced, and as Caramel plans them.

    Caramel places a group in the backward pass, after it, or in the next forward pass,
    each time counted from the start of its own pass. The planned chart draws the
    backward-side groups on the backward pass's axis (never a negative time); the
    groups placed in the next forward pass are in the table with their pass named."""
    parts = []
    rank, iteration, rows = _observed_window_rows(report)
    caramel = _get(report, "plans", "caramel", "ranks")
    if not rows and not caramel:
        raise NotApplicable("needs all-reduce collectives (per-parameter windows)")
    if rows:
        title = f"{rank} step {iteration}: traced windows"
        parts.append(f"<h3>Before: {esc(title)}</h3>")
        parts.append(
            figure(
                _plots().transfer_windows(rows, title),
                f"{UNIT} from the start of step {iteration}.",
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
    if caramel:
        entry = next((r for r in caramel if r["rank"] == rank), caramel[0])
        passes = {g["group"]: g.get("pass", "") for g in _get(entry, "inputs", "groups") or []}
        backward_side = ("backward", "beyond_backward", "")
        transfers = entry["transfers"]
        planned = [
            {
                "param": t.get("param") or t["name"],
                "ready": t["ready"],
                "start": t["start"],
                "duration": t["end"] - t["start"],
                "window_end": None,
                "before": t["ready"] + t["start_boundary_gain"]
                if t.get("start_boundary_gain") is not None
                else None,
            }
            for t in transfers
            if t.get("start") is not None
            and t.get("end") is not None
            and passes.get(t.get("group"), "") in backward_side
            and t["start"] >= 0
        ]
        forward = [t for t in transfers if passes.get(t.get("group"), "") not in backward_side]
        title = f"{entry['rank']}: Caramel plan"
        parts.append(f"<h3>After: {esc(title)}</h3>")
        if planned:
            parts.append(
                figure(
                    _plots().transfer_windows(planned, title, planned=True),
                    f"{UNIT} from the start of the backward pass; hollow marks: when the "
                    "parameter was ready under the baseline order.",
                )
            )
        if forward:
            parts.append(
                f"<p>{len(forward)} transfers are placed in the next forward pass: they are "
                "in the table below (times from that pass's start), not in the chart.</p>"
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
    return "".join(parts)


def _pass_time(value: float | None) -> str:
    """A time from the start of a pass; one before it (a group placed ahead of the next
    forward pass) says so instead of showing a negative time."""
    if value is not None and value < 0:
        return f"{seconds(-value)} before"
    return seconds(value)


def comparison_section(report: Mapping[str, Any]) -> str:
    """Predicted iteration time of every plan beside the measured one and the replay error."""
    comparison = _comparison(report)
    if not comparison or not comparison.get("ranks"):
        raise NotApplicable("no simulation in this report (the input has no timings)")
    replay = {r["rank"]: r for r in _get(_simulation(report), "replay", "ranks") or []}
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
        rank = entry["rank"]
        steps = (replay.get(rank) or {}).get("steps") or []
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
            parts.append(
                figure(
                    _plots().plan_comparison(entry["plans"], measured, f"{rank}: predicted time")
                )
            )
        parts.append(
            table(
                [
                    "plan",
                    "predicted",
                    "p5",
                    "p95",
                    "vs baseline",
                    "vs observed",
                    "replayed",
                    "E",
                    "alpha",
                    "note",
                ],
                rows,
            )  # fmt: skip
        )
    return "".join(parts)


def replay_section(report: Mapping[str, Any]) -> str:
    """Replay of every traced step: predicted vs measured and the signed error."""
    ranks = _get(_simulation(report), "replay", "ranks") if _simulation(report) else None
    if not ranks:
        raise NotApplicable("no simulation in this report (the input has no timings)")
    rows = [
        [esc(r["rank"]), _step(s),
         seconds(s["measured"]), seconds(s["predicted"]), percent(s.get("replay_error")),
         seconds(s.get("idle"))]
        for r in ranks
        for s in r.get("steps") or []
    ]  # fmt: skip
    return table(["rank", "step", "measured m", "replayed", "replay error", "idle"], rows)


def stragglers_section(report: Mapping[str, Any]) -> str:
    """Straggler time per step across ranks (all-reduce jobs)."""
    rows = _get(report, "metrics", "allreduce", "stragglers")
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


def buckets_section(report: Mapping[str, Any]) -> str:
    """DDP bucket advice: predicted step time per bucket_cap_mb, with the replay error."""
    sweep = report.get("bucket_sweep")
    if not sweep:
        raise NotApplicable("needs a PyTorch DDP job traced with record_shapes=True")
    if not sweep["caps"]:
        return f"<p>{esc(sweep['reason'])}.</p>"
    error = sweep.get("replay_error")
    recommended = sweep.get("recommended_cap_mb")
    head = (
        f"<p>Traced buckets: measured {seconds(sweep['measured_step_time'])}, predicted "
        f"{seconds(sweep.get('observed_predicted_step_time'))} (replay error "
        f"<b>{percent(error)}</b>). "
        + (f"<b>Recommended bucket_cap_mb={recommended:g}</b>: " if recommended else "")
        + f"{esc(sweep['reason'])}.</p>"
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
    chart = figure(
        _plots().bucket_sweep(
            sweep["caps"], sweep["measured_step_time"], "Predicted step time per bucket cap"
        )
    )
    rows = [
        [f"{c['bucket_cap_mb']:g}" + (" (recommended)" if c["bucket_cap_mb"] == recommended
                                      else ""), str(c["buckets"]),
         seconds(c["predicted_step_time"])]
        for c in sweep["caps"]
    ]  # fmt: skip
    return head + chart + table(["bucket_cap_mb", "buckets", "predicted step"], rows)


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
                f"{len(transfers)} transfers</summary>"
                + table(["order", "transfer", "parameter", "resource", "bytes", "priority"], rows)
                + "</details>"
            )
    if not parts:
        raise NotApplicable("no scheduler applies to this input")
    return "".join(parts)


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
        _plots()  # matplotlib loaded once, here, rather than in every process
    _RENDERING["report"] = report
    try:
        return forked_map(_outcome_of, range(len(SECTIONS)), workers)
    finally:
        _RENDERING.clear()


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
) -> str:
    """The whole page for `report` (a ``planner.report/1`` document).

    `files`: names of the files written beside it, listed at the end. A section whose
    data is malformed says so on the page instead of failing the whole report.
    `workers`: processes that draw the sections at once (`parallel.forked_map`; None:
    the CPUs), the same page as one process draws (about 1.5 s of figures for a job of
    many ranks, half of it on 2 cores).
    """
    schema = report.get("schema", "")
    if not str(schema).startswith("planner.report/"):
        raise ValueError(f"not a planner report document (schema {schema!r})")
    body = []
    shown = []
    left_out = []
    for (key, heading, _), (drawn, content) in zip(
        SECTIONS, _outcomes(report, workers), strict=True
    ):
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
    framework = _get(report, "inspect", "framework") or ""
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
