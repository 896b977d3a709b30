"""Kineto events the readers must refuse (one InputError line), and look-alikes they accept.

Each broken document is read by both readers: the streaming one must not accept it
(it falls back to the whole-document reader, which words the error), and both must
give the same problem, naming the event by its index in ``traceEvents``.
"""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from planner.errors import InputError
from planner.ingest import execution_trace, files
from planner.ingest import kineto_stream as kineto_events
from planner.ingest.kineto import load_kineto, read_rank, read_rank_generic
from tests.conftest import needs

REPO = Path(__file__).resolve().parents[1]
FUZZ_CRASH = REPO / "bench" / "_data" / "crash-a803f412ded1288c2a6ee5be3d7760eb1c92ce2e"
RESNET = REPO / "traces" / "torch" / "resnet_ddp"

Doc = dict[str, Any]


def _doc() -> Doc:
    """Two steps of one thread, a kernel, and an instant event (which has no 'dur')."""
    step = {"ph": "X", "cat": "user_annotation", "pid": 7, "tid": 7}
    mm = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "args": {}}
    return {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 0, "world_size": 1},
        "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "main"}},
            {**step, "name": "ProfilerStep#1", "ts": 1000, "dur": 100},
            {**mm, "ts": 1010, "dur": 20},
            {**step, "name": "ProfilerStep#2", "ts": 1100, "dur": 100},
            {**mm, "ts": 1110.5, "dur": 20},
            {"ph": "i", "name": "mark", "pid": 7, "tid": 7, "ts": 1150, "s": "t"},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 3, "ts": 1120,
             "dur": 5, "args": {"device": 0, "stream": 3, "correlation": 9}},
        ],
    }  # fmt: skip


def _write(tmp_path: Path, doc: Doc, gz: bool) -> Path:
    text = json.dumps(doc, indent=1).encode()
    path = tmp_path / ("rank0.pt.trace.json.gz" if gz else "rank0.pt.trace.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


def _set(index: int, key: str, value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["traceEvents"][index][key] = value

    return edit


def _set_arg(index: int, key: str, value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        event = doc["traceEvents"][index]
        event["args"] = {**event.get("args", {}), key: value}  # _doc's ops share one args

    return edit


def _set_info(key: str, value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["distributedInfo"][key] = value

    return edit


def _drop(index: int, key: str) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        del doc["traceEvents"][index][key]

    return edit


BROKEN: list[tuple[str, Callable[[Doc], None], str]] = [
    ("no-ts", _drop(2, "ts"), "event 2 (aten::mm) has no 'ts'"),
    ("no-dur", _drop(2, "dur"), "event 2 (aten::mm) has no 'dur'"),
    ("step-no-dur", _drop(3, "dur"), "event 3 (ProfilerStep#2) has no 'dur'"),
    ("ts-null", _set(4, "ts", None), "event 4 (aten::mm) has no 'ts'"),
    ("dur-neg", _set(2, "dur", -5), "event 2 (aten::mm) has a negative duration (-5 us)"),
    ("step-dur-neg", _set(1, "dur", -1), "event 1 (ProfilerStep#1) has a negative duration"),
    ("dur-huge", _set(6, "dur", 1e18), "event 6 (gemm) lasts 1e+18 us, more than a day"),
    ("ts-neg", _set(2, "ts", -1e18), "event 2 (aten::mm) starts at a negative time"),
    ("ts-huge", _set(2, "ts", 1e300), "event 2 (aten::mm) starts at 1e+300 us, out of range"),
    ("end-huge", _set(2, "ts", 4611686018427380), "event 2 (aten::mm) ends at 4.61169e+15"),
    ("no-name", _drop(2, "name"), "malformed event 2: no 'name'"),
    ("name-int", _set(3, "name", 5), "malformed event 3: 'name' is an int, not a string"),
    ("args-str", _set(2, "args", "x"), "event 2 (aten::mm): 'args' is a str, not an object"),
    ("meta-args-str", _set(0, "args", "x"), "event 0 (thread_name): 'args' is a str"),
    ("ts-word", _set(2, "ts", "soon"), "event 2 (aten::mm): 'ts' is not a number ('soon')"),
    ("dur-list", _set(2, "dur", [1]), "event 2 (aten::mm): 'dur' is a list, not a number"),
    ("dur-bool", _set(2, "dur", True), "'dur' is a bool, not a number"),
    ("step-x", _set(1, "name", "ProfilerStep#x"), "event 1 (ProfilerStep#x) is no step marker"),
    ("step-same-number", _set(3, "name", "ProfilerStep#1"), "ProfilerStep#1 appears twice "
     "(events 1 and 3)"),
    ("step-too-big", _set(1, "name", "ProfilerStep#" + "9" * 30), "is no step marker"),
    ("name-newline", lambda d: d["traceEvents"][2].update(name="a\nb", dur=-1),
     "event 2 ('a\\nb') has a negative duration"),
    ("pid-list", _set(2, "pid", [7]), "malformed event 2 (aten::mm): 'pid' is a list"),
    ("meta-tid-dict", _set(0, "tid", {"a": 1}), "malformed event 0 (thread_name): pid/tid"),
    ("correlation-1e30", _set_arg(6, "correlation", 10**30), "malformed event 6 (gemm): "
     "'correlation' is 1000000000000000000000000000000, out of range (-2**62, 2**62)"),
    ("correlation-2p62", _set_arg(6, "correlation", 2**62), "'correlation' is 4611686018427387904"),
    ("record-id-neg-2p63", _set_arg(4, "Record function id", -(2**63) - 1),
     "malformed event 4 (aten::mm): 'Record function id' is -9223372036854775809, out of range"),
    ("rank-2p64", _set_info("rank", 2**64), "distributedInfo.rank 18446744073709551616 is "
     "beyond int64"),
    ("world-size-neg-2p63", _set_info("world_size", -(2**63) - 1),
     "distributedInfo.world_size -9223372036854775809 is beyond int64"),
]  # fmt: skip


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
@pytest.mark.parametrize(("edit", "problem"), [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_broken_event_is_refused_alike_by_both_readers(
    tmp_path: Path, edit: Callable[[Doc], None], problem: str, gz: bool
) -> None:
    doc = _doc()
    edit(doc)
    path = _write(tmp_path, doc, gz)
    cols = kineto_events._Columns()
    # the streaming reader never accepts it
    with pytest.raises((kineto_events._Irregular, InputError)):
        cols.finish(path, kineto_events._stream_columns(path, cols))
    with pytest.raises(InputError) as streamed:
        read_rank(path)
    with pytest.raises(InputError) as whole:
        read_rank_generic(path)
    assert streamed.value.problem == whole.value.problem
    assert problem in whole.value.problem, whole.value.problem
    with pytest.raises(InputError) as loaded:
        load_kineto([path])
    assert str(loaded.value) == f"{path}: {whole.value.problem}"
    assert "\n" not in str(loaded.value)


def test_duplicate_step_marker_is_refused(tmp_path: Path) -> None:
    doc = _doc()
    doc["traceEvents"].append(copy.deepcopy(doc["traceEvents"][3]))
    with pytest.raises(InputError, match=r"ProfilerStep#2 appears twice \(events 3 and 7\)"):
        load_kineto([_write(tmp_path, doc, gz=False)])


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
def test_valid_look_alikes_are_accepted_alike(tmp_path: Path, gz: bool) -> None:
    """Instant events without 'dur', GPU mirrors of the step ranges, a numeric-string time."""
    doc = _doc()
    mirror = {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "pid": 0,
              "ts": 1120, "dur": 5}  # fmt: skip
    doc["traceEvents"] += [{**mirror, "tid": 3}, {**mirror, "tid": 4}]
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "", "pid": 7, "tid": 7,
                               "ts": 1180, "dur": 0})  # fmt: skip
    path = _write(tmp_path, doc, gz)
    cols = kineto_events._Columns()
    streamed = cols.finish(path, kineto_events._stream_columns(path, cols))
    whole = read_rank_generic(path)
    assert streamed.names == whole.names
    assert (streamed.ts == whole.ts).all() and (streamed.end == whole.end).all()
    job = load_kineto([path])
    assert sorted(job.trace.spans["iteration"]) == [1, 2]
    doc["traceEvents"][2]["ts"] = "1010"  # read as a number by the whole-document reader
    job2 = load_kineto([_write(tmp_path, doc, gz)])
    assert job2.trace.timings.equals(job.trace.timings)


def test_a_float_id_is_no_id_and_an_integer_past_int64_is_refused(tmp_path: Path) -> None:
    """A float where an id belongs joins nothing (no id); an integer id past int64 is no
    id a profiler writes: refused in one line naming the event (issue #47)."""
    doc = _doc()
    doc["traceEvents"][6]["args"]["correlation"] = 1e300
    path = _write(tmp_path, doc, gz=False)
    assert read_rank(path).corr.tolist() == [-1, -1, -1, -1, -1]
    doc["traceEvents"][2]["args"]["correlation"] = 2**63 + 5
    path = _write(tmp_path, doc, gz=False)
    with pytest.raises(InputError, match=r"'correlation' is 9223372036854775813, out of range"):
        read_rank(path)


def _with_record(args: dict[str, Any], marked: str = "") -> bytes:
    """`_doc` with an NCCL all-reduce record holding `args` in step 1, as JSON text; the
    string `marked` stands for an integer literal of 5000 digits (no JSON writer makes one)."""
    doc = _doc()
    doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce",
                               "pid": 7, "tid": 7, "ts": 1040, "dur": 5, "args": args})  # fmt: skip
    return json.dumps(doc).replace(f'"{marked}"', "9" * 5000).encode()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"External id": 2**63}, "malformed nccl:all_reduce event: 'External id' is "
         "9223372036854775808, out of range (-2**62, 2**62)"),
        ({"External id": "@N"}, "'External id' is 99999999999999999999...(5000 digits), out"),
        ({"In msg nelems": 1e30}, "'In msg nelems' of a nccl:all_reduce event is 1e+30, out"),
        ({"In msg nelems": -(2**63) - 1}, "is -9223372036854775809, out of range [0, "),
    ],
    ids=["external-id-2p63", "external-id-5000-digits", "nelems-float-1e30", "nelems-neg-2p63"],
)  # fmt: skip
def test_a_records_id_or_size_out_of_range_is_refused(
    tmp_path: Path, args: dict[str, Any], problem: str
) -> None:
    """The External id joining a record to its GPU side and its element count are refused
    in one line where they are used (issue #47): no OverflowError, no join on a bad id."""
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(_with_record(args, "@N"))
    with pytest.raises(InputError) as refused:
        load_kineto([path])
    assert problem in str(refused.value) and str(refused.value).startswith(f"{path}: ")


def test_an_integer_of_5000_digits_where_nothing_reads_it_is_read(tmp_path: Path) -> None:
    """Past Python's 4300-digit limit and every JSON parser's: an unused arg of a kept event
    (a step's External id, a record's Group size) is read as a `LongInt`, not refused."""
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(_with_record({"Group size": "@N", "External id": 3}, "@N"))
    sizes = [a["Group size"] for a in read_rank(path).args.values() if "Group size" in a]
    assert [str(s) for s in sizes] == ["99999999999999999999...(5000 digits)"]
    assert sorted(load_kineto([path]).trace.spans["iteration"]) == [1, 2]


def _crash_doc() -> Doc:
    """The fuzzer's finding, reduced: a step that holds no op (all before or after it)."""
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1009", "pid": 5, "tid": 5}
    return {
        "distributedInfo": {"rank": 1},
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::zeros", "pid": 5, "tid": 5,
             "ts": 1661938466265032, "dur": 25},
            {**step, "ts": 1661938466265087, "dur": 100298},
            {"ph": "X", "cat": "kernel", "name": "fill", "pid": 1, "tid": 7,
             "ts": 1661938466422501, "dur": 207, "args": {"device": 1, "stream": 7}},
        ],
    }  # fmt: skip


def test_fuzz_crash_empty_steps_is_an_input_error(tmp_path: Path) -> None:
    """Was `ValueError: attempt to get argmax of an empty sequence` in reference_step."""
    path = _write(tmp_path, _crash_doc(), gz=False)
    with pytest.raises(InputError, match="no CPU or GPU op falls inside a ProfilerStep#N range"):
        load_kineto([path])


def test_a_file_that_cannot_be_read_is_reported_before_a_rank_that_cannot_be_modelled(
    tmp_path: Path,
) -> None:
    """Ranks are modelled as they are read; a modelling error still waits for every read."""
    empty = tmp_path / "a" / "rank0.json"  # readable, but no op inside a step
    broken = tmp_path / "b" / "rank1.json"
    for path in (empty, broken):
        path.parent.mkdir()
    empty.write_text(json.dumps(_crash_doc()))
    doc = _doc()
    _drop(2, "ts")(doc)
    broken.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="has no 'ts'"):
        load_kineto([empty, broken])
    with pytest.raises(InputError, match="no CPU or GPU op falls inside"):
        load_kineto([empty, _write(tmp_path, _doc(), gz=False)])


@needs(FUZZ_CRASH)
def test_fuzz_crash_file_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no CPU or GPU op falls inside"):
        load_kineto([FUZZ_CRASH])


def test_streaming_reads_the_limit_at_call_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, _doc(), gz=True)
    monkeypatch.delenv("PLANNER_MAX_DECOMPRESSED", raising=False)
    assert b"".join(kineto_events._chunks(path)) == gzip.decompress(path.read_bytes())
    monkeypatch.setattr(files, "max_decompressed", lambda: 64)
    with pytest.raises(InputError, match="(decompresses to more than|over the) 64 bytes"):
        list(kineto_events._chunks(path))  # refused as read: no whole-file fallback reads it again
    monkeypatch.undo()
    monkeypatch.setenv("PLANNER_MAX_DECOMPRESSED", "64")
    with pytest.raises(InputError, match="(decompresses to more than|over the) 64 bytes"):
        list(kineto_events._chunks(path))
    with pytest.raises(InputError, match="(decompresses to more than|over the) 64 bytes"):
        read_rank(path)


def _et(pid: int) -> Doc:
    return {"schema": "1.0.1", "pid": pid, "nodes": [
        {"id": 1, "name": "ProfilerStep#1", "rf_id": 1, "parent": 0, "tid": 7,
         "inputs": [], "input_types": [], "outputs": [], "output_types": []},
    ]}  # fmt: skip


def test_execution_trace_of_another_process_is_refused(tmp_path: Path) -> None:
    ev = read_rank(_write(tmp_path, _doc(), gz=False))
    other = tmp_path / "et_other.json"
    other.write_text(json.dumps(_et(8)))
    with pytest.raises(InputError, match="Execution Trace of process 8 does not belong") as info:
        execution_trace.match_ranks([other], [("rank0", ev)])
    assert info.value.path == str(other)
    same = tmp_path / "et_same.json"
    same.write_text(json.dumps(_et(7)))
    assert execution_trace.match_ranks([same], [("rank0", ev)])["rank0"].path == same


@needs(RESNET)
def test_real_rank_with_the_other_ranks_execution_trace_is_refused() -> None:
    with pytest.raises(InputError, match="does not belong to rank0.json.gz"):
        load_kineto([RESNET / "rank0.json.gz"], [RESNET / "et_rank1.json.gz"])
