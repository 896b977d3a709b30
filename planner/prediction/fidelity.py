"""How far the replay's predictions can be trusted: per rank the median and largest replay
errors against busy and wall-clock time, the warning above `RELIABLE` and the cause it
names. Apart because both the replay and the comparison document carry these figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

RELIABLE = 0.05  # largest replay error (fraction) at which a prediction is shown unflagged


def _error_summary(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median and largest-magnitude (signed) error against busy and wall-clock time, over
    the complete steps (partial ones are left out and counted), and the cause of the worst."""
    complete = [s for s in steps if not s.get("partial")]
    out: dict[str, Any] = {"partial_steps": len(steps) - len(complete)}
    for key, name in (("replay_error", "replay_error"), ("wall_error", "wall_error")):
        errors = np.array([s[key] for s in complete if s.get(key) is not None])
        if not len(errors):
            out[f"{name}_median"] = out[f"{name}_max"] = None
            continue
        out[f"{name}_median"] = float(np.median(errors))
        out[f"{name}_max"] = float(errors[np.argmax(np.abs(errors))])
    misses = [
        (abs(s[key]), s[key], label, s)
        for s in complete
        for key, label in (("wall_error", "wall-clock time"), ("replay_error", "busy time"))
        if s.get(key) is not None
    ]
    worst = max(misses, key=lambda m: m[0], default=None)
    miss = worst[1:] if worst is not None else None  # (error, figure, step)
    out["cause"] = _cause_of(miss[2], miss[1]) if miss is not None else ""
    out["warning"] = reliability_warning(miss)
    out.update(_cpu_range_summary(complete))
    if complete and all(s.get("overhead_from") == "own step" for s in complete):
        out["warning"] = (
            "one traced step per rank: its replay takes the overheads from the step itself "
            "and reproduces it by construction, so the predictions have no measured error "
            "(trace several steps)"
        )
    return out


def _cpu_range_summary(complete: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A GPU rank's CPU range (the training loop's clock, `timed_cpu`) over its complete
    steps: median and largest-magnitude (signed) ``cpu_wall_error``, and above
    `RELIABLE` a warning that its ``predicted_cpu_wall`` is unreliable, naming the worst
    step and its ``cpu_cause`` (the device's step, which the plans are judged on, has
    its own warning). None where no step has a CPU range (a CPU rank, whose step spans
    are its CPU's)."""
    scored = [s for s in complete if s.get("cpu_wall_error") is not None]
    if not scored:
        return {"cpu_wall_error_median": None, "cpu_wall_error_max": None, "cpu_warning": None}
    worst = max(scored, key=lambda s: abs(s["cpu_wall_error"]))
    error = float(worst["cpu_wall_error"])
    warning = None
    if abs(error) > RELIABLE:
        warning = (
            f"the step's CPU range (the training loop's clock, replayed beside the device's "
            f"step) misses step {worst['iteration']} by {error * 100:+.1f}% "
            f"(> {RELIABLE * 100:g}%): its predicted_cpu_wall is unreliable; largest "
            f"unmodelled gap: {worst.get('cpu_cause') or 'unknown'}"
        )
    return {
        "cpu_wall_error_median": float(np.median([s["cpu_wall_error"] for s in scored])),
        "cpu_wall_error_max": error,
        "cpu_warning": warning,
    }


def reliability_warning(worst: tuple[float, str, Mapping[str, Any]] | None) -> str | None:
    """A warning when the replay of the observed order misses a complete step by more
    than `RELIABLE`: `worst` = (its largest error, signed; the figure it is of,
    wall-clock or busy time; the step), the warning naming that step, the figure and
    the step's largest unmodelled gap; None when every prediction beside it can be
    trusted to that error."""
    if worst is None:
        return "no complete step to replay: predictions have no measured error"
    error, figure, step = worst
    if abs(error) <= RELIABLE:
        return None
    return (
        f"predictions unreliable: the replay of the observed order misses the {figure} "
        f"of step {step['iteration']} by {error * 100:+.1f}% (> {RELIABLE * 100:g}%); "
        f"largest unmodelled gap: {_cause_of(step, figure) or 'unknown'}"
    )


def _cause_of(step: Mapping[str, Any], figure: str) -> str:
    """The step's cause for a miss of `figure`: of its wall-clock time, the gap on the
    critical path (``cause``); of its busy time, the largest anywhere among the rank's
    ops (``busy_cause``): a recv answered late while the step waited for other tensors
    moves no step end but spreads the step's work (TF cnn worker0 step 3)."""
    key = "busy_cause" if figure == "busy time" else "cause"
    return str(step.get(key) or step.get("cause") or "")


def _all_errors(ranks: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    return _error_summary([s for r in ranks for s in r["steps"]])
