"""The whole-document reader of Kineto traces: any layout, any odd values, every error worded.

`read_rank_generic` parses the whole JSON document and checks every field of every
complete event, naming the first bad one (``malformed event 12 (aten::mm): 'ts' is a
list, not a number``). The streaming reader (`kineto_stream`) hands it every file that
leaves Kineto's own layout; it needs pandas, which the streaming path does not load.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest.kineto_events import (
    _CCL,
    _UNHASHABLE,
    GPU_CATS,
    MAX_ID,
    STREAM_CATS,
    RankEvents,
    _a,
    _arg_flags,
    _column_problem,
    _event,
    _lane_label,
    _ns,
    _rank_events,
    id_problem,
    read_document_escaped,
)

_STR, _DICT = {str}, {dict}
_TIME_TYPES = {int, float, str, type(None)}  # numeric strings are read as numbers


def _int_arg(values: np.ndarray, default: int) -> np.ndarray:
    """An integer arg column (ids) as int64: `default` where it is no number or out of range."""
    import pandas as pd  # the whole-document reader only (odd files): not on the fast path

    number = pd.to_numeric(pd.Series(values), errors="coerce")
    if number.dtype.kind == "i":
        return number.to_numpy(np.int64)
    as_float = number.astype(np.float64).to_numpy()
    return np.where(np.abs(as_float) < 2.0**62, as_float, default).astype(np.int64)


def _times(
    path: Path, x_index: Sequence[int], names: Sequence[Any], values: list[Any], key: str
) -> np.ndarray:
    """One time field (us) of the complete events as float64, NaN where it is absent or null."""
    if set(map(type, values)) <= _TIME_TYPES:
        try:
            return np.array(values, dtype=np.float64)
        except (ValueError, OverflowError):
            pass
    for row, value in enumerate(values):  # the first value that is no number, for the message
        if type(value) not in _TIME_TYPES:
            problem = f"'{key}' is {_a(value)}, not a number"
        elif isinstance(value, str) and not _is_number(value):
            problem = f"'{key}' is not a number ({value[:40]!r})"
        else:
            continue
        raise InputError(path, f"malformed {_event(x_index[row], names[row])}: {problem}")
    raise InputError(path, f"malformed event: '{key}' values out of range")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _meta_names(path: Path, events: list[Any]) -> dict[tuple[Any, Any], str]:
    """(pid, tid) -> thread name from the ``thread_name`` metadata events (first one wins)."""
    meta_names: dict[tuple[Any, Any], str] = {}
    for i, e in enumerate(events):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            meta = e.get("args") or {}
            if not isinstance(meta, dict):
                problem = f"'args' is {_a(meta)}, not an object"
                raise InputError(path, f"malformed {_event(i, 'thread_name')}: {problem}")
            try:
                meta_names.setdefault((e.get("pid"), e.get("tid")), str(meta.get("name", "")))
            except TypeError:  # an unhashable pid or tid
                raise InputError(path, f"malformed {_event(i, 'thread_name')}: pid/tid") from None
    return meta_names


def read_rank_generic(
    path: Path, document: Any | None = None, keep: re.Pattern[str] | None = None
) -> RankEvents:
    """Columnar events from the whole parsed document (any layout, any odd values)."""
    import pandas as pd  # odd files only: the streaming reader needs no pandas

    doc, escaped = read_document_escaped(path) if document is None else (document, 0)
    if isinstance(doc, list):  # old format: the event array alone
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict):
        raise InputError(path, "not a Kineto trace: top level is not a JSON object")
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise InputError(path, "not a Kineto trace: no traceEvents list")
    try:
        x_index = [i for i, e in enumerate(events) if e.get("ph") == "X"]
    except AttributeError:
        raise InputError(path, "traceEvents holds something that is not an event object") from None
    meta_names = _meta_names(path, events)
    if not x_index:
        raise InputError(path, "Kineto trace has no complete ('X') events")
    xs = [events[i] for i in x_index]
    names = [e.get("name") for e in xs]
    cats = [str(e.get("cat", "")).lower() for e in xs]
    args = [e.get("args") or {} for e in xs]
    pids = [e.get("pid") for e in xs]
    tids = [e.get("tid") for e in xs]
    ts_us = _times(path, x_index, names, [e.get("ts") for e in xs], "ts")
    dur_us = _times(path, x_index, names, [e.get("dur") for e in xs], "dur")
    del xs
    _check_fields(path, x_index, names, args, pids, tids)
    name_code, name_list = pd.factorize(pd.Series(names, dtype=object))
    cat_code, cat_list = pd.factorize(pd.Series(cats, dtype=object))
    problem = _column_problem(
        [str(n) for n in name_list], name_code, [str(c) for c in cat_list], cat_code,
        ts_us, dur_us, x_index.__getitem__,
    )  # fmt: skip
    if problem is not None:
        raise InputError(path, problem)
    ts, dur = _ns(ts_us), _ns(dur_us)
    corr = np.array([a.get("correlation", -1) if isinstance(a, dict) else -1 for a in args])
    rf = np.array([a.get("Record function id", 0) if isinstance(a, dict) else 0 for a in args])
    lane_key = pd.Series([f"{p}|{t}" for p, t in zip(pids, tids, strict=False)], dtype=object)
    lane_code = pd.factorize(lane_key)[0].astype(np.int32)
    keep_name = np.array([_arg_flags(str(n), {}, keep)[0] for n in name_list], dtype=bool)
    ccl_name = np.array([bool(_CCL.search(n)) for n in name_list], dtype=bool)
    gpu_cat = np.array([c in GPU_CATS for c in cat_list], dtype=bool)
    keep = keep_name[name_code] | (gpu_cat[cat_code] & ccl_name[name_code])
    lane_names = _lane_names(lane_code, cats, args, pids, tids, meta_names)
    return _rank_events(
        path,
        doc,
        names=[str(n) for n in name_list],
        cats=[str(c) for c in cat_list],
        name_code=name_code.astype(np.int32),
        cat_code=cat_code.astype(np.int32),
        ts=ts,
        end=ts + dur,
        corr=_int_arg(corr, -1),
        rf=_int_arg(rf, 0),
        lane=lane_code,
        args={int(i): args[i] for i in np.flatnonzero(keep)},
        lane_names=lane_names,
        pids=frozenset(p for p in set(pids) if isinstance(p, int)),
        escaped=escaped,
    )


def _check_fields(
    path: Path,
    x_index: Sequence[int],
    names: list[Any],
    args: list[Any],
    pids: list[Any],
    tids: list[Any],
) -> None:
    """InputError naming the first complete event whose name is no string, whose args are
    no object, or whose pid or tid is a list or an object (no lane key)."""
    fields = (("name", names, _STR, "a string"), ("args", args, _DICT, "an object"))
    for key, values, wanted, what in fields:
        if not set(map(type, values)) <= wanted:
            row = next(i for i, v in enumerate(values) if type(v) not in wanted)
            value = values[row]
            problem = f"no '{key}'" if value is None else f"'{key}' is {_a(value)}, not {what}"
            raise InputError(path, f"malformed {_event(x_index[row], names[row])}: {problem}")
    for key, values in (("pid", pids), ("tid", tids)):
        if set(map(type, values)) & _UNHASHABLE:
            row = next(i for i, v in enumerate(values) if type(v) in _UNHASHABLE)
            problem = f"'{key}' is {_a(values[row])}, not a number"
            raise InputError(path, f"malformed {_event(x_index[row], names[row])}: {problem}")
    for row, event_args in enumerate(args):
        for key in ID_ARGS:
            value = event_args.get(key)
            if type(value) is int and not -MAX_ID < value < MAX_ID:
                problem = id_problem(key, value)
                raise InputError(path, f"malformed {_event(x_index[row], names[row])}: {problem}")


ID_ARGS = ("correlation", "External id", "Record function id", "Ev Idx")
"""The integer args that join events (launch to kernel, op to its record): an id past
int64 is no id a profiler writes (`kineto_events.MAX_ID`)."""


def _lane_names(
    lane_code: np.ndarray,
    cats: list[str],
    args: list[Any],
    pids: list[Any],
    tids: list[Any],
    meta_names: dict[tuple[Any, Any], str],
) -> dict[int, str]:
    """Lane code -> its name: ``gpu<device>/stream<stream>`` for a lane whose first event
    is GPU work (or a stream sync), else the thread's label."""
    lane_names: dict[int, str] = {}
    for lane, row in enumerate(np.unique(lane_code, return_index=True)[1]):
        pid, tid = pids[row], tids[row]
        if cats[row] in STREAM_CATS:
            a = args[row] if isinstance(args[row], dict) else {}
            lane_names[lane] = f"gpu{a.get('device', pid)}/stream{a.get('stream', tid)}"
        else:
            lane_names[lane] = _lane_label(meta_names.get((pid, tid), f"thread {tid}"))
    return lane_names
