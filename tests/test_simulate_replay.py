"""Replay fidelity on the real generated traces: pinned worst errors, what each modelled
effect contributes, partial steps, and the warning beside predictions."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re

import numpy as np
import pytest
from conftest import REPO, RESNET_IN_REPO, SHARED, TF, TF_RUNS, need, run_cli, without_links

from planner.ingest import detect
from planner.ingest import tf_step_stats as tfr
from planner.ingest.tf_graphdef import split_input
from planner.ingest.tf_timeline import kernel_name
from planner.job import analysis
from planner.model import records
from planner.model.graph import build_graph
from planner.model.trace import rank_meta
from planner.prediction import replay as sim
from planner.reporting import measured_sections as html

TORCH = SHARED / "generated" / "torch"
RUNS = {
    **{f"tf/{k}": v for k, v in TF_RUNS.items()},
    **{
        f"torch/{k}": [TORCH / k] for k in ("resnet_ddp", "resnet_ddp_bucket1mb", "transformer_ddp")
    },
}
# Worst |error| over the complete steps of each generated trace, as measured by
# bench/bench_replay.py when this was written (wall-clock, busy time), plus 0.5 points of
# slack for float noise: a change that makes the replay worse on any trace fails here.
PINNED = {
    "tf/cnn_ps_ingraph": (0.0766, 0.1218),  # shared core: wall from 9.80%, busy from 6.34%
    "tf/mlp_ps_betweengraph_sync": (0.0574, 0.0567),  # links: wall from 7.19%, busy 7.33%
    "torch/resnet_ddp": (0.0098, 0.0034),  # slower threads' gaps scaled: wall from 1.31%
    "torch/resnet_ddp_bucket1mb": (0.0063, 0.0052),  # from 0.86%
    "torch/transformer_ddp": (0.0173, 0.0002),  # from 2.79%
}
SLACK = 0.005


def _job(name: str):
    return detect.load([need(p) for p in RUNS[name]])


@pytest.fixture(scope="module")
def replays() -> dict:
    out = {}
    for name in RUNS:
        if all(p.exists() for p in RUNS[name]):
            job = _job(name)
            out[name] = (job, sim.replay(job))
    return out


def _complete(document: dict) -> list[dict]:
    return [s for r in document["ranks"] for s in r["steps"] if not s.get("partial")]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_worst_replay_error_is_pinned(name, replays):
    if name not in replays:
        pytest.skip(f"{RUNS[name][0]} is not available")
    _, document = replays[name]
    steps = _complete(document)
    assert len(steps) >= 9, name  # 5 steps x 2 ranks, less partial ones
    wall = max(abs(s["wall_error"]) for s in steps)
    busy = max(abs(s["replay_error"]) for s in steps)
    pinned_wall, pinned_busy = PINNED[name]
    assert wall <= pinned_wall + SLACK, (name, wall)
    assert busy <= pinned_busy + SLACK, (name, busy)
    for s in steps:  # the figures are what they say
        assert s["wall_error"] == pytest.approx(s["predicted_wall"] / s["wall"] - 1)
        assert s["replay_error"] == pytest.approx(s["predicted"] / s["measured"] - 1)
        assert s["wall"] >= s["span"] > 0 and s["overhead_from"] == "other steps"


def test_the_h100_trace_recorded_after_the_models_replays_within_its_pin():
    """The H100 CNN (traces/torch/h100_cnn_windows: recorded after the simulator's models
    were built, never tuned on): its 6 steps in 2 windows replay within 3.21% wall-clock
    and 2.22% busy time, as bench/bench_replay.py measured them when it was recorded."""
    folder = REPO / "traces" / "torch" / "h100_cnn_windows"
    steps = _complete(sim.replay(detect.load([folder])))
    assert len(steps) == 6
    assert max(abs(s["wall_error"]) for s in steps) <= 0.0321 + SLACK
    assert max(abs(s["replay_error"]) for s in steps) <= 0.0222 + SLACK


@pytest.mark.parametrize("name", ["torch/resnet_ddp", "torch/transformer_ddp"])
def test_ddp_replay_meets_the_targets_against_wall_clock(name, replays):
    if name not in replays:
        pytest.skip(f"{RUNS[name][0]} is not available")
    errors = np.array([abs(s["wall_error"]) for s in _complete(replays[name][1])])
    assert np.median(errors) <= 0.02 and errors.max() <= 0.05


def test_own_overheads_reproduce_each_step(replays):
    """With each step's own overheads (not the other steps'), the replay reproduces the
    traced step: the DAG, lanes and durations agree with the trace (a DAG edge the trace
    contradicts, or a lane run out of order, would show here)."""
    if "torch/transformer_ddp" not in replays:
        pytest.skip("transformer_ddp is not available")
    job, _ = replays["torch/transformer_ddp"]
    frame = sim._frame(job)
    for rank in job.ranks:
        compiled = sim.compile_graph(job.graphs[rank])
        rows = frame[frame["rank"] == rank]
        oracle = sim.mean_of_runs(job.graphs[rank], rows)
        models = sim._step_models(compiled, rows, oracle, sim.spans_of(job, rank))
        _assert_each_step_replays_itself(compiled, models)


def test_ddp_bucket_copy_waits_for_its_all_reduce():
    """DDP copies each bucket back after its all-reduce: the first op on the main thread
    after the last bucket's launch and the all-reduce's end depends on the all-reduce."""
    job = _job("torch/transformer_ddp")
    for rank, graph in job.graphs.items():
        waiting = {v for u, v, _ in graph.edges() if u.startswith("net/all_reduce")}
        assert any("as_strided" in v or "copy_bucket_to_grad" in v for v in waiting), rank
        rows = job.trace.of(rank)
        for it, step in rows.groupby("iteration"):
            times = step.set_index("op")
            for u, v, _ in graph.edges():
                if u.startswith("net/all_reduce") and u in times.index and v in times.index:
                    # the edge is one the trace keeps (within the 2 ms slack of a step
                    # whose occurrence numbering shifted)
                    end = times.loc[u, "start"] + times.loc[u, "duration"]
                    assert times.loc[v, "start"] >= end - 2_000_000, (rank, it, u, v)


def test_partial_step_is_flagged_everywhere_and_left_out(capsys):
    """worker1 step 6 of the between-graph job lacks one PS-side RecvTensor record."""
    paths = [need(p) for p in TF_RUNS["mlp_ps_betweengraph_sync"]]
    job = detect.load(paths)
    rows = job.trace.of("worker1")
    partial = records.partial_steps(rows, job.graphs["worker1"].ops)
    assert list(partial) == [6] and len(partial[6]) == 1
    missing = partial[6][0]
    assert missing.startswith("send:") and missing not in set(rows.loc[rows.iteration == 6, "op"])
    # replay: flagged, left out of the error figures
    document = sim.replay(job)
    w1 = next(r for r in document["ranks"] if r["rank"] == "worker1")
    flagged = [s for s in w1["steps"] if s.get("partial")]
    assert [s["iteration"] for s in flagged] == [6] and missing in flagged[0]["partial"]
    assert w1["partial_steps"] == 1
    complete = [s["replay_error"] for s in w1["steps"] if not s.get("partial")]
    assert w1["replay_error_median"] == pytest.approx(float(np.median(complete)))
    # metrics: flagged, noted, not in the summaries, not gated
    metrics = analysis.metrics(job)
    step6 = next(s for s in metrics["steps"] if (s["rank"], s["iteration"]) == ("worker1", 6))
    assert "partial" in step6 and any("worker1 step 6: partial" in n for n in metrics["notes"])
    code, out, err = run_cli(["metrics", *paths, "--min-efficiency", "0.0"], capsys)
    assert code == 0 and "worker1 step 6: partial" in err
    rows = [line for line in out.splitlines() if "(partial)" in line]
    assert len(rows) == 1 and re.search(r"worker1 │\s*6 \(partial\) │", rows[0])
    # the report's step and efficiency tables mark the row too
    for section in (html.steps_section, html.efficiency_section):
        assert section({"metrics": metrics}).count("6 (partial)") == 1
    code, out, err = run_cli(["metrics", *paths, "--min-efficiency", "0.99", "--json"], capsys)
    failed = json.loads(out)["gate"]["failed"]
    assert (
        code == 1 and failed and all(f["iteration"] != 6 for f in failed if f["rank"] == "worker1")
    )
    # the oracle's fits leave it out
    frame = sim._frame(job)
    oracle = sim.mean_of_runs(job.graphs["worker1"], frame[frame["rank"] == "worker1"])
    assert max(oracle.observed_in.values()) == 4


def test_complete_steps_are_not_flagged():
    job = _job("torch/resnet_ddp")
    for rank, graph in job.graphs.items():
        assert records.partial_steps(job.trace.of(rank), graph.ops) == {}


def test_prediction_carries_its_error_and_a_warning_when_unreliable(capsys):
    from planner.prediction import fidelity as sim

    paths = [need(TF / "cnn_ps_ingraph")]
    code, out, err = run_cli(["simulate", *paths, "--samples", "5", "--json"], capsys)
    assert code == 0
    document = json.loads(out)
    steps = {r["rank"]: r["steps"] for r in document["replay"]["ranks"]}
    for r in document["comparison"]["ranks"]:
        worst = max(abs(r["wall_error_max"]), abs(r["replay_error_max"]))
        assert worst > sim.RELIABLE  # the TF in-graph replay misses by more than 5%
        assert r["warning"].startswith("predictions unreliable") and r["cause"] in r["warning"]
        # the warning names the step and the figure of the largest miss, and its cause
        # (worker0: step 6's busy time, +12.2%, not the wall-clock worst, step 4)
        figure, step = max(
            ((f, s) for s in steps[r["rank"]] if not s.get("partial")
             for f in ("wall_error", "replay_error")),
            key=lambda m: abs(m[1][m[0]]),
        )  # fmt: skip
        label, cause = (
            ("wall-clock time", "cause") if figure == "wall_error" else ("busy time", "busy_cause")
        )
        assert f"misses the {label} of step {step['iteration']} by" in r["warning"]
        assert f"{step[figure] * 100:+.1f}%" in r["warning"] and r["cause"] == step[cause]
    # worker0's largest miss, step 6's busy time, came from a read that waited 5.7 ms
    assert (
        "tower0/Conv2D_3/ReadVariableOp_S51 waited 5.73 ms"
        in document["comparison"]["ranks"][0]["warning"]
    )
    worker1 = document["comparison"]["ranks"][1]
    assert worker1["comparison_error"] < -sim.RELIABLE and worker1["comparison_warning"]
    code, out, err = run_cli(["simulate", *paths, "--samples", "5"], capsys)
    out = " ".join(out.split())  # the caption's lines as one
    assert "predictions unreliable" in err and "wall-clock: median" in out
    assert "comparison on the observed order" in out


def test_no_warning_where_the_replay_is_within_five_percent(capsys):
    from planner.prediction import fidelity as sim

    paths = [need(TORCH / "resnet_ddp")]
    code, out, _ = run_cli(["simulate", *paths, "--samples", "5", "--json"], capsys)
    for r in json.loads(out)["comparison"]["ranks"]:
        assert max(abs(r["wall_error_max"]), abs(r["replay_error_max"])) <= sim.RELIABLE
        assert r["warning"] is None and math.isfinite(r["wall_error_median"])
        assert abs(r["comparison_error"]) <= 0.01 and r["comparison_warning"] is None


def test_report_shows_the_warning_beside_the_predictions(tmp_path, capsys):
    paths = [need(TF / "cnn_ps_ingraph")]
    code, _, _ = run_cli(["analyze", *paths, "-o", tmp_path], capsys)
    assert code == 0
    page = (tmp_path / "report.html").read_text()
    assert "against the wall-clock step" in page
    assert "<b>Warning:</b> predictions unreliable" in page


def _two_steps(ops, edges, rows, spans):
    """A one-rank job of two identical steps (each step's overheads come from the other)."""
    from planner.model.graph import build_graph
    from planner.model.trace import Job, make_trace

    graph = build_graph(ops, edges)
    timed = [
        ("rank0", it, op, start + off, dur)
        for it, off in ((1, 0), (2, 1000))
        for op, start, dur in rows
    ]
    spanned = [
        ("rank0", it, a + off, b + off) for it, off in ((1, 0), (2, 1000)) for a, b in [spans]
    ]
    return Job(framework="pytorch", graphs={"rank0": graph}, trace=make_trace(timed, spanned))


def test_a_kernel_launched_inside_its_cpu_op_starts_at_the_launch():
    """cpu op [0, 100) launches a kernel that runs [30, 70): the edge waits for the launch
    point (30 after the op's start), not for the op's end, so the step stays 100 long."""
    from planner.model.graph import Op

    job = _two_steps(
        [Op("cpu", "compute", "main"), Op("k", "compute", "stream")],
        [("cpu", "k")],
        [("cpu", 0, 100), ("k", 30, 40)],
        (0, 100),
    )
    for step in sim.replay(job)["ranks"][0]["steps"]:
        assert step["predicted_wall"] == pytest.approx(100e-9)
        assert step["wall_error"] == pytest.approx(0.0)


def test_concurrent_transfers_on_one_channel_run_at_their_observed_width():
    """Three recvs overlap on one channel (gRPC); replayed one at a time they would take
    3 x 60; at the observed width of 3 they take the step's 80."""
    from planner.model.graph import Op

    job = _two_steps(
        [Op(f"r{i}", "recv", "w0<-ps0", param=f"p{i}", nbytes=8) for i in range(3)]
        + [Op("c", "compute", "cpu")],
        [(f"r{i}", "c") for i in range(3)],
        [("r0", 0, 60), ("r1", 5, 60), ("r2", 10, 60), ("c", 70, 10)],
        (0, 80),
    )
    for step in sim.replay(job)["ranks"][0]["steps"]:
        assert step["predicted_wall"] == pytest.approx(80e-9)


def test_a_single_step_gives_no_measured_error_and_says_so():
    """With one traced step the replay can only take the overheads from the step itself:
    its error is 0 by construction, which must not read as a trusted prediction."""
    from planner.model.graph import Op
    from planner.model.trace import Job

    job = _two_steps(
        [Op("a", "compute", "main"), Op("b", "compute", "main")],
        [("a", "b")],
        [("a", 0, 40), ("b", 50, 40)],
        (0, 100),
    )
    one = Job(
        framework=job.framework,
        graphs=job.graphs,
        trace=type(job.trace)(
            job.trace.timings[job.trace.timings["iteration"] == 1],
            job.trace.spans[job.trace.spans["iteration"] == 1],
        ),
    )
    document = sim.replay(one)
    rank = document["ranks"][0]
    assert rank["steps"][0]["overhead_from"] == "own step"
    assert rank["wall_error_max"] == pytest.approx(0.0)
    assert "reproduces it by construction" in rank["warning"]
    assert sim.replay(job)["ranks"][0]["warning"] is None  # two steps: measured, small


def _errors(document: dict) -> np.ndarray:
    return np.array([abs(s["wall_error"]) for s in _complete(document)])


def test_tf_worker_replays_jointly_with_the_parameter_server():
    """The SyncReplicas token a worker receives is dequeued on the PS after the PS has
    applied that worker's gradients: the joint graph carries that path (worker send ->
    PS accumulator -> PS dequeue -> worker recv), with the PS ops' records per step."""
    job = _job("tf/mlp_ps_betweengraph_sync")
    joint = job.meta["replay"]["graphs"]["worker0"]
    own = job.graphs["worker0"]
    assert list(joint.ops)[: len(own.ops)] == list(own.ops)  # the worker's ops first
    ps = [name for name in joint.ops if name.startswith("ps0:")]
    assert ps and all(joint.ops[name].resource == "ps0/CPU:0" for name in ps)
    edges = set((u, v) for u, v, _ in joint.edges())
    assert ("ps0:sync_token_q_Dequeue", "recv:sync_token_q_Dequeue") in edges
    applies = {v for u, v in edges if u.startswith("send:") and v.startswith("ps0:")}
    assert any("AccumulatorApplyGradient" in v for v in applies)
    rows = [r for r in job.meta["replay"]["rows"] if r[0] == "worker0"]
    assert {r[1] for r in rows} == {3, 4, 5, 6, 7}
    assert not set(job.trace.timings["op"]) & set(ps)  # PS records stay out of the trace


@pytest.mark.parametrize(
    ("name", "median_alone", "worst_alone"),
    [("tf/cnn_ps_ingraph", 0.10, 0.20), ("tf/mlp_ps_betweengraph_sync", 0.02, 0.10)],
)
def test_the_ps_work_removes_the_tf_error(name, median_alone, worst_alone, replays, monkeypatch):
    """Replayed alone, the workers' recvs take the PS's wait from the other steps and
    miss (cnn in-graph 10.8% median, 24.6% worst; mlp 2.2% / 10.2%); with the PS's work
    of the step (its traced reads, its gradient applies at observed durations) they
    wait for the PS as it ran: cnn 5.1% / 9.8%, mlp 1.1% / 7.2%. Measured as it was
    added: before the PS's links were shared."""
    if name not in replays:
        pytest.skip(f"{RUNS[name][0]} is not available")
    without_links(monkeypatch)
    job = replays[name][0]
    joint = sim.replay(job)
    alone = sim.replay(type(job)(job.framework, job.graphs, job.trace, job.sources, job.notes, {}))
    before, after = _errors(alone), _errors(joint)
    assert np.median(before) > median_alone and before.max() > worst_alone
    assert np.median(after) < 0.6 * np.median(before) and after.max() < 0.75 * before.max()
    # the measured side is the worker's own step either way
    walls = [s["wall"] for s in _complete(joint)]
    assert walls == [s["wall"] for s in _complete(alone)]


HTA = SHARED / "public" / "HolisticTraceAnalysis" / "tests" / "data"
NS_TRACE = HTA / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
MI300 = (
    SHARED / "public" / "external" / "tracelens_mi300_resnet_ddp8" / "resnet_act_checkpoint.json.gz"
)


@pytest.mark.parametrize(
    ("path", "worst_before", "worst_after"),
    [(NS_TRACE, 0.80, 0.01), (MI300, None, 0.005)],
)
def test_a_gpu_stream_begins_the_step_with_the_previous_steps_queue(
    path, worst_before, worst_after
):
    """The CPU queues a step's kernels while the stream still runs the previous step's:
    without that queue the first kernels' waits were taken from the other steps, so the
    first profiled step of the HTA ns trace, whose stream was idle, was +88%. Released
    at the previous step's last end on their stream (the first traced step: at the
    typical queue), it is < 1%. The MI300 DDP steps (CPU two steps ahead) are within
    0.12% either way (2.5% before the inferred stream waits, `test_stream_waits`):
    without the queue their whole device step starts early, and a device step is timed
    from its first device op as replayed."""
    job = detect.load([need(path)])
    after = _errors(sim.replay(job))
    assert after.max() < worst_after
    frame = sim._frame(job)
    rank = job.ranks[0]
    compiled = sim.compile_graph(job.graphs[rank])
    queue = sim.carried_over(compiled, frame[frame["rank"] == rank], sim.spans_of(job, rank))
    steps = sorted(queue)
    assert steps == sorted(frame["iteration"].unique().tolist())  # the first one too
    stream = next(i for i, r in enumerate(compiled.resources) if "stream" in r)
    on_stream = compiled.res == stream
    for before, it in zip(steps, steps[1:], strict=False):
        rows = frame[(frame["iteration"] == before) & (frame["rank"] == rank)]
        ops = rows["op"].map(compiled.index).to_numpy()
        mine = rows[on_stream[ops]]
        assert queue[it][on_stream].max() == int((mine["start"] + mine["duration"]).max())
    # without the queue (each step's releases from itself only)
    original = sim.carried_over
    try:
        sim.carried_over = lambda *args: {}
        before = _errors(sim.replay(job))
    finally:
        sim.carried_over = original
    if worst_before is None:  # the device step moved as a whole
        np.testing.assert_allclose(before, after, atol=1e-4)
    else:
        assert before.max() > worst_before


def test_a_gpu_rank_is_timed_from_its_device_step():
    """MI300 DDP rank 0: the CPU issues each step about 30 ms before the device runs it
    (the raw ``ProfilerStep#N`` CPU ranges against the device's ``gpu_user_annotation``
    markers, one every 19.0 ms). A step's wall-clock time is its device step, not the
    50 ms from its first CPU record to its last kernel: the replay times it from that
    start, and misses by at most 2.5% (0.45 ms) of 19 ms."""
    import gzip
    import json

    raw = json.loads(gzip.decompress(need(MI300).read_bytes()))["traceEvents"]
    marks = {
        (e["cat"], e["name"]): e["ts"]
        for e in raw
        if e.get("name", "").startswith("ProfilerStep#")
        and e.get("cat") in ("user_annotation", "gpu_user_annotation")
    }
    cpu = sorted(t for (c, _), t in marks.items() if c == "user_annotation")
    gpu = sorted(t for (c, _), t in marks.items() if c == "gpu_user_annotation")
    assert all(g - c > 25_000 for c, g in zip(cpu, gpu, strict=True))  # µs: CPU ahead
    period = (gpu[-1] - gpu[0]) / (len(gpu) - 1) / 1e6
    job = detect.load([MI300])
    steps = _complete(sim.replay(job))
    spans = sim.spans_of(job, job.ranks[0])
    assert [s["iteration"] for s in steps] == [15, 16, 17]
    for s in steps:
        begin, end = spans[s["iteration"]]
        assert s["wall"] == pytest.approx((end - begin) / 1e9, abs=1e-6)
        assert s["wall"] == pytest.approx(period, rel=0.03)
        assert abs(s["wall_error"]) < 0.03 and s["cover"] > 0.95
    assert np.median([s["wall"] for s in steps]) < 0.02  # not the 48-53 ms of the records


MERGED_GPU = (
    SHARED
    / "public"
    / "external"
    / "tf1_timeline_ikhlestov"
    / "GPU"
    / "timeline_03_merged_5_runs.json"
)


def _judged(document: dict) -> tuple[np.ndarray, np.ndarray]:
    """(|wall|, |busy|) errors of the complete steps."""
    steps = _complete(document)
    return (
        np.array([abs(s["wall_error"]) for s in steps]),
        np.array([abs(s["replay_error"]) for s in steps]),
    )


def _per_step_shape(compiled, steps):
    """`rank_shape` as it was: nothing dropped rank-wide, no pool wider than its step."""
    none = np.zeros(len(compiled.src), dtype=bool)
    return none, np.ones(len(compiled.resources), np.int64), none


@pytest.mark.parametrize(
    ("name", "before", "after"),
    [
        # (median wall, worst wall, worst busy) without the rank's shape -> bounds with it
        ("tf/cnn_ps_ingraph", (0.042, 0.09, 0.13), (0.04, 0.10, 0.07)),
    ],
)
def test_the_ranks_shape_removes_the_tf_error(name, before, after, replays, monkeypatch):
    """A device that ran two ops at once in one step (TF's inter-op pool) but one in the
    others was chained in those only; an edge dropped only in the steps that contradict
    it made a node's wait long in one step and short in the others. Taken over the rank
    (edge dropped in every step, pool at its widest in every step), cnn in-graph goes
    from 5.1% median, 14.4% worst busy error to 3.7% / 6.3%. Measured as it was added:
    before the shared core (`test_host.py`) and the shared links. (Without the rank's
    shape a pool that ran one op at a time in a step is a chain there, and since an op
    slotted into a chain's gap fills it (`usual_predecessors`) that replay reads 4.3%
    median, 14.4% busy worst: the shape still removes most of it.) (It took the TF1 GPU
    merged file from 5.0% / 58.9% to 3.4% / 3.7% while its nodes were timed by their
    kernels; read as launches and kernels, no step contradicts its DAG: below.)"""
    monkeypatch.setattr(sim.host, "one_core", lambda job, frame: None)
    without_links(monkeypatch)
    if name in replays:
        job = replays[name][0]
    else:
        pytest.skip(f"{RUNS[name][0]} is not available")
    document = sim.replay(job)
    wall, busy = _judged(document)
    assert len(wall) >= 4
    assert np.median(wall) < after[0] and wall.max() < after[1] and busy.max() < after[2]
    original = sim.rank_shape
    try:
        sim.rank_shape = _per_step_shape
        old_wall, old_busy = _judged(sim.replay(job))
    finally:
        sim.rank_shape = original
    assert np.median(old_wall) > before[0] and old_wall.max() > before[1]
    assert old_busy.max() > before[2]
    assert np.median(old_wall) > np.median(wall) + 0.005 and old_busy.max() > 2 * busy.max()


def test_own_overheads_reproduce_each_tf_step_with_the_ranks_shape():
    """The rank-wide shape only drops edges and widens pools: with each step's own
    overheads the replay still reproduces every step of the TF1 GPU merged file, whose
    executor runs up to three launches at once."""
    job = detect.load([need(MERGED_GPU)])
    frame = sim._frame(job)
    for rank in job.ranks:
        compiled = sim.compile_graph(job.graphs[rank])
        rows = frame[frame["rank"] == rank]
        oracle = sim.mean_of_runs(job.graphs[rank], rows)
        models = sim._step_models(compiled, rows, oracle, sim.spans_of(job, rank), pools=True)
        dropped, width, _always = sim.rank_shape(
            compiled, [g for _, g in rows.groupby("iteration")]
        )
        assert not dropped.any() and width.max() == 3  # the GPU's executor: three threads
        _assert_each_step_replays_itself(compiled, models)


def _assert_each_step_replays_itself(compiled, models) -> None:
    """Each step, replayed with its own overheads, ends at its own recorded span (1%)."""
    for _rows, span, model in models.values():
        ticks = sim.to_ticks(model.seconds)
        arrays = sim._arrays(model.compiled, model.priority, (), model.cap)
        _, start, _ = sim._kernel(arrays, ticks, sim._draws(0, [0], len(ticks)), True)
        n = len(compiled.names)
        end = (start[0][:n] + ticks[:n]).max() / sim.TICKS_PER_SECOND + model.tail
        assert end == pytest.approx((span[1] - span[0]) / 1e9, rel=0.01)


def test_a_step_its_records_barely_cover_lends_no_overheads():
    """The TF1 GPU merged file's first run is a 114 ms warm-up: the launch of
    `layer_1/fully_connected/MatMul` took 112 ms of it (cuBLAS starting). Its records
    cover it, so it is judged and lends its waits. Without that launch's record (as when
    a node was timed by its kernels alone) its records cover 1% of it: what it spent
    its time on is not in the trace, and its waits (up to 112 ms) would be typical of
    nothing, so it lends none."""
    job = detect.load([need(MERGED_GPU)])
    frame = sim._frame(job)
    rank = job.ranks[0]
    compiled = sim.compile_graph(job.graphs[rank])
    rows = frame[frame["rank"] == rank]
    oracle = sim.mean_of_runs(job.graphs[rank], rows)
    spans = sim.spans_of(job, rank)
    models = sim._step_models(compiled, rows, oracle, spans, pools=True)
    assert sim.covered_steps(models) == {0, 1, 2, 3, 4}
    launch = (rows["iteration"] == 0) & (rows["op"] == "layer_1/fully_connected/MatMul")
    assert rows.loc[launch, "duration"].item() > 0.1e9
    models = sim._step_models(compiled, rows[~launch], oracle, spans, pools=True)
    assert sim.covered_steps(models) == {1, 2, 3, 4}


MI300 = SHARED / "public/external/tracelens_mi300_resnet_ddp8/resnet_act_checkpoint.json.gz"


def _edges_out_of_collectives(job, rank: str) -> list[tuple[str, str]]:
    graph = job.graphs[rank]
    names = list(graph.ops)
    pairs = zip(graph.src.tolist(), graph.dst.tolist(), strict=True)
    return [(names[u], names[v]) for u, v in pairs
            if names[u].startswith("net/") and not names[v].startswith("net/")]  # fmt: skip


def test_a_device_collective_is_waited_for_by_a_kernel_not_by_the_cpu():
    """On the MI300 DDP rank (RCCL) the CPU issues the optimizer's `_foreach_add_`
    23-29 ms before the all-reduce it waits for runs on the device, in every step: the
    CPU does not wait, the optimizer's first kernel does. Every edge out of a collective
    goes to a device op, and no step runs one against its edge. On a gloo rank the
    collective runs on a CPU thread and the CPU op waits, as before."""
    job = detect.load([need(MI300)])
    rank = job.ranks[0]
    out = _edges_out_of_collectives(job, rank)
    assert len(out) == 7
    assert all(v.startswith("gpu2/stream0/") for _, v in out)
    assert ("net/all_reduce#1", "main/aten::_foreach_add_#0") not in out
    assert any("multi_tensor_apply_kernel" in v for u, v in out if u == "net/all_reduce#1")
    rows = job.trace.of(rank)
    checked = 0
    for _, group in rows.groupby("iteration"):
        start = dict(zip(group["op"], group["start"], strict=True))
        end = dict(zip(group["op"], group["start"] + group["duration"], strict=True))
        for u, v in out:
            if u in start and v in start:
                assert end[u] <= start[v], (u, v)
                checked += 1
    assert checked == 3 * len(out)
    gloo = detect.load([RESNET_IN_REPO])
    cpu_out = _edges_out_of_collectives(gloo, gloo.ranks[0])
    assert cpu_out and any(v.startswith("main/") for _, v in cpu_out)


def test_a_collective_known_by_its_cpu_call_alone_waits_for_no_kernel():
    """HTA's ns trace records no NCCL kernel: each collective is its CPU call (a 20 us
    ``nccl:all_reduce`` annotation), made 80 ms before the GPU, two steps behind, runs
    the kernels launched ahead of it. An edge from such a kernel to the call was
    contradicted by every step, and the CPU-recorded broadcast's by four of five (the
    causes of steps 102-105 named it). No edge joins a kernel to such a collective."""
    job = detect.load([need(NS_TRACE)])
    graph = job.graphs[job.ranks[0]]
    names = list(graph.ops)
    pairs = zip(graph.src.tolist(), graph.dst.tolist(), strict=True)
    into = [(names[u], names[v]) for u, v in pairs if names[v].startswith("net/")]
    assert {v for _, v in into} >= {"net/all_reduce#0", "net/broadcast#0"}
    assert not any(u.startswith("gpu") for u, _ in into)


TF1_GPU_MERGED = (
    SHARED / "public/external/tf1_timeline_ikhlestov/GPU" / "timeline_03_merged_5_runs.json"
)


def _with_edges(job, extra):
    """`job` with the `extra` (u, v) data edges added to its one rank's DAG."""
    (rank,) = job.ranks
    graph = job.graphs[rank]
    edges = [*graph.edges(), *((u, v, "data") for u, v in extra)]
    return dataclasses.replace(job, graphs={rank: build_graph(graph.ops.values(), edges)})


def test_no_step_of_the_tf1_gpu_timeline_contradicts_its_dag():
    """A GPU node of a TF timeline is its launch on the device's executor and its
    kernels on their streams: a consumer's launch follows the producer's launch, and
    its kernels the producer's kernels. Read as one op timed by its kernels, the DAG
    was contradicted by the trace in every step (`GradientDescent` ran before the
    `ApplyGradientDescent` kernels it depends on, launched but queued on the stream) and
    17 more edges in some steps; now in none."""
    job = detect.load([need(TF1_GPU_MERGED)])
    (rank,) = job.ranks
    compiled = sim.compile_graph(job.graphs[rank])
    rows = sim._frame(job)
    dropped, _width, always = sim.rank_shape(
        compiled, [g for _, g in rows[rows["rank"] == rank].groupby("iteration")]
    )
    assert not dropped.any() and not always.any()
    (replayed,) = sim.replay(job)["ranks"]
    assert not any("contradicted" in s["cause"] for s in replayed["steps"])
    # all five steps judged (the warm-up's 112 ms launch is a record of it): 0.72% median,
    # 4.54% worst (busy 2.42% / 3.58%), within #16's targets; 0.81% / 5.83% (busy 3.87%)
    # before a kernel slotted into a stream's gap filled it (below) and the copies of fed
    # tensors led to their consumers (test_tf_timeline.py); 3.5% / 3.7% on steps 1-4 as
    # one op per node
    wall, busy = _judged({"ranks": [replayed]})
    assert len(wall) == 5 and np.median(wall) < 0.01 and wall.max() < 0.05
    assert np.median(busy) < 0.03 and busy.max() < 0.0375


def test_a_kernel_slotted_into_a_stream_gap_fills_the_gap(monkeypatch):
    """In every step of the TF1 GPU timeline the compute stream waits 45-98 us between
    `SoftmaxCrossEntropyWithLogits`'s kernels #4 and #5, all of them launched (the
    node's executor record has ended). In step 1 `Mean_grad/truediv`'s kernel ran in
    that gap, 43 us after #4, and #5 3 us after it. With #5's wait taken from its lane
    predecessor, the replay put the other steps' 57 us after truediv's kernel, which it
    ran after #4: 8-12 us more. #5's wait now runs from its usual predecessor, #4 (and
    is measured so in every step): step 1 +0.87% -> +0.37% (+5.83% -> +5.33% before the
    copies of fed tensors led to their consumers)."""
    job = detect.load([need(TF1_GPU_MERGED)])
    (rank,) = job.ranks
    compiled = sim.compile_graph(job.graphs[rank])
    rows = sim._frame(job)
    steps = {it: g for it, g in rows[rows["rank"] == rank].groupby("iteration")}
    softmax = [compiled.index[kernel_name("SoftmaxCrossEntropyWithLogits", k)] for k in (4, 5)]
    truediv = compiled.index[kernel_name("gradients/Mean_grad/truediv", 0)]

    def before(it: int, op: int) -> int:
        """The op that ran just before `op` on its stream in step `it`."""
        frame, idx = sim.op_rows(compiled, steps[it])
        mine = np.flatnonzero(compiled.res[idx] == compiled.res[op])
        order = idx[mine][np.argsort(frame["start"].to_numpy()[mine], kind="stable")]
        return int(order[list(order).index(op) - 1])

    assert before(1, softmax[1]) == truediv and before(1, truediv) == softmax[0]
    assert all(before(it, softmax[1]) == softmax[0] for it in (0, 2, 3, 4))
    usual = sim.usual_predecessors(
        compiled,
        (
            {"start": g["start"].to_numpy(), "idx": sim.op_rows(compiled, g)[1]}
            for g in steps.values()
        ),
    )
    assert usual[softmax[1]] == softmax[0]

    replayed_steps = []
    replay_step = sim.replay_step

    def keep(model, seed=0):
        start, ticks = replay_step(model, seed)
        replayed_steps.append((model, start, ticks))
        return start, ticks

    monkeypatch.setattr(sim, "replay_step", keep)

    def step1() -> tuple[float, float, float]:
        """Step 1's wall-clock error, and #5's replayed start less its lent overhead,
        counted from #4's and from truediv's replayed end (us)."""
        replayed_steps.clear()
        (replayed,) = sim.replay(job)["ranks"]
        error = next(s["wall_error"] for s in replayed["steps"] if s["iteration"] == 1)
        model, start, ticks = replayed_steps[1]  # steps 0..4 in order
        us = 1e6 / sim.TICKS_PER_SECOND
        end = (start + ticks) * us
        begin = start[softmax[1]] * us
        assert end[softmax[0]] < end[truediv] <= begin  # truediv's kernel ran in the gap
        waited_from = begin - model.overhead[softmax[1]] * 1e6
        return error, waited_from - end[softmax[0]], waited_from - end[truediv]

    error, from_4, from_truediv = step1()
    assert from_4 == pytest.approx(0, abs=0.5)  # #5 waits its overhead after #4
    monkeypatch.setattr(sim, "usual_predecessors", lambda c, _steps: np.full(len(c.names), -1))
    old_error, _, old_from_truediv = step1()
    assert old_from_truediv == pytest.approx(0, abs=0.5)  # ... not after truediv's kernel
    assert 0 < error < old_error - 0.004  # 0.87% -> 0.37% (5.83% -> 5.33% without copy edges)


def test_an_edge_every_step_contradicts_is_no_cause_of_a_step(monkeypatch):
    """An edge from the `ApplyGradientDescent` kernel to `GradientDescent` (TensorFlow's
    executor runs it once the kernels it depends on are launched, not run) is
    contradicted by every step of the TF1 GPU timeline: the rank's shape (dropped in every
    step), no gap of one step, so no cause names it; free to name it, the causes of
    four of the five steps did. An edge only some steps contradict still is named
    (`Mean_grad/truediv`'s kernel -> the launch of `Reshape_2_grad/Reshape`, which runs
    once `truediv` is launched: steps 1-4, not the warm-up). No cause of the MI300 DDP
    or the ns trace names a contradicted edge: their collectives' edges are the ones the
    device keeps."""
    apply = "GradientDescent/update_layer_1/fully_connected/weights/ApplyGradientDescent"
    every = (kernel_name(apply, 0), "GradientDescent")
    some = (kernel_name("gradients/Mean_grad/truediv", 0), "gradients/Reshape_2_grad/Reshape")
    job = _with_edges(detect.load([need(TF1_GPU_MERGED)]), [every, some])
    rank = job.ranks[0]
    compiled = sim.compile_graph(job.graphs[rank])
    rows = sim._frame(job)
    _dropped, _width, always = sim.rank_shape(
        compiled, [g for _, g in rows[rows["rank"] == rank].groupby("iteration")]
    )
    shape = [f"DAG edge {compiled.names[u]} -> {compiled.names[v]} contradicted"
             for u, v in zip(compiled.src[always], compiled.dst[always], strict=True)]  # fmt: skip
    assert shape == [f"DAG edge {every[0]} -> {every[1]} contradicted"]
    (replayed,) = sim.replay(job)["ranks"]
    causes = {s["iteration"]: s["cause"] for s in replayed["steps"]}
    assert sorted(causes) == [0, 1, 2, 3, 4]
    assert not any(c.startswith(shape[0]) for c in causes.values())
    named = {it for it, c in causes.items() if c.startswith(f"DAG edge {some[0]} -> {some[1]}")}
    assert named == {1, 2, 3, 4}
    unshaped = sim.rank_shape

    def without_shape(*args, **kwargs):
        dropped, width, every = unshaped(*args, **kwargs)
        return dropped, width, np.zeros_like(every)

    monkeypatch.setattr(sim, "rank_shape", without_shape)
    (free,) = sim.replay(job)["ranks"]
    named = [s["cause"].startswith(shape[0].removesuffix(" contradicted")) for s in free["steps"]]
    assert sum(named) >= 3
    monkeypatch.undo()
    for path, steps in ((MI300, 3), (NS_TRACE, 5)):
        (other,) = sim.replay(detect.load([need(path)]))["ranks"]
        texts = [other["cause"], *(s[k] for s in other["steps"] for k in ("cause", "cpu_cause"))]
        assert len(texts) == 1 + 2 * steps and not any("contradicted" in t for t in texts)


DF_INDEX = HTA / "df_index_resolver" / "df_index_resolver.json.gz"


@pytest.mark.parametrize(
    ("path", "worst_before", "worst_after", "busy_after"),
    [(NS_TRACE, 0.05, 0.01, 0.001), (DF_INDEX, 0.015, 0.01, 0.01)],
)
def test_a_thread_starts_when_the_main_thread_hands_it_work(
    path, worst_before, worst_after, busy_after, monkeypatch
):
    """Autograd's engine thread starts the backward once the main thread's `backward()`
    has seeded the gradient (`aten::ones_like`): without that edge its first op waited
    from the step's start for as long as the forward took in the other steps (HTA ns
    trace: `DivBackward1` 14.4 ms in step 101, 38.3 ms in the others; +7.0% wall). With
    it the ns steps replay within 0.1%, df_index_resolver within 0.8%. (Their busy time is
    the device's, whose kernels keep their own durations either way; counted over the
    CPU's records too, the ns trace's was -14.7% without the edge.)"""
    from planner.ingest import kineto_dag

    job = detect.load([need(path)])
    graph = job.graphs[job.ranks[0]]
    names = list(graph.ops)
    frame = sim._frame(job)
    to_thread = [
        (names[u], names[v])
        for u, v in zip(graph.src.tolist(), graph.dst.tolist(), strict=True)
        if graph.ops[names[u]].resource == "main"
        and graph.ops[names[v]].resource not in ("main",)
        and "stream" not in graph.ops[names[v]].resource
        and not graph.ops[names[v]].is_transfer
    ]
    assert any("autograd::engine::evaluate_function" in v for _, v in to_thread)
    for u, v in to_thread:  # each is the first op of its thread, after u began
        for _, rows in frame.groupby("iteration"):
            at = rows.set_index("op")["start"]
            if u in at and v in at:
                assert at[u] <= at[v]
                lane = rows[rows["op"].map(lambda o: graph.ops[o].resource)
                            == graph.ops[v].resource]  # fmt: skip
                assert lane["start"].min() == at[v]
    document = sim.replay(job)
    busy = max(abs(s["replay_error"]) for s in _complete(document))
    assert _errors(document).max() < worst_after and busy < busy_after
    empty = np.zeros(0, dtype=np.int64)
    monkeypatch.setattr(kineto_dag, "thread_start_edges", lambda *args: (empty,) * 3)
    old = sim.replay(detect.load([need(path)]))
    assert _errors(old).max() > worst_before


LINEAR = SHARED / "public/param/et_replay/tests/inputs/linear_kineto.json.gz"


def test_a_thread_that_ran_its_ops_faster_ran_its_gaps_faster(monkeypatch):
    """`param/linear_kineto` iteration 1 ran its ops faster than the others did, and
    the gaps between them (Python, the dispatcher: each thread's own work) with them:
    autograd's thread at 0.72 of its typical op time, the main thread at 0.86. With the
    other steps' gaps as they are the replay missed it by +4.7%. Scaled by each CPU
    thread's speed (median per-op ratio) it replays within 2%; the GPU stream is not
    scaled, nor, on a GPU rank, the slower steps (iteration 10, 48 ms against 24 ms:
    its CPU ops waited inside for the device)."""
    job = detect.load([need(LINEAR)])
    document = sim.replay(job)
    by_step = {s["iteration"]: s for s in _complete(document)}
    assert abs(by_step[1]["wall_error"]) < 0.02 and abs(by_step[2]["wall_error"]) < 0.02
    errors = _errors(document)
    assert np.median(errors) < 0.01 and errors.max() < 0.05

    frame = sim._frame(job)
    rank = job.ranks[0]
    compiled = sim.compile_graph(job.graphs[rank])
    rows = frame[frame["rank"] == rank]
    oracle = sim.mean_of_runs(job.graphs[rank], rows)
    models = {it: m for it, (_, _, m) in sim._step_models(compiled, rows, oracle, None).items()}
    factors = sim.thread_speeds(compiled, models)
    lane = np.array(compiled.resources)[compiled.res]
    gpu = np.char.startswith(lane.astype(str), "gpu")
    assert all((f <= 1).all() and (f[gpu] == 1).all() for f in factors.values())
    assert 0.7 < factors[1][lane == "python.0"].max() < 0.75
    assert 0.8 < factors[1][lane == "main"].max() < 0.9 and (factors[10] == 1).all()

    def ones(compiled, models, lenders=None):  # no thread scaled
        return {it: np.ones(len(compiled.names)) for it in models}

    monkeypatch.setattr(sim, "thread_speeds", ones)
    before = {s["iteration"]: s for s in _complete(sim.replay(job))}
    assert before[1]["wall_error"] > 0.04


def test_a_thread_that_ran_its_ops_slower_ran_its_gaps_slower(replays, monkeypatch):
    """The CPU loader loop recorded here (`traces/torch/cpu_dataloader/steps.json.gz`,
    ``ProfilerStep#N``, 7 ms steps on this 2-core VM): in step 7 the main thread's ops
    ran at 1.27x their typical time and its gaps at 1.38x (a host stall). With the
    other steps' gaps as they are, the replay missed the step by -6.3%; scaled by the
    thread's speed it replays within 2%, as every step does. The speed is capped at
    `MAX_SLOWDOWN`: resnet DDP's step 5 ran its ops at 5.5-6.3x (waits inside them)
    and its gaps at 1.5-2.3x, and uncapped the trace's worst step missed by 4.6%."""
    job = detect.load([REPO / "traces/torch/cpu_dataloader/steps.json.gz"])
    steps = {s["iteration"]: s for s in _complete(sim.replay(job))}
    assert len(steps) == 10 and max(abs(s["wall_error"]) for s in steps.values()) < 0.02

    def faster_only(compiled, models, lenders=None):  # the slower steps not scaled
        return {it: np.minimum(f, 1.0) for it, f in speeds(compiled, models, lenders).items()}

    speeds = sim.thread_speeds
    monkeypatch.setattr(sim, "thread_speeds", faster_only)
    before = {s["iteration"]: s for s in _complete(sim.replay(job))}
    assert before[7]["wall_error"] < -0.05
    monkeypatch.undo()

    if "torch/resnet_ddp" not in replays:
        pytest.skip(f"{RUNS['torch/resnet_ddp'][0]} is not available")
    ddp, capped = replays["torch/resnet_ddp"]
    monkeypatch.setattr(sim, "MAX_SLOWDOWN", math.inf)
    uncapped = sim.replay(ddp)
    assert _errors(capped).max() < 0.015 and _errors(uncapped).max() > 0.04


def _step(document: dict, rank: str, iteration: int) -> dict:
    ranks = {r["rank"]: r for r in document["ranks"]}
    return next(s for s in ranks[rank]["steps"] if s["iteration"] == iteration)


def test_the_cause_is_a_wait_on_the_critical_path(replays, monkeypatch):
    """The cause names the wait that moved the step, not the largest wait anywhere: in
    cnn worker0 step 3 a recv was answered 10.2 ms after the step began (0.002 ms
    typically) while the step waited for other tensors, off its critical path; the
    step lost its time to `Conv2D_6_grad/Conv2DBackpropInput`, which waited 5.2 ms
    (0.96 ms typically) on the path. Where a recv does hold the step (worker1 step 4,
    all its recvs answered 5 ms late), the recv is named. (Replayed as before the shared
    core, which brings both steps within 1% of the measured: `test_host.py`.)"""
    if "tf/cnn_ps_ingraph" not in replays:
        pytest.skip(f"{RUNS['tf/cnn_ps_ingraph'][0]} is not available")
    monkeypatch.setattr(sim.host, "one_core", lambda job, frame: None)
    job = replays["tf/cnn_ps_ingraph"][0]
    document = sim.replay(job)
    step3 = _step(document, "worker0", 3)["cause"]
    assert step3.startswith("tower0/gradients/tower0/Conv2D_6_grad/Conv2DBackpropInput waited")
    assert _step(document, "worker1", 4)["cause"].startswith("recv:tower1/Conv2D/ReadVariableOp")

    # the largest wait difference anywhere in the step was the late recv, off the path
    def nowhere(traced, *_, **__):
        return np.zeros(len(traced.overhead), bool)

    monkeypatch.setattr(sim, "_critical", nowhere)
    anywhere = _step(sim.replay(job), "worker0", 3)["cause"]
    assert anywhere.startswith("recv:tower0/add/ReadVariableOp waited 10.2 ms")
    # it spread the step's work, though: the cause of the step's busy time
    busy = _step(document, "worker0", 3)["busy_cause"]
    assert busy.startswith("recv:tower0/add/ReadVariableOp waited 10.2 ms")


def _answers_after_the_sender(path) -> tuple[int, int]:
    """(RecvTensor records whose tensor's sending op has a record, those of them that
    start before that op ended) in one RunMetadata file."""
    run = tfr.parse_run_metadata(path.read_bytes(), path)
    ends = {
        (d.device, n.node_name): n.all_start_micros + n.all_end_rel_micros
        for d in run.step_stats.dev_stats
        for n in d.node_stats
        if n.node_name != "RecvTensor"
    }
    sender = {
        n.attr["tensor_name"].s.decode(): (n.device, split_input(n.input[0])[0])
        for g in run.partition_graphs
        for n in g.node
        if n.op == "_Send" and n.input
    }
    total = early = 0
    for d in run.step_stats.dev_stats:
        for n in d.node_stats:
            label = tfr._LABEL.match(n.timeline_label) if n.node_name == "RecvTensor" else None
            end = ends.get(sender.get(label["edge"], ("", ""))) if label else None
            if end is not None:
                total += 1
                early += n.all_start_micros < end
    return total, early


def test_a_recvtensor_record_starts_when_the_sender_answered():
    """TensorFlow's gRPC client logs a RecvTensor from the time the sender began its
    answer (`send_start_micros`: request there and tensor produced), not from the
    request: no record of the generated TF traces starts before the op producing its
    tensor ended, though the PS asks for every gradient at the step's start. A late
    record is a late answer, which no graph edge explains (no `_Recv` has an input)."""
    files = [p for run in TF_RUNS.values() for d in run for p in sorted(need(d).glob("*.pb"))]
    files = [p for p in files if p.name.startswith("run_metadata")]
    counts = np.array([_answers_after_the_sender(p) for p in files])
    assert len(files) == 15 and counts[:, 0].sum() > 800
    assert counts[:, 1].sum() == 0
    for p in files:
        run = tfr.parse_run_metadata(p.read_bytes(), p)
        recvs = [n for g in run.partition_graphs for n in g.node if n.op == "_Recv"]
        assert recvs and not any(n.input for n in recvs)


def test_an_op_whose_predecessor_ran_before_the_step_starts_where_it_typically_does(
    replays, monkeypatch
):
    """cnn worker0 step 3: the PS read of `add` ended before the worker's first record,
    so the step holds no record of it, and its recv (answered 10.2 ms into the step,
    10.3 ms long) had no ready time but the step's start. Its typical wait after the
    read (2 us) replayed it from the step's start, and the step's busy time missed by
    +12.6%. Started where the other steps started it, the step replays within 5%; no
    other step of the job moves."""
    if "tf/cnn_ps_ingraph" not in replays:
        pytest.skip(f"{RUNS['tf/cnn_ps_ingraph'][0]} is not available")
    job, document = replays["tf/cnn_ps_ingraph"]
    assert abs(_step(document, "worker0", 3)["replay_error"]) < 0.05

    def unchanged(compiled, models, overheads, own, lenders=None):
        return dict(overheads)

    monkeypatch.setattr(sim, "orphan_overheads", unchanged)
    before = sim.replay(job)
    assert _step(before, "worker0", 3)["replay_error"] > 0.12
    moved = {
        (r["rank"], s["iteration"])
        for r, r0 in zip(document["ranks"], before["ranks"], strict=True)
        for s, s0 in zip(r["steps"], r0["steps"], strict=True)
        if s["predicted_wall"] != s0["predicted_wall"] or s["predicted"] != s0["predicted"]
    }
    assert moved == {("worker0", 3)}


def _executor_records(path, device: str) -> dict[str, tuple[float, float, float]]:
    """Op -> (scheduled, start, end) in ms of one device's executed ops in a RunMetadata
    file, from TensorFlow's own `scheduled_micros` (when the executor queued the op,
    its inputs done) and `all_start_micros`."""
    run = tfr.parse_run_metadata(path.read_bytes(), path)
    out = {}
    for d in run.step_stats.dev_stats:
        if device in d.device:
            for n in d.node_stats:
                if n.node_name != "RecvTensor" and n.scheduled_micros:
                    end = n.all_start_micros + n.all_end_rel_micros
                    out[n.node_name] = (n.scheduled_micros, n.all_start_micros, end)
    return {k: tuple(v / 1e3 for v in t) for k, t in out.items()}


def test_the_waits_left_are_of_ops_the_executor_had_queued():
    """The two wall-clock misses above 5% (docs/algorithms.md, "What remains") are waits
    of ops TensorFlow's executor had already queued, their inputs done, that no thread
    ran: waits of the host's cores, which no record of the step holds.

    - mlp worker1 step 7: `MatMul_1_grad/tuple/control_dependency_1` was queued when
      its MatMul ended and ran 12.3 ms later, 6.5 ms after worker1's last op before it
      ended: worker1's executor ran nothing meanwhile.
    - cnn worker1 step 6: `Conv2D_3_grad/Conv2DBackpropFilter` was queued with its
      sibling `Conv2DBackpropInput` and ran when the sibling ended, 0.68 ms later, as in
      steps 4 and 5; in steps 3 and 7 the second of the two ran beside the first, from
      3.3-3.9 ms into it (a time slice of the one core, not an order of the graph)."""
    mlp = need(TF / "mlp_ps_betweengraph_sync" / "worker1" / "run_metadata_step7.pb")
    ops = _executor_records(mlp, "job:worker/replica:0/task:1")
    queued, start, _ = ops["gradients/MatMul_1_grad/tuple/control_dependency_1"]
    assert queued == pytest.approx(ops["gradients/MatMul_1_grad/MatMul"][2], abs=0.05)
    assert start - queued == pytest.approx(12.3, abs=0.1)
    before = max(end for _, s, end in ops.values() if s < start)
    assert start - before == pytest.approx(6.5, abs=0.1)

    grad = "tower1/gradients/tower1/Conv2D_3_grad/Conv2DBackprop"
    into = {}
    for step in range(3, 8):
        path = need(TF / "cnn_ps_ingraph" / f"run_metadata_step{step}.pb")
        ops = _executor_records(path, "job:worker/replica:0/task:1")
        first, second = sorted((ops[grad + k] for k in ("Input", "Filter")), key=lambda t: t[1])
        assert abs(first[0] - second[0]) < 0.05  # queued together
        into[step] = second[1] - first[1]
        if step in (4, 5, 6):  # one after the other: when the first ended
            assert second[1] == pytest.approx(first[2], abs=0.02)
    assert 3.3 < into[3] < 3.4 and 3.8 < into[7] < 3.9  # beside it, a time slice in


# Median and worst |error| on the wall clock, worst on the busy time, over the complete
# steps of each run of the TF jobs recorded on this host's kind (traces/tf/record.py),
# pinned so that they cannot regress. Each job was recorded after the rules then set and
# first judged untuned (in the comments). The shared links were then found on
# mlp_ps_ingraph/run2 worker1 step 5, and the PS's records' cover and the orphan rule
# on the CNN's between-graph runs; one link per PS, both ways, was chosen over its two
# ends on 16 more runs (not kept): none of these runs is untuned any more. The link
# shared by connection, not by transfer, was found on the lab's shaped mlp (a plan's
# chained reads, docs/algorithms.md): it moved these pins, the medians down or level on
# all twelve, the worst up on four (cnn in-graph run3 17.10% -> 23.82%, mlp in-graph
# run1 2.44% -> 3.38%, run2 2.26% -> 2.97%, between-graph run2 0.62% -> 0.71%).
TF_RECORDED = {
    "mlp_ps_ingraph/run1": (0.0024, 0.0338, 0.0261),  # untuned: 0.89% / 3.52% / 3.83%
    "mlp_ps_ingraph/run2": (0.0025, 0.0297, 0.0369),  # 0.96% / 9.68% / 9.38%
    "mlp_ps_ingraph/run3": (0.0035, 0.0479, 0.0252),  # 3.32% / 8.05% / 6.89%
    "mlp_ps_betweengraph/run1": (0.0016, 0.0331, 0.0294),  # 0.54% / 3.11% / 3.81%
    "mlp_ps_betweengraph/run2": (0.0014, 0.0071, 0.0488),  # 0.53% / 5.65% / 6.52%
    "mlp_ps_betweengraph/run3": (0.0053, 0.0105, 0.0739),  # 0.80% / 3.64% / 7.13%
    "cnn_ps_ingraph/run1": (0.0072, 0.1401, 0.1458),  # untuned: 1.98% / 15.67% / 11.35%
    "cnn_ps_ingraph/run2": (0.0352, 0.2600, 0.2237),  # 5.48% / 29.46% / 27.93%
    "cnn_ps_ingraph/run3": (0.0303, 0.2382, 0.3368),  # 4.20% / 17.10% / 31.79%
    "cnn_ps_betweengraph/run1": (0.0272, 0.1976, 0.2935),  # 3.86% / 52.02% / 30.00%
    "cnn_ps_betweengraph/run2": (0.0412, 0.1027, 0.1163),  # 3.98% / 18.55% / 15.18%
    "cnn_ps_betweengraph/run3": (0.0328, 0.2255, 0.2131),  # 2.05% / 20.73% / 35.58%
}


@pytest.mark.parametrize("run", sorted(TF_RECORDED))
def test_the_tf_jobs_recorded_here_replay_within_their_pins(run):
    """Each recorded run: 2 workers x 5 steps, complete but one (the CNN in-graph run1's
    worker1 step 6 lacks a PS-side record), replayed within its pins."""
    folder = REPO / "traces" / "tf" / run
    workers = sorted(p for p in folder.iterdir() if p.is_dir()) or [folder]
    steps = _complete(sim.replay(detect.load(workers)))
    assert len(steps) == (9 if run == "cnn_ps_ingraph/run1" else 10)
    wall = np.array([abs(s["wall_error"]) for s in steps])
    busy = np.array([abs(s["replay_error"]) for s in steps])
    median, worst, worst_busy = TF_RECORDED[run]
    assert np.median(wall) <= median + SLACK and wall.max() <= worst + SLACK
    assert busy.max() <= worst_busy + SLACK


# The TF jobs recorded with no process waiting for a core (traces/tf/README.md): 1 ps + 1
# worker in-graph, each server `taskset`-pinned to its own core, intra-op and inter-op 1
# thread, 9 steps traced (3..11). Median and worst |error| on the wall clock, worst on
# the busy time, as bench/bench_replay.py measured them when they were recorded (no rule
# set on them). Over the 36 steps: 1.48% median (within #16's 2%), 10.27% worst (not
# within 5%: the largest misses are a recv or a gradient's send started 1-4 ms late or
# early, waiting on the one inter-op thread that also serves TensorFlow's RPCs, and a
# 1.1 ms stall of every read at cnn run2 step 5's start that nothing recorded explains).
TF_PINNED = {
    "mlp_ps_pinned/run1": (0.0192, 0.0607, 0.0196),
    "mlp_ps_pinned/run2": (0.0167, 0.0633, 0.0209),
    "cnn_ps_pinned/run1": (0.0119, 0.0412, 0.0691),
    "cnn_ps_pinned/run2": (0.0096, 0.1027, 0.0169),
}


def test_the_pinned_tf_jobs_replay_within_their_pins_and_the_median_target():
    """Each pinned run: one worker x 9 steps, all complete, each process on the core
    its meta.json says (`record.py --pin` read every thread's affinity back), replayed
    within its pins; over all 36 steps the wall-clock and busy medians within 2%."""
    wall_all, busy_all = [], []
    for run, (median, worst, worst_busy) in TF_PINNED.items():
        folder = REPO / "traces" / "tf" / run
        meta = json.loads((folder / "meta.json").read_text())
        assert meta["affinity"] == {"ps0": [0], "worker0": [1], "client": [0]}
        assert meta["workers"] == 1 and meta["server_config"] == {"intra_op": 1, "inter_op": 1}
        steps = _complete(sim.replay(detect.load([folder])))
        assert len(steps) == 9 and all(s["overhead_from"] == "other steps" for s in steps)
        wall = np.array([abs(s["wall_error"]) for s in steps])
        busy = np.array([abs(s["replay_error"]) for s in steps])
        assert np.median(wall) <= median + SLACK and wall.max() <= worst + SLACK, run
        assert busy.max() <= worst_busy + SLACK, run
        wall_all.extend(wall)
        busy_all.extend(busy)
    assert np.median(wall_all) <= 0.02 and np.median(busy_all) <= 0.02


def _raw_cover(path) -> tuple[float, float]:
    """(union of every record of a RunMetadata file over its span, the span in ms): all
    its partitions, the worker's ops and transfers and the PS's ops, from the protobuf."""
    run = tfr.parse_run_metadata(gzip.decompress(path.read_bytes()), path)
    spans = sorted(
        (n.all_start_micros, n.all_start_micros + n.all_end_rel_micros)
        for d in run.step_stats.dev_stats
        for n in d.node_stats
    )
    union, (lo, hi) = 0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            union, lo, hi = union + hi - lo, a, b
        else:
            hi = max(hi, b)
    union += hi - lo
    span = max(b for _, b in spans) - spans[0][0]
    return union / span, span / 1e3


def test_a_tf_steps_cover_counts_the_ps_work_of_its_runmetadata():
    """A TF worker's step is covered by every record of its RunMetadata: its own ops and
    transfers and the PS's ops (the joined PS work), not its own alone. A between-graph
    worker waits for the PS between its records (its token, answered once the PS has
    applied both workers' gradients): the PS's records show that wait. Counted with its
    own records alone, 13 of the 30 steps of the small CNN's between-graph runs read as
    covered 25-49% and were excluded as traces that do not say what their time went on;
    each step's cover is the union of its RunMetadata's records (raw protobuf), over
    the step's span where the two spans agree."""
    folder = REPO / "traces" / "tf" / "cnn_ps_betweengraph" / "run3"
    document = sim.replay(detect.load(sorted(p for p in folder.iterdir() if p.is_dir())))
    checked = 0
    for rank in document["ranks"]:
        for step in rank["steps"]:
            raw, span = _raw_cover(
                folder / rank["rank"] / f"run_metadata_step{step['iteration']}.pb.gz"
            )
            assert step["cover"] > 0.5
            if abs(step["wall"] * 1e3 - span) < 0.02 * span:
                assert step["cover"] == pytest.approx(raw, abs=0.015)
                checked += 1
    assert checked >= 8


def test_an_op_with_a_predecessor_left_in_its_step_is_no_orphan():
    """cnn between-graph run1 worker1 step 3: the PS read of `global_step` ended before
    the worker's first record and is left out of the step, but `Read/ReadVariableOp`'s
    other predecessor, the PS's `AssignVariableOp_1`, ran in it, 5 us before it. Taken
    as an orphan, it waited until its typical start, 5.4 ms later than it ran: the step
    replayed +96.9% long. An orphan is an op none of whose predecessors ran in the step."""
    folder = REPO / "traces" / "tf" / "cnn_ps_betweengraph" / "run1"
    document = sim.replay(detect.load(sorted(p for p in folder.iterdir() if p.is_dir())))
    step = _step(document, "worker1", 3)
    assert abs(step["wall_error"]) < 0.25
    assert not step["cause"].startswith("ps0:Read/ReadVariableOp")


def test_a_cause_says_how_much_of_a_tf_wait_was_queued_for_a_core(replays):
    """mlp worker1 step 7's busy time missed by -5.6%: `control_dependency_1` waited
    12.3 ms, all of it queued in TensorFlow's executor with its inputs done
    (`scheduled_micros`, the same figure `test_the_waits_left_are_of_ops_the_executor_had_queued`
    reads from the raw protobuf). The cause, and so the warning beside every
    prediction, says so. A wait the executor did not hold queued (a recv answered late:
    no scheduled time) and a Kineto trace's causes say nothing of a queue."""
    if "tf/mlp_ps_betweengraph_sync" not in replays:
        pytest.skip(f"{RUNS['tf/mlp_ps_betweengraph_sync'][0]} is not available")
    job, document = replays["tf/mlp_ps_betweengraph_sync"]
    cause = _step(document, "worker1", 7)["busy_cause"]
    assert cause.startswith("gradients/MatMul_1_grad/tuple/control_dependency_1 waited 12.3 ms")
    assert cause.endswith(
        "12.3 ms of it queued in TensorFlow's executor with its inputs done: a wait for a "
        "core or a thread"
    )
    queued = rank_meta(job, "worker1")["queued"][7]
    queued = queued["gradients/MatMul_1_grad/tuple/control_dependency_1"]
    assert queued / 1e6 == pytest.approx(12.29, abs=0.01)
    if "tf/cnn_ps_ingraph" in replays:  # worker1 step 4: a recv, answered late
        cnn = replays["tf/cnn_ps_ingraph"][1]
        late = _step(cnn, "worker1", 4)["cause"]
        assert late.startswith("recv:") and "queued" not in late
    torch = replays.get("torch/transformer_ddp")
    if torch is not None:
        assert not any("queued" in s["cause"] for s in _complete(torch[1]))
