"""The replay's list-scheduling loops (`_simkernel`, `_pyloop`): a first sample that never
drew (no resource picked among several ready ops) stands for every row, to the same
schedules as each row run alone; a sample that drew leaves the others to run."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import REPO, RESNET_IN_REPO

from planner.ingest import detect
from planner.prediction import _pyloop, _simkernel
from planner.prediction import event_loop as sim

sys.path.insert(0, str(REPO))  # bench.synthetic

ROWS = 4


def _args(graph, ticks, record, priority=None, channels=1):
    """The kernel's arguments for `graph`: structure arrays, `ROWS` rows of draws (read
    only, as `event_loop.run` hands them) and zeroed outputs."""
    compiled = sim.compile_graph(graph)
    arrays = sim._arrays(compiled, priority, (), sim.capacities(compiled, channels))
    n = len(graph)
    shape = (ROWS, n) if record else (1, 1)
    outs = [np.zeros(shape, np.int64), np.zeros(shape, np.int64)]
    outs += [np.zeros(ROWS, np.int64), np.zeros(ROWS, np.int64)]
    return [ticks, *arrays, sim._draws(0, range(ROWS), n), record, *outs]


def _run(loop, args, **options):
    """(what `loop` returns, its outputs) on `args` with fresh outputs."""
    fresh = [*args[:13], *(np.zeros_like(a) for a in args[13:])]
    return loop(*fresh, **options), fresh[13:]


@pytest.fixture(scope="module")
def resnet_rank():
    """A rank of a DDP job (its streams run their ops in one order) with seeded op times."""
    job = detect.load([RESNET_IN_REPO])
    graph = job.graphs[job.ranks[0]]
    ticks = sim.to_ticks(np.random.default_rng(1).uniform(1e-5, 1e-3, len(graph)))
    return graph, ticks


@pytest.fixture(scope="module")
def layered():
    """A PS worker's DAG with priorities and two channels per link: its samples draw."""
    from bench.synthetic import layered_dag

    graph, oracle = layered_dag(6, 9, recvs_per_layer=3, seed=2)
    compiled = sim.compile_graph(graph)
    rng = np.random.default_rng(0)
    priority = np.where(rng.random(len(graph)) < 0.5, rng.integers(0, 5, len(graph)), -1)
    return graph, sim.to_ticks(sim.op_seconds(compiled, oracle)), priority


def _row_by_row(args):
    """Every row run alone by the interpreted numba loop (one row: nothing to stand for)."""
    out = [np.zeros_like(a) for a in args[13:]]
    for s in range(ROWS):
        one = [*args[:11], args[11][s : s + 1], args[12]]
        parts = [o[s : s + 1] if o.shape[0] == ROWS else o.copy() for o in out[:2]]
        parts += [out[2][s : s + 1], out[3][s : s + 1]]
        _simkernel.python_list_schedule(*one, *parts)
    return out


@pytest.mark.parametrize("record", [False, True])
def test_a_first_sample_that_never_drew_stands_for_every_row(resnet_rank, record):
    graph, ticks = resnet_rank
    args = _args(graph, ticks, record)
    ran, out = _run(_pyloop.list_schedule, args)
    assert ran == (True, len(graph))  # one row run
    expected = _row_by_row(args)
    for got, want in zip(out, expected, strict=True):
        assert np.array_equal(got, want)
    loops = [_simkernel.python_list_schedule]
    loops += [_simkernel.compiled()] if _simkernel.ACCELERATED else []
    for loop in loops:
        for got, want in zip(_run(loop, args)[1], expected, strict=True):
            assert np.array_equal(got, want)
    assert len(set(out[2].tolist())) == 1 and out[3][0] == len(graph)


def test_a_sample_that_drew_leaves_the_rows_to_run(layered):
    graph, ticks, priority = layered
    args = _args(graph, ticks, True, priority, channels=2)
    ran, out = _run(_pyloop.list_schedule, args)
    assert ran == (True, ROWS * len(graph))
    for got, want in zip(out, _row_by_row(args), strict=True):
        assert np.array_equal(got, want)
    assert len(set(out[2].tolist())) > 1  # the samples differ
    # over the budget: the first row only, the others left to the caller (numba)
    ran, partial = _run(_pyloop.list_schedule, args, budget=len(graph))
    assert ran == (False, len(graph))
    assert partial[2][0] == out[2][0] and not partial[2][1:].any()


def test_a_process_handed_many_ranks_loads_the_compiled_loop_after_the_first(monkeypatch):
    """`simulate` per rank tells each replay about how many ranks its process replays
    after it (rank i of n on k processes: (n - 1 - i) // k); the compiled loop is loaded
    where that many more replays like the one just run would pass SMALL_WORK of the
    Python loop, and only then (not twice, not without numba)."""
    from planner.job import parallel

    monkeypatch.setitem(_simkernel._state, "compiled", None)  # the Python loop runs,
    monkeypatch.setitem(_simkernel._state, "python_work", 0)  # whatever ran before it
    seen = []
    monkeypatch.setattr(_simkernel, "load_ahead", lambda work, later: seen.append((work, later)))
    ranks = parallel.rank_inputs([RESNET_IN_REPO])
    parallel.simulate_ranks(ranks, workers=1, samples=4)
    assert [later for _, later in seen] == [1, 0]
    assert all(work > 0 for work, _ in seen)  # each replay's own dispatches

    monkeypatch.undo()
    loads = []
    monkeypatch.setattr(_simkernel, "warm", lambda: loads.append(1))
    monkeypatch.setattr(_simkernel, "ACCELERATED", True)
    monkeypatch.setitem(_simkernel._state, "compiled", None)
    work = _simkernel.SMALL_WORK // 10
    _simkernel.load_ahead(work, 10)  # exactly SMALL_WORK more: the Python loop is as cheap
    assert loads == []
    _simkernel.load_ahead(work, 11)
    assert loads == [1]
    monkeypatch.setitem(_simkernel._state, "compiled", lambda *args: None)
    _simkernel.load_ahead(work, 100)  # loaded already
    monkeypatch.setattr(_simkernel, "ACCELERATED", False)
    monkeypatch.setitem(_simkernel._state, "compiled", None)
    _simkernel.load_ahead(work, 100)  # no numba
    assert loads == [1]
