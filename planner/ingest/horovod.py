"""Horovod timelines (``HOROVOD_TIMELINE=file.json``): each tensor's negotiation and transfer.

Horovod's coordinator (rank 0) writes one chrome trace for the whole job, a JSON array
it never closes (read by `files.loads_unterminated`). Its layout (Horovod's
``timeline.cc``, and the 4-rank MPI timeline of the shared test traces):

- one chrome-trace *process* per tensor: ``pid`` numbers the tensor, an ``M`` event
  ``process_name`` names it (``tower_0/v0/HorovodAllreduce_..._0``); there is no
  ``tid``, and no process per rank;
- per tensor and collective, ``B``/``E`` pairs in order: ``NEGOTIATE_ALLREDUCE``
  (``NEGOTIATE_BROADCAST``, ...) holding one ``X`` event of no duration per rank, named
  by the rank ("0".."3"), when that rank's request reached the coordinator (its tick);
  then ``ALLREDUCE`` (``BROADCAST``, ...) holding the activities of the transfer:
  ``MPI_ALLREDUCE`` / ``NCCL_ALLREDUCE`` (the wire), ``MEMCPY_IN_FUSION_BUFFER`` /
  ``MEMCPY_OUT_FUSION_BUFFER`` (a fused tensor's copies), ``INIT_FUSION_BUFFER``; the
  ``E`` of ``ALLREDUCE`` carries ``args`` ``{dtype, shape}``;
- ``CYCLE_START`` instant events (``ph`` ``i``) mark the coordinator's cycles;
- times in µs of the coordinator's clock, one clock for every rank.

The data model: every rank seen in a tick is a rank (``rank0``..); each all-reduced
tensor is one ``collective`` op on ``net`` of each rank (``param`` the tensor,
``nbytes`` from dtype and shape); iterations come from the per-tensor repetition (each
tensor is all-reduced once per iteration: its k-th all-reduce is iteration k). A rank's
row of an all-reduce is its ``wait`` (from its tick to the last rank's, Horovod's
negotiation) followed by the transfer (the ``ALLREDUCE`` span, the same on every
rank): it starts ``wait`` before the transfer, so `waits.split_waits` finds the same
split; the coordinator's response between the last tick and the transfer is no rank's
span. An iteration spans from a rank's first row of it to its first row of the next
(the last: to its last end): the compute between is in the step, untimed.
Tensors whose backend spans (``MPI_ALLREDUCE`` / ``NCCL_ALLREDUCE``) overlap went in
one fused all-reduce (Horovod runs one response at a time). Broadcasts and other
collectives are counted, not modelled (they run once, before training). What
`planner inspect` shows of it is ``meta["horovod"]`` (`horovod_summary`).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest.files import MAX_NBYTES, MAX_TIME_NS
from planner.ingest.sniffers import HOROVOD_ACTIVITIES, is_horovod_events  # noqa: F401
from planner.model.graph import Op, build_graph
from planner.model.trace import SPAN_COLUMNS, TIMING_COLUMNS, Job, Trace

WIRE = ("MPI_ALLREDUCE", "NCCL_ALLREDUCE", "GLOO_ALLREDUCE", "CCL_ALLREDUCE", "DDL_ALLREDUCE")
"""The activities inside ``ALLREDUCE`` that are the transfer on the wire."""

DTYPE_BYTES = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
    "int16": 2, "uint16": 2, "int32": 4, "int64": 8, "bool": 1,
}  # fmt: skip
_RANK = re.compile(r"^\d+$")


@dataclass
class _Reduce:
    """One all-reduce of one tensor: its negotiation, its ticks and its transfer (µs)."""

    tensor: str
    negotiate: tuple[int, int] | None
    ticks: dict[int, int]
    start: int
    end: int
    nbytes: int = 0
    dtype: str = ""
    shape: str = ""
    wire: list[tuple[int, int]] = field(default_factory=list)
    copies: Counter[str] = field(default_factory=Counter)


@dataclass
class _Events:
    """The timeline's events grouped: all-reduces in file order, other collectives."""

    reduces: list[_Reduce] = field(default_factory=list)
    others: Counter[str] = field(default_factory=Counter)
    other_time: Counter[str] = field(default_factory=Counter)
    cycles: int = 0
    cycle_ts: list[int] = field(default_factory=list)


def _number(value: Any, path: Path, index: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InputError(path, f"event {index}: {what} {value!r} is not a number")
    if not 0 <= value * 1000 < MAX_TIME_NS:
        raise InputError(path, f"event {index}: {what} {value!r} out of range")
    return int(round(value))


def _events(document: Any, path: Path) -> list[Any]:
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise InputError(path, "a Horovod timeline is a JSON array of events")
    return events


def _size(args: Mapping[str, Any]) -> int:
    """Bytes of a tensor from its ``dtype`` and ``shape`` args (0 when unknown)."""
    width = DTYPE_BYTES.get(str(args.get("dtype", "")))
    dims = re.findall(r"\d+", str(args.get("shape", "")))
    if width is None or "shape" not in args:
        return 0
    return width * int(np.prod([int(d) for d in dims], dtype=object)) if dims else width


def _read(events: list[Any], path: Path) -> _Events:
    """Walk the events: per tensor (pid) a stack of open ``B`` activities."""
    names: dict[Any, str] = {}
    open_: dict[Any, list[tuple[str, int]]] = defaultdict(list)
    ticks: dict[Any, dict[int, int]] = defaultdict(dict)
    negotiated: dict[Any, tuple[int, int]] = {}
    current: dict[Any, _Reduce] = {}
    out = _Events()
    for index, e in enumerate(events):
        if not isinstance(e, dict):
            raise InputError(path, f"event {index} is not an object")
        ph, pid, name = e.get("ph"), e.get("pid"), e.get("name")
        if ph == "M" and name == "process_name" and isinstance(e.get("args"), dict):
            names[pid] = str(e["args"].get("name", pid))
        elif ph == "i" and name == "CYCLE_START":
            out.cycles += 1
            out.cycle_ts.append(_number(e.get("ts"), path, index, "ts"))
        elif ph == "X" and isinstance(name, str) and _RANK.match(name):
            ticks[pid][int(name)] = _number(e.get("ts"), path, index, "ts")
        elif ph == "B":
            ts = _number(e.get("ts"), path, index, "ts")
            stack = open_[pid]
            if not stack and name == "ALLREDUCE":
                tensor = names.get(pid, f"tensor{pid}")
                current[pid] = _Reduce(tensor, negotiated.pop(pid, None),
                                       ticks.pop(pid, {}), ts, ts)  # fmt: skip
            elif not stack and str(name).startswith("NEGOTIATE_"):
                ticks.pop(pid, None)
            stack.append((str(name), ts))
        elif ph == "E":
            ts = _number(e.get("ts"), path, index, "ts")
            if not open_[pid]:
                raise InputError(path, f"event {index}: an 'E' with no open 'B' (pid {pid!r})")
            name, begin = open_[pid].pop()
            _close(out, current, negotiated, pid, (name, begin, ts), e.get("args"), open_[pid])
    return out


def _close(
    out: _Events,
    current: dict[Any, _Reduce],
    negotiated: dict[Any, tuple[int, int]],
    pid: Any,
    span: tuple[str, int, int],
    args: Any,
    stack: list[tuple[str, int]],
) -> None:
    """File the activity `span` (name, begin, end) that an ``E`` just closed."""
    name, begin, end = span
    reduce = current.get(pid)
    if name == "NEGOTIATE_ALLREDUCE" and not stack:
        negotiated[pid] = (begin, end)
    elif name == "ALLREDUCE" and not stack and reduce is not None:
        reduce.end = end
        if isinstance(args, dict):
            reduce.nbytes = min(_size(args), MAX_NBYTES)
            reduce.dtype, reduce.shape = str(args.get("dtype", "")), str(args.get("shape", ""))
        out.reduces.append(current.pop(pid))
    elif reduce is not None and stack:
        if name in WIRE:
            reduce.wire.append((begin, end))
        reduce.copies[name] += end - begin
    elif not stack and not name.startswith("NEGOTIATE_"):
        out.others[name] += 1
        out.other_time[name] += end - begin


def _fused(reduces: list[_Reduce]) -> list[list[int]]:
    """Groups of all-reduces (indices) whose wire spans overlap: one fused all-reduce each
    (a reduce without a wire activity is its own ``ALLREDUCE`` span)."""
    spans = [
        (min(b for b, _ in r.wire), max(e for _, e in r.wire)) if r.wire else (r.start, r.end)
        for r in reduces
    ]
    groups: list[list[int]] = []
    last_end = None
    for i in sorted(range(len(spans)), key=lambda i: spans[i]):
        if last_end is not None and spans[i][0] < last_end:
            groups[-1].append(i)
            last_end = max(last_end, spans[i][1])
        else:
            groups.append([i])
            last_end = spans[i][1]
    return groups


def load_horovod(path: Path, document: Any) -> Job:
    """The Job of one Horovod timeline (see the module docstring)."""
    found = _read(_events(document, path), path)
    if not found.reduces:
        raise InputError(path, "Horovod timeline has no complete ALLREDUCE")
    ranks = sorted({r for x in found.reduces for r in x.ticks}) or [0]
    seen: Counter[str] = Counter()
    iteration = []
    for x in found.reduces:
        iteration.append(seen[x.tensor])
        seen[x.tensor] += 1
    tensors = list(dict.fromkeys(x.tensor for x in found.reduces))
    nbytes = {t: max(x.nbytes for x in found.reduces if x.tensor == t) for t in tensors}
    ops = [Op(t, "collective", "net", t, nbytes[t], "backward", "ALLREDUCE") for t in tensors]
    graphs = {f"rank{r}": build_graph(ops, []) for r in ranks}
    table, spans = _tables(found.reduces, iteration, ranks)
    notes = _notes(found, seen)
    trace = Trace(table=table, span_table=spans)
    meta = {
        "horovod": horovod_summary(found, iteration, ranks, path),
        "clock_alignment": {
            "method": "one clock: the Horovod coordinator's timeline",
            "reference": f"rank{ranks[0]}",
            "offsets": {f"rank{r}": 0.0 for r in ranks},
            "occurrences": len(found.reduces),
            "residual_median": 0.0,
            "residual_max": 0.0,
        },
        "horovod_allreduces": allreduce_records(found, iteration),
    }
    return Job("horovod", graphs, trace, (str(path),), tuple(notes), meta)


def allreduce_records(found: _Events, iteration: list[int]) -> dict[str, Any]:
    """Each all-reduce as the fusion what-if replays it (`planner.planning.horovod_fusion`),
    ns of the coordinator's clock: its tensor, iteration, bytes, when the first and the last
    rank asked for it (the last: when it was ready everywhere), its ``ALLREDUCE`` span and
    its fused all-reduce (`_fused`); and the median time between ``CYCLE_START`` marks (the
    background loop's period, None without two marks)."""
    reduces = found.reduces
    fused = np.zeros(len(reduces), dtype=np.int64)
    for k, group in enumerate(_fused(reduces)):
        fused[group] = k
    ready = [(min(x.ticks.values()), max(x.ticks.values())) if x.ticks else (x.start, x.start)
             for x in reduces]  # fmt: skip
    gaps = np.diff(np.sort(np.array(found.cycle_ts, dtype=np.int64)))
    return {
        "tensor": [x.tensor for x in reduces],
        "iteration": list(iteration),
        "nbytes": [x.nbytes for x in reduces],
        "ready_first": [first * 1000 for first, _ in ready],
        "ready_last": [last * 1000 for _, last in ready],
        "start": [x.start * 1000 for x in reduces],
        "end": [x.end * 1000 for x in reduces],
        "fused": fused.tolist(),
        "cycle_period": int(np.median(gaps)) * 1000 if len(gaps) else None,
    }


def _tables(
    reduces: list[_Reduce], iteration: list[int], ranks: list[int]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The timings (with ``wait``) and spans tables, ns, one row per rank and all-reduce."""
    rows: dict[str, list[Any]] = {k: [] for k in (*TIMING_COLUMNS, "wait")}
    for r in ranks:
        for x, k in zip(reduces, iteration, strict=True):
            last = max(x.ticks.values(), default=0)
            wait = last - x.ticks[r] if r in x.ticks else 0
            start = x.start - wait
            for key, value in zip(
                (*TIMING_COLUMNS, "wait"),
                (f"rank{r}", k, x.tensor, start * 1000, (x.end - start) * 1000, wait * 1000),
                strict=True,
            ):
                rows[key].append(value)
    table = {
        k: np.array(v, dtype=object if k in ("rank", "op") else np.int64) for k, v in rows.items()
    }
    spans: dict[str, list[Any]] = {k: [] for k in SPAN_COLUMNS}
    for rank in (f"rank{r}" for r in ranks):
        mine = table["rank"] == rank
        its, starts = table["iteration"][mine], table["start"][mine]
        ends = starts + table["duration"][mine]
        first = {int(k): int(starts[its == k].min()) for k in np.unique(its)}
        for k in sorted(first):
            end = first.get(k + 1, int(ends[its == k].max()))
            for key, value in zip(SPAN_COLUMNS, (rank, k, first[k], end), strict=True):
                spans[key].append(value)
    span_table = {
        k: np.array(v, dtype=object if k == "rank" else np.int64) for k, v in spans.items()
    }
    return table, span_table


def _notes(found: _Events, seen: Counter[str]) -> list[str]:
    notes = []
    counts = sorted(set(seen.values()))
    if len(counts) > 1:
        short = [t for t, c in seen.items() if c < counts[-1]]
        notes.append(
            f"Horovod: {len(short)} tensor(s) all-reduced fewer times than the others "
            f"({counts[0]} vs {counts[-1]}): the last iterations are partial (a cut timeline?)"
        )
    if found.others:
        listed = ", ".join(f"{n} x{c}" for n, c in sorted(found.others.items()))
        notes.append(f"Horovod: other collectives counted, not modelled: {listed}")
    return notes


def horovod_summary(
    found: _Events, iteration: list[int], ranks: list[int], path: Path
) -> dict[str, Any]:
    """What the timeline holds, in seconds: per tensor its all-reduces, negotiation
    (``NEGOTIATE_ALLREDUCE`` spans), wait (first to last rank's tick) and transfer
    (``ALLREDUCE`` spans); the fused groups; wait vs transfer per iteration."""
    reduces = found.reduces
    per: dict[str, dict[str, Any]] = {}
    for x in reduces:
        entry = per.setdefault(
            x.tensor,
            {"tensor": x.tensor, "dtype": x.dtype, "shape": x.shape, "nbytes": x.nbytes,
             "allreduces": 0, "negotiate": 0, "wait": 0, "transfer": 0, "wire": 0,
             "memcpy_in": 0, "memcpy_out": 0},
        )  # fmt: skip
        entry["allreduces"] += 1
        entry["negotiate"] += x.negotiate[1] - x.negotiate[0] if x.negotiate else 0
        entry["wait"] += _spread(x.ticks)
        entry["transfer"] += x.end - x.start
        entry["wire"] += sum(e - b for b, e in x.wire)
        entry["memcpy_in"] += x.copies["MEMCPY_IN_FUSION_BUFFER"]
        entry["memcpy_out"] += x.copies["MEMCPY_OUT_FUSION_BUFFER"]
    timed = ("negotiate", "wait", "transfer", "wire", "memcpy_in", "memcpy_out")
    tensors = [{k: (v / 1e6 if k in timed else v) for k, v in e.items()} for e in per.values()]
    return {
        "source": str(path),
        "ranks": len(ranks),
        "iterations": len(set(iteration)),
        "cycles": found.cycles,
        "wire": sorted({n for x in reduces for n in x.copies if n in WIRE}),
        "tensors": tensors,
        "bytes_per_iteration": sum(e["nbytes"] for e in per.values()),
        "fused": _fused_summary(reduces),
        "other_collectives": dict(sorted(found.others.items())),
        "steps": _step_summary(reduces, iteration),
    }


def _spread(ticks: Mapping[int, int]) -> int:
    return max(ticks.values()) - min(ticks.values()) if ticks else 0


def _fused_summary(reduces: list[_Reduce]) -> dict[str, Any]:
    """The fused all-reduces: how many, and per set of tensors fused together how often,
    bytes per fused all-reduce, and its wire time in all."""
    groups = [g for g in _fused(reduces) if len(g) > 1]
    sets: dict[tuple[str, ...], dict[str, Any]] = {}
    for g in groups:
        key = tuple(sorted(reduces[i].tensor for i in g))
        entry = sets.setdefault(key, {"tensors": list(key), "count": 0, "nbytes": 0, "time": 0})
        entry["count"] += 1
        entry["nbytes"] = max(entry["nbytes"], sum(reduces[i].nbytes for i in g))
        wires = [w for i in g for w in reduces[i].wire] or [(reduces[g[0]].start, 0)]
        entry["time"] += max(e for _, e in wires) - min(b for b, _ in wires)
    listed = [{**e, "time": e["time"] / 1e6} for e in sets.values()]
    return {"allreduces": len(groups), "groups": sorted(listed, key=lambda e: -e["count"])}


def _step_summary(reduces: list[_Reduce], iteration: list[int]) -> list[dict[str, Any]]:
    """Per iteration (seconds): the negotiation wait (over its tensors, first to last
    rank's tick: their sum, and the time they cover), the transfer (``ALLREDUCE`` spans:
    their sum, and the time they cover, a fused all-reduce once) and its span from the
    first tick to the last transfer's end."""
    by: dict[int, list[_Reduce]] = defaultdict(list)
    for x, k in zip(reduces, iteration, strict=True):
        by[k].append(x)
    steps = []
    for k in sorted(by):
        xs = by[k]
        waits = [(min(x.ticks.values()), max(x.ticks.values())) for x in xs if x.ticks]
        first = min([x.start for x in xs] + [b for b, _ in waits])
        steps.append(
            {
                "iteration": k,
                "tensors": len(xs),
                "wait": sum(e - b for b, e in waits) / 1e6,
                "wait_covered": _covered(waits) / 1e6,
                "transfer": sum(x.end - x.start for x in xs) / 1e6,
                "transfer_covered": _covered([(x.start, x.end) for x in xs]) / 1e6,
                "span": (max(x.end for x in xs) - first) / 1e6,
            }
        )
    return steps


def _covered(spans: list[tuple[int, int]]) -> int:
    """The time the union of `spans` (begin, end) covers."""
    covered, reach = 0, None
    for b, e in sorted(spans):
        covered += max(0, e - (b if reach is None else max(b, reach)))
        reach = e if reach is None else max(reach, e)
    return covered
