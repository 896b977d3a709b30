"""Kineto chrome traces read into columns: one `RankEvents` per file.

Complete ('X') events become numpy columns (name and category codes, ns times,
correlation and record-function ids, a (pid, tid) lane) plus the args of the rows
that need them. Kineto's own layout is streamed in pieces of `STREAM_CHUNK` bytes
(`kineto_stream`, whose `read_rank` is the entry); anything else is parsed whole by the
generic reader (`kineto_generic`), which also words every error (one line naming the
event and what is wrong with it). This module holds what the two readers share: the
columns (`RankEvents`), the event categories, which args are kept, and the checks of
the columns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest.exact_json import JSONError as _JSONError
from planner.ingest.exact_json import fast as _json  # noqa: F401 (the streaming reader's)
from planner.ingest.exact_json import loads, number_text
from planner.ingest.files import (
    MAX_SPAN_S,
    MAX_TIME_NS,
    escape_invalid_utf8,
    loads_unterminated,
    read_bytes,
)
from planner.ingest.sniffers import is_execution_trace, is_kineto  # noqa: F401 (re-exported)

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
_STEP = STEP_NAME
_THREAD_LABEL = re.compile(r"^thread \d+ \((.*)\)$")
CPU_OP_CATS = frozenset({"cpu_op", "operator", "cuda_runtime", "runtime", "cuda_driver"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
# a lane is a GPU stream if its first event is GPU work or a sync Kineto records on the
# stream (``cuda_sync``: a stream lane can begin with one, HTA ``cuda_event_sync_multi_stream``)
STREAM_CATS = GPU_CATS | {"cuda_sync"}
LAUNCH_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})

# ----------------------------------------------------------------------------- sniffing


def read_document(path: Path) -> Any:
    """Parse a `.json` / `.json.gz` file; InputError on unreadable, truncated or bad JSON."""
    return read_document_escaped(path)[0]


def read_document_escaped(path: Path) -> tuple[Any, int]:
    """(`read_document`, how many bytes of its text were not UTF-8 and were read escaped
    by `files.escape_invalid_utf8`)."""
    raw = read_bytes(path)
    if not raw.strip():
        raise InputError(path, "file is empty")
    try:
        return loads_unterminated(loads, raw, _JSONError), 0
    except _JSONError as exc:
        escaped, count = escape_invalid_utf8(raw)
        if not count:
            raise InputError(path, f"invalid JSON ({exc})") from None
    try:
        return loads_unterminated(loads, escaped, _JSONError), count
    except _JSONError as exc:
        raise InputError(path, f"invalid JSON ({exc})") from None


# ----------------------------------------------------------------------------- one rank


@dataclass
class RankEvents:
    """The columnar events of one rank's trace: one row per complete ('X') event, file order.

    Names and categories are codes into `names` / `cats` (distinct values), so a string
    test runs once per distinct name, not once per event.
    """

    path: Path
    rank: int | None
    world_size: int | None
    distributed: dict[str, Any]
    names: list[str]  # distinct event names; name_code indexes it
    cats: list[str]  # distinct lower-cased categories; cat_code indexes it
    name_code: np.ndarray  # int32 per row
    cat_code: np.ndarray  # int32 per row
    ts: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns (ts + dur; both readers refuse a negative dur)
    corr: np.ndarray  # int64 `correlation` arg, -1 without
    rf: np.ndarray  # int64 `Record function id` arg, 0 without
    lane: np.ndarray  # int32 (pid, tid) code, in order of first event
    args: dict[int, Any]  # row -> args, only for the rows that need them
    lane_names: dict[int, str]
    pids: frozenset[int] = frozenset()
    escaped: int = 0  # bytes of the text that were not UTF-8, read escaped

    def __len__(self) -> int:
        return len(self.ts)

    def name_flags(self, test: Callable[[str], Any]) -> np.ndarray:
        """Per row: bool(test(name)), evaluated once per distinct name."""
        per_name = np.fromiter((bool(test(n)) for n in self.names), bool, len(self.names))
        return per_name[self.name_code]

    def cat_flags(self, wanted: frozenset[str] | set[str]) -> np.ndarray:
        """Per row: the category is in `wanted`."""
        per_cat = np.fromiter((c in wanted for c in self.cats), bool, len(self.cats))
        return per_cat[self.cat_code]


_KEEP_ARGS = re.compile(
    r"^(?:nccl|gloo|rccl|hccl|mpi|ucc|xccl|mccl|c10d)[:_]|record_param_comms|ProfilerStep"
    r"|^aten::(?:conv[123]d|linear|batch_norm|layer_norm|group_norm|embedding(?:_bag)?)$"
    r"|^torch::autograd::AccumulateGrad$|^Stream Wait Event$",
    re.IGNORECASE,
)
_CCL = re.compile("ccl", re.IGNORECASE)
ArgFlags = dict[str, tuple[bool, bool]]
"""Event name -> (keep its args whatever the category, keep them for GPU events)."""


def _arg_flags(name: str, memo: ArgFlags, keep: re.Pattern[str] | None = None) -> tuple[bool, bool]:
    """The `ArgFlags` of one name, through `memo`: the ranks of a job share their names,
    and the case-blind searches through long kernel names cost more than the rest.
    `keep` names more ops whose args are kept (the sizes of pattern-table collectives)."""
    flags = memo.get(name)
    if flags is None:
        kept = _KEEP_ARGS.search(name) is not None or (keep is not None and bool(keep.search(name)))
        flags = memo[name] = (kept, _CCL.search(name) is not None)
    return flags


def _ns(values: Any) -> np.ndarray:
    """Microsecond timestamps (float or int) to int64 ns without amplifying float error."""
    arr = np.asarray(values, dtype=np.float64)
    whole = np.floor(arr)
    return whole.astype(np.int64) * 1000 + np.rint((arr - whole) * 1000).astype(np.int64)


def _a(value: Any) -> str:
    """'a str', 'an int', ...: the JSON value's Python type, for messages."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _event(index: int, name: Any) -> str:
    """``event 12 (aten::mm)``: an event by its index in ``traceEvents`` (and its name)."""
    if not isinstance(name, str):
        return f"event {index}"
    shown = name if name.isprintable() else repr(name)  # the message stays one line
    return f"event {index} ({shown if len(shown) <= 80 else shown[:77] + '...'})"


_MAX_TS_US = MAX_TIME_NS / 1000  # event times (us) must end below this
_MAX_DUR_US = MAX_SPAN_S * 1e6
_MAX_STEP = 1 << 62


def _time_problem(ts: float, dur: float) -> str:
    """What is wrong with the times (us, NaN = absent) of a complete event."""
    if np.isnan(ts):
        return "has no 'ts'"
    if np.isnan(dur):
        return "has no 'dur'"
    if ts < 0:
        return f"starts at a negative time ({ts:g} us)"
    if dur < 0:
        return f"has a negative duration ({dur:g} us)"
    if dur > _MAX_DUR_US:
        return f"lasts {dur:g} us, more than a day (wrong units or a broken clock)"
    if ts >= _MAX_TS_US:
        return f"starts at {ts:g} us, out of range (times must stay below 2**62 ns)"
    return f"ends at {ts + dur:g} us, out of range (times must stay below 2**62 ns)"


def _column_problem(
    names: Sequence[str],
    name_code: np.ndarray,
    cats: Sequence[str],
    cat_code: np.ndarray,
    ts_us: np.ndarray,
    dur_us: np.ndarray,
    index: Callable[[int], int],
) -> str | None:
    """What makes the columns of complete events invalid, or None when they are sound.

    Checked on the columns both readers produce (times in us, NaN where absent): every
    time present, not negative, in range (`MAX_SPAN_S`, `MAX_TIME_NS`); every
    ``ProfilerStep#`` name a step number; no step number twice (the GPU mirrors of the
    step ranges, ``gpu_user_annotation``, repeat them by design and are not counted).
    `index` maps a row to the event's index in ``traceEvents``, for the message.
    """

    def event(row: int) -> str:
        return _event(index(row), names[name_code[row]])

    ok = (ts_us >= 0) & (dur_us >= 0) & (dur_us <= _MAX_DUR_US) & (ts_us + dur_us < _MAX_TS_US)
    if not ok.all():
        row = int(np.argmin(ok))
        return f"{event(row)} {_time_problem(float(ts_us[row]), float(dur_us[row]))}"
    step_of_name = np.full(len(names), -1, dtype=np.int64)
    for code, name in enumerate(names):
        if name.startswith("ProfilerStep#"):
            found = _STEP.match(name)
            if found is None or len(found.group(1)) > 19 or int(found.group(1)) >= _MAX_STEP:
                row = int(np.argmax(name_code == code))
                return f"{event(row)} is no step marker (ProfilerStep#<integer below 2**62>)"
            step_of_name[code] = int(found.group(1))
    rows = np.flatnonzero(step_of_name[name_code] >= 0)
    gpu_side = np.array([c.startswith("gpu") for c in cats], dtype=bool)
    rows = rows[~gpu_side[cat_code[rows]]]
    numbers = step_of_name[name_code[rows]]
    unique, counts = np.unique(numbers, return_counts=True)
    if (counts > 1).any():
        number = int(unique[np.argmax(counts > 1)])
        first, second = rows[numbers == number][:2].tolist()
        return f"ProfilerStep#{number} appears twice (events {index(first)} and {index(second)})"
    return None


def _lane_label(raw: str) -> str:
    found = _THREAD_LABEL.match(raw.strip())
    label = found.group(1) if found else raw.strip()
    return re.sub(r"\s+", "_", label) or "thread"


def _rank_events(path: Path, doc: dict[str, Any], **columns: Any) -> RankEvents:
    dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank, world = _distributed_int(path, dist, "rank"), _distributed_int(path, dist, "world_size")
    return RankEvents(path=path, rank=rank, world_size=world, distributed=dict(dist), **columns)


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _distributed_int(path: Path, dist: dict[str, Any], key: str) -> int | None:
    """``distributedInfo[key]`` when it is an integer, else None; InputError past int64
    (no rank or world size a job has, and none the job's columns can hold)."""
    value = dist.get(key)
    if not isinstance(value, int):
        return None
    if not _INT64[0] <= value <= _INT64[1]:
        raise InputError(path, f"distributedInfo.{key} {number_text(value)} is beyond int64")
    return value


MAX_ID = 1 << 62
"""Ids that join events (correlation, External id, Record function id) lie in
(-MAX_ID, MAX_ID): an int64 column holds them, and an id past int64 is none a profiler
writes."""


def id_problem(key: str, value: Any) -> str | None:
    """What makes `value` of the id arg `key` unusable: an integer out of (-2**62, 2**62);
    None for an id in range, and for a float or a string (no id: it joins nothing)."""
    if not isinstance(value, int) or isinstance(value, bool) or -MAX_ID < value < MAX_ID:
        return None
    return f"'{key}' is {number_text(value)}, out of range (-2**62, 2**62)"


_UNHASHABLE = {list, dict}  # pid / tid values that cannot be a key
