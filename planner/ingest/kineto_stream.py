"""The streaming reader of Kineto traces: Kineto's own layout read in pieces into columns.

Kineto writes ``{header, "traceEvents": [event, ...], trailer}``; the event array is
parsed `STREAM_CHUNK` bytes at a time (msgspec, one struct per event, the args kept as
their JSON text), so memory is bounded by the columns plus one piece. Anything off that
layout (`_Irregular`) goes to the whole-document reader (`kineto_generic`), which words
the problem; `read_rank` tries this reader first and falls back to that one. A module of
its own so that the speed-tuned path reads apart from the one that checks everything.
"""

from __future__ import annotations

import itertools
import re
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from planner.errors import InputError
from planner.ingest import files as _files
from planner.ingest.exact_json import loads
from planner.ingest.kineto_events import (
    _UNHASHABLE,
    GPU_CATS,
    MAX_ID,
    STREAM_CATS,
    ArgFlags,
    RankEvents,
    _arg_flags,
    _column_problem,
    _event,
    _json,
    _JSONError,
    _lane_label,
    _ns,
    _rank_events,
    id_problem,
)
from planner.ingest.kineto_generic import read_rank_generic


class _Irregular(Exception):
    """The file leaves the layout the streaming reader handles; parse it whole instead."""


class _Refused(Exception):
    """The file is broken (its text says how): `_stream_columns` refuses it, naming the file."""


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
_ARGS = msgspec.json.Decoder(list[Any])
_LONG_ID = re.compile(r"^Integer value out of range - at `\$\[(\d+)\]\.(.+)`$")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
STREAM_CHUNK = 1 << 18
"""Bytes of decompressed JSON parsed at a time by the streaming reader (bounds its memory)."""
_MAX_PENDING = 64 << 20  # an unsplittable stretch longer than this: parse the file whole


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
        self.escaped = 0  # bytes of the text that were not UTF-8 (`files.escape_invalid_utf8`)
        self.seen = 0  # events of traceEvents before the block being added (for messages)

    def add(self, events: list[_Event]) -> None:
        """Append the complete events of `events` (raises `_Irregular` on anything odd).

        One list comprehension per field and codes through dicts keep the per-event work
        in C loops; the types were checked as the piece was parsed (`_Event`).
        """
        start = self.seen  # traceEvents index of events[0]
        self.seen += len(events)
        phs = [e.ph for e in events]
        if "M" in phs:  # the metadata: Kineto writes it last, so most blocks have none
            for e, ph in zip(events, phs, strict=True):
                if ph == "M" and e.name == "thread_name":
                    key = (e.pid, e.tid)
                    if type(key[0]) in _UNHASHABLE or type(key[1]) in _UNHASHABLE:
                        raise _Irregular
                    if key not in self.meta_names:
                        meta = self.loads(bytes(e.args)) or {}
                        if meta.__class__ is not dict:
                            raise _Irregular
                        self.meta_names[key] = str(meta.get("name", ""))
        xs = [e for e, ph in zip(events, phs, strict=True) if ph == "X"]
        if not xs:
            return
        row0 = len(self.ts)
        names = [e.name for e in xs]
        # numpy converts a block of Python numbers at once; a missing time reads NaN (JSON
        # has no NaN), which is the cheaper test
        ts = np.array([e.ts for e in xs], dtype=np.float64)
        dur = np.array([e.dur for e in xs], dtype=np.float64)
        if None in names or np.isnan(ts).any() or np.isnan(dur).any():
            raise _Irregular
        raw_args = [e.args for e in xs]
        corr, rf = self._ids(raw_args, lambda row: _x_event(events, start, xs, row))
        try:
            keys = list(zip([e.pid for e in xs], [e.tid for e in xs], strict=True))
            pairs = self.lane_ids
            known = len(pairs)
            pair_code = [pairs.setdefault(k, len(pairs)) for k in keys]
            for new in range(known, len(pairs)):  # a new (pid, tid): its lane, maybe new
                first = pair_code.index(new)
                self._new_lane(keys[first], row0 + first, self.loads(bytes(raw_args[first])) or {})
        except TypeError:  # unhashable values
            raise _Irregular from None
        self.corr.frombytes(corr.tobytes())
        self.rf.frombytes(rf.tobytes())
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
        kept = np.flatnonzero(keep).tolist()
        for i, args in zip(kept, self._kept_args([raw_args[i] for i in kept]), strict=True):
            self.args[row0 + i] = args
        self.name_code.frombytes(name_code.tobytes())
        self.cat_code.frombytes(cat_code.tobytes())
        self.lane.frombytes(np.array(self.pair_lane, dtype=np.int32)[pair_code].tobytes())
        self.ts.frombytes(ts.tobytes())
        self.dur.frombytes(dur.tobytes())

    @staticmethod
    def _ids(raw_args: list[msgspec.Raw], event: Callable[[int], str]) -> tuple[Any, Any]:
        """The correlation and record-function ids (int64, -1 and 0 without) of the complete
        events whose args are `raw_args`, checked where they are parsed: an integer out of
        (-2**62, 2**62) is refused (`_Refused`, `event(row)` names it); a float or a
        string id leaves the file to the whole-document reader, where it is no id."""
        try:
            ids = _IDS.decode(b"[" + b",".join(raw_args) + b"]")
        except msgspec.ValidationError as exc:
            found = _LONG_ID.match(str(exc))  # an integer of more than 4300 digits
            if found is None:
                raise _Irregular from None
            problem = f"'{found[2]}' has more than 4300 digits, out of range (-2**62, 2**62)"
            raise _Refused(f"malformed {event(int(found[1]))}: {problem}") from None
        except msgspec.DecodeError:  # args that are no object: an odd file
            raise _Irregular from None
        columns = []
        for key, values in (
            ("correlation", [-1 if i is None else i.correlation for i in ids]),
            ("Record function id", [0 if i is None else i.rf for i in ids]),
        ):
            try:
                column = np.array(values, dtype=np.int64)
                bad = len(column) > 0 and (column.min() <= -MAX_ID or column.max() >= MAX_ID)
            except OverflowError:  # past int64
                bad = True
            if bad:
                row = next(r for r, v in enumerate(values) if not -MAX_ID < v < MAX_ID)
                raise _Refused(f"malformed {event(row)}: {id_problem(key, values[row])}")
            columns.append(column)
        return columns[0], columns[1]

    def _new_lane(self, pair: tuple[Any, Any], row: int, args: dict[str, Any]) -> None:
        pid, tid = pair
        key = f"{pid}|{tid}"  # lanes are told apart by their text, as the generic reader does
        code = self.lane_keys.get(key)
        if code is None:
            code = self.lane_keys[key] = len(self.lane_first)
            self.lane_first.append((row, pid, tid, args))
        self.pair_lane.append(code)

    def _kept_args(self, raws: list[msgspec.Raw]) -> list[Any]:
        """The args of the kept events (`raws`, each an object or null, checked by `_ids`),
        null read as {}. (speed) One parse of the block's kept args together; where it
        fails, `loads` of each, which words or escapes what it must."""
        try:
            found = _ARGS.decode(b"[" + b",".join(raws) + b"]")
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            return [self.loads(bytes(raw)) or {} for raw in raws]
        return [args or {} for args in found]

    def loads(self, raw: bytes) -> Any:
        """JSON text of the stream (an event's args, the header), its integers exact and
        one of more than 4300 digits a `LongInt` (`exact_json`): bytes that are not UTF-8
        read escaped and counted (`files.escape_invalid_utf8`); any other fault leaves the
        file to the whole-document reader, which words it (`_Irregular`)."""
        try:
            return loads(raw, long_ints=True)
        except _JSONError:
            data, count = _files.escape_invalid_utf8(raw)
            if not count:
                raise _Irregular from None
        try:
            found = loads(data, long_ints=True)
        except _JSONError:
            raise _Irregular from None
        self.escaped += count
        return found

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
            escaped=self.escaped,
        )


def _x_event(events: list[_Event], first: int, xs: list[_Event], row: int) -> str:
    """``event 12 (aten::mm)``: complete event `row` of a block, by its traceEvents index
    (`first` is that of the block's first event); for messages only."""
    index = [i for i, e in enumerate(events) if e.ph == "X"][row]
    return _event(first + index, xs[row].name)


def _chunks(path: Path) -> Iterator[bytes]:
    """The decompressed content in pieces of STREAM_CHUNK bytes (InputError past the limit)."""
    return _files.iter_content(path, STREAM_CHUNK)


def _parse_array(body: bytes, cols: _Columns) -> list[_Event] | None:
    """`body` (events separated by commas) as events, or None when it is no JSON array
    (a cut inside an event); `_Irregular` when an event's field has another type. Bytes
    that are not UTF-8 are read escaped, counted in `cols`."""
    try:
        return _PIECE.decode(b"[" + body + b"]")
    except msgspec.ValidationError:
        raise _Irregular from None
    except msgspec.DecodeError:
        return None
    except UnicodeDecodeError:
        data, count = _files.escape_invalid_utf8(b"[" + body + b"]")
        events = _parse_array(data[1:-1], cols)
        if events is not None:
            cols.escaped += count
        return events


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

    InputError when a value is refused where it is parsed (an id out of range); `_Irregular`
    when the file leaves Kineto's layout (`_stream_pieces`).
    """
    try:
        return _stream_pieces(path, cols)
    except _Refused as exc:
        raise InputError(path, str(exc)) from None


def _stream_pieces(path: Path, cols: _Columns) -> dict[str, Any]:
    """`_stream_columns`, the problems found in a piece raised as `_Refused`.

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
            events = _parse_array(pending[: cut + 1], cols)
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
            doc = cols.loads(header + b"[]" + pending[close + 1 :])
        except _Irregular:
            continue
        events = _parse_array(pending[:close], cols) if pending[:close].strip() else []
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
