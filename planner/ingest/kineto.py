"""PyTorch profiler (Kineto) chrome traces of data-parallel jobs: one `Job` for all ranks.

What becomes an op (per rank):

- CPU: the *outermost* `cpu_op` / `cuda_runtime` / `cuda_driver` event on each thread
  (nested events are the op's own internals; `user_annotation` ranges give steps and
  phases, `python_function` frames are ignored). Resource: the thread lane (``main``
  is the thread holding ``ProfilerStep#N``; others ``<thread name>.<i>``).
- GPU: kernels, memcpy and memset on ``gpu<device>/stream<stream>``.
- Collectives and p2p (kind ``collective``): one per backend record (``nccl:*``,
  ``gloo:*``, ``rccl:*`` ...); its time is the communication kernel it launched when
  the trace has one (``ncclKernel_*``, joined through the launch's ``correlation``),
  otherwise the backend record itself (gloo's worker-thread record spans transfer +
  reduce). Resource ``net`` for the default process group, ``net:<pg>`` for others.

Op identity: ``<lane>/<event name>#<k>`` with k the occurrence in the step on that
lane, and ``<net>/<collective kind>#<k>`` for collectives (k in launch order within the
process group, which NCCL and gloo require to match on every rank), so the same op has
the same name in every step and on every rank. All-reduces in the backward pass carry
``param = bucket<k>`` (DDP launches one per bucket, in bucket order).

Conservative DAG without an Execution Trace (all edges ``control``):
per-lane program order; launch -> kernel (correlation); launching CPU op ->
collective; every collective -> the first optimizer op of the step (or, without an
optimizer range, the first op on the launching thread that starts after the
collective ends). Edges come from one reference step; ops only seen in other steps
get their edges from the first step that has them.
"""

from __future__ import annotations

import gc
import itertools
import re
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd

from planner.errors import InputError
from planner.graph import PHASES, GraphError, Op, OpGraph, build_graph
from planner.ingest import files as _files
from planner.ingest import limits
from planner.ingest.files import MAX_SPAN_S, MAX_TIME_NS, read_bytes
from planner.trace import SPAN_COLUMNS, TIMING_COLUMNS, Job, Trace

try:  # orjson parses Kineto JSON ~2-3x faster with less peak memory than json
    import orjson as _json

    _JSONError: tuple[type[Exception], ...] = (_json.JSONDecodeError,)
except ImportError:  # pragma: no cover - orjson is a dependency; json is the fallback
    import json as _json  # type: ignore[no-redef]

    _JSONError = (ValueError,)

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_BACKEND = re.compile(r"^(nccl|gloo|rccl|hccl|mpi|ucc|xccl|mccl):(\w+)$", re.IGNORECASE)
_COMM_KERNEL = re.compile(r"^(nccl|rccl)\w*?(?:Kernel|DevKernel)_(\w+?)_", re.IGNORECASE)
_THREAD_LABEL = re.compile(r"^thread \d+ \((.*)\)$")
CPU_OP_CATS = frozenset({"cpu_op", "operator", "cuda_runtime", "runtime", "cuda_driver"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
LAUNCH_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})

#: Element sizes of the dtype names Kineto writes (`Input type`, record_param_comms `dtype`).
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "unsigned int": 4,
    "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "long long": 8,
    "complexfloat": 8, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "half": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "short": 2, "short int": 2,
    "signed char": 1, "unsigned char": 1, "char": 1, "byte": 1, "bool": 1, "int8": 1,
    "uint8": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}  # fmt: skip
_KIND = {
    "allreduce": "all_reduce", "alltoall": "all_to_all", "alltoallbase": "all_to_all",
    "alltoallv": "all_to_all", "allgather": "all_gather", "allgatherbase": "all_gather",
    "allgatherintocoalesced": "all_gather", "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter", "broadcast": "broadcast", "barrier": "barrier",
    "send": "send", "recv": "recv", "sendrecv": "send_recv", "reduce": "reduce",
    "gather": "gather", "scatter": "scatter",
}  # fmt: skip


def collective_kind(raw: str) -> str:
    """Normalised collective kind (``all_reduce``, ``all_to_all``, ...) of a backend name."""
    key = raw.lower().replace("_", "")
    return _KIND.get(key, raw.lower())


# ----------------------------------------------------------------------------- sniffing


def is_kineto(head: bytes) -> bool:
    """True when the first bytes of (decompressed) content look like a Kineto trace."""
    text = head.lstrip()
    if b'"/job:' in head:  # a TensorFlow timeline
        return False
    if text.startswith(b"["):  # the old (2020) format: a bare event array
        return b'"ph"' in head and (b'"Operator"' in head or b"ProfilerStep#" in head)
    if not text.startswith(b"{") or b'"traceEvents"' not in head and b'"schemaVersion"' not in head:
        return False
    markers = (
        b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"', b'"cpu_op"',
        b"ProfilerStep#", b'"displayTimeUnit"', b'"cuda_runtime"', b'"Operator"',
    )  # fmt: skip
    return any(m in head for m in markers)


def is_execution_trace(head: bytes) -> bool:
    """True when the first bytes look like an ExecutionTraceObserver JSON document."""
    text = head.lstrip()
    return (
        text.startswith(b"{")
        and b'"schema"' in head
        and b'"nodes"' in head
        and (b'"rf_id"' in head or b"execution_trace" in head or b"execution_graph" in head)
    )


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


#: Layer ops whose (argument position, name) inputs are parameters; with Input Dims these
#: give the parameter sizes when no Execution Trace is at hand.
LAYER_PARAMS: dict[str, tuple[tuple[int, str], ...]] = {
    "aten::conv1d": ((1, "weight"), (2, "bias")),
    "aten::conv2d": ((1, "weight"), (2, "bias")),
    "aten::conv3d": ((1, "weight"), (2, "bias")),
    "aten::linear": ((1, "weight"), (2, "bias")),
    "aten::batch_norm": ((1, "weight"), (2, "bias")),
    "aten::layer_norm": ((2, "weight"), (3, "bias")),
    "aten::group_norm": ((2, "weight"), (3, "bias")),
    "aten::embedding": ((0, "weight"),),
    "aten::embedding_bag": ((0, "weight"),),
}
_KEEP_ARGS = re.compile(
    r"^(?:nccl|gloo|rccl|hccl|mpi|ucc|xccl|mccl|c10d)[:_]|record_param_comms|ProfilerStep"
    r"|^aten::(?:conv[123]d|linear|batch_norm|layer_norm|group_norm|embedding(?:_bag)?)$",
    re.IGNORECASE,
)
_CCL = re.compile("ccl", re.IGNORECASE)
ArgFlags = dict[str, tuple[bool, bool]]
"""Event name -> (keep its args whatever the category, keep them for GPU events)."""


def _arg_flags(name: str, memo: ArgFlags) -> tuple[bool, bool]:
    """The `ArgFlags` of one name, through `memo`: the ranks of a job share their names,
    and the case-blind searches through long kernel names cost more than the rest."""
    flags = memo.get(name)
    if flags is None:
        flags = memo[name] = (_KEEP_ARGS.search(name) is not None, _CCL.search(name) is not None)
    return flags


_NUMBER, _INT, _STR, _DICT = {int, float}, {int}, {str}, {dict}
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

    def __init__(self, memo: ArgFlags | None = None) -> None:
        self.memo: ArgFlags = {} if memo is None else memo
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

    def add(self, events: list[Any]) -> None:
        """Append the complete events of `events` (raises `_Irregular` on anything odd).

        One list comprehension per field, type checks per column and codes through
        dicts keep the per-event work in C loops.
        """
        try:
            phs = [e.get("ph") for e in events]
        except AttributeError:  # not an event object
            raise _Irregular from None
        if "M" in phs:  # the metadata: Kineto writes it last, so most blocks have none
            for e, ph in zip(events, phs, strict=True):
                if ph == "M" and e.get("name") == "thread_name":
                    key = (e.get("pid"), e.get("tid"))
                    if type(key[0]) in _UNHASHABLE or type(key[1]) in _UNHASHABLE:
                        raise _Irregular
                    if key not in self.meta_names:
                        meta = e.get("args") or {}
                        if meta.__class__ is not dict:
                            raise _Irregular
                        self.meta_names[key] = str(meta.get("name", ""))
        xs = [e for e, ph in zip(events, phs, strict=True) if ph == "X"]
        if not xs:
            return
        row0 = len(self.ts)
        names = [e.get("name") for e in xs]  # None (no name) fails the type test below
        cats = [e.get("cat", "") for e in xs]
        ts = [e.get("ts") for e in xs]
        dur = [e.get("dur") for e in xs]
        args = [e.get("args") or {} for e in xs]
        if not (
            set(map(type, ts)) <= _NUMBER
            and set(map(type, dur)) <= _NUMBER
            and set(map(type, names)) <= _STR
            and set(map(type, cats)) <= _STR
            and set(map(type, args)) <= _DICT
        ):
            raise _Irregular
        corr = [a.get("correlation", -1) for a in args]
        rf = [a.get("Record function id", 0) for a in args]
        if not (set(map(type, corr)) <= _INT and set(map(type, rf)) <= _INT):
            raise _Irregular
        try:
            keys = list(zip([e.get("pid") for e in xs], [e.get("tid") for e in xs], strict=True))
            pairs = self.lane_ids
            known = len(pairs)
            pair_code = [pairs.setdefault(k, len(pairs)) for k in keys]
            for new in range(known, len(pairs)):  # a new (pid, tid): its lane, maybe new
                first = pair_code.index(new)
                self._new_lane(keys[first], row0 + first, args[first])
            self.corr.frombytes(np.array(corr, dtype=np.int64).tobytes())
            self.rf.frombytes(np.array(rf, dtype=np.int64).tobytes())
        except (TypeError, OverflowError):  # unhashable or out-of-range values
            raise _Irregular from None
        ids = self.name_ids
        known = len(ids)
        name_code = np.array([ids.setdefault(n, len(ids)) for n in names], dtype=np.int32)
        for name in itertools.islice(ids, known, None):
            self.names.append(name)
            keep, ccl = _arg_flags(name, self.memo)
            self.keep_name.append(keep)
            self.ccl_name.append(ccl)
        cat_ids = self.cat_ids
        known = len(cat_ids)
        cat_code = np.array([cat_ids.setdefault(c, len(cat_ids)) for c in cats], dtype=np.int32)
        for cat in itertools.islice(cat_ids, known, None):
            self.cats.append(cat.lower())
            self.gpu_cat.append(cat.lower() in GPU_CATS)
        keep = np.array(self.keep_name)[name_code] | (
            np.array(self.ccl_name)[name_code] & np.array(self.gpu_cat)[cat_code]
        )
        for i in np.flatnonzero(keep).tolist():
            self.args[row0 + i] = args[i]
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
            if cats[cat_code[row]] in GPU_CATS:
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


def _parse_array(body: bytes) -> list[Any] | None:
    """`body` (events separated by commas) as a list, or None when it is not one."""
    try:
        parsed = _json.loads(b"[" + body + b"]")
    except _JSONError:
        return None
    return parsed if isinstance(parsed, list) else None


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


def read_rank(path: Path, document: Any | None = None, memo: ArgFlags | None = None) -> RankEvents:
    """Columnar events of one Kineto file.

    Streams the file (bounded memory, no event object graph) when it has Kineto's
    layout; otherwise, or given the parsed `document`, reads the whole document with
    the generic reader, which also words every error. `memo` is shared by the ranks
    of one job.
    """
    if document is None:
        cols = _Columns(memo)
        try:
            return cols.finish(path, _stream_columns(path, cols))
        except _Irregular:
            pass
        del cols
    return read_rank_generic(path, document)


_TIME_TYPES = {int, float, str, type(None)}  # numeric strings are read as numbers
_UNHASHABLE = {list, dict}


def _int_arg(values: np.ndarray, default: int) -> np.ndarray:
    """An integer arg column (ids) as int64: `default` where it is no number or out of range."""
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


def read_rank_generic(path: Path, document: Any | None = None) -> RankEvents:
    """Columnar events from the whole parsed document (any layout, any odd values)."""
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
    keep_name = np.array([bool(_KEEP_ARGS.search(n)) for n in name_list], dtype=bool)
    ccl_name = np.array([bool(_CCL.search(n)) for n in name_list], dtype=bool)
    gpu_cat = np.array([c in GPU_CATS for c in cat_list], dtype=bool)
    keep = keep_name[name_code] | (gpu_cat[cat_code] & ccl_name[name_code])
    lane_names: dict[int, str] = {}
    for lane, row in enumerate(np.unique(lane_code, return_index=True)[1]):
        pid, tid = pids[row], tids[row]
        if cats[row] in GPU_CATS:
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


# ----------------------------------------------------------------------------- per-rank model


@dataclass
class Occurrences:
    """The op occurrences of one rank, one entry each (columns of the timings table)."""

    iteration: np.ndarray  # int64 step
    op: np.ndarray  # int64 op id (index into RankModel.op_names)
    start: np.ndarray  # int64 ns
    duration: np.ndarray  # int64 ns

    def __len__(self) -> int:
        return len(self.op)


@dataclass
class RankModel:
    """One rank, reduced to ops: the op occurrences plus the edge candidates."""

    rank: str
    ops: dict[str, Op]
    occurrences: Occurrences
    spans: list[tuple[int, int, int]]  # (step, start, end)
    op_names: list[str]  # op id -> name (the keys of `ops`, in order)
    edges_by_step: dict[int, tuple[np.ndarray, np.ndarray]]  # step -> (src ids, dst ids)
    rf_to_op: dict[int, str]  # Record function id (ET step) -> op name
    notes: list[str]
    meta: dict[str, Any]
    #: step -> forward layer-op parameter reads in time order: (op, label, nbytes)
    layer_reads: dict[int, list[tuple[str, str, int]]] = field(default_factory=dict)


_FORWARD, _BACKWARD, _OPTIMIZER, _UNKNOWN = map(
    PHASES.index, ("forward", "backward", "optimizer", "unknown")
)  # phase codes: indexes into PHASES


def _phase_code(name: str) -> int:
    """The phase (its index in `PHASES`) a record_function range of this name marks."""
    key = name.strip("# ").lower()
    if key == "forward" or key.startswith("forward_"):
        return _FORWARD
    if key == "backward" or key.startswith("backward_"):
        return _BACKWARD
    if key.startswith("optimizer") and "zero_grad" not in key:
        return _OPTIMIZER
    return _UNKNOWN


def _nbytes(args: dict[str, Any]) -> int:
    """Bytes of a comm record: `In msg nelems` x dtype, else `Input Dims` x `Input type`."""
    if "In msg nelems" in args:
        try:
            nelems = int(args["In msg nelems"])
        except (TypeError, ValueError):
            nelems = 0
        return nelems * DTYPE_BYTES.get(str(args.get("dtype", "float")).lower(), 4)
    dims = args.get("Input Dims")
    types = args.get("Input type") or []
    if not isinstance(dims, list) or not dims:
        return 0
    first = dims[0]
    dtype = str(types[0]).lower() if types else "float"

    def numel(shape: Any) -> int:
        if isinstance(shape, list) and shape and all(isinstance(x, list) for x in shape):
            return sum(numel(s) for s in shape)  # a TensorList
        if isinstance(shape, list) and shape:
            return int(np.prod(shape))
        return 0

    return numel(first) * DTYPE_BYTES.get(dtype, 4)


def _outer_index(
    lane: np.ndarray, ts: np.ndarray, end: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For rows in `mask` (one lane each): (is outermost, row of the enclosing outermost)."""
    sel = np.flatnonzero(mask)
    order = np.lexsort((-end[sel], ts[sel], lane[sel]))
    rows = sel[order]
    lanes, starts_, ends = lane[rows], ts[rows], end[rows]
    new_lane = np.concatenate([[True], lanes[1:] != lanes[:-1]])
    big = np.int64(1) << np.int64(62)
    reach = np.empty_like(ends)
    bounds = np.append(np.flatnonzero(new_lane), len(ends))
    for a, b in zip(bounds[:-1], bounds[1:], strict=False):  # one vectorised cummax per lane
        reach[a:b] = np.maximum.accumulate(ends[a:b])
    prev = np.concatenate([[-big], reach[:-1]])
    outer = new_lane | (starts_ >= prev)
    pos = np.where(outer, np.arange(len(rows)), -1)
    owner = rows[np.maximum.accumulate(pos)] if len(rows) else rows
    is_outer = np.zeros(len(lane), dtype=bool)
    is_outer[rows] = outer
    enclosing = np.full(len(lane), -1, dtype=np.int64)
    enclosing[rows] = owner
    return is_outer, enclosing


def _by_lane(
    rows: np.ndarray, lanes: np.ndarray, ts: np.ndarray | None, key: np.ndarray | None = None
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Rows grouped by lane, each sorted by `key` (default: the rows' ts): lane -> (keys, rows)."""
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if len(rows) == 0:
        return out
    keys = key if key is not None else ts[rows]
    lane_of = lanes if key is not None else lanes[rows]
    for lane in np.unique(lane_of):
        sel = lane_of == lane
        order = np.argsort(keys[sel], kind="stable")
        out[int(lane)] = (keys[sel][order], rows[sel][order])
    return out


def _cumcount(*keys: np.ndarray) -> np.ndarray:
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


OpMemo = dict[tuple[Any, ...], Op]
"""An Op's fields -> the one Op with them: the ranks of a data-parallel job repeat their
ops, and an Op is a frozen value, so one object (and one name string) serves them all."""


def build_rank(
    ev: RankEvents, rank_name: str, et_step: int | None = None, op_memo: OpMemo | None = None
) -> RankModel:
    """Reduce one rank's events to op occurrences per step, collectives and DAG edges.

    `op_memo` is shared by the ranks of one job.
    """
    path = ev.path
    names, name_code = ev.names, ev.name_code
    limits.check_world(path, ev.rank, ev.distributed.get("world_size"))
    limits.check_input_dims(path, ev.args, names, name_code)
    ts, end, lane_arr = ev.ts, ev.end, ev.lane
    n_rows = len(ev)
    step_name = np.array([_STEP.match(n) is not None for n in names], dtype=bool)
    step_rows = np.flatnonzero(step_name[name_code])
    if len(step_rows) == 0:
        raise InputError(path, "no ProfilerStep#N events: profile with torch.profiler.schedule "
                         "and call prof.step() each iteration")  # fmt: skip
    # the step ranges by start (a quicksort, as pandas' sort_values: ties resolve as they
    # always have), the first range of each step number kept
    numbers = np.array([int(names[name_code[i]].split("#")[1]) for i in step_rows], np.int64)
    by_start = np.argsort(ts[step_rows], kind="quicksort")
    first_of_number = np.sort(np.unique(numbers[by_start], return_index=True)[1])
    s_rows = step_rows[by_start[first_of_number]]
    s_step, s_start, s_end = numbers[by_start[first_of_number]], ts[s_rows], end[s_rows]
    main_lane = int(np.bincount(lane_arr[s_rows]).argmax())  # the most common; lowest on ties
    notes: list[str] = []

    is_cpu = ev.cat_flags(CPU_OP_CATS)
    is_gpu = ev.cat_flags(GPU_CATS)
    annotations = ev.cat_flags({"user_annotation"})
    backend = ev.name_flags(_BACKEND.match) & annotations
    comm_kernel = is_gpu & ev.name_flags(_COMM_KERNEL.match)

    # outermost CPU ops per thread (comm backend records count as CPU events for nesting)
    cpu_like = (is_cpu | backend) & ~ev.name_flags(lambda n: n.startswith("ProfilerStep#"))
    is_outer, enclosing = _outer_index(lane_arr, ts, end, cpu_like)

    # lane naming: main thread "main"; others label.i in order of first event
    n_lanes = int(lane_arr.max()) + 1
    lane_names = dict(ev.lane_names)
    lane_names[main_lane] = "main"
    seen_labels: dict[str, int] = {}
    first = np.full(n_lanes, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, lane_arr, ts)
    lanes_used = np.unique(lane_arr)
    final_lane: dict[int, str] = {}
    for lane in lanes_used[np.argsort(first[lanes_used], kind="quicksort")].tolist():
        label = lane_names.get(int(lane), f"lane{lane}")
        if int(lane) == main_lane or label.startswith("gpu"):
            final_lane[int(lane)] = label
            continue
        i = seen_labels.get(label, 0)
        seen_labels[label] = i + 1
        final_lane[int(lane)] = f"{label}.{i}"

    # launch time / launching op of GPU events through the correlation id
    launch_rows = np.flatnonzero(ev.cat_flags(LAUNCH_CATS) & (ev.corr >= 0))
    launch_row = np.full(n_rows, -1, dtype=np.int64)
    gpu_idx = np.flatnonzero(is_gpu)
    if len(gpu_idx) and len(launch_rows):
        corr_keys, first_of = np.unique(ev.corr[launch_rows], return_index=True)
        want = ev.corr[gpu_idx]
        pos = np.minimum(np.searchsorted(corr_keys, want), len(corr_keys) - 1)
        ok = corr_keys[pos] == want
        launch_row[gpu_idx[ok]] = launch_rows[first_of[pos[ok]]]
    anchor = ts.copy()  # the time that places an event in a step/phase: launch time for GPU
    has_launch = launch_row >= 0
    anchor[has_launch] = ts[launch_row[has_launch]]

    # step of every event
    idx = np.searchsorted(s_start, anchor, side="right") - 1
    valid = idx >= 0
    valid[valid] &= anchor[valid] < s_end[idx[valid]]
    step_of = np.where(valid, s_step[np.maximum(idx, 0)], -1)

    # phases (codes into PHASES) from record_function ranges (any CPU thread)
    name_phase = np.array([_phase_code(n) for n in names], dtype=np.int8)
    pr = np.flatnonzero(annotations & (name_phase[name_code] != _UNKNOWN))
    phase_of = np.full(n_rows, _UNKNOWN, dtype=np.int8)
    if len(pr):
        order = pr[np.argsort(ts[pr], kind="stable")]
        p_start, p_end = ts[order], end[order]
        p_code = name_phase[name_code[order]]
        j = np.searchsorted(p_start, anchor, side="right") - 1
        inside = (j >= 0) & (anchor < p_end[np.maximum(j, 0)])
        phase_of[inside] = p_code[j[inside]]
    else:
        auto = ev.name_flags(lambda n: n.startswith("autograd::engine::evaluate_function"))
        phase_of[auto] = _BACKWARD
        notes.append(f"{rank_name}: no forward/backward/optimizer ranges; phases are guessed")

    # ------------------------------------------------------------------ collectives
    coll_rows: list[int] = []  # the event whose time is the transfer
    coll_info: list[dict[str, Any]] = []
    kernel_taken: set[int] = set()
    ann_rows = np.flatnonzero(backend & (step_of >= 0))
    # comm kernels launched inside a backend record, per launching lane
    kernel_rows = np.flatnonzero(comm_kernel)
    launched = kernel_rows[launch_row[kernel_rows] >= 0]
    kernel_by_launch = _by_lane(
        launched,
        lane_arr[launch_row[launched]] if len(launched) else launched,
        None,
        key=ts[launch_row[launched]] if len(launched) else None,
    )
    # record_param_comms per lane, for the process group and size
    rpc_rows = np.flatnonzero(ev.name_flags(lambda n: n == "record_param_comms"))
    c10d_rows = np.flatnonzero(ev.name_flags(lambda n: n.startswith("c10d::")) & is_cpu)
    c10d_by_kind: dict[str, list[int]] = {}
    for r in c10d_rows[np.argsort(ts[c10d_rows], kind="stable")]:
        kind = collective_kind(names[name_code[r]].split("::", 1)[1].rstrip("_"))
        c10d_by_kind.setdefault(kind, []).append(int(r))
    c10d_next: dict[str, int] = {}  # FIFO per kind: the used ones are always a prefix

    rpc_by_lane = _by_lane(rpc_rows, lane_arr, ts)

    def enclosing_rpc(row: int) -> dict[str, Any]:
        """Args of the innermost record_param_comms around `row` on its thread."""
        starts, rows_ = rpc_by_lane.get(int(lane_arr[row]), (None, None))
        if starts is None:
            return {}
        j = int(np.searchsorted(starts, ts[row], side="right")) - 1
        while j >= 0:
            r = int(rows_[j])
            if end[r] >= end[row]:
                return ev.args.get(r, {})
            j -= 1
            if ts[row] - starts[j + 1] > 10**9:  # give up past 1 s of unrelated records
                break
        return {}

    for a in ann_rows[np.argsort(ts[ann_rows], kind="stable")]:
        a = int(a)
        a_args = ev.args.get(a, {})
        kind = collective_kind(_BACKEND.match(names[name_code[a]]).group(2))
        rpc = enclosing_rpc(a) if enclosing[a] != a else {}
        kernel = -1
        kstarts, krows = kernel_by_launch.get(int(lane_arr[a]), (None, None))
        if kstarts is not None:
            j = int(np.searchsorted(kstarts, ts[a], side="left"))
            while j < len(krows) and kstarts[j] <= end[a]:
                if int(krows[j]) not in kernel_taken:
                    kernel = int(krows[j])
                    break
                j += 1
        k_args = ev.args.get(kernel, {}) if kernel >= 0 else {}
        nbytes = _nbytes(a_args) or _nbytes(rpc) or _nbytes(k_args)
        pg = str(rpc.get("Process Group Name") or k_args.get("Process Group Name") or "0")
        if enclosing[a] != a:  # launched inside a c10d/cpu op on this thread
            launcher = int(enclosing[a])
        else:  # gloo worker-thread record: the c10d op that queued it, FIFO per kind
            launcher = -1
            queue = c10d_by_kind.get(kind, [])
            nxt = c10d_next.get(kind, 0)
            if nxt < len(queue) and ts[queue[nxt]] <= ts[a]:
                r = queue[nxt]
                c10d_next[kind] = nxt + 1
                launcher = int(enclosing[r]) if enclosing[r] >= 0 else r
        if kernel >= 0:
            kernel_taken.add(kernel)
        coll_rows.append(kernel if kernel >= 0 else a)
        coll_info.append(
            {"kind": kind, "pg": pg, "nbytes": nbytes, "launcher": launcher, "anchor_row": a}
        )
    for k in kernel_rows:  # comm kernels with no backend record around their launch
        k = int(k)
        if k in kernel_taken or step_of[k] < 0:
            continue
        k_args = ev.args.get(k, {})
        raw = _COMM_KERNEL.match(names[name_code[k]]).group(2)
        kind = collective_kind(str(k_args.get("Collective name") or raw))
        lr = int(launch_row[k])
        coll_rows.append(k)
        coll_info.append(
            {
                "kind": kind,
                "pg": str(k_args.get("Process Group Name") or "0"),
                "nbytes": _nbytes(k_args),
                "launcher": int(enclosing[lr]) if lr >= 0 and enclosing[lr] >= 0 else -1,
                "anchor_row": lr if lr >= 0 else k,
            }
        )

    # ------------------------------------------------------------------ op occurrences
    # Lanes (thread/stream lanes, then the net lanes) as codes whose order is the label's.
    net_labels = ["net" if c["pg"] in ("0", "default_pg", "") else f"net:{c['pg']}"
                  for c in coll_info]  # fmt: skip
    labels = sorted(set(final_lane.values()) | set(net_labels))
    label_code = {label: i for i, label in enumerate(labels)}
    lane_code_of = np.array([label_code[final_lane[i]] for i in range(n_lanes)], dtype=np.int64)

    op_mask = ((is_cpu & is_outer) | is_gpu) & (step_of >= 0)
    op_mask[coll_rows] = False
    op_mask[ann_rows] = False
    o_row = np.flatnonzero(op_mask)
    o_step, o_lane = step_of[o_row], lane_code_of[lane_arr[o_row]]
    o_order = np.lexsort((o_row, ts[o_row], o_lane, o_step))
    o_row, o_step, o_lane = o_row[o_order], o_step[o_order], o_lane[o_order]
    o_ev = name_code[o_row]
    o_k = _cumcount(o_step, o_lane, o_ev)

    c_row = np.array(coll_rows, dtype=np.int64)
    c_kind: list[str] = []
    c_param: list[str] = []
    if len(c_row):
        a_row = np.array([c["anchor_row"] for c in coll_info], dtype=np.int64)
        c_step = step_of[np.where(step_of[a_row] >= 0, a_row, c_row)]
        c_lane = np.array([label_code[x] for x in net_labels], dtype=np.int64)
        c_nbytes = np.array([int(c["nbytes"]) for c in coll_info], dtype=np.int64)
        c_launcher = np.array([c["launcher"] for c in coll_info], dtype=np.int64)
        keep = np.flatnonzero(c_step >= 0)
        c_order = keep[np.lexsort((c_row[keep], ts[a_row[keep]], c_step[keep]))]
        c_row, c_step, c_lane = c_row[c_order], c_step[c_order], c_lane[c_order]
        c_nbytes, c_launcher = c_nbytes[c_order], c_launcher[c_order]
        c_kind = [coll_info[i]["kind"] for i in c_order.tolist()]
        kind_ids: dict[str, int] = {}
        kind_code = np.array([kind_ids.setdefault(k, len(kind_ids)) for k in c_kind], np.int64)
        c_k = _cumcount(c_step, c_lane, kind_code)
        all_reduce = np.array([k == "all_reduce" for k in c_kind], dtype=bool)
        bwd = np.flatnonzero(all_reduce & (phase_of[c_row] == _BACKWARD))
        bucket = _cumcount(c_step[bwd], c_lane[bwd])
        c_param = [f"{k}#{i}" for k, i in zip(c_kind, c_k.tolist(), strict=True)]
        for j, i in zip(bwd.tolist(), bucket.tolist(), strict=True):
            c_param[j] = f"bucket{i}"
    else:
        c_step = c_lane = c_k = c_nbytes = c_launcher = np.zeros(0, dtype=np.int64)

    if len(o_row) + len(c_row) == 0:
        raise InputError(path, f"no CPU or GPU op falls inside a ProfilerStep#N range "
                         f"({len(s_step)} step(s) found, all empty)")  # fmt: skip

    # all occurrences: compute ops, then collectives; op ids in order of first occurrence
    n_comp = len(o_row)
    rows_ = np.concatenate([o_row, c_row])
    step_ = np.concatenate([o_step, c_step])
    lane_ = np.concatenate([o_lane, c_lane])
    start_ = ts[rows_]
    end_ = end[rows_]
    text = [names[c] for c in o_ev.tolist()] + c_kind
    ks = np.concatenate([o_k, c_k]).tolist()
    lanes_ = lane_.tolist()
    op_ids: dict[str, int] = {}
    op_id = np.array(
        [op_ids.setdefault(f"{labels[la]}/{t}#{k}", len(op_ids))
         for la, t, k in zip(lanes_, text, ks, strict=True)],
        dtype=np.int64,
    )  # fmt: skip
    del text, ks
    op_names = list(op_ids)
    del op_ids
    first_occ = np.unique(op_id, return_index=True)[1].tolist()
    op_nbytes = np.zeros(len(op_names), dtype=np.int64)
    np.maximum.at(op_nbytes, op_id[n_comp:], c_nbytes)
    phase_ = phase_of[rows_]
    phases = phase_.tolist()
    types = name_code[rows_[first_occ]].tolist()
    ops: dict[str, Op] = {}
    memo: OpMemo = {} if op_memo is None else op_memo
    for i, (occ, nbytes, type_code) in enumerate(
        zip(first_occ, op_nbytes.tolist(), types, strict=True)
    ):
        collective = occ >= n_comp
        kind = "collective" if collective else "compute"
        resource = labels[lanes_[occ]]
        param = c_param[occ - n_comp] if collective else None
        phase, type_ = PHASES[phases[occ]], names[type_code]
        key = (op_names[i], kind, resource, param, nbytes, phase, type_)
        op = memo.get(key)
        if op is None:
            op = memo[key] = Op(
                name=op_names[i], kind=kind, resource=resource, param=param, nbytes=nbytes,
                phase=phase, type=type_,
            )  # fmt: skip
        ops[op.name] = op
        op_names[i] = op.name

    # ------------------------------------------------------------------ edges per step
    op_at_row = np.full(n_rows, -1, dtype=np.int64)
    op_at_row[rows_] = op_id
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    tag: list[np.ndarray] = []  # step of each edge
    # per-lane program order (o_* are sorted by step, lane, start, row)
    same = (o_step[1:] == o_step[:-1]) & (o_lane[1:] == o_lane[:-1])
    src.append(op_id[:n_comp][:-1][same])
    dst.append(op_id[:n_comp][1:][same])
    tag.append(o_step[1:][same])
    # launch -> GPU op
    g_occ = np.flatnonzero(is_gpu[o_row])
    lr = launch_row[o_row[g_occ]]
    owner = np.where(lr >= 0, enclosing[np.maximum(lr, 0)], -1)
    launcher_op = np.where(owner >= 0, op_at_row[np.maximum(owner, 0)], -1)
    hit = launcher_op >= 0
    src.append(launcher_op[hit])
    dst.append(op_id[g_occ[hit]])
    tag.append(o_step[g_occ[hit]])
    # launcher -> collective, collective -> optimizer / next op on the launching thread
    if len(c_row):
        c_src, c_dst, c_tag = _collective_edges(
            op_id, n_comp, o_step, o_lane, start_[:n_comp], phase_[:n_comp], ts, end,
            c_step, c_row, c_launcher, lane_code_of[lane_arr], op_at_row,
        )  # fmt: skip
        src.append(c_src)
        dst.append(c_dst)
        tag.append(c_tag)
    all_src, all_dst, all_tag = np.concatenate(src), np.concatenate(dst), np.concatenate(tag)
    # group by step, keeping lane edges, then launch edges, then collective edges
    e_order = np.argsort(all_tag, kind="stable")
    all_src, all_dst, all_tag = all_src[e_order], all_dst[e_order], all_tag[e_order]
    edge_steps = np.union1d(np.unique(o_step), np.unique(c_step))
    cut = np.searchsorted(all_tag, edge_steps)
    cut_end = np.searchsorted(all_tag, edge_steps, side="right")
    edges_by_step = {
        int(s): (all_src[a:b], all_dst[a:b])
        for s, a, b in zip(edge_steps, cut, cut_end, strict=True)
    }

    # spans: the step range, extended to the last op assigned to it (GPU tails)
    occ_steps, step_at = np.unique(step_, return_inverse=True)
    last_end = np.full(len(occ_steps), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last_end, step_at, end_)
    last = dict(zip(occ_steps.tolist(), last_end.tolist(), strict=True))
    spans = [
        (s, a, max(b, last[s]))
        for s, a, b in zip(s_step.tolist(), s_start.tolist(), s_end.tolist(), strict=True)
        if s in last
    ]
    occurrences = Occurrences(step_.astype(np.int64), op_id, start_, end_ - start_)
    # Record function id -> op, for the ET join (any event inside the op maps to it)
    rf_to_op: dict[int, str] = {}
    rf = ev.rf
    if et_step is not None:
        cand = np.flatnonzero((rf > 0) & (step_of == et_step) & cpu_like)
        for r, o in zip(cand.tolist(), enclosing[cand].tolist(), strict=False):
            if o >= 0 and op_at_row[o] >= 0:
                rf_to_op[int(rf[r])] = op_names[op_at_row[o]]
            elif op_at_row[r] >= 0:
                rf_to_op[int(rf[r])] = op_names[op_at_row[r]]
        for i, row in enumerate(coll_rows):  # the backend record of a collective -> it
            a = coll_info[i]["anchor_row"]
            if rf[a] > 0 and op_at_row[row] >= 0:
                rf_to_op[int(rf[a])] = op_names[op_at_row[row]]
    per_step = np.unique(c_step, return_counts=True)
    meta = {
        "lanes": sorted({labels[i] for i in np.unique(lane_).tolist()}),
        "collectives_per_step": dict(zip(per_step[0].tolist(), per_step[1].tolist(), strict=True)),
        "distributed": ev.distributed,
    }
    layer_reads: dict[int, list[tuple[str, str, int]]] = {}
    layer_rows = np.flatnonzero(
        ev.name_flags(LAYER_PARAMS.__contains__) & is_cpu & (step_of >= 0) & (phase_of == _FORWARD)
    )
    for r in layer_rows[np.argsort(ts[layer_rows], kind="stable")].tolist():
        o = int(enclosing[r]) if enclosing[r] >= 0 else r
        if op_at_row[o] < 0:
            continue
        args = ev.args.get(r, {})
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        for pos, label in LAYER_PARAMS[names[name_code[r]]]:
            if pos >= len(dims) or pos >= len(types) or not dims[pos]:
                continue
            size = DTYPE_BYTES.get(str(types[pos]).lower())
            if size is None or not all(isinstance(d, int) for d in dims[pos]):
                continue
            nbytes = int(np.prod(dims[pos])) * size
            layer_reads.setdefault(int(step_of[r]), []).append(
                (op_names[op_at_row[o]], label, nbytes)
            )
    return RankModel(
        rank_name, ops, occurrences, spans, op_names, edges_by_step, rf_to_op, notes, meta,
        layer_reads=layer_reads,
    )  # fmt: skip


def parameters_from_sizes(
    model: RankModel, reference: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """Parameters of one rank from the layer ops' Input Dims and the DDP bucket sizes.

    Used without an Execution Trace. The candidates are the weight/bias inputs of the
    forward layer ops (`LAYER_PARAMS`) of the reference step. They are assigned to the
    gradient all-reduces (``bucket<k>``, in launch order) only when that is unambiguous:
    one bucket holding exactly their bytes, or several whose cumulative sizes each fall
    on a boundary between two layer ops of the reverse forward order (the order DDP
    fills its buckets in). Otherwise nothing is assigned and a note says the windows
    stay per bucket.
    """
    occ = model.occurrences
    sel = np.flatnonzero(occ.iteration == reference)
    found: list[tuple[int, str]] = []  # (start, op) of the step's bucket all-reduces
    for start, op_id in zip(occ.start[sel].tolist(), occ.op[sel].tolist(), strict=True):
        op = model.ops[model.op_names[op_id]]
        if op.kind == "collective" and (op.param or "").startswith("bucket"):
            found.append((start, op.name))
    found.sort()
    buckets = list(dict.fromkeys(op for _, op in found))  # in order of first start
    buckets.sort(key=lambda op: int(str(model.ops[op].param)[len("bucket") :]))
    if not buckets:
        return [], []
    sizes = [model.ops[op].nbytes for op in buckets]
    cands = list(reversed(model.layer_reads.get(reference, [])))
    total = sum(n for _, _, n in cands)
    per_bucket = f"{model.rank}: parameters stay per DDP bucket ({len(buckets)} buckets)"
    if not cands:
        return [], [f"{per_bucket}: no layer-op input shapes (profile with record_shapes=True)"]
    if total != sum(sizes):
        return [], [
            f"{per_bucket}: the forward layer ops read {total} parameter bytes, the buckets "
            f"carry {sum(sizes)}; an Execution Trace would tell them apart"
        ]
    owner: list[str] = []
    done, k, ambiguous = 0, 0, False
    for i, (op, _, nbytes) in enumerate(cands):
        if done == sizes[k] and k + 1 < len(sizes):  # a bucket ends before this one
            ambiguous |= i > 0 and cands[i - 1][0] == op
            done, k = 0, k + 1
        owner.append(buckets[k])
        done += nbytes
        if done > sizes[k]:
            ambiguous = True
            break
    if ambiguous or k != len(sizes) - 1:
        return [], [f"{per_bucket}: bucket sizes do not split the layers unambiguously"]
    out: list[dict[str, Any]] = []
    used: dict[str, int] = {}
    for (op, label, nbytes), bucket in zip(cands, owner, strict=True):
        base = f"{op.split('/', 1)[-1]}:{label}"
        used[base] = used.get(base, 0) + 1
        out.append(
            {
                "name": base if used[base] == 1 else f"{base}~{used[base]}",
                "shape": None,
                "nbytes": nbytes,
                "collective": bucket,
                "bucket_offset": None,
                "first_read_op": op,
            }
        )
    out.sort(key=lambda r: (r["collective"], r["name"]))
    return out, [
        f"{model.rank}: {len(out)} parameters assigned to {len(buckets)} DDP bucket(s) from "
        "their sizes (layer-op input shapes, reverse forward order); no names without an "
        "Execution Trace"
    ]


def _collective_edges(
    op_id: np.ndarray,
    n_comp: int,
    o_step: np.ndarray,
    o_lane: np.ndarray,
    o_start: np.ndarray,
    o_phase: np.ndarray,  # codes into PHASES
    ts: np.ndarray,
    end: np.ndarray,
    c_step: np.ndarray,
    c_row: np.ndarray,
    c_launcher: np.ndarray,
    lane_of_row: np.ndarray,
    op_at_row: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges launcher -> collective and collective -> the op that waits for it.

    The waiting op is the step's first optimizer op starting after the launcher, else
    the first op on the launching thread starting after the collective ends (and after
    the launcher: a GPU clock can lag the CPU one). Candidates are ordered by a
    quicksort on start time, so ties resolve as they always have.
    """
    comp_op = op_id[:n_comp]
    opt = np.flatnonzero(o_phase == _OPTIMIZER)
    opt = opt[np.argsort(o_start[opt], kind="quicksort")]
    opt = opt[np.argsort(o_step[opt], kind="stable")]  # per step, in that start order
    opt_step = o_step[opt]
    lane_groups: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    src: list[int] = []
    dst: list[int] = []
    tag: list[int] = []
    for step, cop, launcher, cend in zip(
        c_step.tolist(),
        op_id[n_comp:].tolist(),
        c_launcher.tolist(),
        end[c_row].tolist(),
        strict=True,
    ):
        if launcher >= 0 and op_at_row[launcher] >= 0:
            src.append(int(op_at_row[launcher]))
            dst.append(cop)
            tag.append(step)
        if launcher < 0:
            continue
        a = int(np.searchsorted(opt_step, step))
        b = int(np.searchsorted(opt_step, step, side="right"))
        if b > a:  # the optimizer waits for the gradients
            cand = opt[a:b]
            i = int(np.searchsorted(o_start[cand], ts[launcher], side="right"))
            if i < len(cand):
                src.append(cop)
                dst.append(int(comp_op[cand[i]]))
                tag.append(step)
                continue
        key = (step, int(lane_of_row[launcher]))
        group = lane_groups.get(key)
        if group is None:
            members = np.flatnonzero((o_step == key[0]) & (o_lane == key[1]))
            members = members[np.argsort(o_start[members], kind="quicksort")]
            group = lane_groups[key] = (members, o_start[members])
        members, starts = group
        i = int(np.searchsorted(starts, max(cend, int(ts[launcher]) + 1), side="left"))
        if i < len(members):
            src.append(cop)
            dst.append(int(comp_op[members[i]]))
            tag.append(step)
    return (
        np.array(src, dtype=np.int64),
        np.array(dst, dtype=np.int64),
        np.array(tag, dtype=np.int64),
    )


def _merge_edges(model: RankModel, reference: int) -> list[tuple[str, str, str]]:
    """Reference step's edges, plus edges of ops it lacks from the first step that has them."""
    names = model.op_names
    empty = np.zeros(0, dtype=np.int64)
    ref_src, ref_dst = model.edges_by_step.get(reference, (empty, empty))
    src, dst = [ref_src], [ref_dst]
    covered = np.zeros(len(names), dtype=bool)
    covered[ref_src] = True
    covered[ref_dst] = True
    for step in sorted(model.edges_by_step):
        if step == reference:
            continue
        s, d = model.edges_by_step[step]
        extra = ~covered[s] | ~covered[d]
        if not extra.any():  # the common case: every step repeats the reference's ops
            continue
        s, d = s[extra], d[extra]
        trial = nx.DiGraph()
        trial.add_edges_from(zip(np.concatenate([*src, s]).tolist(),
                                 np.concatenate([*dst, d]).tolist(), strict=True))  # fmt: skip
        if nx.is_directed_acyclic_graph(trial):
            src.append(s)
            dst.append(d)
            covered[s] = True
            covered[d] = True
        else:
            model.notes.append(
                f"{model.rank}: step {step} orders some ops differently; "
                "its extra edges are dropped"
            )
    return [
        (names[u], names[v], "control")
        for u, v in zip(np.concatenate(src).tolist(), np.concatenate(dst).tolist(), strict=True)
    ]


def reference_step(model: RankModel, et_step: int | None = None) -> int:
    """The step whose edges define the DAG: the ET step, else the one with most ops."""
    if et_step is not None and et_step in model.edges_by_step:
        return et_step
    steps, counts = np.unique(model.occurrences.iteration, return_counts=True)
    return int(steps[np.argmax(counts)])


@contextmanager
def _cycle_gc_paused() -> Iterator[None]:
    """Pause Python's cycle collector, restoring its state afterwards.

    Ingest allocates millions of short-lived containers that cannot form cycles (JSON
    trees, the DAG's dicts); the collector would scan them again and again, which
    costs about half the load time. Reference counting still frees them.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_kineto(paths: Sequence[Path], et_paths: Sequence[Path] | None = None) -> Job:
    """One Job from Kineto traces (files or directories), one file per rank.

    Ranks are named ``rank<distributedInfo.rank>``, else by file order. With
    `et_paths` (one Execution Trace per rank, matched by their `pid`/order), the DAG
    of each rank is the ET's data dependencies plus the thread/stream/launch order
    (see `planner.ingest.execution_trace`).
    """
    with _cycle_gc_paused():
        return _load_kineto(paths, et_paths)


def _load_kineto(paths: Sequence[Path], et_paths: Sequence[Path] | None) -> Job:
    files = expand_paths(paths)
    arg_memo: ArgFlags = {}
    used: set[str] = set()

    def read(order: int, path: Path) -> tuple[str, RankEvents]:
        ev = read_rank(path, memo=arg_memo)
        name = f"rank{ev.rank}" if ev.rank is not None else f"rank{order}"
        if name in used:
            raise InputError(path, f"{name} is given twice (distributedInfo.rank repeats)")
        used.add(name)
        return name, ev

    ets: dict[str, Any] = {}
    ranks: Iterator[tuple[str, RankEvents]]
    if et_paths:  # an ET is matched to its rank among all of them: read them all first
        from planner.ingest import execution_trace

        ranked = [read(order, path) for order, path in enumerate(files)]
        ets = execution_trace.match_ranks(et_paths, ranked)
        ranks = iter(ranked)
    else:  # one rank's events in memory at a time
        ranks = (read(order, path) for order, path in enumerate(files))
    parts = _JobParts()
    op_memo: OpMemo = {}
    failed: InputError | None = None
    for name, ev in ranks:
        if failed is None:
            try:
                _add_rank(parts, name, ev, ets.get(name), op_memo)
            except InputError as exc:
                failed = exc  # raised once every file is read: a bad file is reported first
        del ev
    if failed is not None:
        raise failed
    limits.check_same_job(parts.graphs, parts.meta["ranks"])
    return Job(
        framework="pytorch",
        graphs=parts.graphs,
        trace=Trace(timings=_timings(parts.occurrences), spans=_spans(parts.spans)),
        sources=tuple(str(p) for p in files) + tuple(str(p) for p in (et_paths or ())),
        notes=tuple(parts.notes),
        meta=parts.meta,
    )


@dataclass
class _JobParts:
    """What the ranks add to their Job, gathered rank by rank."""

    graphs: dict[str, OpGraph] = field(default_factory=dict)
    occurrences: list[tuple[str, Occurrences, list[str]]] = field(default_factory=list)
    spans: list[tuple[str, int, int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(
        default_factory=lambda: {"ranks": {}, "parameters": {}, "parameter_source": {}}
    )


def _add_rank(parts: _JobParts, name: str, ev: RankEvents, et: Any | None, op_memo: OpMemo) -> None:
    """Model one rank (joined to its Execution Trace `et`, if any) into `parts`."""
    notes, meta = parts.notes, parts.meta
    step = None
    if et is not None:
        step = et.step if et.step is not None else _guess_et_step(ev, et)
        if step is None:
            raise InputError(et.path, f"no record-function id joins it to {ev.path.name}")
    model = build_rank(ev, name, et_step=step, op_memo=op_memo)
    ref = reference_step(model, step)
    edges = _merge_edges(model, ref)
    params: list[dict[str, Any]] = []
    p_notes: list[str] = []
    source = "bucket"
    if et is not None:
        from planner.ingest import execution_trace

        edges, et_notes = execution_trace.dag_edges(et, model, edges, ref)
        notes.extend(et_notes)
        if et.parameters:
            params, p_notes = execution_trace.resolve_parameters(et, model)
            source = "execution_trace"
        else:
            p_notes = [f"{name}: the Execution Trace has no DDP bucket copies"]
    if not params:
        params, size_notes = parameters_from_sizes(model, ref)
        p_notes += size_notes
        source = "bucket_sizes" if params else "bucket"
    notes.extend(p_notes)
    meta["parameters"][name] = params
    meta["parameter_source"][name] = source
    try:
        parts.graphs[name] = build_graph(model.ops.values(), edges)
    except GraphError as exc:  # a cycle means the trace contradicts itself
        text = str(exc)
        text = text if len(text) < 300 else text[:300] + " ..."
        raise InputError(ev.path, f"cannot build the op DAG ({text})") from None
    parts.occurrences.append((name, model.occurrences, model.op_names))
    parts.spans.extend((name, s, a, b) for s, a, b in model.spans)
    notes.extend(model.notes)
    meta["ranks"][name] = {
        "source": str(ev.path),
        "reference_step": ref,
        "world_size": ev.world_size,
        **model.meta,
    }


# The two tables are built from whole columns: a DataFrame from rows, a `columns=`
# reindex or an `astype` would each page in more of pandas than the load itself needs.


def _timings(rows: Sequence[tuple[str, Occurrences, list[str]]]) -> pd.DataFrame:
    """The timings table (`TIMING_COLUMNS`) of every rank's op occurrences, in rank order."""
    rank = np.repeat(np.array([name for name, _, _ in rows], dtype=object),
                     [len(occ) for _, occ, _ in rows])  # fmt: skip
    op = np.concatenate([np.array(names, dtype=object)[occ.op] for _, occ, names in rows])
    columns = (
        pd.array(rank, dtype="str"),
        np.concatenate([occ.iteration for _, occ, _ in rows]),
        pd.array(op, dtype="str"),
        np.concatenate([occ.start for _, occ, _ in rows]),
        np.concatenate([occ.duration for _, occ, _ in rows]),
    )
    return pd.DataFrame(dict(zip(TIMING_COLUMNS, columns, strict=True)))


def _spans(spans: Sequence[tuple[str, int, int, int]]) -> pd.DataFrame:
    """The spans table (`SPAN_COLUMNS`): one row per (rank, iteration)."""
    rank, iteration, start, end = zip(*spans, strict=True) if spans else ((), (), (), ())
    columns = (
        pd.array(np.array(rank, dtype=object), dtype="str"),
        np.array(iteration, dtype=np.int64),
        np.array(start, dtype=np.int64),
        np.array(end, dtype=np.int64),
    )
    return pd.DataFrame(dict(zip(SPAN_COLUMNS, columns, strict=True)))


def _guess_et_step(ev: RankEvents, et: Any) -> int | None:
    """The step whose Kineto events carry the ET's record-function ids."""
    ids = np.fromiter(et.rf_ids(), dtype=np.int64)
    hit = np.isin(ev.rf, ids[ids > 0])
    if not hit.any():
        return None
    starts = ev.ts[hit]
    step_rows = np.flatnonzero(ev.name_flags(_STEP.match))
    for r in step_rows.tolist():
        number = int(ev.names[ev.name_code[r]].split("#")[1])
        if ((starts >= ev.ts[r]) & (starts < ev.end[r])).sum() * 2 >= len(starts):
            return number
    return None


def expand_paths(paths: Sequence[Path]) -> list[Path]:
    """Files as given; a directory yields its ``*.pt.trace.json[.gz]`` / ``rank*.json[.gz]``."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(
                p
                for p in path.iterdir()
                if p.is_file()
                and (
                    re.search(r"\.pt\.trace\.json(\.gz)?$", p.name)
                    or re.match(r"^rank[^/]*\.json(\.gz)?$", p.name)
                )
            )
            if not found:
                raise InputError(path, "directory holds no Kineto traces (*.pt.trace.json[.gz])")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise InputError(path, "no such file or directory")
    if not files:
        raise InputError(None, "no Kineto trace given")
    return files
