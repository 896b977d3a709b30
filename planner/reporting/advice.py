"""The report's advice: what to do on each rank, and why not where nothing gains.

`recommendation` judges one rank of a plan comparison (the plan predicted fastest, its
gain, whether it is worth applying); the opening section of the page, the job summary,
the timelines and the plan comparison all show its verdict, so it lives apart from
each of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.prediction import enforced
from planner.reporting.markup import (
    SAME,
    NotApplicable,
    comparison_of,
    esc,
    lookup,
    percent,
    seconds,
)

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
    comparison = comparison_of(report)
    if not comparison or not comparison.get("ranks"):
        if lookup(report, "plans", "tic"):
            return (
                '<p class="headline">No timings in this input, so no gain can be predicted. '
                "Apply the TIC order (<code>priorities_tic.json</code>) and trace a few "
                "steps (RunMetadata) to measure it.</p>"
            )
        raise NotApplicable("no simulation in this report (the input has no timings)")
    picks = [recommendation(e) for e in comparison["ranks"]]
    worth = [r for r in picks if r["apply"]]
    lines = _apply_lines(report, worth)
    for r in picks:
        if r["apply"]:
            continue
        lines.append(f"<p>{esc(r['rank'])}: nothing to gain, because {_why_not(r)}.</p>")
    sweep = report.get("bucket_sweep")
    if sweep and sweep.get("recommended_cap_mb") is not None:
        lines.append(
            f'<p class="headline">Set DDP\'s <code>bucket_cap_mb={sweep["recommended_cap_mb"]:g}'
            f"</code>: {esc(sweep['reason'])} (see DDP bucket size).</p>"
        )
    elif sweep:
        lines.append(f"<p>DDP bucket size: {esc(sweep['reason'])}.</p>")
    return "".join(lines)


def _apply_lines(report: Mapping[str, Any], worth: Sequence[Mapping[str, Any]]) -> list[str]:
    """The headline and one line per rank of the plans worth applying (`worth`, picks of
    `recommendation`), or the headline that the observed order is as good as any."""
    lines = []
    if worth:
        names = sorted({r["plan"] for r in worth})
        files = ", ".join(f"<code>priorities_{esc(n)}.json</code>" for n in names)
        lead = f"Apply the {esc(' / '.join(n.upper() for n in names))} order ({files})"
        if "caramel" in names and lookup(report, "exports", "bucket_plan"):
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
    return lines


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
