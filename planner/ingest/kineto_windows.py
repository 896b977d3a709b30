"""Windows of one profiling session joined into one rank's events.

A ``torch.profiler`` schedule with ``repeat`` (a few steps, several times over a run)
writes one file per cycle and rank: ``tensorboard_trace_handler`` names them
``<host>_<pid>.<time>.pt.trace.json``, so a rank's windows sort next to each other.
Spread windows sample the machine's states the way the run's own steps do, where one
stretch of steps can catch the host in another state (docs/algorithms.md, "DDP bucket
advice"). Files of one rank are windows of one session only when they come from the
same process, do not overlap in time and number their ``ProfilerStep#N`` apart (the
profiler numbers steps over the whole session); anything else is refused, naming the
file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest.kineto_events import STEP_NAME, RankEvents


def _steps(ev: RankEvents) -> set[str]:
    present = np.unique(ev.name_code)
    return {ev.names[c] for c in present.tolist() if STEP_NAME.match(ev.names[c])}


def _lanes(ev: RankEvents) -> list[tuple[str, int]]:
    """Each lane as (label, how many lanes before it had that label): threads of one
    process keep their order of first event from window to window, and two threads may
    share a label (Kineto names a process's main threads ``python``)."""
    seen: dict[str, int] = {}
    out = []
    for code in range(int(ev.lane.max()) + 1):
        label = ev.lane_names.get(code, f"lane {code}")
        out.append((label, seen.get(label, 0)))
        seen[label] = seen.get(label, 0) + 1
    return out


def _codes(known: list[Any], names: list[Any]) -> tuple[list[Any], np.ndarray]:
    """`known` extended by the new ones of `names`, and each of `names`' code in it."""
    index = {n: i for i, n in enumerate(known)}
    merged = list(known)
    for n in names:
        if n not in index:
            index[n] = len(merged)
            merged.append(n)
    return merged, np.array([index[n] for n in names], dtype=np.int32)


def join_windows(first: RankEvents, later: RankEvents) -> RankEvents:
    """One rank's events from two windows of one profiling session, in time order.

    Names, categories and lanes (by their label: the same thread in both windows) are
    coded anew; args keep their rows."""
    name = f"rank{first.rank}" if first.rank is not None else first.path.name
    if first.pids != later.pids:
        raise InputError(
            later.path,
            f"{name} is given twice, from another process (pids {sorted(later.pids)}, "
            f"not {sorted(first.pids)}): give one run's traces",
        )
    if int(later.end.max()) <= int(first.ts.min()):  # given in reverse order
        first, later = later, first
    elif int(later.ts.min()) < int(first.end.max()):
        raise InputError(later.path, f"{name}: this window overlaps {first.path.name}")
    both = _steps(first) & _steps(later)
    if both:
        step = min(both, key=lambda s: int(STEP_NAME.match(s).group(1)))  # type: ignore[union-attr]
        raise InputError(
            later.path,
            f"{name}: {step} is in {first.path.name} too: windows of separate profiler "
            "sessions; give one session's windows (a schedule with repeat) or one file per rank",
        )
    names, name_map = _codes(first.names, later.names)
    cats, cat_map = _codes(first.cats, later.cats)
    lanes, lane_map = _codes(_lanes(first), _lanes(later))
    offset = len(first)
    return RankEvents(
        path=first.path,
        rank=first.rank,
        world_size=first.world_size,
        distributed=first.distributed,
        names=names,
        cats=cats,
        name_code=np.concatenate([first.name_code, name_map[later.name_code]]),
        cat_code=np.concatenate([first.cat_code, cat_map[later.cat_code]]),
        ts=np.concatenate([first.ts, later.ts]),
        end=np.concatenate([first.end, later.end]),
        corr=np.concatenate([first.corr, later.corr]),
        rf=np.concatenate([first.rf, later.rf]),
        lane=np.concatenate([first.lane, lane_map[later.lane]]),
        args={**first.args, **{row + offset: a for row, a in later.args.items()}},
        lane_names={code: label for code, (label, _) in enumerate(lanes)},
        pids=first.pids,
    )


def grouped(ranks: Iterable[tuple[str, RankEvents]]) -> Iterator[tuple[str, RankEvents, int]]:
    """The ranks with adjacent files of one rank joined as windows: (name, events, number
    of windows). Holds at most one rank's windows and the next file at a time."""
    held: tuple[str, RankEvents, int] | None = None
    for name, ev in ranks:
        if held is not None and held[0] == name:
            held = (name, join_windows(held[1], ev), held[2] + 1)
            continue
        if held is not None:
            yield held
        held = (name, ev, 1)
    if held is not None:
        yield held
