"""The overheads a step's replay is lent by the rank's other steps (leave one out): the
typical wait of each op (`typical_overheads`), an orphan's typical start
(`orphan_overheads`) and which steps cover enough of their time to lend (`covered_steps`).
Apart because they are the statistics over a rank's step models, not the model of one."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from planner.prediction.compiled import Compiled, sorted_unique
from planner.prediction.step_model import StepModel, measured, own_rows

MIN_COVER = 0.5  # a step whose records cover less of its wall-clock time is untypical


def _others(lending: np.ndarray, row: int) -> np.ndarray:
    """The rows a step's replay takes typical values from: the lending steps other than
    `row`, or every other step when none of them lends (leave one out)."""
    mask = lending.copy()
    mask[row] = False
    if not mask.any():
        mask = np.ones(len(lending), dtype=bool)
        mask[row] = False
    return mask


def nan_medians(table: np.ndarray) -> np.ndarray:
    """`np.nanmedian(table, axis=0)` for a 2-d `table` whose every column holds a
    number: the same values bit for bit (the mean of the two middle numbers is their sum
    halved, as numpy's masked median takes it), without the masked arrays numpy goes
    through for short columns (the replay asks once per step and rank)."""
    ordered = np.sort(table, axis=0)  # NaN last
    count = (~np.isnan(table)).sum(axis=0)
    cols = np.arange(table.shape[1])
    low, high = ordered[(count - 1) // 2, cols], ordered[count // 2, cols]
    return (low + high) / 2.0


def typical_overheads(
    models: Mapping[int, StepModel], lenders: Collection[int] | None = None
) -> dict[int, np.ndarray]:
    """Step -> the overhead per op the replay of that step uses: the median of the op's
    overhead over the *other* steps of the rank (leave one out) among `lenders` (all
    steps when None or when no other step lends).

    The replay must not be handed the step's own waits, or it reproduces the step by
    construction and its error says nothing: with the overhead of the other steps it
    predicts the step from what is typical of each op, as a plan's prediction must. An op
    seen in no other step (or a rank with one step) keeps its own overhead.
    """
    items = sorted(models)
    if not items:
        return {}
    table = np.stack([np.where(models[i].observed, models[i].overhead, np.nan) for i in items])
    lending = np.array([lenders is None or i in lenders for i in items])
    out = {}
    for row, it in enumerate(items):
        others = table[_others(lending, row)]
        typical = np.full(table.shape[1], np.nan)
        seen = (~np.isnan(others)).any(axis=0) if len(others) else np.zeros(len(typical), bool)
        if seen.any():
            typical[seen] = nan_medians(others[:, seen])
        out[it] = np.where(np.isnan(typical), models[it].overhead, typical)
    return out


def orphan_overheads(
    compiled: Compiled,
    models: Mapping[int, StepModel],
    overheads: Mapping[int, np.ndarray],
    own: int | None,
    lenders: Collection[int] | None = None,
) -> dict[int, np.ndarray]:
    """`overheads` (as `typical_overheads` gives them) with the orphans of each step
    waiting until their typical start: an orphan is an op with a record none of whose
    predecessors has one in this step, one of them recorded in another step.

    An op's typical overhead is its wait after its predecessors, but an orphan's ready
    time in this step is taken without the predecessor, so that wait would start it
    from a point it never started from: `generated/tf/cnn_ps_ingraph` worker0 step 3's
    PS read of `add` ended before the worker's first record (not in the step), and its
    recv, answered 10.2 ms into the step and 10.3 ms long, replayed from the step's
    start (its wait after the read is 2 us in the other steps); its busy time +12.6%.
    Its start in the step (the median over the other lending steps, as
    `typical_overheads` takes them) is what the other steps say of it. Only a
    predecessor among the joined PS work (numbered from `own` on) makes an orphan: an
    op of the rank's own missing from one step (a Kineto call named differently) leaves
    its successors' waits as they are, and a kernel's ready time holds its launch's
    offset, which a typical start would not. An op with another predecessor in the
    step waits after that one as usual: in the small CNN's between-graph run1
    (traces/tf) the PS's `global_step` read ended before worker1's step 3 began, but
    `Read/ReadVariableOp` ran 5 us after its other predecessor, 5.4 ms before its
    typical start.
    """
    items = sorted(models)
    if len(items) < 2 or own is None:
        return dict(overheads)
    g_src, g_dst = compiled.src, compiled.dst
    starts = np.stack([np.where(models[i].observed, models[i].start_of, np.nan) for i in items])
    lending = np.array([lenders is None or i in lenders for i in items])
    out = dict(overheads)
    for row, it in enumerate(items):
        model = models[it]
        elsewhere = ~np.isnan(np.delete(starts, row, axis=0)).all(axis=0)
        cut = model.observed[g_dst] & ~model.observed[g_src] & elsewhere[g_src] & (g_src >= own)
        held = sorted_unique(g_dst[model.observed[g_dst] & model.observed[g_src]])
        orphans = np.setdiff1d(sorted_unique(g_dst[cut]), held)  # no predecessor left
        others = starts[_others(lending, row)][:, orphans]
        seen = (~np.isnan(others)).any(axis=0)
        orphans, others = orphans[seen], others[:, seen]
        if not len(orphans):
            continue
        typical = nan_medians(others)
        waits = out[it].copy()
        waits[orphans] = np.maximum(typical - model.ready[orphans], 0) / 1e9
        out[it] = waits
    return out


def covered_steps(
    models: Mapping[int, tuple[Mapping[str, np.ndarray], tuple[int, int], StepModel]],
    own: int | None = None,
) -> set[int]:
    """The steps whose records of the rank's own ops (the first `own` of the compiled
    graph, all when None) cover at least `MIN_COVER` of their wall-clock span (`models`:
    as `_step_models` gives them). A step covered less (a warm-up spent in what the
    trace does not record: TF1's first run of the merged timeline, 114 ms with 1%
    covered) is not judged by the bench and lends no overheads: its waits are not
    typical."""
    out = set()
    for it, (known, span, _) in models.items():
        rows = own_rows(known, own)
        wall = (span[1] - span[0]) / 1e9
        if len(rows["idx"]) and wall > 0 and measured(rows)[0] >= MIN_COVER * wall:
            out.add(it)
    return out
