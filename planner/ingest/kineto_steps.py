"""Steps, lanes, phases and op nesting of one rank's Kineto events.

A step is a ``ProfilerStep#N`` range; without one, the ranges of `step_marker` (any
annotation or op name the user gives); without that, the occurrences of the top-level
annotation that repeats most (covering the most time), else the whole trace as one
step. Ranges that cover little of the loop (``Optimizer.zero_grad``) mark its
iterations from one start to the next, the last one to the end of the loop's last
annotation. Every fallback leaves a note, so a user knows what a "step" means for the
trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from planner.errors import InputError
from planner.ingest.kineto_events import CPU_OP_CATS, GPU_CATS, STEP_NAME, RankEvents
from planner.model.arrays import unique
from planner.model.graph import PHASES

FORWARD, BACKWARD, OPTIMIZER, UNKNOWN, INPUT = map(
    PHASES.index, ("forward", "backward", "optimizer", "unknown", "input")
)  # phase codes: indexes into PHASES
_BIG = np.int64(1) << np.int64(62)


@dataclass(frozen=True)
class Steps:
    """The step ranges of one rank (CPU side), in order of start."""

    number: np.ndarray  # int64 step numbers
    start: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    main_lane: int  # lane code of the thread that runs the steps, -1 without CPU events
    source: str  # "ProfilerStep", "marker", "annotation" or "whole"
    notes: list[str] = field(default_factory=list)


def find_steps(ev: RankEvents, rank: str, step_marker: str | None = None) -> Steps:
    """The step ranges of `ev`: ProfilerStep#N, else `step_marker`, else a fallback."""
    if step_marker:
        return _marker_steps(ev, rank, step_marker)
    step_rows = np.flatnonzero(ev.name_flags(STEP_NAME.match) & ~ev.cat_flags(_GPU_SIDE))
    if len(step_rows):
        return _profiler_steps(ev, step_rows)
    return _fallback_steps(ev, rank)


_GPU_SIDE = frozenset({*GPU_CATS, "gpu_user_annotation"})


def _profiler_steps(ev: RankEvents, step_rows: np.ndarray) -> Steps:
    """``ProfilerStep#N`` ranges by start (a quicksort, as pandas' sort_values: ties
    resolve as they always have), the first range of each step number kept."""
    names, code = ev.names, ev.name_code
    numbers = np.array([int(names[code[i]].split("#")[1]) for i in step_rows], np.int64)
    by_start = np.argsort(ev.ts[step_rows], kind="quicksort")
    first = np.sort(np.unique(numbers[by_start], return_index=True)[1])
    rows = step_rows[by_start[first]]
    main = int(np.bincount(ev.lane[rows]).argmax())  # the most common; lowest on ties
    return Steps(numbers[by_start[first]], ev.ts[rows], ev.end[rows], main, "ProfilerStep")


def _ranges(ev: RankEvents, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The outermost of the ranges `rows` (nested repeats dropped), by start, numbered 0.."""
    rows = rows[np.lexsort((-ev.end[rows], ev.ts[rows]))]
    reach = np.maximum.accumulate(ev.end[rows])
    outer = np.concatenate([[True], ev.ts[rows][1:] >= reach[:-1]])
    rows = rows[outer]
    return np.arange(len(rows), dtype=np.int64), ev.ts[rows], ev.end[rows]


def _main_lane(ev: RankEvents, rows: np.ndarray | None = None) -> int:
    """The lane of `rows` (most common), else the CPU lane with the most events."""
    if rows is None or len(rows) == 0:
        rows = np.flatnonzero(ev.cat_flags(CPU_OP_CATS | {"user_annotation"}))
    return int(np.bincount(ev.lane[rows]).argmax()) if len(rows) else -1


def _marker_steps(ev: RankEvents, rank: str, marker: str) -> Steps:
    rows = np.flatnonzero(ev.name_flags(marker.__eq__) & ~ev.cat_flags(_GPU_SIDE))
    if len(rows) == 0:
        raise InputError(ev.path, f"no event named {marker!r} (the --step-marker)")
    loop = not _covers_loop(ev, rows) and _one_loop(ev, rows)
    number, start, end, said = _iterations(ev, rows, _loop_marks(ev, rows) if loop else None)
    note = f"{rank}: steps are the {len(number)} {_what(loop)} {marker!r} (--step-marker){said}"
    return Steps(number, start, end, _main_lane(ev, rows), "marker", [note])


LOOP_COVER = 0.5
"""Ranges of a repeating annotation whose median length is less than this share of the
median time from one's start to the next's mark a point of the training loop (the
optimizer's ``zero_grad``), not its body."""


def _covers_loop(ev: RankEvents, rows: np.ndarray) -> bool:
    """Whether the ranges `rows` are the loop's body (`LOOP_COVER`)."""
    _, start, end = _ranges(ev, rows)
    return len(start) < 2 or np.median(end - start) >= LOOP_COVER * np.median(np.diff(start))


def _iterations(
    ev: RankEvents, rows: np.ndarray, marks: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(number, start, end, what a note adds) of the iterations the ranges `rows` mark:
    the ranges themselves, or, given `marks` (the rows of the loop's annotations), the
    time from each one's start to the next's. The work before the first start is the
    first iteration where annotations that run in every iteration (`_loop_marks`) run
    there (the marker ends its iteration, as ``Optimizer.step`` does), from the first
    of them, unless that is under `LOOP_COVER` of the loop's median period; the
    last iteration runs to the end of the loop's last annotation, and is left out as a
    stub where that is under `LOOP_COVER` of the loop's median period (a marker that
    ends its iteration leaves only its own last range after it). What the trace holds
    outside them is in no iteration."""
    number, start, end = _ranges(ev, rows)
    if marks is None or len(number) < 2:
        return number, start, end, ""
    last = int(ev.end[marks[ev.ts[marks] >= start[-1]]].max())
    end = np.append(start[1:], last)
    said = ""
    period = float(np.median(np.diff(start)))
    loop = _loop_marks(ev, rows)
    before = loop[ev.ts[loop] < start[0]]
    if len(before) and start[0] - ev.ts[before].min() >= LOOP_COVER * period:
        start, end = np.insert(start, 0, ev.ts[before].min()), np.insert(end, 0, start[0])
        said += "; the first from the loop's first annotation before the first of them"
    if len(start) > 1 and end[-1] - start[-1] < LOOP_COVER * period:
        said += (
            f"; the {(end[-1] - start[-1]) / 1e3:.1f} µs from the last one on is no whole "
            "iteration (a stub): left out"
        )
        start, end = start[:-1], end[:-1]
    return np.arange(len(start), dtype=np.int64), start, end, said


_NUMBERED = re.compile(r"#\d+$")


def _loop_marks(ev: RankEvents, rows: np.ndarray) -> np.ndarray:
    """The rows of the loop's annotations: `rows`, and the annotations on their thread
    whose name (a step number dropped: ``ProfilerStep#N``) runs in every iteration from
    one start of `rows` to the next (``Optimizer.zero_grad`` beside ``Optimizer.step``)."""
    _, start, _ = _ranges(ev, rows)
    ann = ev.cat_flags({"user_annotation"}) & ~ev.name_flags(_COMM_ANNOTATION.match)
    others = np.flatnonzero(ann & (ev.lane == ev.lane[rows[0]]))
    others = np.setdiff1d(others, rows)
    if len(start) < 2 or not len(others):
        return rows
    key = [_NUMBERED.sub("", n) for n in ev.names]
    iteration = np.searchsorted(start, ev.ts[others], side="right") - 1
    complete = (iteration >= 0) & (iteration < len(start) - 1)
    seen: dict[str, set[int]] = {}
    for r, it in zip(others[complete].tolist(), iteration[complete].tolist(), strict=True):
        seen.setdefault(key[ev.name_code[r]], set()).add(it)
    every = {name for name, its in seen.items() if len(its) == len(start) - 1}
    mine = np.fromiter((key[ev.name_code[r]] in every for r in others.tolist()), bool, len(others))
    return np.sort(np.concatenate([rows, others[mine]]))


def _one_loop(ev: RankEvents, rows: np.ndarray) -> bool:
    """Whether the ranges `rows` can mark a training loop: on one thread, none inside
    another (an inference server's stages on many threads cannot)."""
    return len(unique(ev.lane[rows])) == 1 and len(_ranges(ev, rows)[0]) == len(rows)


def _what(loop: bool) -> str:
    """How a note names the iterations `_iterations` made."""
    return "iterations from one start to the next of" if loop else "ranges of"


def _fallback_steps(ev: RankEvents, rank: str) -> Steps:
    """The ranges of the repeating top-level annotation covering most time where they
    are the loop's body (long, and no other annotation repeats on their thread); else
    the iterations from one start to the next of the loop's head (the most frequent
    repeating top-level annotation, the earliest on ties: the DataLoader's ``__next__``
    before ``Optimizer.zero_grad``) where it marks one loop (`_one_loop`); else the
    whole trace."""
    ann = ev.cat_flags({"user_annotation"}) & ~ev.name_flags(_COMM_ANNOTATION.match)
    rows = np.flatnonzero(ann)
    candidates: list[tuple[int, int, int, str, np.ndarray]] = []
    if len(rows):
        top = _top_level(ev, rows)
        for code in unique(ev.name_code[top]).tolist():
            mine = top[ev.name_code[top] == code]
            if len(mine) >= 2:
                covered = int((ev.end[mine] - ev.ts[mine]).sum())
                first = int(ev.ts[mine].min())
                candidates.append((covered, len(mine), first, ev.names[code], mine))
    if candidates:
        best = max(candidates, key=lambda c: c[0])
        head = min(candidates, key=lambda c: (-c[1], c[2]))
        best_lane, head_lane = ev.lane[best[4][0]], ev.lane[head[4][0]]
        alone = not any(c is not best and (ev.lane[c[4]] == best_lane).any() for c in candidates)
        loop = not (alone and _covers_loop(ev, best[4])) and _one_loop(ev, head[4])
        _, _, _, name, mine = head if loop else best
        marks = [c[4] for c in candidates if (ev.lane[c[4]] == head_lane).all()]  # the loop's
        number, start, end, said = _iterations(ev, mine, np.concatenate(marks) if loop else None)
        note = (
            f"{rank}: no ProfilerStep#N; steps are the {len(number)} {_what(loop)} the "
            f"top-level annotation {name!r}{said} (give --step-marker NAME to choose another)"
        )
        return Steps(number, start, end, _main_lane(ev, mine), "annotation", [note])
    note = (
        f"{rank}: no ProfilerStep#N and no repeating top-level annotation; the whole "
        "trace is one step (give --step-marker NAME to split it)"
    )
    start, end = np.array([ev.ts.min()]), np.array([ev.end.max() + 1])
    return Steps(np.zeros(1, np.int64), start, end, _main_lane(ev), "whole", [note])


_COMM_ANNOTATION = re.compile(r"^(nccl|gloo|rccl|hccl|mpi|ucc|xccl|mccl):", re.IGNORECASE)


def _top_level(ev: RankEvents, rows: np.ndarray) -> np.ndarray:
    """Those of `rows` that no CPU op or annotation on their lane encloses."""
    cpu = ev.cat_flags(CPU_OP_CATS | {"user_annotation"})
    is_outer, _ = outer_index(ev.lane, ev.ts, ev.end, cpu)
    return rows[is_outer[rows]]


def phase_code(name: str) -> int:
    """The phase (its index in `PHASES`) a record_function range of this name marks."""
    key = name.strip("# ").lower()
    if key == "forward" or key.startswith("forward_"):
        return FORWARD
    if key == "backward" or key.startswith("backward_"):
        return BACKWARD
    if key.startswith("optimizer") and "zero_grad" not in key:
        return OPTIMIZER
    return UNKNOWN


def phases(ev: RankEvents, anchor: np.ndarray, rank: str, notes: list[str]) -> np.ndarray:
    """Per row, the phase code of the record_function range around its `anchor` time.

    Without forward/backward/optimizer ranges, autograd's evaluate_function ops are
    the backward pass and a note says the phases are guessed.
    """
    name_phase = np.array([phase_code(n) for n in ev.names], dtype=np.int8)
    annotations = ev.cat_flags({"user_annotation"})
    pr = np.flatnonzero(annotations & (name_phase[ev.name_code] != UNKNOWN))
    out = np.full(len(ev), UNKNOWN, dtype=np.int8)
    if len(pr):
        order = pr[np.argsort(ev.ts[pr], kind="stable")]
        p_start, p_end = ev.ts[order], ev.end[order]
        p_code = name_phase[ev.name_code[order]]
        j = np.searchsorted(p_start, anchor, side="right") - 1
        inside = (j >= 0) & (anchor < p_end[np.maximum(j, 0)])
        out[inside] = p_code[j[inside]]
    else:
        auto = ev.name_flags(lambda n: n.startswith("autograd::engine::evaluate_function"))
        out[auto] = BACKWARD
        notes.append(f"{rank}: no forward/backward/optimizer ranges; phases are guessed")
    return out


def step_of(steps: Steps, anchor: np.ndarray) -> np.ndarray:
    """Per row, the step whose range holds its `anchor` time, -1 outside every step."""
    idx = np.searchsorted(steps.start, anchor, side="right") - 1
    valid = idx >= 0
    valid[valid] &= anchor[valid] < steps.end[idx[valid]]
    return np.where(valid, steps.number[np.maximum(idx, 0)], -1)


def lane_labels(ev: RankEvents, main_lane: int) -> dict[int, str]:
    """Lane code -> label: ``main`` for the step thread, ``gpu<d>/stream<s>`` for GPU
    lanes, ``<thread name>.<i>`` for the others in order of their first event."""
    n_lanes = int(ev.lane.max()) + 1
    names = dict(ev.lane_names)
    if main_lane >= 0:
        names[main_lane] = "main"
    seen: dict[str, int] = {}
    first = np.full(n_lanes, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, ev.lane, ev.ts)
    used = unique(ev.lane)
    out: dict[int, str] = {}
    for lane in used[np.argsort(first[used], kind="quicksort")].tolist():
        label = names.get(int(lane), f"lane{lane}")
        if int(lane) == main_lane or label.startswith("gpu"):
            out[int(lane)] = label
            continue
        i = seen.get(label, 0)
        seen[label] = i + 1
        out[int(lane)] = f"{label}.{i}"
    return out


def outer_index(
    lane: np.ndarray, ts: np.ndarray, end: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For rows in `mask` (one lane each): (is outermost, row of the enclosing outermost)."""
    sel = np.flatnonzero(mask)
    order = np.lexsort((-end[sel], ts[sel], lane[sel]))
    rows = sel[order]
    lanes, starts_, ends = lane[rows], ts[rows], end[rows]
    new_lane = np.concatenate([[True], lanes[1:] != lanes[:-1]])
    reach = np.empty_like(ends)
    bounds = np.append(np.flatnonzero(new_lane), len(ends))
    for a, b in zip(bounds[:-1], bounds[1:], strict=False):  # one vectorised cummax per lane
        reach[a:b] = np.maximum.accumulate(ends[a:b])
    prev = np.concatenate([[-_BIG], reach[:-1]])
    outer = new_lane | (starts_ >= prev)
    pos = np.where(outer, np.arange(len(rows)), -1)
    owner = rows[np.maximum.accumulate(pos)] if len(rows) else rows
    is_outer = np.zeros(len(lane), dtype=bool)
    is_outer[rows] = outer
    enclosing = np.full(len(lane), -1, dtype=np.int64)
    enclosing[rows] = owner
    return is_outer, enclosing


def by_lane(
    rows: np.ndarray, lanes: np.ndarray, ts: np.ndarray | None, key: np.ndarray | None = None
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Rows grouped by lane, each sorted by `key` (default: the rows' ts): lane -> (keys, rows)."""
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if len(rows) == 0:
        return out
    keys = key if key is not None else ts[rows]
    lane_of = lanes if key is not None else lanes[rows]
    for lane in unique(lane_of):
        sel = lane_of == lane
        order = np.argsort(keys[sel], kind="stable")
        out[int(lane)] = (keys[sel][order], rows[sel][order])
    return out


def cumcount(*keys: np.ndarray) -> np.ndarray:
    """Per element, how many earlier elements share all its `keys` (pandas' cumcount)."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(keys[::-1])  # stable: ties keep their order
    sorted_keys = [k[order] for k in keys]
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for k in sorted_keys:
        new[1:] |= k[1:] != k[:-1]
    starts = np.flatnonzero(new)
    run = np.repeat(starts, np.diff(np.append(starts, n)))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - run
    return out
