"""Steps with missing records: detected once, flagged in every output, kept out of gates
and fits.

A profiler can drop records: TF's PS-side RecvTensor log is shared by the workers'
concurrently traced steps and can be incomplete, a Kineto buffer can overflow. Such a
step's busy time lacks the missing ops, so its efficiency, its replay error and any fit
on it are wrong. An op recorded in every other step of a rank but not in this one marks
the step partial (an op seen in only some steps is not taken as missing).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd


def partial_steps(rows: pd.DataFrame, ops: Iterable[str]) -> dict[int, tuple[str, ...]]:
    """Step -> the ops of `ops` recorded in every other step of one rank but not in it.

    `rows`: one rank's timings (`iteration`, `op`). Empty with fewer than 2 steps (there
    is nothing to compare with).
    """
    known = rows.loc[rows["op"].isin(list(ops)), ["iteration", "op"]]
    steps = known["iteration"].unique()
    if len(steps) < 2:
        return {}
    seen = known.drop_duplicates().groupby("op")["iteration"].nunique()
    candidates = set(seen.index[seen == len(steps) - 1])
    if not candidates:
        return {}
    out = {}
    for step, of_step in known.groupby("iteration", sort=True):
        gone = tuple(sorted(candidates - set(of_step["op"])))
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
