"""TF2 profiler traces of multi-replica jobs: each replica its own rank lane and steps.

`traces/tf/mwms_cpu2/` is a real `MultiWorkerMirroredStrategy` job of 2 CPU workers on
127.0.0.1, profiled together by `tf.profiler.experimental.client.trace` and converted by
TensorFlow's own tools (the xprof package; its `record.py`). Every figure is counted
here from the raw JSON of the files.
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SHARED, run_cli

from planner.ingest import detect
from planner.ingest.tf_profiler import COLLECTIVE_TYPES, task_name
from tests.test_schemas import validate

MWMS = REPO / "traces" / "tf" / "mwms_cpu2"
FILES = sorted(MWMS.glob("*.trace.json.gz"))
EXTERNAL = SHARED / "public" / "external"
CHESS_TRACE = EXTERNAL / "tf2_profiler_chess_engine" / "aoberai.trace.json.gz"


def _events(path: Path) -> list[dict[str, Any]]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _raw(path: Path) -> dict[str, Any]:
    """What one worker's file says, counted from its events: step markers by group,
    executor ops (``long_name``) by (group, node)."""
    events = _events(path)
    xs = [e for e in events if e.get("ph") == "X" and "group_id" in e.get("args", {})]
    markers = {e["args"]["group_id"]: e for e in xs if "step_num" in e["args"]}
    ops = [e for e in xs if "long_name" in e["args"]]
    return {"markers": markers, "ops": ops}


def _collective(event: dict[str, Any]) -> bool:
    """An executor op event whose type (``long_name`` = ``node:Type``) is a collective."""
    return bool(COLLECTIVE_TYPES.match(event["args"].get("long_name", "").rpartition(":")[2]))


@pytest.fixture(scope="module")
def job():  # noqa: ANN201
    return detect.load([MWMS])


def test_the_recording_is_two_workers_of_one_job() -> None:
    meta = json.loads((MWMS / "meta.json").read_text())
    assert meta["strategy"] == "MultiWorkerMirroredStrategy"
    assert len(FILES) == len(meta["cluster"]["worker"]) == 2
    assert {p.name.removesuffix(".trace.json.gz") for p in FILES} == set(meta["profiler"])


def test_each_worker_is_a_rank_named_by_its_task_address(job) -> None:  # noqa: ANN001
    meta = json.loads((MWMS / "meta.json").read_text())
    expected = {name.replace("_", ":") for name in meta["profiler"]}  # 127.0.0.1_P -> :P
    assert set(job.ranks) == expected
    assert all(r.startswith("127.0.0.1:") for r in job.ranks)  # never "127"
    for rank in job.ranks:
        assert job.meta["ranks"][rank]["task"] == rank
        assert job.meta["ranks"][rank]["device"] == "CPU"


def test_each_worker_has_its_own_steps_as_its_markers_span(job) -> None:  # noqa: ANN001
    spans = job.trace.span_table
    for path in FILES:
        rank = task_name(path)
        markers = _raw(path)["markers"]
        steps = {int(e["args"]["step_num"]): e for e in markers.values()}
        assert job.trace.iterations(rank) == sorted(steps)
        mine = spans["rank"] == rank
        for it, start, end in zip(spans["iteration"][mine], spans["start"][mine],
                                  spans["end"][mine], strict=True):  # fmt: skip
            marker = steps[int(it)]
            dur_ns = float(marker["dur"]) * 1000
            assert abs((end - start) - dur_ns) <= 0.05 * dur_ns
            assert abs(start - float(marker["ts"]) * 1000) < 1000  # same start, ns of µs


def test_collective_reduce_ops_are_transfers_with_their_raw_times(job) -> None:  # noqa: ANN001
    table = job.trace.table
    for path in FILES:
        rank = task_name(path)
        raw = _raw(path)
        collectives = [e for e in raw["ops"] if _collective(e)]
        assert collectives and all("CollectiveReduce" in e["name"] for e in collectives)
        graph = job.graphs[rank]
        nodes = {e["args"]["long_name"].rpartition(":")[0] for e in collectives}
        assert set(graph.transfers) == nodes
        assert all(graph.ops[n].kind == "collective" and graph.ops[n].resource == "net"
                   for n in nodes)  # fmt: skip
        mine = (table["rank"] == rank) & [op in nodes for op in table["op"]]
        assert mine.sum() == len(collectives)  # one row per raw event: none merged
        raw_ns = sum(round(float(e["dur"]) * 1000) for e in collectives)
        assert abs(int(table["duration"][mine].sum()) - raw_ns) <= len(collectives)


def test_compute_ops_are_the_executor_ops_of_each_step(job) -> None:  # noqa: ANN001
    table = job.trace.table
    for path in FILES:
        rank = task_name(path)
        ops = _raw(path)["ops"]
        per_step = Counter((e["args"]["group_id"], e["args"]["long_name"]) for e in ops)
        assert max(per_step.values()) == 1  # each node once per step in this run
        assert (table["rank"] == rank).sum() == len(ops)
        nodes = {e["args"]["long_name"].rpartition(":")[0] for e in ops}
        assert set(job.graphs[rank].ops) == nodes


def test_collective_waits_split_across_the_two_workers(job) -> None:  # noqa: ANN001
    table = job.trace.table
    collective = [job.graphs[r].ops[o].kind == "collective"
                  for r, o in zip(table["rank"], table["op"], strict=True)]  # fmt: skip
    wait = table["wait"][collective]
    duration = table["duration"][collective]
    assert (wait >= 0).all() and (wait <= duration).all() and wait.sum() > 0
    shared = sum(1 for e in _raw(FILES[0])["ops"] if _collective(e))
    assert job.meta["clock_alignment"]["occurrences"] == shared


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("34.82.10.7.trace.json.gz", "34.82.10.7"),  # TensorBoard: HOST.trace.json.gz
        ("10.0.0.2_8466.trace.json.gz", "10.0.0.2:8466"),  # a multi-worker capture
        ("aoberai.trace.json.gz", "aoberai"),
        ("gpu-node.example.com.trace.json", "gpu-node.example.com"),
    ],
)
def test_a_file_names_its_task_whole(name: str, task: str) -> None:
    assert task_name(Path(name)) == task


def test_two_workers_of_one_host_name_ranks_by_folder(tmp_path: Path) -> None:
    for k, src in enumerate(FILES):
        (tmp_path / f"worker{k}").mkdir()
        shutil.copy(src, tmp_path / f"worker{k}" / "vm.trace.json.gz")
    job = detect.load([tmp_path / "worker0", tmp_path / "worker1"])
    assert job.ranks == ["worker0/vm", "worker1/vm"]


def test_cli_inspect_and_metrics_read_each_worker(capsys) -> None:  # noqa: ANN001
    for command in ("inspect", "metrics"):
        code, out, err = run_cli([command, "--json", MWMS], capsys)
        assert code == 0, err
        document = json.loads(out)
        validate(document)
        assert {task_name(p) for p in FILES} <= set(json.dumps(document).split('"'))


def _two_gpus(document: dict[str, Any], shift_us: float) -> dict[str, Any]:
    """The chess trace with its GPU:0 process repeated as GPU:1, `shift_us` later: the
    shape of a profile of two replicas on two GPUs of one host (the same step groups on
    both devices, each its own step)."""
    out = copy.deepcopy(document)
    pids = {e["pid"] for e in document["traceEvents"] if e.get("name") == "process_name"
            and e["args"]["name"] == "/device:GPU:0"}  # fmt: skip
    twin = []
    for e in document["traceEvents"]:
        if e.get("pid") in pids:
            e = copy.deepcopy(e)
            e["pid"] = e["pid"] + 1000
            if e.get("name") == "process_name":
                e["args"]["name"] = "/device:GPU:1"
            if "ts" in e:
                e["ts"] = float(e["ts"]) + shift_us
            twin.append(e)
    out["traceEvents"].extend(twin)
    return out


def test_two_devices_of_one_file_are_two_ranks_with_their_own_steps(tmp_path: Path) -> None:
    if not CHESS_TRACE.exists():
        pytest.skip(f"needs {CHESS_TRACE}, which is not present")
    document = json.loads(gzip.decompress(CHESS_TRACE.read_bytes()))
    path = tmp_path / "34.82.10.7.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_two_gpus(document, 650_000.0)).encode()))
    job = detect.load([path])
    assert job.ranks == ["GPU:0", "GPU:1"]  # by device; never "34"
    steps = [e for e in document["traceEvents"] if e.get("ph") == "X"
             and e.get("tid") == 3735928559]  # fmt: skip  # the Steps line
    spans = job.trace.span_table
    for rank in job.ranks:
        mine = spans["rank"] == rank
        durations = sorted((spans["end"][mine] - spans["start"][mine]).tolist())
        assert durations == sorted(round(float(e["dur"]) * 1000) for e in steps)
    assert len(job.graphs["GPU:0"].ops) == len(job.graphs["GPU:1"].ops)


def _multi_gpu_traces() -> list[Path]:
    """TF2 profiler traces in ../shared with two or more GPUs' TensorFlow Ops lines."""
    found = []
    for path in sorted(EXTERNAL.glob("*/*.trace.json.gz")) if EXTERNAL.exists() else []:
        names = {e["args"]["name"] for e in _events(path) if e.get("name") == "process_name"}
        if sum(n.startswith("/device:GPU:") for n in names) >= 2:
            found.append(path)
    return found


def test_a_shared_multi_gpu_profile_reads_per_device() -> None:
    traces = _multi_gpu_traces()
    if not traces:
        pytest.skip(f"no TF2 profiler trace of several GPUs under {EXTERNAL}/*/ (the issue's "
                    "two-replica tf.distribute trace) is present")  # fmt: skip
    for path in traces:
        events = _events(path)
        processes = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                   if e.get("name") == "thread_name"}  # fmt: skip
        job = detect.load([path])
        assert not any(r.isdigit() for r in job.ranks)
        spans = job.trace.span_table
        for rank in job.ranks:
            device = job.meta["ranks"][rank]["device"]
            marks = {int(e["args"]["group_id"]): float(e["dur"]) * 1000 for e in events
                     if e.get("ph") == "X" and processes.get(e["pid"]) == f"/device:{device}"
                     and threads.get((e["pid"], e["tid"])) == "Steps"}  # fmt: skip
            mine = spans["rank"] == rank
            for start, end, it in zip(spans["start"][mine], spans["end"][mine],
                                      spans["iteration"][mine], strict=True):  # fmt: skip
                if it in marks:
                    assert abs((end - start) - marks[it]) <= 0.05 * marks[it]
        grouped = [e for e in events if e.get("ph") == "X" and "group_id" in e.get("args", {})]
        raw = {e["args"]["long_name"].rpartition(":")[0] for e in grouped if _collective(e)}
        found = {t for r in job.ranks for t in job.graphs[r].transfers}
        assert raw == found
