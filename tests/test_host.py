"""Processors shared evenly (planner.prediction.host): one host core shared by a job's processes,
and a PS's links shared by every worker's transfers: the shares, the shared replay, the
detection on real TF traces, the replay's consistency with its own waits and the error
each removes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO, SHARED, TF_RUNS, need, without_links

from planner.ingest import detect
from planner.model.graph import Op
from planner.model.oracle import mean_of_runs
from planner.prediction import host
from planner.prediction import replay as sim


def test_shares_split_overlaps_evenly_and_keep_the_busy_time():
    # [0, 10) and [5, 15): 5 alone each, 5 shared -> 7.5 each, 15 in all (the union)
    got = host.shares(np.array([0, 5, 20]), np.array([10, 10, 0]))
    assert got.tolist() == [7.5, 7.5, 0.0]
    # from 8 on: the first has 2 shared left (1), the second 2 shared and 5 alone (6)
    assert host.shares(np.array([0, 5]), np.array([10, 10]), since=8).tolist() == [1.0, 6.0]


def test_only_cpu_compute_ops_run_on_the_host_core():
    assert host.on_host(Op("MatMul", "compute", "worker0/CPU:0"))
    assert host.on_host(Op("ps0:AddN", "compute", "ps0/CPU:0"))
    assert not host.on_host(Op("MatMul", "compute", "worker0/GPU:0"))
    assert not host.on_host(Op("recv:w", "recv", "worker0<-ps0"))


def test_shared_schedule_shares_the_core_and_leaves_other_resources_alone():
    # ops 0, 1 on the core (work 1 and 2, both ready at 0); op 2 on resource 1 (3 ticks)
    # after op 0; op 3 on the core after op 2
    ticks = np.array([1, 2, 3, 1])
    src, dst = np.array([0, 2]), np.array([2, 3])
    res = np.array([0, 0, 1, 0])
    start, end = host.shared_schedule(
        ticks, src, dst, res, np.array([1, 1]), np.full(4, -1), np.array([True, False])
    )
    # 0 and 1 share: 0 ends at 2 (1 work at half speed), 1 has 1 left alone: ends at 3
    assert end[:2].tolist() == pytest.approx([2.0, 3.0])
    assert (start[2], end[2]) == pytest.approx((2.0, 5.0))  # off the core: full speed
    assert (start[3], end[3]) == pytest.approx((5.0, 6.0))


def test_shared_schedule_shares_each_processor_apart():
    # ops 0, 1 share processor 0 (work 2 each); op 2 has processor 1 alone (work 2)
    ticks = np.array([2, 2, 2])
    res = np.array([0, 0, 1])
    none = np.zeros(0, dtype=np.int64)
    start, end = host.shared_schedule(
        ticks, none, none, res, np.array([1, 1]), np.full(3, -1), np.array([True, True])
    )
    assert end.tolist() == pytest.approx([4.0, 4.0, 2.0])


def test_a_link_is_shared_by_connections_then_by_the_transfers_of_each():
    # a [0, 12) alone in its flow, b, c, d [0, 12) in the other: a gets 1/2, each of the
    # three 1/6 -> 6, 2, 2, 2 (12 in all, the union)
    start, duration = np.zeros(4, dtype=np.int64), np.full(4, 12)
    flow = np.array(["worker1", "", "", ""], dtype=object)
    assert host.shares(start, duration, flow=flow).tolist() == pytest.approx([6, 2, 2, 2])
    assert host.shares(start, duration).tolist() == pytest.approx([3, 3, 3, 3])  # one flow
    # replayed with that work on one processor, every op ends at 12, as it ran ...
    none = np.zeros(0, dtype=np.int64)
    args = (none, none, np.zeros(4, dtype=np.int64), np.array([1]), np.full(4, -1))
    _, end = host.shared_schedule(np.array([6, 2, 2, 2]), *args, np.array([True]), flow)
    assert end.tolist() == pytest.approx([12, 12, 12, 12])
    # ... and a flow's transfer alone in it keeps half the link (a chained read): 6 of
    # work ends at 12 beside the other flow's three, not at 4 * 6 = 24
    _, end = host.shared_schedule(np.array([6, 6, 6, 6]), *args, np.array([True]), flow)
    assert end[0] == pytest.approx(12.0) and end[1:].tolist() == pytest.approx([24, 24, 24])


def test_the_replay_names_each_link_transfer_by_its_workers_connection():
    names = ["recv:a", "(link) worker1:recv:b", "(host core) worker1:MatMul", "MatMul"]
    where = ["(link) ps0", "(link) ps0", host.HOST, host.HOST]
    assert host.flows(names, where).tolist() == ["", "worker1", "", ""]


def test_a_transfer_runs_through_its_ps_link_both_ways():
    assert host.link_of("worker1<-ps0") == "(link) ps0"  # the PS sends
    assert host.link_of("worker0->ps0") == "(link) ps0"  # the PS receives
    assert host.link_of("worker0->ps1") == "(link) ps1"
    assert host.link_of("worker0/CPU:0") is None and host.link_of("net") is None
    assert host.is_shared("(link) ps0") and host.is_shared(host.HOST)
    assert not host.is_shared("worker1<-ps0")


def test_shared_schedule_leaves_a_cycle_unrun():
    start, end = host.shared_schedule(
        np.array([1, 1]), np.array([0, 1]), np.array([1, 0]), np.zeros(2, dtype=np.int64),
        np.array([1]), np.full(2, -1), np.array([True]),
    )  # fmt: skip
    assert (end < 0).all()


@pytest.fixture(scope="module")
def cnn():
    job = detect.load([need(p) for p in TF_RUNS["cnn_ps_ingraph"]])
    return job, sim._frame(job)


def test_the_in_graph_cnn_job_ran_on_one_core(cnn):
    # its three processes' ops, where two ran at once, never progressed faster than one
    # core (checked by hand: every overlapping pair's progress adds up to <= 1.07)
    job, frame = cnn
    evidence = host.one_core(job, frame)
    assert evidence is not None
    assert evidence["overlap"] > 0.5 and evidence["within_one_core"] > 0.95


def test_jobs_that_had_two_cores_or_are_not_tf_are_not_on_one_core():
    mlp = detect.load([need(p) for p in TF_RUNS["mlp_ps_betweengraph_sync"]])
    assert host.one_core(mlp, sim._frame(mlp)) is None  # worker0 + ps reach 2 cores
    torch = detect.load([need(SHARED / "generated" / "torch" / "resnet_ddp")])
    assert host.one_core(torch, sim._frame(torch)) is None


MLP_RUN2 = REPO / "traces" / "tf" / "mlp_ps_ingraph" / "run2"


@pytest.mark.parametrize("placement", ["on_one_core", "on_links"])
def test_a_step_replayed_with_its_own_waits_on_shared_processors_runs_as_it_ran(placement, cnn):
    # the model's consistency: with each op's share of its processor and its own wait,
    # every op of the rank starts when it started (the same ops share it at each instant)
    if placement == "on_one_core":
        job, frame = cnn
    else:  # a job on two cores, in the repo
        job = detect.load([MLP_RUN2])
        frame = sim._frame(job)
    for rank in job.ranks:
        own = len(job.graphs[rank].ops)
        graph, rows, release = sim.joint_work(
            job, rank, frame[frame["rank"] == rank], sim.job_releases(job, frame).get(rank)
        )
        spans = sim.spans_of(job, rank)
        place = getattr(host, placement)
        graph, rows, release = place(job, rank, graph, rows, release, frame, spans)
        compiled = sim.compile_graph(graph)
        release = sim._latest(release, sim.carried_over(compiled, rows, spans))
        models = sim._step_models(
            compiled, rows, mean_of_runs(graph, rows), spans, release, own, True
        )
        for it, (_, span, model) in models.items():
            start, took = sim.replay_step(model)
            mine = np.flatnonzero(model.observed[:own])
            shift = start[mine] / sim.TICKS_PER_SECOND * 1e9 - model.start_of[mine]
            assert np.abs(shift).max() < 1_000, (rank, it)  # ns
            end = (start[mine] + took[mine]).max() / sim.TICKS_PER_SECOND + model.tail
            assert end == pytest.approx((span[1] - span[0]) / 1e9, rel=1e-4), (rank, it)


def test_the_shared_core_cuts_the_cnn_replay_error(cnn):
    # before the shared core: wall-clock median 3.67%, worst 9.80% (worker0 step 6)
    job, frame = cnn
    document = sim.replay(job, frame=frame)
    steps = [s for r in document["ranks"] for s in r["steps"]]
    wall = np.abs([s["wall_error"] for s in steps])
    assert np.median(wall) < 0.015 and wall.max() < 0.08
    assert document["shared_core"]["within_one_core"] > 0.95  # the document says why
    (worker0,) = [r for r in document["ranks"] if r["rank"] == "worker0"]
    (step6,) = [s for s in worker0["steps"] if s["iteration"] == 6]
    assert abs(step6["wall_error"]) < 0.05


def _wall_errors(document: dict) -> dict[tuple[str, int], float]:
    return {
        (r["rank"], s["iteration"]): s["wall_error"]
        for r in document["ranks"]
        for s in r["steps"]
        if not s.get("partial")
    }


def test_the_shared_links_cut_the_two_core_tf_replay_error(monkeypatch):
    """mlp in-graph run2 worker1 step 5: its 16 MB read of `MatMul_1` was answered 5.1 ms
    after worker0's, and took 21.0 ms against 24.9 ms for worker0's: both ended within
    1.2 ms, as the PS's sending end served both. Started at its typical time, at its
    observed duration, the replay ended it 5 ms early (-9.68%); on the PS's end shared
    with worker0's transfers it ends with worker0's (-2.0%). Over the run's 10 steps,
    wall-clock 0.96% / 9.68% -> 0.25% / 2.97% (2.26% with the link shared by transfer,
    not by connection: `host.flows`)."""
    job = detect.load([MLP_RUN2])
    shared = _wall_errors(sim.replay(job))
    without_links(monkeypatch)
    alone = _wall_errors(sim.replay(job))
    assert alone[("worker1", 5)] < -0.09 and abs(shared[("worker1", 5)]) < 0.03
    before, after = np.abs(list(alone.values())), np.abs(list(shared.values()))
    assert np.median(before) > 0.009 and before.max() > 0.09
    assert np.median(after) < 0.004 and after.max() < 0.031
