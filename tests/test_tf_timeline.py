"""TensorFlow chrome traces on real files: TF1/TF2 timelines, a TF2 profiler trace, XPlane.

Every expected count is taken from the raw JSON here, and the facts stated in each
SOURCE.md are checked against those counts.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
from conftest import SHARED, TF, need, run_cli

from planner.errors import InputError
from planner.ingest import detect
from planner.ingest.tf_graphdef import split_input
from planner.ingest.tf_timeline import kernel_name
from tests.test_schemas import validate

EXTERNAL = SHARED / "public" / "external"
IKHLESTOV = EXTERNAL / "tf1_timeline_ikhlestov"
CHESS = EXTERNAL / "tf2_profiler_chess_engine"
CHESS_TRACE = CHESS / "aoberai.trace.json.gz"
CHESS_XPLANE = CHESS / "aoberai.xplane.pb"
AGGREGATES = re.compile(r"/(stream:all|memcpy) Compute$")


def _events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def _processes(events: list[dict[str, Any]]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}


def _executor(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The node records of executor devices (``/job:...`` processes)."""
    names = _processes(events)
    return [e for e in events if e["ph"] == "X" and names[e["pid"]].startswith("/job:")]


def _stream_records(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kernel and copy records on numbered GPU streams (not the aggregates)."""
    names = _processes(events)
    return [
        e
        for e in events
        if e["ph"] == "X"
        and "/stream:" in names[e["pid"]]
        and not AGGREGATES.search(names[e["pid"]])
    ]


def _nodes(events: list[dict[str, Any]]) -> set[str]:
    """Executor nodes and the host<->device copies that only streams record."""
    return {e["args"]["name"] for e in _executor(events) + _stream_records(events)}


def _ops(events: list[dict[str, Any]]) -> set[str]:
    """The ops of one run: each executor record's node, each stream record's kernel."""
    count = Counter(e["args"]["name"] for e in _stream_records(events))
    kernels = {kernel_name(node, k) for node, n in count.items() for k in range(n)}
    return {e["args"]["name"] for e in _executor(events)} | kernels


def _facts(source: Path, file: str) -> list[int]:
    """The integers of the SOURCE.md fact sentence about `file`."""
    text = need(source).read_text()
    line = re.search(re.escape(file) + r":([^;\n]*)", text)
    assert line, f"{source} states no facts about {file}"
    return [int(n) for n in re.findall(r"\d+", line.group(1))]


# ----------------------------------------------------------------------------- TF1 GPU step


def test_gpu_step_counts_match_the_raw_file_and_source_md() -> None:
    path = need(IKHLESTOV / "GPU" / "timeline_02_step_0.json")
    events = _events(path)
    xs = [e for e in events if e["ph"] == "X"]
    with_inputs = [e for e in xs if any(k.startswith("input") for k in e["args"])]
    arrows = [e for e in events if e["ph"] in ("s", "t")]
    # SOURCE.md: 216 events (171 X ops, 64 with args.inputN, 14 dataflow arrows ph s/t)
    assert _facts(IKHLESTOV / "SOURCE.md", "GPU/timeline_02_step_0.json")[:4] == [
        len(events),
        len(xs),
        len(with_inputs),
        len(arrows) // 2,
    ]
    job = detect.load([path])
    assert job.framework == "tensorflow" and job.ranks == ["localhost0"]
    graph = job.graphs["localhost0"]
    nodes = {e["args"]["name"] for e in _executor(events)}
    kernels = Counter(e["args"]["name"] for e in _stream_records(events))
    # one op per executor record, one per kernel or copy on a numbered stream
    expected = nodes | {kernel_name(n, k) for n, count in kernels.items() for k in range(count)}
    assert set(graph.ops) == expected
    assert len(graph.ops) == len(nodes) + len(_stream_records(events))
    # host<->device copies have a stream record and no executor node
    copies = set(kernels) - nodes
    assert copies and {graph.ops[kernel_name(c, 0)].type for c in copies} == {
        "MEMCPYHtoD",
        "MEMCPYDtoH",
    }
    assert job.trace.iterations("localhost0") == [0]
    assert not graph.transfers
    assert any("no transfers" in n for n in job.notes)


def test_a_gpu_node_is_its_launch_and_its_kernels_on_their_streams() -> None:
    """The executor's record of a GPU node is its launch (on the device's executor);
    each of its kernels is an op on the stream that ran it, after the launch and in the
    order they ran. One op spanning a node's kernels overlapped the kernels of other
    nodes run between them (`SoftmaxCrossEntropyWithLogits`'s seven kernels, with
    `Mean_grad/Cast`'s between its fourth and fifth), and the replay took the stream for
    one that runs two kernels at once."""
    path = need(IKHLESTOV / "GPU" / "timeline_02_step_0.json")
    events = _events(path)
    names = _processes(events)
    kernels: dict[str, list[dict[str, Any]]] = {}
    for e in _stream_records(events):
        kernels.setdefault(e["args"]["name"], []).append(e)
    job = detect.load([path])
    graph = job.graphs["localhost0"]
    timings = job.trace.of("localhost0", 0).set_index("op")
    assert timings.index.is_unique and len(timings) == len(graph.ops)
    assert kernels  # the GPU run has kernels
    edges = {(graph.names[u], graph.names[v]) for u, v in zip(graph.src, graph.dst, strict=True)}
    for node, records in kernels.items():
        records.sort(key=lambda e: (e["ts"], e["ts"] + e["dur"]))
        ops = [kernel_name(node, k) for k in range(len(records))]
        for op, e in zip(ops, records, strict=True):
            assert timings.loc[op, "start"] == e["ts"] * 1000
            assert timings.loc[op, "duration"] == e["dur"] * 1000
            stream = names[e["pid"]].split("/")[-1].removesuffix(" Compute")
            assert graph.ops[op].resource == f"localhost0/GPU:0/{stream}"
        chain = ([node] if node in graph.ops else []) + ops
        assert set(pairwise(chain)) <= edges
    # every executor record is an op on its device: a launch, or a node with no kernel
    once = Counter(e["args"]["name"] for e in _executor(events))
    for e in _executor(events):
        node = e["args"]["name"]
        device = "GPU:0" if "gpu:0" in names[e["pid"]] else "CPU:0"
        if once[node] == 1:  # not `_SOURCE`, run on each device
            assert graph.ops[node].resource == f"localhost0/{device}"
            assert timings.loc[node, "start"] == e["ts"] * 1000
    # in the merged runs, other nodes' kernels ran between its kernels on its stream
    merged = detect.load([need(IKHLESTOV / "GPU" / "timeline_03_merged_5_runs.json")])
    rows = merged.trace.timings
    softmax = rows[rows["op"].str.startswith("SoftmaxCrossEntropyWithLogits#")]
    assert softmax.groupby("iteration").size().min() > 1
    stream = merged.graphs["localhost0"].ops[softmax["op"].iloc[0]].resource
    on_stream = rows["op"].map(lambda o: merged.graphs["localhost0"].ops[o].resource) == stream
    between = 0
    for it, mine in softmax.groupby("iteration"):
        others = rows[on_stream & (rows["iteration"] == it) & ~rows["op"].isin(mine["op"])]
        between += int(others["start"].between(mine["start"].min(), mine["start"].max()).sum())
    assert between


def _expected_edges(events: list[dict[str, Any]], known: set[str]) -> tuple[set, set]:
    """(edges from args.inputN between known nodes, edges drawn by flow arrows). An input
    from an untimed _Recv node ``X/_k`` (TensorFlow names a partition's _Recv after its
    source, and the tensor it receives ``edge_<id>_X``) comes from the one copy a stream
    recorded of ``edge_<id>_X``, which comes from ``X`` where ``X`` has a record."""
    launches = {e["args"]["name"] for e in _executor(events)}
    copies: dict[str, list[str]] = {}
    for name in {e["args"]["name"] for e in _stream_records(events)} - launches:
        if name.startswith("edge_") and name.split("_")[1].isdigit():
            copies.setdefault(name.split("_", 2)[2], []).append(name)
    inputs = set()
    for e in _executor(events):
        for key, raw in e["args"].items():
            src = split_input(raw)[0]
            base, _, k = src.rpartition("/_")
            if src not in known and k.isdigit() and len(copies.get(base, [])) == 1:
                src = copies[base][0]
                if base in known:
                    inputs.add((base, src))
            if key.startswith("input") and src in known and src != e["args"]["name"]:
                inputs.add((src, e["args"]["name"]))
    at = {(e["pid"], e["tid"], e["ts"]): e["args"]["name"] for e in reversed(_executor(events))}
    flows = {
        (split_input(e["name"])[0], at[(e["pid"], e["tid"], e["ts"])])
        for e in events
        if e["ph"] == "t"
    }
    return inputs, flows


def _as_ops(edges: set[tuple[str, str]], events: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """Node edges as op edges: from the producer's launch (a copy with no executor record:
    its last copy) to the consumer's launch (or first copy), plus last kernel to first
    kernel where both nodes have kernels, plus each GPU node's launch -> kernel chain."""
    launches = {e["args"]["name"] for e in _executor(events)}
    count = Counter(e["args"]["name"] for e in _stream_records(events))
    ops: set[tuple[str, str]] = set()
    for node, n in count.items():
        chain = ([node] if node in launches else []) + [kernel_name(node, k) for k in range(n)]
        ops |= set(pairwise(chain))
    for u, v in edges:
        ops.add(
            (
                u if u in launches else kernel_name(u, count[u] - 1),
                v if v in launches else kernel_name(v, 0),
            )
        )
        if count[u] and count[v]:
            ops.add((kernel_name(u, count[u] - 1), kernel_name(v, 0)))
    return ops


def test_an_input_from_a_recv_node_comes_from_the_copy_it_waited_for() -> None:
    """The GPU timeline's `layer_1/fully_connected/MatMul` reads the fed batch through
    the untimed _Recv node `_recv_Placeholder_0/_13`; the copy that brought it to the GPU
    is the stream record `edge_184__recv_Placeholder_0` (MEMCPYHtoD, 50-52 us). The
    MatMul's launch and its kernel wait for that copy, and a device-to-host copy waits
    for the node it copies: 7 of the merged file's 13 inputs from untimed nodes are
    such _Recv nodes; the 6 left name nodes TensorFlow did not time at all."""
    path = need(IKHLESTOV / "GPU" / "timeline_03_merged_5_runs.json")
    events = _events(path)
    matmul = next(
        e for e in _executor(events) if e["args"]["name"] == "layer_1/fully_connected/MatMul"
    )
    assert matmul["args"]["input0"] == "_recv_Placeholder_0/_13"
    assert "edge_184__recv_Placeholder_0" in {e["args"]["name"] for e in _stream_records(events)}
    job = detect.load([path])
    graph = job.graphs[job.ranks[0]]
    edges = {(u, v) for u, v, _ in graph.edges()}
    copy = kernel_name("edge_184__recv_Placeholder_0", 0)
    assert {
        (copy, "layer_1/fully_connected/MatMul"),
        (copy, "layer_1/fully_connected/MatMul#0"),
    } <= edges
    d2h = kernel_name("edge_9_gradients/Mean_grad/Prod", 0)
    assert {("gradients/Mean_grad/Prod", d2h), (d2h, "gradients/Mean_grad/floordiv")} <= edges
    assert any("6 input(s) name nodes with no record" in n for n in job.notes)


@pytest.mark.parametrize("device", ["CPU", "GPU"])
@pytest.mark.parametrize("step", [0, 1, 2])
def test_edges_are_the_inputs_and_flow_arrows_and_the_dag_is_acyclic(
    device: str, step: int
) -> None:
    path = need(IKHLESTOV / device / f"timeline_02_step_{step}.json")
    events = _events(path)
    graph = detect.load([path]).graphs["localhost0"]
    inputs, flows = _expected_edges(events, _nodes(events))
    edges = {(u, v) for u, v, _ in graph.edges()}
    assert inputs and flows
    assert edges == _as_ops(inputs | flows, events)
    assert nx.is_directed_acyclic_graph(graph.dag)
    # control inputs (^node) are control edges, data inputs data edges
    kinds = {(u, v): k for u, v, k in graph.edges()}
    for e in _executor(events):
        for key, raw in e["args"].items():
            src, kind = split_input(raw)
            if key.startswith("input") and (src, e["args"]["name"]) in kinds and kind == "data":
                assert kinds[(src, e["args"]["name"])] == "data"


def test_flow_arrows_add_the_edges_that_pass_through_a_recv() -> None:
    """An input `x/_5` is the intra-process `_Recv` of x, which has no record; the
    arrow from x's thread keeps the dependency."""
    path = need(IKHLESTOV / "GPU" / "timeline_02_step_0.json")
    events = _events(path)
    graph = detect.load([path]).graphs["localhost0"]
    inputs, flows = _expected_edges(events, _nodes(events))
    through = flows - inputs
    assert through
    for src, dst in _as_ops(through, events) - _as_ops(set(), events):
        assert graph.dag.has_edge(src, dst)


def test_three_step_files_are_three_steps_of_one_job() -> None:
    paths = [need(IKHLESTOV / "GPU" / f"timeline_02_step_{k}.json") for k in range(3)]
    job = detect.load(list(reversed(paths)))
    assert job.trace.iterations("localhost0") == [0, 1, 2]
    ops = set().union(*(_ops(_events(p)) for p in paths))
    assert set(job.graphs["localhost0"].ops) == ops
    for k, path in enumerate(paths):
        step = job.trace.of("localhost0", k)
        assert set(step["op"]) == _ops(_events(path))
        span = job.trace.spans.query("iteration == @k").iloc[0]
        assert span["start"] == step["start"].min()
        assert span["end"] == (step["start"] + step["duration"]).max()


def test_a_step_given_twice_is_refused(tmp_path: Path) -> None:
    src = need(IKHLESTOV / "CPU" / "timeline_02_step_0.json")
    copy = tmp_path / "copy_step_0.json"
    shutil.copy(src, copy)
    with pytest.raises(InputError, match="step 0 of localhost0 is given twice"):
        detect.load([src, copy])


# ----------------------------------------------------------------------------- merged runs


@pytest.mark.parametrize("device", ["CPU", "GPU"])
def test_merged_runs_are_split_at_each_runs_source_node(device: str) -> None:
    path = need(IKHLESTOV / device / "timeline_03_merged_5_runs.json")
    events = _events(path)
    executor = _executor(events)
    names = _processes(events)
    sources = Counter(names[e["pid"]] for e in executor if e["args"]["name"] == "_SOURCE")
    runs = max(sources.values())
    assert runs == 5  # "merges 5 runs"
    if device == "CPU":
        # SOURCE.md: 335 ops (280 with inputs), 134 arrows
        with_inputs = [e for e in executor if any(k.startswith("input") for k in e["args"])]
        arrows = [e for e in events if e["ph"] == "t"]
        facts = _facts(IKHLESTOV / "SOURCE.md", "CPU/timeline_03_merged_5_runs.json")
        assert facts[:3] == [len(executor), len(with_inputs), len(arrows)]
    job = detect.load([path])
    assert job.trace.iterations("localhost0") == list(range(runs))
    per_node = Counter((names[e["pid"]], e["args"]["name"]) for e in executor)
    graph = job.graphs["localhost0"]
    assert set(graph.ops) >= {node for _, node in per_node}
    for k in range(runs):
        step = job.trace.of("localhost0", k)
        assert step["op"].is_unique
    # a node that ran once per run is in every step, at its k-th record
    on_devices = Counter(node for _, node in per_node)
    for (process, node), count in per_node.items():
        if count != runs or on_devices[node] > 1:  # _SOURCE runs on every device
            continue
        starts = sorted(
            e["ts"] * 1000
            for e in executor
            if e["args"]["name"] == node and names[e["pid"]] == process
        )
        rows = job.trace.timings.query("op == @node").sort_values("iteration")
        assert len(rows) == runs
        if graph.ops[node].resource.endswith(("CPU:0", "GPU:0")):
            assert rows["start"].tolist() == starts
    assert nx.is_directed_acyclic_graph(graph.dag)


def test_a_merged_runs_misfiled_gpu_nodes_are_launches_with_their_kernels() -> None:
    """The merging script kept only the first run's process names; TensorFlow listed the
    last run's devices the other way round, so that run's GPU node records sit under the
    ``cpu:0`` process (and the CPU's ``_SOURCE`` under ``gpu:0``). They are still the
    launches of the GPU's executor, and their kernels, on their streams, still run after
    them: the last step spans its raw records (1.245 ms, not the 0.92 ms of its executor
    records alone) and its nodes are launches and kernels as in the other runs; a note
    names the misfiling."""
    path = need(IKHLESTOV / "GPU" / "timeline_03_merged_5_runs.json")
    events = _events(path)
    names = _processes(events)
    executor = _executor(events)
    sources = sorted(e["ts"] for e in executor if e["args"]["name"] == "_SOURCE")
    last = sources[-2]  # the last run's first _SOURCE (one per device per run)
    cpu = [e for e in executor if e["ts"] >= last and names[e["pid"]].endswith("cpu:0 Compute")]
    kernels = [e for e in _stream_records(events) if e["ts"] >= last]
    kernel_nodes = {e["args"]["name"] for e in kernels}
    misfiled = {e["args"]["name"] for e in cpu} & kernel_nodes
    assert len(cpu) == 80 and len(misfiled) > 20  # GPU nodes under the CPU's process
    job = detect.load([path])
    assert any("filed under another device's process" in n for n in job.notes)
    step = job.trace.of("localhost0", 4)
    in_run = [e for e in events if e["ph"] == "X" and e["ts"] >= last]
    raw_span = max(e["ts"] + e["dur"] for e in in_run) - min(e["ts"] for e in in_run)
    assert (step["start"] + step["duration"]).max() - step["start"].min() == raw_span * 1000
    assert raw_span > 1200
    graph = job.graphs["localhost0"]
    for node in misfiled:  # its launch on the GPU's executor, its kernels on their streams
        assert graph.ops[node].resource == "localhost0/GPU:0"
        (launch,) = [e for e in cpu if e["args"]["name"] == node]
        assert step.loc[step["op"] == node, "start"].item() == launch["ts"] * 1000
        mine = sorted((e for e in kernels if e["args"]["name"] == node), key=lambda e: e["ts"])
        for k, e in enumerate(mine):
            row = step[step["op"] == kernel_name(node, k)].iloc[0]
            assert (row["start"], row["duration"]) == (e["ts"] * 1000, e["dur"] * 1000)


# ----------------------------------------------------------------------------- TF2 PS job


def test_generated_timelines_alone_are_workers_without_transfers() -> None:
    run = need(TF / "cnn_ps_ingraph")
    paths = sorted(run.glob("timeline_step*.json"))
    assert len(paths) == 5
    job = detect.load(paths)
    assert job.ranks == ["worker0", "worker1"]
    numbers = [int(re.search(r"step(\d+)", p.name).group(1)) for p in paths]
    for rank in job.ranks:
        assert job.trace.iterations(rank) == sorted(numbers)
        graph = job.graphs[rank]
        assert not graph.transfers
        assert nx.is_directed_acyclic_graph(graph.dag)
    recv = 0
    for path in paths:
        events = _events(path)
        names = _processes(events)
        recv += sum(
            1
            for e in _executor(events)
            if e["args"].get("op") == "RecvTensor" and "/job:ps" not in names[e["pid"]]
        )
    assert any(f"{recv} RecvTensor records skipped" in n for n in job.notes)
    assert any("parameter-server" in n for n in job.notes)


def test_runmetadata_beside_the_timelines_is_preferred() -> None:
    run = need(TF / "cnn_ps_ingraph")
    job = detect.load([run])
    assert job.meta.get("input") != "tf_timeline"
    assert any(job.graphs[r].transfers for r in job.ranks)
    ignored = [n for n in job.notes if "timeline_step" in n]
    assert len(ignored) == 5 and all("RunMetadata" in n for n in ignored)


# ----------------------------------------------------------------------------- TF2 profiler


def test_tf2_profiler_trace_is_ingested_as_tensorflow_with_a_note() -> None:
    events = _events(need(CHESS_TRACE))
    names = _processes(events)
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"
    }
    assert {"/device:GPU:0", "/host:CPU"} <= set(names.values())
    ops = [
        e
        for e in events
        if e.get("ph") == "X" and threads.get((e["pid"], e["tid"])) == "TensorFlow Ops"
    ]
    grouped = [e for e in ops if "group_id" in e["args"]]
    assert len(events) == _facts(CHESS / "SOURCE.md", "Facts")[0]  # "721 events"
    job = detect.load([CHESS_TRACE])
    assert job.framework == "tensorflow"
    (rank,) = job.ranks
    graph = job.graphs[rank]
    nodes = {e["args"]["long_name"].rpartition(":")[0] for e in grouped}
    assert set(graph.ops) == nodes
    assert {op.type for op in graph.ops.values()} >= {"Conv2D", "BiasAdd", "ResourceApplyAdam"}
    steps = {int(e["args"]["group_id"]) for e in grouped}
    assert job.trace.iterations(rank) == sorted(steps)
    assert not graph.transfers
    assert all(op.resource.startswith(f"{rank}/GPU:0/stream:") for op in graph.ops.values())
    assert any("TF2 profiler trace" in n and "no graph" in n for n in job.notes)


def test_xplane_is_answered_in_one_line() -> None:
    with pytest.raises(InputError, match="XPlane") as caught:
        detect.load([need(CHESS_XPLANE)])
    assert "trace.json.gz" in str(caught.value) and "RunMetadata" in str(caught.value)


def test_xplane_renamed_is_still_recognised(tmp_path: Path) -> None:
    renamed = tmp_path / "profile.pb"
    shutil.copy(need(CHESS_XPLANE), renamed)
    with pytest.raises(InputError, match="XPlane"):
        detect.load([renamed])


def test_profiler_directory_skips_the_xplane_and_reads_the_trace(tmp_path: Path) -> None:
    for src in (need(CHESS_TRACE), need(CHESS_XPLANE)):
        shutil.copy(src, tmp_path / src.name)
    job = detect.load([tmp_path])
    assert job.meta["input"] == "tf_profiler"
    assert any("aoberai.xplane.pb: a TF profiler XPlane" in n for n in job.notes)


# ----------------------------------------------------------------------------- CLI


def _cli_paths() -> list[list[Path]]:
    return [
        [IKHLESTOV / "GPU" / "timeline_02_step_0.json"],
        [IKHLESTOV / "CPU" / f"timeline_02_step_{k}.json" for k in range(3)],
        [IKHLESTOV / "GPU" / "timeline_03_merged_5_runs.json"],
        [CHESS_TRACE],
    ]


@pytest.mark.parametrize("paths", _cli_paths(), ids=["gpu-step", "cpu-steps", "merged", "tf2"])
@pytest.mark.parametrize("command", ["inspect", "metrics"])
def test_cli_reads_each_tf_trace(paths: list[Path], command: str, capsys) -> None:
    for path in paths:
        need(path)
    code, out, err = run_cli([command, "--json", *paths], capsys)
    assert code == 0, err
    document = json.loads(out)
    assert document["schema"].startswith(f"planner.{command}/")
    validate(document)


@pytest.mark.parametrize("paths", _cli_paths(), ids=["gpu-step", "cpu-steps", "merged", "tf2"])
def test_cli_analyze_writes_a_valid_report(paths: list[Path], tmp_path: Path, capsys) -> None:
    for path in paths:
        need(path)
    code, _, err = run_cli(["analyze", *paths, "-o", tmp_path / "out"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    validate(report, "planner.report/1")
    assert report["inspect"]["framework"] == "tensorflow"
    # the report carries what the input can and cannot give
    assert any("no transfers" in n or "no graph" in n for n in report["inspect"]["notes"])


def test_cli_xplane_exit_2_one_line(capsys) -> None:
    code, out, err = run_cli(["inspect", need(CHESS_XPLANE)], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert str(CHESS_XPLANE) in lines[0] and "XPlane" in lines[0]


def _truncated(text: str) -> str:
    return text[: len(text) // 2]


def _with_cycle(text: str) -> str:
    """`weights` made an input of its own reader `weights/read`: a cycle."""
    document = json.loads(text)
    for e in document["traceEvents"]:
        if e.get("args", {}).get("name") == "layer_1/fully_connected/weights":
            e["args"]["input0"] = "layer_1/fully_connected/weights/read"
    return json.dumps(document)


@pytest.mark.parametrize(
    ("mutate", "problem"), [(_truncated, "invalid JSON"), (_with_cycle, "cycle")]
)
def test_cli_bad_timeline_exit_2_one_line(mutate, problem: str, tmp_path: Path, capsys) -> None:
    text = need(IKHLESTOV / "GPU" / "timeline_02_step_0.json").read_text()
    bad = tmp_path / "timeline_step0.json"
    changed = mutate(text)
    assert changed != text
    bad.write_text(changed)
    code, out, err = run_cli(["metrics", bad], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and problem in lines[0]


# ----------------------------------------------------------------------------- robustness

_JUNK: list[Any] = [None, -1, "x", 1e300, [], {}, True, 2**70, "^", ":", "_SOURCE"]


def _mutated(document: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A copy of a real trace with a few fields of a few events dropped or junked."""
    out = json.loads(json.dumps(document))
    events = out["traceEvents"]
    for _ in range(rng.randint(1, 6)):
        event = rng.choice(events)
        if not isinstance(event, dict) or not event:
            continue
        key = rng.choice([*event, "args"])
        args = event.get("args")
        if rng.random() < 0.3:
            event.pop(key, None)
        elif key == "args" and isinstance(args, dict) and args:
            args[rng.choice(list(args))] = rng.choice(_JUNK)
        else:
            event[key] = rng.choice(_JUNK)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_mutated_tf_traces_load_or_raise_input_error(seed: int, tmp_path: Path) -> None:
    """Whatever a damaged timeline or profiler trace holds, the ingest either reads it or
    raises InputError naming the file: never another exception."""
    sources = [
        need(IKHLESTOV / "GPU" / "timeline_02_step_0.json"),
        need(TF / "cnn_ps_ingraph" / "timeline_step3.json"),
        need(CHESS_TRACE),
    ]
    documents = [{"traceEvents": _events(p)} for p in sources]
    rng = random.Random(seed)
    outcomes = Counter()
    for i in range(40):
        k = i % len(sources)
        path = tmp_path / f"case{i}_{sources[k].name}"
        data = json.dumps(_mutated(documents[k], rng)).encode()
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
        try:
            detect.load([path])
        except InputError as exc:
            assert str(path) in str(exc)
            outcomes["refused"] += 1
        else:
            outcomes["read"] += 1
    assert outcomes["read"] and outcomes["refused"]
