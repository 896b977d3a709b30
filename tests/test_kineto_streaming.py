"""The streaming Kineto reader gives exactly the columns of the whole-document reader."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from planner.errors import InputError
from planner.ingest import kineto_stream as kineto_events
from planner.ingest.kineto import RankEvents, load_kineto, read_rank, read_rank_generic

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
RUN = Path(__file__).resolve().parents[1] / "traces" / "torch" / "resnet_ddp"
DLRM = SHARED / "public/param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"
HTA = SHARED / "public" / "HolisticTraceAnalysis" / "tests" / "data"
FILES = [
    RUN / "rank0.json.gz",
    *sorted(DLRM.glob("*.json.gz"))[:1],
    HTA / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    HTA / "call_stack" / "backward_thread.json",
    HTA / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
]
COLUMNS = ("name_code", "cat_code", "ts", "end", "corr", "rf", "lane")


def _same(a: RankEvents, b: RankEvents) -> None:
    assert a.names == b.names and a.cats == b.cats
    for col in COLUMNS:
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col), err_msg=col)
    assert a.args == b.args
    assert a.lane_names == b.lane_names
    assert (a.rank, a.world_size, a.distributed, a.pids) == (
        b.rank,
        b.world_size,
        b.distributed,
        b.pids,
    )


def _streamed(path: Path) -> RankEvents:
    cols = kineto_events._Columns()
    doc = kineto_events._stream_columns(path, cols)  # raises _Irregular if it had to fall back
    return cols.finish(path, doc)


@pytest.mark.parametrize("path", [p for p in FILES if p.is_file()], ids=lambda p: p.name)
@pytest.mark.parametrize("chunk", [1 << 10, 1 << 18])
def test_stream_equals_whole_document(path, chunk, monkeypatch):
    monkeypatch.setattr(kineto_events, "STREAM_CHUNK", chunk)  # tiny pieces: many cuts
    _same(_streamed(path), read_rank_generic(path))


def _write(tmp_path: Path, name: str, doc: object, *, indent: bool) -> Path:
    text = json.dumps(doc, indent=2 if indent else None).encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return path


def _doc() -> dict:
    """A small trace whose events hold the awkward things: `},` in strings and nested args."""
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "thread 2 (x)"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 2,
         "ts": 0, "dur": 1000, "args": {}},
    ]  # fmt: skip
    for i in range(200):
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": "aten::op},{" + str(i % 7), "pid": 1, "tid": 2,
             "ts": 1 + i * 4.125, "dur": 2.5, "args": {"nested": {"a": [1, {"b": 2}]},
             "Record function id": i}}
        )  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 4},
            "traceEvents": events, "traceName": "x]y", "displayTimeUnit": "ms"}  # fmt: skip


@pytest.mark.parametrize("indent", [True, False])
@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_stream_handles_nested_objects_and_separators_in_strings(
    tmp_path, monkeypatch, indent, name
):
    monkeypatch.setattr(kineto_events, "STREAM_CHUNK", 97)
    path = _write(tmp_path, name, _doc(), indent=indent)
    streamed = _streamed(path)
    assert streamed.rank == 3 and len(streamed) == 201
    _same(streamed, read_rank_generic(path))


def test_odd_values_fall_back_to_the_whole_document(tmp_path):
    doc = _doc()
    doc["traceEvents"][5]["ts"] = "17"  # a string: the generic reader's business
    doc["traceEvents"][6]["args"]["correlation"] = 4.0
    path = _write(tmp_path, "t.json", doc, indent=True)
    with pytest.raises(kineto_events._Irregular):
        _streamed(path)
    _same(read_rank(path), read_rank_generic(path))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "du', "invalid JSON"),
        # left unterminated (issue #45): read as closed, so the closed text's fault
        (b'{"traceEvents": [{"ph": "X", "ts": "abc", "dur": 1}, ', "malformed event"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}]} trailing', "invalid JSON"),
        (b'{"traceEvents": [1, 2]}', "not an event"),
        (b'{"traceEvents": [{"ph": "X", "ts": "abc", "dur": 1}]}', "malformed event"),
        (b'{"traceEvents": [{"ph": "i", "ts": 1}]}', "no complete"),
    ],
)
def test_errors_are_those_of_the_whole_document_reader(tmp_path, text, problem):
    path = tmp_path / "bad.json"
    path.write_bytes(text)
    with pytest.raises(InputError) as info:
        read_rank(path)
    assert problem in info.value.problem


def test_truncated_gzip_is_one_input_error(tmp_path):
    raw = (RUN / "rank0.json.gz").read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match="broken gzip"):
        read_rank(path)


def test_collector_state_is_restored():
    import gc

    gc.disable()
    try:
        load_kineto([RUN / "rank0.json.gz"])
        assert not gc.isenabled()
    finally:
        gc.enable()
    load_kineto([RUN / "rank0.json.gz"])
    assert gc.isenabled()
