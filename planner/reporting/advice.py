"""The report's advice: what to do on each rank, and why not where nothing gains.

`recommendation` judges one rank of a plan comparison (the plan predicted fastest, its
gain, whether it is worth applying); the opening section of the page, the job summary,
the timelines and the plan comparison all show its verdict, so it lives apart from
each of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.job.verdict import verdict
from planner.reporting.markup import (
    SAME,
    NotApplicable,
    esc,
    percent,
    seconds,
)


def advice_section(report: Mapping[str, Any]) -> str:
    """The headline: the report's verdict (`planner.job.verdict`, the line every output
    opens with), then per rank the figures behind it, or why nothing gains there."""
    found = report.get("verdict") or verdict(report)
    if not found["ranks"] and found["action"] != "trace_timings":
        raise NotApplicable("no simulation in this report (the input has no timings)")
    lines = [f'<p class="headline">{esc(found["text"])}</p>']
    for r in found["ranks"]:
        if r["apply"]:
            lines.append(_apply_line(r))
        else:
            lines.append(f"<p>{esc(r['rank'])}: nothing to gain, because {_why_not(r)}.</p>")
    sweep = report.get("bucket_sweep")
    if sweep and found["action"] != "set_bucket_cap":
        lines.append(f"<p>DDP bucket size: {esc(sweep['reason'])}.</p>")
    return "".join(lines)


def _apply_line(r: Mapping[str, Any]) -> str:
    """The figures of a rank whose plan is worth applying (`r`, a `recommendation`)."""
    return (
        f"<p>{esc(r['rank'])}: {esc(r['plan'].upper())} predicts "
        f"<b>{seconds(r['predicted'])}</b> per step against {seconds(r['observed'])} "
        f"with the observed order: <b>{percent(r['speedup'])}</b>"
        + (
            f" ({percent(r['replayed_gain'])} replayed on the traced steps)"
            if r["replayed_gain"] is not None
            else ""
        )
        + f", replay error of the traced steps {percent(r['replay_error'])} (median)."
        + (f" Replayed: {esc(r['caution'])}." if r.get("caution") else "")
        + "</p>"
    )


def _why_not(r: Mapping[str, Any]) -> str:
    """Why a rank's best plan (`r`, a pick of `recommendation` not worth applying) gains
    nothing: no plan applies, every plan predicts the observed time, the replay takes
    the gain back, or the gain is within the replay error."""
    if r["plans"] == 0:
        return "no scheduler applies to this rank"
    if r["same"]:
        which = "the one plan that applies" if r["plans"] == 1 else f"all {r['plans']} plans"
        return (
            f"{which} ({esc(str(r['plan']).upper())}) predicts the same step time as the "
            f"observed order, {seconds(r['observed'])}: the order of its transfers does "
            "not change the step"
        )
    if r["gain"] is not None and r["gain"] > SAME and r["replayed_gain"] is not None:
        applied = (
            f", applied as <code>planner export --enforce {esc(r['enforce'])}</code> does,"
            if r.get("enforce")
            else ""
        )
        return (
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
    return (
        f"the best plan, {esc(str(r['plan']).upper())}, predicts "
        f"{seconds(r['predicted'])} against {seconds(r['observed'])} observed "
        f"({percent(r['gain'])}), within the replay error of the traced steps "
        f"({percent(r['replay_error'])})"
    )
