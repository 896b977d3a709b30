"""Kineto chrome traces read into columns: one `RankEvents` per file.

Complete ('X') events become numpy columns (name and category codes, ns times,
correlation and record-function ids, a (pid, tid) lane) plus the args of the rows
that need them. Kineto's own layout is streamed in pieces of `STREAM_CHUNK` bytes;
anything else is parsed whole by the generic reader, which also words every error
(one line naming the event and what is wrong with it).
"""

from __future__ import annotations

import itertools
import re
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from planner.errors import InputError
from planner.ingest import files as _files
from planner.ingest.files import MAX_SPAN_S, MAX_TIME_NS, read_bytes
from planner.ingest.sniffers import is_execution_trace, is_kineto  # noqa: F401 (re-exported)

try:  # orjson parses Kineto JSON ~2-3x faster with less peak memory than json
    import orjson as _json

    _JSONError: tuple[type[Exception], ...] = (_json.JSONDecodeError,)
except ImportError:  # pragma: no cover - orjson is a dependency; json is the fallback
    import json as _json  # type: ignore[no-redef]

    _JSONError = (ValueError,)

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
    raw = read_bytes(path)
    if not raw.strip():
        raise InputError(path, "file is empty")
    try:
        return _json.loads(raw)
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


class _Irregular(Exception):
    """The file leaves the layout the streaming reader handles; parse it whole instead."""


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


_STR, _DICT = {str}, {dict}
_NULL = msgspec.Raw(b"null")


class _Event(msgspec.Struct, gc=False):
    """The fields of a trace event the streaming reader reads; the others are skipped
    unparsed and ``args`` is kept as its JSON text. A field of another type fails the
    piece (`_Irregular`): the whole-document reader words the problem."""

    ph: Any = None
    name: str | None = None
    cat: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: Any = None
    tid: Any = None
    args: msgspec.Raw = _NULL


class _Ids(msgspec.Struct, gc=False):
    """The ids every complete event's args carry, parsed without building the args."""

    correlation: int = -1
    rf: int = msgspec.field(name="Record function id", default=0)


_PIECE = msgspec.json.Decoder(list[_Event])
_IDS = msgspec.json.Decoder(list[_Ids | None])
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
STREAM_CHUNK = 1 << 16
"""Bytes of decompressed JSON parsed at a time by the streaming reader (bounds its memory)."""
_MAX_PENDING = 64 << 20  # an unsplittable stretch longer than this: parse the file whole


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
            if found is None or int(found.group(1)) >= _MAX_STEP:
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


class _Columns:
    """Column buffers filled block by block (regular events only; see `_Irregular`)."""

    def __init__(self, memo: ArgFlags | None = None, keep: re.Pattern[str] | None = None) -> None:
        self.memo: ArgFlags = {} if memo is None else memo
        self.keep = keep
        self.name_ids: dict[str, int] = {}
        self.names: list[str] = []
        self.keep_name: list[bool] = []  # args kept whatever the category
        self.ccl_name: list[bool] = []  # args kept for GPU categories
        self.cat_ids: dict[Any, int] = {}
        self.cats: list[str] = []
        self.gpu_cat: list[bool] = []
        self.lane_ids: dict[tuple[Any, Any], int] = {}  # (pid, tid) -> pair code
        self.pair_lane: list[int] = []  # pair code -> lane code
        self.lane_keys: dict[str, int] = {}
        self.lane_first: list[tuple[int, Any, Any, Any]] = []  # row, pid, tid, args of 1st
        self.name_code = array("i")
        self.cat_code = array("i")
        self.lane = array("i")
        self.ts = array("d")
        self.dur = array("d")
        self.corr = array("q")
        self.rf = array("q")
        self.args: dict[int, Any] = {}
        self.meta_names: dict[tuple[Any, Any], str] = {}

    def add(self, events: list[_Event]) -> None:
        """Append the complete events of `events` (raises `_Irregular` on anything odd).

        One list comprehension per field and codes through dicts keep the per-event work
        in C loops; the types were checked as the piece was parsed (`_Event`).
        """
        phs = [e.ph for e in events]
        if "M" in phs:  # the metadata: Kineto writes it last, so most blocks have none
            for e, ph in zip(events, phs, strict=True):
                if ph == "M" and e.name == "thread_name":
                    key = (e.pid, e.tid)
                    if type(key[0]) in _UNHASHABLE or type(key[1]) in _UNHASHABLE:
                        raise _Irregular
                    if key not in self.meta_names:
                        meta = _json.loads(bytes(e.args)) or {}
                        if meta.__class__ is not dict:
                            raise _Irregular
                        self.meta_names[key] = str(meta.get("name", ""))
        xs = [e for e, ph in zip(events, phs, strict=True) if ph == "X"]
        if not xs:
            return
        row0 = len(self.ts)
        names = [e.name for e in xs]
        ts = [e.ts for e in xs]
        dur = [e.dur for e in xs]
        if None in names or None in ts or None in dur:
            raise _Irregular
        raw_args = [e.args for e in xs]
        try:
            ids = _IDS.decode(b"[" + b",".join(raw_args) + b"]")
        except msgspec.DecodeError:  # args that are no object: an odd file
            raise _Irregular from None
        corr = [-1 if i is None else i.correlation for i in ids]
        rf = [0 if i is None else i.rf for i in ids]
        try:
            keys = list(zip([e.pid for e in xs], [e.tid for e in xs], strict=True))
            pairs = self.lane_ids
            known = len(pairs)
            pair_code = [pairs.setdefault(k, len(pairs)) for k in keys]
            for new in range(known, len(pairs)):  # a new (pid, tid): its lane, maybe new
                first = pair_code.index(new)
                self._new_lane(keys[first], row0 + first, _args(raw_args[first]))
            self.corr.frombytes(np.array(corr, dtype=np.int64).tobytes())
            self.rf.frombytes(np.array(rf, dtype=np.int64).tobytes())
        except (TypeError, OverflowError):  # unhashable or out-of-range values
            raise _Irregular from None
        name_ids = self.name_ids
        known = len(name_ids)
        name_code = np.array([name_ids.setdefault(n, len(name_ids)) for n in names], np.int32)
        for name in itertools.islice(name_ids, known, None):
            self.names.append(name)
            keep, ccl = _arg_flags(name, self.memo, self.keep)
            self.keep_name.append(keep)
            self.ccl_name.append(ccl)
        cat_ids = self.cat_ids
        known = len(cat_ids)
        cat_code = np.array([cat_ids.setdefault(e.cat, len(cat_ids)) for e in xs], np.int32)
        for cat in itertools.islice(cat_ids, known, None):
            self.cats.append(cat.lower())
            self.gpu_cat.append(cat.lower() in GPU_CATS)
        keep = np.array(self.keep_name)[name_code] | (
            np.array(self.ccl_name)[name_code] & np.array(self.gpu_cat)[cat_code]
        )
        for i in np.flatnonzero(keep).tolist():
            self.args[row0 + i] = _args(raw_args[i])
        # numpy converts a block of Python numbers at once, array.extend one by one
        self.name_code.frombytes(name_code.tobytes())
        self.cat_code.frombytes(cat_code.tobytes())
        self.lane.frombytes(np.array(self.pair_lane, dtype=np.int32)[pair_code].tobytes())
        self.ts.frombytes(np.array(ts, dtype=np.float64).tobytes())
        self.dur.frombytes(np.array(dur, dtype=np.float64).tobytes())

    def _new_lane(self, pair: tuple[Any, Any], row: int, args: dict[str, Any]) -> None:
        pid, tid = pair
        key = f"{pid}|{tid}"  # lanes are told apart by their text, as the generic reader does
        code = self.lane_keys.get(key)
        if code is None:
            code = self.lane_keys[key] = len(self.lane_first)
            self.lane_first.append((row, pid, tid, args))
        self.pair_lane.append(code)

    def finish(self, path: Path, doc: dict[str, Any]) -> RankEvents:
        """The RankEvents of the collected columns, `doc` holding the top-level keys."""
        if not self.ts:
            raise InputError(path, "Kineto trace has no complete ('X') events")
        # categories differing only in case share one code, as in the generic reader
        cats = list(dict.fromkeys(self.cats))
        remap = np.array([cats.index(c) for c in self.cats], dtype=np.int32)
        cat_code = remap[np.frombuffer(self.cat_code, dtype=np.int32)]
        ts_us = np.frombuffer(self.ts, dtype=np.float64)
        dur_us = np.frombuffer(self.dur, dtype=np.float64)
        name_code = np.frombuffer(self.name_code, dtype=np.int32).copy()
        if _column_problem(self.names, name_code, cats, cat_code, ts_us, dur_us, int) is not None:
            raise _Irregular  # the whole-document reader words it, with the event's index
        ts, dur = _ns(ts_us), _ns(dur_us)
        lane_names: dict[int, str] = {}
        for lane, (row, pid, tid, a) in enumerate(self.lane_first):
            if cats[cat_code[row]] in STREAM_CATS:
                lane_names[lane] = f"gpu{a.get('device', pid)}/stream{a.get('stream', tid)}"
            else:
                lane_names[lane] = _lane_label(self.meta_names.get((pid, tid), f"thread {tid}"))
        pids = frozenset(p for p, _ in self.lane_ids if isinstance(p, int))
        return _rank_events(
            path,
            doc,
            names=self.names,
            cats=cats,
            name_code=name_code,
            cat_code=cat_code,
            ts=ts,
            end=ts + dur,
            corr=np.frombuffer(self.corr, dtype=np.int64).copy(),
            rf=np.frombuffer(self.rf, dtype=np.int64).copy(),
            lane=np.frombuffer(self.lane, dtype=np.int32).copy(),
            args=self.args,
            lane_names=lane_names,
            pids=pids,
        )


def _rank_events(path: Path, doc: dict[str, Any], **columns: Any) -> RankEvents:
    dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
    world = dist.get("world_size") if isinstance(dist.get("world_size"), int) else None
    return RankEvents(path=path, rank=rank, world_size=world, distributed=dict(dist), **columns)


def _chunks(path: Path) -> Iterator[bytes]:
    """The decompressed content in pieces of STREAM_CHUNK bytes (InputError past the limit)."""
    return _files.iter_content(path, STREAM_CHUNK)


def _args(raw: msgspec.Raw) -> dict[str, Any]:
    """An event's args (its ``args`` JSON text, checked an object or null by `_IDS`)."""
    return _json.loads(bytes(raw)) or {}


def _parse_array(body: bytes) -> list[_Event] | None:
    """`body` (events separated by commas) as events, or None when it is no JSON array
    (a cut inside an event); `_Irregular` when an event's field has another type."""
    try:
        return _PIECE.decode(b"[" + body + b"]")
    except msgspec.ValidationError:
        raise _Irregular from None
    except msgspec.DecodeError:
        return None


def _too_long(path: Path, pending: bytearray) -> _Irregular:
    """A stretch of _MAX_PENDING bytes with no event boundary: refused now when it is no
    JSON (nothing after it can make the file parse), else left to the whole-file reader."""
    try:
        _json.loads(b"[" + pending)
    except _JSONError as exc:
        if getattr(exc, "pos", len(pending) + 1) <= len(pending):
            raise InputError(path, f"invalid JSON ({exc})") from None
    return _Irregular()


def _stream_columns(path: Path, cols: _Columns) -> dict[str, Any]:
    """Read the trace piece by piece into `cols`; returns the top-level object sans events.

    Kineto writes ``{header, "traceEvents": [event, ...], trailer}``. The event array is
    cut after a ``},`` and each piece parsed as a JSON array: a cut inside an event (a
    nested object or a string) cannot parse, so a piece that parses is whole events,
    and the next cut is tried instead. Memory is bounded by the columns plus one piece.
    """
    chunks = _chunks(path)
    buf, searched = bytearray(), 0
    for chunk in chunks:  # the header, up to the opening bracket of traceEvents
        buf += chunk
        if len(buf) > _MAX_PENDING:
            raise _Irregular
        if len(buf) < 2 * searched:  # search again once doubled: linear, not quadratic
            continue
        searched = len(buf)
        found = _EVENTS_KEY.search(buf)
        if found:
            break
    else:
        found = _EVENTS_KEY.search(buf)
        if found is None:
            raise _Irregular
    if not buf.lstrip().startswith(b"{"):
        raise _Irregular  # the old bare-array format: small, parsed whole
    header = bytes(buf[: found.end() - 1])
    pending = buf[found.end() :]
    del buf
    failed = 0  # pending's length when no cut parsed: try again once it has doubled (linear)
    total = len(header) + len(pending)
    for chunk in itertools.chain([b""], chunks):  # the rest of the header's piece first
        pending += chunk
        total += len(chunk)
        end = len(pending)
        if end > _MAX_PENDING:
            raise _too_long(path, pending)
        if end < 2 * failed:
            continue
        failed = end
        for _ in range(8):
            cut = pending.rfind(b"},", 0, end)
            if cut < 0:
                if end == len(pending) and pending.isspace():  # padding: nothing to keep
                    pending.clear()
                    failed = 0
                break
            events = _parse_array(pending[: cut + 1])
            if events is not None:
                cols.add(events)
                del events
                del pending[: cut + 2]
                failed = 0
                break
            end = cut
        if len(pending) > _MAX_PENDING:
            raise _too_long(path, pending)
    # the last events, the closing bracket and the trailer: find the bracket from the right
    close = len(pending)
    for _ in range(64):
        close = pending.rfind(b"]", 0, close)
        if close < 0:
            break
        try:
            doc = _json.loads(header + b"[]" + pending[close + 1 :])
        except _JSONError:
            continue
        events = _parse_array(pending[:close]) if pending[:close].strip() else []
        if isinstance(doc, dict) and events is not None:
            cols.add(events)
            return doc
    _files.check_document_size(path, total)  # the whole-file reader would refuse it anyway
    raise _Irregular


def read_rank(
    path: Path,
    document: Any | None = None,
    memo: ArgFlags | None = None,
    keep: re.Pattern[str] | None = None,
) -> RankEvents:
    """Columnar events of one Kineto file.

    Streams the file (bounded memory, no event object graph) when it has Kineto's
    layout; otherwise, or given the parsed `document`, reads the whole document with
    the generic reader, which also words every error. `memo` is shared by the ranks
    of one job; `keep` names more ops whose args are kept.
    """
    if document is None:
        cols = _Columns(memo, keep)
        try:
            return cols.finish(path, _stream_columns(path, cols))
        except _Irregular:
            pass
        del cols
    return read_rank_generic(path, document, keep)


_TIME_TYPES = {int, float, str, type(None)}  # numeric strings are read as numbers
_UNHASHABLE = {list, dict}


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

    doc = read_document(path) if document is None else document
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
    lane_names: dict[int, str] = {}
    for lane, row in enumerate(np.unique(lane_code, return_index=True)[1]):
        pid, tid = pids[row], tids[row]
        if cats[row] in STREAM_CATS:
            a = args[row] if isinstance(args[row], dict) else {}
            lane_names[lane] = f"gpu{a.get('device', pid)}/stream{a.get('stream', tid)}"
        else:
            lane_names[lane] = _lane_label(meta_names.get((pid, tid), f"thread {tid}"))
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
    )
