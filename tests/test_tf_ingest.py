"""TensorFlow RunMetadata ingest on the real parameter-server traces."""

from __future__ import annotations

import functools
import gzip
import re
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from conftest import DEMO, REPO, TF_RUNS, need

from planner.errors import InputError
from planner.ingest import detect
from planner.ingest.proto import tf_subset_pb2 as tfpb
from planner.ingest.tf_graphdef import task_of
from planner.job import analysis
from planner.model.records import partial_steps
from planner.model.trace import busy_time, with_dedicated


@pytest.fixture(scope="module", params=sorted(TF_RUNS))
def tf_run(request: pytest.FixtureRequest):
    paths = [need(p) for p in TF_RUNS[request.param]]
    return request.param, paths, detect.load(paths)


def _ps_recvs(run: tfpb.RunMetadata) -> dict[str, dict[str, str]]:
    """Worker -> {transfer name: tensor_name} of the `_Recv` nodes fed by a PS, read
    straight from the protobuf. The name is the tensor the PS's `_Send` of the same
    tensor_name carries (``recv:node``, ``recv:node:1``), or ``recv:^src`` when it sends
    the dummy constant of a control edge; TF's own node names (``..._S9``) number edges
    and change with every rewrite."""
    sends = {}
    for graph in run.partition_graphs:
        for n in graph.node:
            if n.op == "_Send":
                sends[n.attr["tensor_name"].s.decode()] = n.input[0]
    found: dict[str, dict[str, str]] = {}
    for graph in run.partition_graphs:
        device = graph.node[0].device
        if "/job:worker" not in device:
            continue
        for n in graph.node:
            if n.op != "_Recv" or "/job:ps" not in n.attr["send_device"].s.decode():
                continue
            edge, src = n.attr["tensor_name"].s.decode(), n.attr["_src"].s.decode()
            sent = sends[edge]
            name = (
                f"recv:{sent.removesuffix(':0')}" if sent.split(":")[0] == src else f"recv:^{src}"
            )
            found.setdefault(task_of(device), {})[name] = edge
    return found


def _partition_recvs(paths) -> dict[str, set[str]]:
    """Worker -> names of its transfers from a PS over all steps (`_ps_recvs`)."""
    found: dict[str, set[str]] = {}
    for directory in paths:
        for file in sorted(directory.glob("run_metadata_step*.pb")):
            run = tfpb.RunMetadata()
            run.ParseFromString(file.read_bytes())
            for rank, names in _ps_recvs(run).items():
                found.setdefault(rank, set()).update(names)
    return found


def test_every_worker_partition_is_a_rank_with_its_ps_recvs(tf_run):
    _, paths, job = tf_run
    expected = _partition_recvs(paths)
    assert job.ranks == sorted(expected)
    for rank, names in expected.items():
        graph = job.graphs[rank]
        assert set(graph.recvs) == names
        for name in names:
            op = graph.ops[name]
            assert op.resource == f"{rank}<-ps0"
            assert bool(op.param) == (not name.startswith("recv:^")), name  # data: a variable


def test_steps_and_timings(tf_run):
    _, _, job = tf_run
    for rank in job.ranks:
        assert job.trace.iterations(rank) == [3, 4, 5, 6, 7]
    timings = job.trace.timings
    assert (timings["duration"] >= 0).all()
    spans = job.trace.spans
    merged = timings.merge(spans, on=["rank", "iteration"], suffixes=("", "_span"))
    assert (merged["start"] >= merged["start_span"]).all()
    assert (merged["start"] + merged["duration"] <= merged["end"]).all()


def test_transfer_sizes_match_recvtensor_labels(tf_run):
    """A transfer's bytes are the largest `requested_bytes` its records show."""
    _, paths, job = tf_run
    labelled = 0
    for directory in paths:
        run = tfpb.RunMetadata()
        run.ParseFromString((directory / "run_metadata_step3.pb").read_bytes())
        for dev in run.step_stats.dev_stats:
            for stats in dev.node_stats:
                if stats.node_name != "RecvTensor" or " from /job:ps" not in stats.timeline_label:
                    continue
                edge = stats.timeline_label.split("] ")[2].split(" ")[0]
                rank = task_of(stats.timeline_label.split(" to ")[1])
                graph = job.graphs[rank]
                for name in graph.recvs:
                    node_edge = _edge_of(paths, rank, name)
                    if node_edge == edge:
                        req = stats.output[0].tensor_description.allocation_description
                        assert graph.ops[name].nbytes >= req.requested_bytes
                        labelled += 1
    assert labelled > 0


def _edge_of(paths, rank, name):
    return _recv_edges(tuple(paths), rank).get(name)


@functools.cache
def _recv_edges(paths: tuple, rank: str) -> dict[str, str]:
    """Transfer name -> its `tensor_name`, read straight from step 3's partition graphs."""
    edges = {}
    for directory in paths:
        run = tfpb.RunMetadata()
        run.ParseFromString((directory / "run_metadata_step3.pb").read_bytes())
        edges.update(_ps_recvs(run).get(rank, {}))
    return edges


def test_oracle_is_minimum_over_steps(tf_run):
    _, _, job = tf_run
    frame = with_dedicated(job.trace, job.graphs)
    oracles = analysis.oracles(job)
    for rank in job.ranks:
        of_rank = frame[frame["rank"] == rank]
        partial = partial_steps(of_rank, job.graphs[rank].ops)  # left out of the oracle
        of_rank = of_rank[~of_rank["iteration"].isin(list(partial))]
        for op, rows in list(of_rank.groupby("op"))[:50]:
            assert oracles[rank].times[op] == pytest.approx(rows["dedicated"].min() / 1e9)
            assert oracles[rank].observed_in[op] == len(rows)


def test_missing_record_is_noted_and_oracle_uses_other_steps():
    paths = [need(p) for p in TF_RUNS["mlp_ps_betweengraph_sync"]]
    job = detect.load(paths)
    notes = [n for n in job.notes if "no RecvTensor record" in n]
    assert notes, job.notes
    assert any(re.match(r"worker1 step 6: 1 transfer", n) for n in notes)
    oracle = analysis.oracles(job)["worker1"]
    partial = [op for op, n in oracle.observed_in.items() if n == 4]
    assert partial and all(oracle.source[op] == "observed" for op in partial)


def test_efficiency_in_unit_interval_for_every_step(tf_run):
    _, _, job = tf_run
    document = analysis.metrics(job)
    assert len(document["steps"]) == 5 * len(job.ranks)
    for step in document["steps"]:
        assert 0.0 <= step["efficiency"] <= 1.0
        assert step["lmin"] <= step["busy_makespan"] + 1e-9
        assert step["busy_makespan"] <= step["umax"] + 1e-9
        assert step["busy_makespan"] <= step["makespan"] + 1e-12
        assert step["speedup_bound"] >= 0.0


def test_analyze_gives_priorities_for_every_transfer(tf_run):
    _, _, job = tf_run
    report = analysis.analyze(job)
    for name in ("tic", "tac"):
        for entry in report["plans"][name]["ranks"]:
            graph = job.graphs[entry["rank"]]
            names = [t["name"] for t in entry["transfers"]]
            assert sorted(names) == sorted(graph.recvs)
            assert sorted(t["order_index"] for t in entry["transfers"]) == list(range(len(names)))


def test_transfer_start_is_trimmed_to_when_the_tensor_exists():
    """Gradient sends start no earlier than the op that produced the gradient ends."""
    job = detect.load([need(DEMO)])
    graph = job.graphs["worker0"]
    timings = job.trace.of("worker0", 3).set_index("op")
    checked = 0
    for name, op in graph.ops.items():
        if op.kind != "send" or name not in timings.index:
            continue
        for producer in graph.dag.predecessors(name):
            if producer in timings.index:
                end = timings.loc[producer, "start"] + timings.loc[producer, "duration"]
                assert timings.loc[name, "start"] >= end, (name, producer)
                checked += 1
    assert checked > 0
    assert np.isfinite(job.trace.timings["duration"]).all()


def test_client_graphdef_gives_tic_plans_without_timings():
    """A bare client GraphDef: edges from the PS become recvs, TIC orders them."""
    path = need(TF_RUNS["cnn_ps_ingraph"][0] / "graph.pbtxt")
    job = detect.load([path])
    assert len(job.trace.timings) == 0
    assert job.ranks == ["worker0", "worker1"]
    plans = analysis.schedule(job, "tic")
    for rank, graph in job.graphs.items():
        assert graph.recvs
        assert all(graph.ops[r].resource.startswith(f"{rank}<-") for r in graph.recvs)
        assert sorted(plans[rank].order) == sorted(graph.recvs)
    with pytest.raises(InputError, match="TAC needs timings"):
        analysis.schedule(job, "tac")
    binary = detect.load([TF_RUNS["cnn_ps_ingraph"][0] / "graph.pb"])
    assert {r: sorted(g.ops) for r, g in binary.graphs.items()} == {
        r: sorted(g.ops) for r, g in job.graphs.items()
    }


def test_waits_on_the_ps_become_edges_of_the_worker_dag():
    """A worker's recv whose PS-side producer waits for that worker's sends depends on
    them: the averaged loss waits for the tower's loss (in-graph cnn), and SyncReplicas'
    token waits for every gradient the worker sent (demo). The worker partition alone
    has no such path."""
    cnn = detect.load([need(TF_RUNS["cnn_ps_ingraph"][0])]).graphs["worker0"]
    assert list(cnn.dag.predecessors("recv:truediv")) == ["send:tower0/Mean->ps0"]
    run = tfpb.RunMetadata()
    run.ParseFromString((TF_RUNS["cnn_ps_ingraph"][0] / "run_metadata_step3.pb").read_bytes())
    (part,) = [g for g in run.partition_graphs if task_of(g.node[0].device) == "worker0"]
    raw = nx.DiGraph((i.lstrip("^").split(":")[0], n.name) for n in part.node for i in n.input)
    (send,) = [n.name for n in part.node if n.op == "_Send" and n.input[0] == "tower0/Mean"]
    (recv,) = [n.name for n in part.node if n.op == "_Recv" and n.attr["_src"].s == b"truediv"]
    assert not (send in raw and recv in raw and nx.has_path(raw, send, recv))
    demo = detect.load([need(DEMO)]).graphs["worker0"]
    token = "recv:sync_token_q_Dequeue"
    sends = [name for name, op in demo.ops.items() if op.kind == "send"]
    assert len(sends) == 24
    assert all(demo.dag.has_edge(s, token) for s in sends)


def _raw_queued(
    paths: list[Path], spans: dict[tuple[str, int], int]
) -> dict[tuple[str, int], float]:
    """(worker, step) -> s in which some executed op of the worker sat queued with its
    inputs done, counted straight from the RunMetadata files: the union of
    [scheduled, start] over the worker's node stats (not the RecvTensor records, not the
    executor's own `_SOURCE`), from the step's span start (`spans`) on."""
    found = {}
    for path in sorted(p for folder in paths for p in folder.rglob("run_metadata_step*.pb*")):
        data = path.read_bytes()
        run = tfpb.RunMetadata.FromString(gzip.decompress(data) if path.suffix == ".gz" else data)
        step = int(re.search(r"step(\d+)", path.name).group(1))
        for device in run.step_stats.dev_stats:
            task = re.search(r"/job:worker/replica:0/task:(\d+)/", device.device)
            stats = [s for s in device.node_stats if s.node_name not in ("RecvTensor", "_SOURCE")]
            stats = [s for s in stats if s.scheduled_micros]
            if task is None or not stats:
                continue
            key = (f"worker{task.group(1)}", step)
            begin = np.array([s.all_start_nanos for s in stats], dtype=np.int64)
            since = np.maximum([s.scheduled_nanos for s in stats], spans[key])
            found[key] = busy_time(since, np.maximum(begin - since, 0)) / 1e9
    return found


def _check_queued(paths: list[Path], job) -> None:
    spans = job.trace.spans
    starts = {
        (rank, int(step)): int(start)
        for rank, step, start in spans[["rank", "iteration", "start"]].itertuples(index=False)
    }
    raw = _raw_queued(paths, starts)
    steps = analysis.metrics(job)["steps"]
    got = {(s["rank"], s["iteration"]): s["queued"] for s in steps}
    assert got.keys() == raw.keys() and len(got) == 5 * len(job.ranks)
    for step in steps:
        key = (step["rank"], step["iteration"])
        assert step["queued"] == pytest.approx(raw[key], abs=1e-9), key
        assert 0 < step["queued"] <= step["makespan"]


def test_queued_time_is_the_union_of_the_executor_queues_in_the_raw_files(tf_run):
    """`planner metrics` reports per TF step the time in which some op waited queued in
    the executor for a thread or a core; counted again here from the protobufs."""
    _, paths, job = tf_run
    _check_queued(paths, job)


def test_queued_time_of_a_job_recorded_here_matches_its_raw_files():
    paths = [REPO / "traces" / "tf" / "cnn_ps_ingraph" / "run1"]
    _check_queued(paths, detect.load(paths))
