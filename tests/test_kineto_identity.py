"""Op identity across steps (`planner.ingest.kineto_identity`) and the steps it stops
calling partial, on HTA's ``trace_diff`` traces and on generated sequences."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.ingest import detect
from planner.ingest import kineto_ops as kineto
from planner.ingest.kineto_identity import Aligned, aligned_occurrence, op_suffixes
from planner.ingest.kineto_steps import cumcount
from planner.model import records
from planner.prediction import replay as sim
from tests.conftest import SHARED, need

HTA = SHARED / "public/HolisticTraceAnalysis/tests/data"
CONTROL = HTA / "trace_diff/control/control.json.gz"
TEST = HTA / "trace_diff/test/test.json.gz"


def _names(steps: list[list[int]], alphabet: list[str]) -> list[list[str]]:
    """Each step's op names (``<name><suffix>``) on one lane, as the ingest forms them."""
    step = np.concatenate([np.full(len(s), i) for i, s in enumerate(steps)]).astype(np.int64)
    name = np.concatenate([np.array(s, dtype=np.int64) for s in steps])
    aligned = aligned_occurrence(step, np.zeros(len(step), dtype=np.int64), name)
    out: list[list[str]] = [[] for _ in steps]
    for i, suffix in enumerate(op_suffixes(aligned, alphabet)):
        out[int(step[i])].append(alphabet[int(name[i])] + suffix)
    return out


def test_a_call_one_step_adds_keeps_the_names_after_it():
    """Counted, the extra ``B`` of step 3 would take ``B#1`` and push the next ``B`` to
    ``B#2``, the same name as no call of the other steps; aligned, it is named by the
    op it follows and every other call keeps its name. A step lacking a call keeps the
    names of the rest."""
    ab = ["A", "B", "C"]
    ref = [0, 1, 2, 1, 0]
    steps = _names([ref, ref, [0, 1, 1, 2, 1, 0], [0, 2, 1, 0]], ab)
    assert steps[0] == steps[1] == ["A#0", "B#0", "C#0", "B#1", "A#1"]
    assert steps[2] == ["A#0", "B#0", "B@B#0", "C#0", "B#1", "A#1"]
    assert steps[3] == ["A#0", "C#0", "B#1", "A#1"]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=30),
    st.lists(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3), st.booleans()),
                      max_size=4), min_size=1, max_size=4),
)  # fmt: skip
def test_aligned_names_are_unique_and_keep_the_reference_order(ref, edits):
    """Steps made from one reference sequence by inserting and deleting calls: in every
    step each name stands for one call, a step equal to the reference is numbered by
    counting, and the calls paired with the reference (``#k`` names) keep its order."""
    ab = ["A", "B", "C", "D"]
    steps = [list(ref) for _ in range(len(edits) + 1)]  # the most common sequence: the reference
    for change in edits:
        seq = list(ref)
        for at, name, insert in change:
            if insert:
                seq.insert(at % (len(seq) + 1), name)
            elif seq:
                del seq[at % len(seq)]
        steps.append(seq)
    named = _names(steps, ab)
    counted = _names([ref], ab)[0]
    assert named[0] == counted
    position = {n: i for i, n in enumerate(counted)}
    for names in named:
        assert len(set(names)) == len(names)
        paired = [position[n] for n in names if "@" not in n]
        assert paired == sorted(paired)


def _outer_counts(path, name: str) -> list[int]:
    """Per ProfilerStep, the outermost records of `name` on the step's thread, counted
    from the raw JSON as the ingest nests them (sorted by start then longest first; a
    record starting at or after the enclosing one's end is outermost)."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    tid = steps[0]["tid"]
    cpu = sorted(
        (e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime") and e["tid"] == tid),
        key=lambda e: (e["ts"], -e["dur"]),
    )
    outer, reach = [], -1
    for e in cpu:
        if e["ts"] >= reach:
            outer.append(e)
        reach = max(reach, e["ts"] + e["dur"])
    return [
        sum(1 for e in outer if s["ts"] <= e["ts"] < s["ts"] + s["dur"] and e["name"] == name)
        for s in steps
    ]


def _counted(step, lane, name) -> Aligned:
    """The identity before alignment: the occurrence count in the step."""
    k = cumcount(step, lane, name)
    none = np.zeros(len(k), dtype=np.int64)
    return Aligned(k, none, none - 1, none)


def test_trace_diff_steps_are_whole_once_calls_are_aligned(monkeypatch):
    """HTA ``trace_diff/control`` (integer microseconds): a zero-length child that starts
    in its parent's last microsecond reads as nested in some steps and as its sibling in
    others, so the outermost ``aten::resolve_conj`` runs 5-7 times a step (raw JSON).
    Counted, ``#4`` named different calls in different steps, and 60 of the DAG's
    edges ran against the trace in some step (``aten::sum#11 -> aten::resolve_conj#4``:
    that ``#4`` started 43 ms before). Aligned, 3 do, no step is partial, and each
    ``aten::zero_`` that came out of its ``aten::zeros`` is named after it and starts
    the microsecond that ``aten::zeros`` ends (the ingest's rows)."""
    path = need(CONTROL)
    counts = _outer_counts(path, "aten::resolve_conj")
    assert min(counts) == 5 and max(counts) == 7
    job = detect.load([path])
    (rank,) = job.ranks
    rows = job.trace.of(rank)
    assert records.partial_steps(rows, job.graphs[rank].ops) == {}
    replayed = sim.replay(job)["ranks"][0]["steps"]
    assert len(replayed) == 6 and not any(s.get("partial") for s in replayed)
    extra = [o for o in job.graphs[rank].ops if o.startswith("main/aten::zero_@aten::zeros#")]
    assert extra
    by_step = {it: dict(zip(g["op"], zip(g["start"], g["duration"], strict=True), strict=True))
               for it, g in rows.groupby("iteration")}  # fmt: skip
    checked = 0
    for ops in by_step.values():
        for op in extra:
            if op in ops:
                parent = ops["main/" + op.split("@", 1)[1]]
                assert ops[op][0] // 1000 == (parent[0] + parent[1]) // 1000
                checked += 1
    assert checked >= 6
    assert _contradicted(job) <= 3
    monkeypatch.setattr(kineto, "aligned_occurrence", _counted)
    assert _contradicted(detect.load([path])) >= 50


def _contradicted(job) -> int:
    """How many of the DAG's edges u -> v some step runs against: v started before u."""
    (rank,) = job.ranks
    graph = job.graphs[rank]
    names = list(graph.ops)
    bad = set()
    for _, group in job.trace.of(rank).groupby("iteration"):
        start = dict(zip(group["op"], group["start"], strict=True))
        for u, v in zip(graph.src.tolist(), graph.dst.tolist(), strict=True):
            a, b = names[u], names[v]
            if a in start and b in start and start[b] < start[a]:
                bad.add((a, b))
    return len(bad)


@pytest.mark.parametrize("path", [CONTROL, TEST], ids=["control", "test"])
def test_a_step_missing_only_calls_of_no_time_is_not_partial(path):
    """The calls a ``trace_diff`` step lacks (an ``aten::zero_`` nested this time, a
    polling thread's ``cudaPointerGetAttributes``) took at most 15 us in the other
    steps of a 76-124 ms step: below `MISSING_SHARE` of the step's op time they cannot
    move its figures, and the step is kept. Counted with no share, they are missing."""
    job = detect.load([need(path)])
    (rank,) = job.ranks
    rows = job.trace.of(rank)
    ops = job.graphs[rank].ops
    assert records.partial_steps(rows, ops) == {}
    share = records.MISSING_SHARE
    try:
        records.MISSING_SHARE = 0.0
        missing = records.partial_steps(rows, ops)
    finally:
        records.MISSING_SHARE = share
    assert missing
    typical = rows.groupby("op")["duration"].median()
    for step, gone in missing.items():
        assert sum(typical[o] for o in gone) < 20_000  # ns
        assert Counter(rows["iteration"])[step] > 1000
