"""Steps with missing records: detected once, flagged in every output, kept out of gates
and fits.

A profiler can drop records: TF's PS-side RecvTensor log is shared by the workers'
concurrently traced steps and can be incomplete, a Kineto buffer can overflow. Such a
step's busy time lacks the missing ops, so its efficiency, its replay error and any fit
on it are wrong. An op recorded in every other step of a rank but not in this one is
missing from it (an op seen in only some steps is not taken as missing), and the step
is partial when its missing ops took at least `MISSING_SHARE` of the recorded op time
of a typical step: less than that cannot move a figure of the step by as much. Real
traces need the share. A call can be absent from a step without any record lost: in an
integer-microsecond Kineto trace a zero-length child starting in its parent's last
microsecond reads as nested in some steps and as its parent's sibling in others (HTA
``trace_diff``: an ``aten::zero_``, ``aten::resolve_conj`` or ``aten::to`` of 0-4 us
in a 76 ms step), and a polling thread calls ``cudaEventQuery`` as often as it happens to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

MISSING_SHARE = 0.005  # of a typical step's recorded op time: below it, not partial


def partial_steps(
    rows: pd.DataFrame | Mapping[str, Any], ops: Iterable[str]
) -> dict[int, tuple[str, ...]]:
    """Step -> the ops of `ops` recorded in every other step of one rank but not in it.

    `rows`: one rank's timings (`iteration`, `op`, `duration`), a DataFrame or numpy
    columns (`Trace.table`: no pandas needed). Empty with fewer than 2 steps (there is
    nothing to compare with).
    """
    op = np.asarray(rows["op"], dtype=object).tolist()
    iteration = np.asarray(rows["iteration"], dtype=np.int64)
    duration = np.asarray(rows["duration"], dtype=np.float64)
    if not len(op):
        return {}
    # (speed) the names numbered (a dict, not pandas: `inspect` loads no pandas), each
    # distinct one tested once, then (op, step) presence as a bool table: called per
    # rank by the oracle, the metrics and the replay, on every row
    number = {o: i for i, o in enumerate(dict.fromkeys(op))}
    codes = np.fromiter(map(number.__getitem__, op), np.int64, len(op))
    names = np.empty(len(number), dtype=object)
    names[:] = list(number)
    wanted = set(ops)
    keep = np.fromiter((n in wanted for n in number), dtype=bool, count=len(names))
    chosen = keep[codes]
    return missing_ops(codes[chosen], iteration[chosen], names, duration[chosen])


def missing_ops(
    codes: np.ndarray,
    iteration: np.ndarray,
    names: Sequence[str] | np.ndarray,
    duration: np.ndarray,
) -> dict[int, tuple[str, ...]]:
    """`partial_steps` of rows given as op numbers (`codes`, indices into `names`), their
    steps and durations: for a caller that has numbered the ops already (the replay, by
    its compiled graph), so no name is looked up again."""
    steps, step_of = np.unique(iteration, return_inverse=True)
    if len(steps) < 2:
        return {}
    present = np.zeros((len(names), len(steps)), dtype=bool)
    present[codes, step_of] = True
    candidates = np.flatnonzero(present.sum(axis=1) == len(steps) - 1)
    if not len(candidates):
        return {}
    duration = np.asarray(duration, dtype=np.float64)
    typical_step = float(np.median(np.bincount(step_of, duration, len(steps))))
    # each candidate's time per step it ran in (rows of one op in one step summed)
    slot = np.full(len(names), -1, dtype=np.int64)
    slot[candidates] = np.arange(len(candidates))
    mine = slot[codes] >= 0
    took = np.zeros((len(candidates), len(steps)), dtype=np.float64)
    np.add.at(took, (slot[codes[mine]], step_of[mine]), duration[mine])
    took[~present[candidates]] = np.nan
    typical_op = np.nanmedian(took, axis=1)
    names = np.asarray(names, dtype=object)
    out = {}
    for column, step in enumerate(steps.tolist()):
        absent = ~present[candidates, column]
        if typical_step > 0 and typical_op[absent].sum() < MISSING_SHARE * typical_step:
            continue
        gone = tuple(sorted(names[candidates[absent]].tolist()))
        if gone:
            out[int(step)] = gone
    return out


def note(rank: str, step: int, missing: tuple[str, ...]) -> str:
    """One line naming the step and what is missing, for notes and JSON flags."""
    shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    return (
        f"{rank} step {step}: partial: {len(missing)} op(s) recorded in every other step "
        f"have no record ({shown}); left out of gates, fits and error figures"
    )
