"""A loaded one-rank Job kept on disk between the two passes of a job (`planner analyze`
of many ranks), so that the second pass does not parse the rank's trace again.

The first pass writes the Job as numpy columns (`save`: one file, a JSON header that
names each column's dtype and place, then the columns' bytes; text as UTF-8 joined by
NUL, a text column of the trace as its distinct values and each row's index into them,
the meta as JSON with its tuples and integer keys tagged); the second reads it back
(`load`), equal field by field to the one the trace gives. The file is data, never
code: bytes read into arrays of the dtypes the header names, nothing unpickled
(`tests/test_safety.py`). (speed) One read and one write per rank, no zip members and
no per-array header to parse as ``.npz`` has. A
Job that does not round-trip exactly (a meta value JSON cannot hold, a NUL in a name)
is not kept, and a missing or unreadable file means reading the trace again: the store
only saves time, it never changes an answer. On a Dask cluster a worker that cannot
see the parent's folder (another machine) keeps nothing and the second pass re-reads.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from planner.model.graph import Op, OpGraph
from planner.model.trace import Job, Trace, text_codes

_SEP = "\0"
_INT_KEYS = "\0int_keys"
_TUPLE = "\0tuple"
_TUPLES = "\0tuples"
_OP_TEXT = ("name", "kind", "resource", "phase", "type")
_SCALARS = {str, int, float, bool, type(None)}


def path_of(folder: str, paths: Sequence[str]) -> Path:
    """The file that holds the rank read from `paths` in `folder` (named by a digest of
    the paths, so that both passes find it without being told)."""
    digest = hashlib.sha256(_SEP.join(paths).encode()).hexdigest()[:32]
    return Path(folder) / f"{digest}.rank"


def save(folder: str, paths: Sequence[str], job: Job) -> bool:
    """Keep one-rank `job` (read from `paths`) under `folder`; False when it is not kept
    (the folder is not here, or the Job would not read back the same)."""
    if not os.path.isdir(folder):
        return False
    try:
        arrays = _arrays(job)
    except ValueError:
        return False
    target = path_of(folder, paths)
    part = target.with_suffix(f".{os.getpid()}.part")
    try:
        with open(part, "wb") as out:
            out.write(_packed(arrays))
        part.replace(target)
    except OSError:
        part.unlink(missing_ok=True)
        return False
    return True


def load(folder: str, paths: Sequence[str], keep: bool = False) -> Job | None:
    """The Job `save` kept for `paths` under `folder`, the file removed (the second pass
    reads each once) unless `keep` (the reference rank's plan reads it before); None
    when there is none to read."""
    target = path_of(folder, paths)
    try:
        with open(target, "rb") as stored:
            arrays = _unpacked(bytearray(stored.read()))
        job = _job(arrays)
    except (OSError, ValueError, KeyError, TypeError, IndexError):  # not one `save` wrote
        return None
    if not keep:
        target.unlink(missing_ok=True)
    from planner.job.summaries import plain_text

    return plain_text(job)


_MAGIC = b"planner.rank/1\n"


def _packed(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The file of `arrays` (1-D, plain dtypes): magic, the header's length (8 bytes),
    the header (JSON: name, dtype, length, offset of each), then the arrays' bytes, each
    at an offset that is a multiple of 8 (aligned views on load)."""
    layout, parts, offset = [], [], 0
    for name, array in arrays.items():
        data = np.ascontiguousarray(array).tobytes()
        layout.append([name, array.dtype.str, len(array), offset])
        pad = -len(data) % 8
        parts.append(data + b"\0" * pad)
        offset += len(data) + pad
    header = json.dumps(layout).encode()
    header += b" " * (-(len(_MAGIC) + 8 + len(header)) % 8)
    return b"".join([_MAGIC, len(header).to_bytes(8, "little"), header, *parts])


def _unpacked(data: bytearray) -> dict[str, np.ndarray]:
    """The arrays of `_packed` (views of `data`, writable); ValueError for a file that
    is not one."""
    if not data.startswith(_MAGIC):
        raise ValueError("not a kept rank")
    start = len(_MAGIC) + 8
    size = int.from_bytes(data[len(_MAGIC) : start], "little")
    try:
        layout = json.loads(data[start : start + size])
        base = start + size
        out = {}
        for name, dtype, count, offset in layout:
            kind = np.dtype(dtype)
            if kind.hasobject:
                raise ValueError("an object column")
            out[name] = np.frombuffer(data, dtype=kind, count=count, offset=base + offset)
    except (TypeError, KeyError) as err:
        raise ValueError(f"a damaged kept rank: {err}") from None
    return out


def _arrays(job: Job) -> dict[str, np.ndarray]:
    """The numpy arrays of one-rank `job`; ValueError when it would not round-trip."""
    (rank,) = job.ranks
    graph = job.graphs[rank]
    ops = list(graph.ops.values())
    header = {
        "framework": job.framework,
        "rank": rank,
        "sources": list(job.sources),
        "notes": list(job.notes),
        "meta": _tagged(job.meta),
        "table": _kinds(job.trace.table),
        "span_table": _kinds(job.trace.span_table),
        "param_none": [op.param is None for op in ops],
    }
    if _untagged(header["meta"]) != job.meta:
        raise ValueError("meta does not round-trip")
    arrays = {"header": _text([json.dumps(header)])}
    for field in _OP_TEXT:
        arrays[f"op.{field}"] = _text([getattr(op, field) for op in ops])
    arrays["op.param"] = _text(["" if op.param is None else op.param for op in ops])
    arrays["op.nbytes"] = np.array([op.nbytes for op in ops], dtype=np.int64)
    if any(type(op.nbytes) is not int for op in ops):
        raise ValueError("an op's bytes are not an int")
    arrays.update(src=graph.src, dst=graph.dst, control=graph.control)
    for prefix, table in (("table", job.trace.table), ("span_table", job.trace.span_table)):
        for name, column in table.items():
            if column.dtype == object:
                names, codes = _coded(job.trace, prefix, name)
                arrays[f"{prefix}.{name}"] = _text(names)
                arrays[f"{prefix}.{name}.codes"] = codes
            else:
                arrays[f"{prefix}.{name}"] = column
    if any(a.ndim != 1 or a.dtype.hasobject for a in arrays.values()):
        raise ValueError("a column that is not a plain 1-D array")
    return arrays


def _coded(trace: Trace, table: str, column: str) -> tuple[list[str], np.ndarray]:
    """(the distinct strings of a text `column` of the trace's `table`, each row's index
    into them: `Trace.codes_of`, numbered once); ValueError when a value is not a str."""
    values = getattr(trace, table)[column]
    if set(map(type, values.tolist())) - {str}:
        raise ValueError("not text")
    return trace.codes_of(column) if table == "table" else text_codes(values)


def _job(arrays: Mapping[str, np.ndarray]) -> Job:
    """The Job of `_arrays`."""
    (header,) = _strings(arrays["header"])
    header = json.loads(header)
    text = {field: _strings(arrays[f"op.{field}"]) for field in (*_OP_TEXT, "param")}
    nbytes = arrays["op.nbytes"].tolist()
    params = [
        None if none else p for none, p in zip(header["param_none"], text["param"], strict=True)
    ]
    ops = {
        name: Op(name, kind, res, param, b, ph, t)
        for name, kind, res, param, b, ph, t in zip(
            text["name"],
            text["kind"],
            text["resource"],
            params,
            nbytes,
            text["phase"],
            text["type"],
            strict=True,
        )  # fmt: skip
    }
    graph = OpGraph(ops=ops, src=arrays["src"], dst=arrays["dst"], control=arrays["control"])
    tables = {}
    for prefix in ("table", "span_table"):
        tables[prefix] = {
            name: _object(arrays[f"{prefix}.{name}"])[arrays[f"{prefix}.{name}.codes"]]
            if kind == "text"
            else arrays[f"{prefix}.{name}"]
            for name, kind in header[prefix]
        }
    return Job(
        framework=header["framework"],
        graphs={header["rank"]: graph},
        trace=Trace(table=tables["table"], span_table=tables["span_table"]),
        sources=tuple(header["sources"]),
        notes=tuple(header["notes"]),
        meta=_untagged(header["meta"]),
    )


def _kinds(table: Mapping[str, np.ndarray]) -> list[list[str]]:
    """(column, "text" or "array") of a column table, in its order."""
    return [[name, "text" if column.dtype == object else "array"] for name, column in table.items()]


def _text(values: Any) -> np.ndarray:
    """Strings as one UTF-8 byte array, NUL between them; ValueError for a non-str or a
    string holding NUL."""
    values = list(values)
    if set(map(type, values)) - {str}:
        raise ValueError("not text")
    joined = _SEP.join(values)
    if joined.count(_SEP) != max(len(values) - 1, 0):
        raise ValueError("text holds NUL")
    count = np.array([len(values)], dtype=np.int64).view(np.uint8)
    return np.concatenate([count, np.frombuffer(joined.encode(), dtype=np.uint8)])


def _strings(array: np.ndarray) -> list[str]:
    """The strings of `_text`."""
    count = int(array[:8].view(np.int64)[0])
    return array[8:].tobytes().decode().split(_SEP) if count else []


def _object(array: np.ndarray) -> np.ndarray:
    """An object array of the strings of `_text` (as the ingest's text columns)."""
    strings = _strings(array)
    out = np.empty(len(strings), dtype=object)
    out[:] = strings
    return out


def _tagged(value: Any) -> Any:
    """`value` as plain JSON, its tuples and integer-keyed dicts tagged; ValueError for
    anything else JSON cannot hold."""
    if value is None or type(value) in _SCALARS:
        return value
    if type(value) is list:
        kinds = set(map(type, value))
        if not kinds - _SCALARS:  # (speed) a list of scalars is as it is
            return value
        if kinds == {tuple} and not set(map(type, chain.from_iterable(value))) - _SCALARS:
            return {_TUPLES: [list(v) for v in value]}  # (speed) one tag, not one a tuple
        return [_tagged(v) for v in value]
    if type(value) is tuple:
        return {_TUPLE: [_tagged(v) for v in value]}
    if (
        type(value) is dict
        and not set(map(type, value.values())) - _SCALARS
        and not set(map(type, value)) - {str}
        and _INT_KEYS not in value
        and _TUPLE not in value
        and _TUPLES not in value
    ):
        return value  # (speed) a flat dict of text keys is as it is
    if isinstance(value, Mapping):
        keys = list(value)
        if all(type(k) is str for k in keys) and not {_INT_KEYS, _TUPLE, _TUPLES} & set(keys):
            return {k: _tagged(v) for k, v in value.items()}
        if all(type(k) is int for k in keys):
            return {_INT_KEYS: [[k, _tagged(v)] for k, v in value.items()]}
    raise ValueError(f"{type(value).__name__} does not round-trip through JSON")


def _untagged(value: Any) -> Any:
    """The value of `_tagged`."""
    if type(value) is list:
        if not set(map(type, value)) - _SCALARS:
            return value
        return [_untagged(v) for v in value]
    if type(value) is dict:
        if len(value) == 1 and _TUPLES in value:
            return [tuple(v) for v in value[_TUPLES]]
        if not set(map(type, value.values())) - _SCALARS:
            return value
        if _INT_KEYS in value and len(value) == 1:
            return {k: _untagged(v) for k, v in value[_INT_KEYS]}
        if _TUPLE in value and len(value) == 1:
            return tuple(_untagged(v) for v in value[_TUPLE])
        return {k: _untagged(v) for k, v in value.items()}
    return value
