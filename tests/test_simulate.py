"""Simulation: hand-computed makespans, TicTac §3.1 picking, replay error, plans, export."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from conftest import DEMO, MLP_IN_REPO, REPO, SHARED, TF_RUNS, need, run_cli

from planner.errors import InputError
from planner.export.chrome_trace import chrome_trace
from planner.ingest import detect
from planner.job import analysis
from planner.model.arrays import lanes
from planner.model.graph import Op, build_graph
from planner.model.plan import Plan
from planner.prediction import _pyloop, _simkernel
from planner.prediction import event_loop as sim

sys.path.insert(0, str(REPO))  # bench.synthetic


def figure_1a(recv1: float = 1.0, recv2: float = 1.0, op1: float = 1.0, op2: float = 1.0):
    """TicTac Figure 1a: recv1 -> op1 -> op2 <- recv2, one channel, one compute device."""
    ops = [
        Op("recv1", "recv", "worker0<-ps0", param="w1", nbytes=100),
        Op("recv2", "recv", "worker0<-ps0", param="w2", nbytes=200),
        Op("op1", "compute", "cpu"),
        Op("op2", "compute", "cpu"),
    ]
    graph = build_graph(ops, [("recv1", "op1"), ("op1", "op2"), ("recv2", "op2")])
    return graph, {"recv1": recv1, "recv2": recv2, "op1": op1, "op2": op2}


@pytest.mark.parametrize(
    ("times", "good", "bad"),
    [
        # all 1: good = recv1, then recv2 beside op1, op2 -> 3; bad -> 1 + 1 + 1 + 1 = 4
        ((1, 1, 1, 1), 3.0, 4.0),
        # recv1 0-2, recv2 2-3, op1 2-5, op2 5-6 | recv2 0-1, recv1 1-3, op1 3-6, op2 6-7
        ((2, 1, 3, 1), 6.0, 7.0),
        # long recv2 hides op1 in the good order: max(0.5 + 4, 0.5 + 0.25) + 0.5 | 4.5+.25+.5
        ((0.5, 4, 0.25, 0.5), 5.0, 5.25),
    ],
)
def test_figure_1a_by_hand(times, good, bad):
    graph, oracle = figure_1a(*times)
    runs = {
        name: sim.simulate(graph, oracle, priority, samples=5)
        for name, priority in (
            ("good", {"recv1": 0, "recv2": 1}),
            ("bad", {"recv2": 0, "recv1": 1}),
        )
    }
    assert runs["good"].makespan.tolist() == [good] * 5
    assert runs["bad"].makespan.tolist() == [bad] * 5
    start = dict(zip(graph.ops, runs["good"].start, strict=True))
    assert start["recv1"] == 0.0 and start["recv2"] == times[0]
    assert start["op2"] == pytest.approx(good - times[3])


def test_random_order_mixes_both_orders_and_ties_are_random():
    graph, oracle = figure_1a()
    run = sim.simulate(graph, oracle, None, samples=400, seed=3)
    assert set(run.makespan.tolist()) == {3.0, 4.0}
    assert 0.4 < (run.makespan == 3.0).mean() < 0.6
    tied = sim.simulate(graph, oracle, {"recv1": 7, "recv2": 7}, samples=400, seed=3)
    assert 0.4 < (tied.makespan == 3.0).mean() < 0.6


def test_pick_is_lowest_number_or_unprioritized():
    """TicTac §3.1: a free resource draws among the lowest number and the unnumbered."""
    ops = [Op(n, "recv", "net") for n in ("a", "b", "c")]
    graph = build_graph(ops, [])
    compiled = sim.compile_graph(graph)
    seconds = np.ones(3)
    firsts = []
    for seed in range(60):
        result = sim.run(compiled, seconds, {"a": 0, "b": 1}, seed=seed, record=True)
        firsts.append(compiled.names[int(np.argmin(result.start))])
    assert set(firsts) == {"a", "c"}
    for seed in range(20):
        result = sim.run(compiled, seconds, {"a": 0, "b": 1, "c": 2}, seed=seed, record=True)
        assert result.start.tolist() == [0.0, 1.0, 2.0]


def test_control_edges_are_honoured():
    graph, oracle = figure_1a()
    plan = Plan("x", "worker0", {"recv1": 0, "recv2": 1}, ("recv1", "recv2"), (("recv2", "recv1"),))
    run = sim.simulate(graph, oracle, plan, samples=3)
    assert run.makespan.tolist() == [4.0] * 3
    start = dict(zip(graph.ops, run.start, strict=True))
    assert start["recv1"] >= start["recv2"] + 1.0
    cyclic = Plan("x", "worker0", {}, (), (("recv1", "recv2"), ("recv2", "recv1")))
    with pytest.raises(InputError, match="cyclic"):
        sim.simulate(graph, oracle, cyclic)


def test_channels_and_knobs():
    ops = [Op(f"r{i}", "recv", "net", nbytes=10) for i in range(4)] + [Op("c", "compute", "gpu")]
    graph = build_graph(ops, [(f"r{i}", "c") for i in range(4)])
    compiled = sim.compile_graph(graph)
    times = {**{f"r{i}": 1.0 for i in range(4)}, "c": 1.0}
    seconds = sim.op_seconds(compiled, times)
    spans = [sim.run(compiled, seconds, channels=c).makespan[0] for c in (1, 2, 3, 4, 8)]
    assert spans == [5.0, 3.0, 3.0, 2.0, 2.0]
    run = sim.run(compiled, seconds, channels=2, record=True)
    lanes = {(float(s), int(la)) for s, la in zip(run.start[:4], run.lane[:4], strict=True)}
    assert lanes == {(0.0, 0), (0.0, 1), (1.0, 0), (1.0, 1)}
    faster = sim.op_seconds(compiled, times, bandwidth_scale=2, compute_scale=4, latency=0.25)
    assert faster.tolist() == [0.75] * 4 + [0.25]
    assert sim.run(compiled, faster).makespan[0] == 4 * 0.75 + 0.25
    assert sim.bounds(compiled, seconds, sim.capacities(compiled, 2)) == (5.0, 2.0)


def test_determinism_for_a_seed():
    from planner.prediction import comparison as sim

    job = detect.load([DEMO])
    plans = {"tic": analysis.schedule(job, "tic")}
    a = sim.compare(job, plans, samples=20, seed=5, timelines=True)
    b = sim.compare(job, plans, samples=20, seed=5, timelines=True)
    c = sim.compare(job, plans, samples=20, seed=6)
    assert a == b
    base = [r["plans"][0] for r in (a["ranks"][0], c["ranks"][0])]
    assert base[0]["plan"] == "baseline" and base[0]["predicted"] != base[1]["predicted"]


@pytest.mark.skipif(not _simkernel.ACCELERATED, reason="numba not installed")
def test_compiled_and_python_loops_agree():
    """numba's loop, its interpreted form and the Python-list loop (`_pyloop`)."""
    from bench.synthetic import layered_dag

    graph, oracle = layered_dag(6, 9, recvs_per_layer=3, seed=2)
    compiled = sim.compile_graph(graph)
    rng = np.random.default_rng(0)
    priority = np.where(rng.random(len(graph)) < 0.5, rng.integers(0, 5, len(graph)), -1)
    arrays = sim._arrays(compiled, priority, (), sim.capacities(compiled, 2))
    ticks = sim.to_ticks(sim.op_seconds(compiled, oracle))
    rand = sim._draws(1, range(8), len(graph))
    outs = []
    for loop in (_simkernel.compiled(), _simkernel.python_list_schedule, _pyloop.list_schedule):
        start, lane = np.zeros((8, len(graph)), np.int64), np.zeros((8, len(graph)), np.int64)
        makespan, done = np.zeros(8, np.int64), np.zeros(8, np.int64)
        loop(ticks, *arrays, rand, True, start, lane, makespan, done)
        outs.append((start, lane, makespan, done))
    for other in outs[1:]:
        for x, y in zip(outs[0], other, strict=True):
            assert np.array_equal(x, y)
    assert len(set(outs[0][2].tolist())) > 1  # the samples differ


def _generated_runs() -> list[tuple[str, list]]:
    runs = [(f"tf/{name}", paths) for name, paths in TF_RUNS.items()]
    torch = SHARED / "generated" / "torch"
    if torch.exists():
        runs += [(f"torch/{d.name}", [d]) for d in sorted(torch.iterdir()) if d.is_dir()]
    return runs


def _load_or_skip(paths):
    for p in paths:
        need(p)
    try:
        return detect.load(paths)
    except InputError as exc:
        pytest.skip(f"input not readable by this version yet: {exc}")


@pytest.mark.parametrize(("name", "paths"), _generated_runs(), ids=lambda x: str(x))
def test_replay_error_on_every_generated_trace(name, paths, capsys):
    from planner.prediction import comparison as sim

    job = _load_or_skip(paths)
    document = sim.replay(job)
    steps = [s for r in document["ranks"] for s in r["steps"]]
    assert steps, name
    for s in steps:
        assert math.isfinite(s["replay_error"]), (name, s)
        assert s["replay_error"] == pytest.approx(s["predicted"] / s["measured"] - 1)
        assert s["predicted"] > 0 and s["measured"] > 0
    assert math.isfinite(document["replay_error_median"])
    code, out, _ = run_cli(["simulate", *paths, "--samples", "5"], capsys)
    assert code == 0
    assert "replay_error" in out and "replay error on the observed run" in out
    worst = max(steps, key=lambda s: abs(s["replay_error"]))
    assert f"{worst['replay_error'] * 100:+.1f}%" in out


@pytest.mark.parametrize("name", sorted(TF_RUNS))
def test_tac_never_worse_than_the_baseline_mean(name):
    from planner.prediction import comparison as sim

    job = _load_or_skip(TF_RUNS[name])
    plans = {"tac": analysis.schedule(job, "tac")}
    document = sim.compare(job, plans, samples=100, seed=0)
    for rank in document["ranks"]:
        entry = {p["plan"]: p for p in rank["plans"]}
        assert entry["tac"]["predicted"] <= entry["baseline"]["predicted"], rank["rank"]
        assert entry["tac"]["speedup_vs_baseline"] >= 0
        assert 0 <= entry["tac"]["efficiency"] <= 1
        assert rank["lmin"] <= entry["tac"]["min"] <= rank["umax"]


def test_timeline_is_valid_chrome_trace_with_one_event_per_op(tmp_path, capsys):
    paths = MLP_IN_REPO
    out = tmp_path / "timeline.json"
    code, _, _ = run_cli(["simulate", *paths, "--samples", "4", "--timeline", out], capsys)
    assert code == 0
    document = json.loads(out.read_text())
    events = document["traceEvents"]
    job = detect.load(paths)
    listed = document["otherData"]["schedules"]
    assert {s["plan"] for s in listed} == {"measured", "baseline", "observed", "tic", "tac"}
    for schedule in listed:
        mine = [e for e in events if e["pid"] == schedule["pid"]]
        complete = [e for e in mine if e["ph"] == "X"]
        graph = job.graphs[schedule["rank"]]
        if schedule["plan"] != "measured":
            assert sorted(e["args"]["op"] for e in complete) == sorted(graph.ops)
        assert len(complete) == schedule["ops"]
        names = {e["name"]: e["args"] for e in mine if e["ph"] == "M"}
        assert schedule["plan"] in names["process_name"]["name"]
        tracks = {e["tid"] for e in mine if e["name"] == "thread_name"}
        assert {e["tid"] for e in complete} <= tracks
        for e in complete:
            assert e["dur"] >= 0 and e["ts"] >= 0
            if e["args"].get("kind") == "recv":
                assert e["args"]["param"] in e["name"] and f"{e['args']['nbytes']} B" in e["name"]
        by_track: dict[int, list] = {}
        for e in complete:
            by_track.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
        for intervals in by_track.values():  # one op at a time per track
            intervals.sort()
            assert all(a[1] <= b[0] + 1e-6 for a, b in zip(intervals, intervals[1:], strict=False))


def test_chrome_trace_of_a_simulated_run():
    graph, oracle = figure_1a()
    compiled = sim.compile_graph(graph)
    run = sim.run(compiled, sim.op_seconds(compiled, oracle), {"recv1": 0}, record=True)
    schedule = {"plan": "tac", "rank": "w", "timeline": sim.timeline(compiled, run), "graph": graph}
    doc = chrome_trace([schedule])
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 4
    assert {e["name"] for e in complete} == {"recv w1 (100 B)", "recv w2 (200 B)", "op1", "op2"}
    assert doc["otherData"]["schedules"][0]["plan"] == "tac"
    json.loads(json.dumps(doc, allow_nan=False))


def test_sweep_and_cli_json(capsys):
    paths = MLP_IN_REPO
    code, out, _ = run_cli(
        ["simulate", *paths, "--plan", "tac", "--samples", "5", "--json", "--sweep",
         "bandwidth-scale=0.5:2:3", "--channels", "2"],
        capsys,
    )  # fmt: skip
    assert code == 0
    document = json.loads(out)
    assert document["schema"] == "planner.simulation/1"
    assert document["comparison"]["knobs"]["channels"] == 2
    plans = [p["plan"] for p in document["comparison"]["ranks"][0]["plans"]]
    assert plans == ["baseline", "observed", "tac"]
    for rank in document["sweep"]["ranks"]:
        rhos = [p["rho"] for p in rank["points"]]
        assert [p["value"] for p in rank["points"]] == [0.5, 1.25, 2.0]
        assert rhos[0] > rhos[1] > rhos[2]
        base = [p["plans"]["baseline"]["predicted"] for p in rank["points"]]
        assert base[0] > base[2]


@pytest.mark.parametrize(
    "args",
    [["--sweep", "speed=1:2:3"], ["--sweep", "latency=1:2"], ["--samples", "0"]],
)
def test_bad_options_exit_2(args, capsys):
    code, _, err = run_cli(["simulate", DEMO, *args], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1


def _greedy_lanes(resource: np.ndarray, start: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """Greedy interval partitioning, written plainly: in start order per resource, the
    lowest lane whose last interval has ended."""
    out = np.zeros(len(start), dtype=np.int64)
    ends: dict[object, list[float]] = {}
    for i in np.lexsort((start, resource)):
        free = ends.setdefault(resource[i], [])
        lane = next((k for k, last in enumerate(free) if last <= start[i]), len(free))
        if lane == len(free):
            free.append(0.0)
        free[lane], out[i] = start[i] + duration[i], lane
    return out


def test_lanes_are_the_greedy_partition() -> None:
    """`lanes`, which skips its loop on resources where no interval starts before an
    earlier one ended, gives the plain greedy partition: random intervals on resources
    with and without overlap (integer and text resources, zero durations, ties)."""
    rng = np.random.default_rng(7)
    crowded = 0
    for case in range(600):
        n = int(rng.integers(0, 30))
        resource = rng.integers(0, 4, n)
        if case % 3 == 0:
            resource = np.array([f"gpu0/stream{r}" for r in resource.tolist()], dtype=object)
        start = rng.integers(0, 40, n).astype(np.float64)
        duration = rng.integers(0, 9 if case % 2 else 2, n).astype(np.float64)
        got = lanes(resource, start, duration)
        assert got.tolist() == _greedy_lanes(resource, start, duration).tolist()
        crowded += int((got > 0).any())
    assert 100 < crowded < 600  # both paths ran


def test_draws_are_kept_and_equal_fresh_ones() -> None:
    """The replay's random rows are kept between calls (every rank draws the same) and
    are the seeded rows themselves."""
    rows = sim._draws(3, range(5), 7)
    assert sim._draws(3, range(5), 7) is rows
    fresh = np.stack([np.random.default_rng((3, i)).random(7) for i in range(5)])
    assert np.array_equal(rows, fresh)
    assert np.array_equal(sim._draws(3, [4], 7), fresh[4:])
    assert sim._draws(4, range(5), 7)[0, 0] != rows[0, 0]
