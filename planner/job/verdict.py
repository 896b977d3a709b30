"""The verdict of an analysis: the one thing to do, computed once from the report
document (`planner.report/1`) and rendered the same by every output (the CLI's first
line, the HTML headline, report.json's ``verdict``, the Markdown summary), so that no
two outputs can say different things (issue #46).

The action is one of: apply a plan (TIC, TAC or Caramel) whose predicted gain over the
observed order exceeds the replay error of the traced steps and `MIN_GAIN` and, where the plan was
replayed as enforced, its replayed gain too (`recommendation`), and which no rank's
replay as enforced says would slow it (`_losing`: every rank waits for the slowest each
step); set DDP's
``bucket_cap_mb`` where the bucket sweep recommends a cap (the larger predicted gain of
the two wins); trace timings where the input has none; else keep what you have, with
the reason. The figures it cites are those the outputs' tables show: a plan's speedup
against the observed order (the ``vs obs`` column, observed / predicted - 1), the median
replay error, the sweep's predicted step times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# A plan is applied only when it is predicted faster than the observed order by more
# than a bucket cap must be (`buckets.MIN_GAIN`): the lab's A/A pairs, the same job
# measured twice, differed by 0.1-6.5%, and a plan predicted +0.1% to +0.4% (the TF mlp at
# 1500 and 600 Mbit/s) measured +0.2% to +0.4% slower.
from planner.planning.buckets import MIN_GAIN
from planner.prediction import enforced

SCHEMA = "planner.verdict/1"

SAME = 0.001
"""Predicted step times within this fraction of each other are the same step."""

REFERENCE_PLANS = ("baseline", "observed")


def recommendation(entry: Mapping[str, Any]) -> dict[str, Any]:
    """What to do on one rank of a comparison: the plan (never the random-order baseline
    nor the observed order) predicted fastest, its gain over the observed order, the
    replay error beside it, and whether the gain is worth applying: larger than the
    replay error and than `MIN_GAIN`, in the comparison and, where the plan was replayed on
    the traced steps (``replayed``, the model the replay error measures), there too."""
    plans = {p["plan"]: p for p in entry.get("plans") or []}
    observed = plans.get("observed")
    candidates = [p for name, p in plans.items() if name not in REFERENCE_PLANS]
    best = min(candidates, key=lambda p: p["predicted"], default=None)
    error = entry.get("replay_error_median")
    gain = None
    if best is not None and observed is not None and observed["predicted"] > 0:
        gain = 1.0 - best["predicted"] / observed["predicted"]
    margin = max(abs(error) if error is not None else 0.0, MIN_GAIN)
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
        "speedup": best.get("speedup_vs_observed") if best else None,
        "replay_error": error,
        "replayed_gain": replayed_gain,
        "enforce": replayed.get("enforce"),
        "caution": replayed.get("caution"),
        "hook_seconds": (best or {}).get("hook_seconds"),
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


def with_verdict(report: Mapping[str, Any]) -> dict[str, Any]:
    """`report` with its ``verdict``."""
    return {**report, "verdict": verdict(report)}


def verdict(report: Mapping[str, Any]) -> dict[str, Any]:
    """`planner.verdict/1` of a `planner.report/1` document (see the module docstring)."""
    comparison = (report.get("simulation") or {}).get("comparison") or {}
    picks = [recommendation(e) for e in comparison.get("ranks") or []]
    sweep = report.get("bucket_sweep") or {}
    if not picks:
        if (report.get("plans") or {}).get("tic"):
            return _document(
                "trace_timings", picks, plan="tic", files=["priorities_tic.json"],
                text="Apply the TIC order (priorities_tic.json) and trace a few steps "
                "(RunMetadata) to measure it: this input has no timings, so no gain can be "
                "predicted.",
            )  # fmt: skip
        return _document("keep", picks, text="Keep what you have: no plan applies.")
    # every rank waits for the slowest each step: a plan that slows one rank slows the job
    losing = _losing(picks)
    for r in picks:
        r["apply"] = r["apply"] and r["plan"] not in losing
    worth = [r for r in picks if r["apply"]]
    plan_gain = min((r["speedup"] for r in worth if r["speedup"] is not None), default=None)
    cap_gain = _cap_gain(sweep)
    if worth and (cap_gain is None or (plan_gain is not None and plan_gain >= cap_gain)):
        return _plan_verdict(worth, picks, report)
    if cap_gain is not None:
        cap = sweep["recommended_cap_mb"]
        return _document(
            "set_bucket_cap", picks, bucket_cap_mb=cap, speedup=cap_gain,
            text=f"Set DDP's bucket_cap_mb={cap:g}: {sweep['reason']}.",
        )  # fmt: skip
    return _document("keep", picks, text=f"Keep what you have: {_why_keep(picks, sweep, losing)}.")


def _losing(picks: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Plan -> the rank where, replayed on the traced steps as enforced, it loses most:
    the plans some rank would run slower."""
    out: dict[str, Mapping[str, Any]] = {}
    for r in picks:
        gain = r["replayed_gain"]
        if (
            gain is not None
            and gain < -SAME
            and (r["plan"] not in out or gain < out[r["plan"]]["replayed_gain"])
        ):
            out[r["plan"]] = r
    return out


def _plan_verdict(
    worth: Sequence[Mapping[str, Any]], picks: list[dict[str, Any]], report: Mapping[str, Any]
) -> dict[str, Any]:
    """Apply the plan(s) of the ranks where one is worth it."""
    names = sorted({r["plan"] for r in worth})
    files = [f"priorities_{n}.json" for n in names]
    if "caramel" in names and (report.get("exports") or {}).get("bucket_plan"):
        files.append("bucket_plan.json")
    speedups = sorted(r["speedup"] for r in worth if r["speedup"] is not None)
    errors = sorted(abs(r["replay_error"]) for r in worth if r["replay_error"] is not None)
    cited = _span(speedups) if speedups else "a gain"
    text = (
        f"Apply {' / '.join(plan_label(n) for n in names)} ({', '.join(files)}): predicted "
        f"{cited} per step against the observed order"
        + (f" on {len(worth)} of {len(picks)} ranks" if len(picks) > 1 else "")
        + (f", replay error {_span(errors, signed=False)} (median)" if errors else "")
        + "."
    )
    return _document(
        "apply_plan", picks, plan=names[0] if len(names) == 1 else None, files=files,
        speedup=speedups[0] if speedups else None,
        replay_error=errors[-1] if errors else None, text=text,
    )  # fmt: skip


def _cap_gain(sweep: Mapping[str, Any]) -> float | None:
    """The bucket sweep's predicted gain of its recommended cap over the traced buckets
    (traced predicted / recommended predicted - 1), None without a recommendation."""
    cap = sweep.get("recommended_cap_mb")
    if cap is None:
        return None
    row = next((c for c in sweep.get("caps") or [] if c["bucket_cap_mb"] == cap), None)
    traced = sweep.get("observed_predicted_step_time")
    if row is None or not traced or not row["predicted_step_time"]:
        return None
    return traced / row["predicted_step_time"] - 1.0


def _why_keep(
    picks: Sequence[Mapping[str, Any]],
    sweep: Mapping[str, Any],
    losing: Mapping[str, Mapping[str, Any]],
) -> str:
    """Why no plan is worth applying: the first reason that holds over the ranks."""
    best = max(picks, key=lambda r: r["speedup"] if r["speedup"] is not None else -1.0)
    # (a rank its plan would speed up, the rank the same plan would slow most)
    held = [
        (r, losing[r["plan"]])
        for r in picks
        if r["plan"] in losing and r["replayed_gain"] is not None and r["replayed_gain"] > -SAME
    ]
    if all(r["plans"] == 0 for r in picks):
        why = "no scheduler applies"
    elif all(r["same"] for r in picks):
        why = (
            "no plan changes the predicted step time: the order of the transfers does not decide it"
        )
    elif held:
        gains, loses = held[0]
        why = (
            f"{plan_label(gains['plan'])} gains on {gains['rank']} but, replayed on "
            f"{loses['rank']}'s traced steps as enforced, {loses['replayed_gain']:+.1%}: every "
            "rank waits for the slowest each step, so a plan that slows one slows the job"
        )
    elif best["replayed_gain"] is not None and best["replayed_gain"] < -SAME:
        how = (
            f"through planner's DDP hook ({best['hook_seconds'] * 1e3:.1f} ms a step for its "
            "calls and its passes over the buckets)"
            if best.get("hook_seconds")
            else "as enforced"
        )
        why = (
            f"the best plan, {plan_label(best['plan'])}, replayed on the traced steps {how} "
            f"gains {best['replayed_gain']:+.1%}: enforcing its order costs more than it gains"
        )
    else:
        error = best["replay_error"]
        bound = (
            f"within the replay error of the traced steps ({error:+.1%})"
            if error is not None and abs(error) >= MIN_GAIN
            else f"less than the {MIN_GAIN:.0%} a plan must gain"
            + (f" (replay error {error:+.1%})" if error is not None else "")
        )
        why = (
            f"the best plan, {plan_label(best['plan'])}, predicts "
            + (f"{best['speedup']:+.1%}" if best["speedup"] is not None else "no gain")
            + f" against the observed order, {bound}"
        )
    if sweep.get("reason"):
        why += f"; DDP bucket size: {sweep['reason']}"
    return why


def _document(action: str, picks: list[dict[str, Any]], text: str, **fields: Any) -> dict[str, Any]:
    document = {"schema": SCHEMA, "action": action, "plan": None, "files": [],
                "bucket_cap_mb": None, "speedup": None, "replay_error": None}  # fmt: skip
    document.update(fields)
    document["text"] = text
    document["ranks"] = picks
    return document


def plan_label(plan: str | None) -> str:
    """A plan as the tables name it: Caramel, TIC, TAC."""
    return "Caramel" if plan == "caramel" else str(plan).upper()


def _span(values: Sequence[float], signed: bool = True) -> str:
    """One figure, or the lowest and highest of several, as the tables show them."""
    form = "{:+.1%}" if signed else "{:.1%}"
    low, high = form.format(values[0]), form.format(values[-1])
    return low if low == high else f"{low} to {high}"
