"""TicTac §3.2 figures: bounds, efficiency, speedup, and the dedicated-time split."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.ingest import detect
from planner.job.analysis import metrics
from planner.measure.metrics import (
    bounds,
    device_ops,
    efficiency,
    group_sums,
    speedup_bound,
    step_metrics,
)
from planner.model.graph import Op, build_graph
from planner.model.trace import busy_time, dedicated_durations, with_dedicated
from tests.conftest import REPO, SHARED, need

RESNET = REPO / "traces" / "torch" / "resnet_ddp"
HTA_COMPARE = SHARED / "public/HolisticTraceAnalysis/tests/data/trace_compare/test/test.json.gz"


def test_dedicated_durations_share_overlaps_equally():
    # [0,10) [0,4) [5,15) [20,25): 0-4 two ops, 4-5 one, 5-10 two, 10-15 one, 20-25 one.
    starts = np.array([0, 0, 5, 20])
    durations = np.array([10, 4, 10, 5])
    assert dedicated_durations(starts, durations).tolist() == [5.5, 2.0, 7.5, 5.0]
    assert busy_time(starts, durations) == 20


def test_equations_1_to_4_by_hand():
    graph = build_graph(
        [Op("r1", "recv", "net"), Op("r2", "recv", "net"), Op("c1", "compute", "gpu")],
        [("r1", "c1")],
    )
    umax, lmin = bounds({"r1": 2.0, "r2": 3.0, "c1": 4.0}, graph)
    assert (umax, lmin) == (9.0, 5.0)
    assert efficiency(umax, lmin, 5.0) == 1.0
    assert efficiency(umax, lmin, 9.0) == 0.0
    assert efficiency(umax, lmin, 7.0) == pytest.approx(0.5)
    assert speedup_bound(umax, lmin) == pytest.approx(0.8)


def test_step_metrics_by_hand():
    graph = build_graph(
        [Op("r1", "recv", "net"), Op("r2", "recv", "net"), Op("c1", "compute", "cpu")],
        [("r1", "c1")],
    )
    # r1 [0,2) r2 [2,5) on the channel, c1 [2,6) on the cpu, then 4 ns idle, nothing else.
    rows = pd.DataFrame(
        {
            "op": ["r1", "r2", "c1"],
            "start": [0, 2, 2],
            "duration": [2, 3, 4],
            "resource": ["net", "net", "cpu"],
            "dedicated": [2.0, 3.0, 4.0],
        }
    )
    s = step_metrics(graph, "w", 1, rows)
    assert s.makespan == pytest.approx(6e-9)
    assert s.busy_makespan == pytest.approx(6e-9)
    assert s.umax == pytest.approx(9e-9) and s.lmin == pytest.approx(5e-9)
    assert s.efficiency == pytest.approx((9 - 6) / (9 - 5))
    assert s.transfer_order == ("r1", "r2")


intervals = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1000), st.integers(0, 300)), min_size=1, max_size=40
)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_lmin_busy_umax_hold_for_any_observed_step(items):
    """With dedicated times, Lmin <= busy makespan <= Umax, so E lies in [0, 1]."""
    # one transfer among them, so that E applies (without one it is None)
    ops = [
        Op(f"o{i}", "recv" if i == 0 else "compute", f"res{r}") for i, (r, _, _) in enumerate(items)
    ]
    graph = build_graph(ops, [])
    frame = pd.DataFrame(
        {
            "op": [op.name for op in ops],
            "start": [s for _, s, _ in items],
            "duration": [d for _, _, d in items],
            "resource": [op.resource for op in ops],
        }
    )
    frame["dedicated"] = 0.0
    for _, idx in frame.groupby("resource").indices.items():
        frame.loc[frame.index[idx], "dedicated"] = dedicated_durations(
            frame["start"].to_numpy()[idx], frame["duration"].to_numpy()[idx]
        )
    s = step_metrics(graph, "w", 0, frame)
    assert s.lmin <= s.busy_makespan + 1e-15
    assert s.busy_makespan <= s.umax + 1e-15
    assert s.busy_makespan <= s.makespan + 1e-15
    assert 0.0 <= s.efficiency <= 1.0
    per_resource = frame.groupby("resource")
    for _, rows in per_resource:
        total = rows["dedicated"].sum()
        assert total == pytest.approx(
            busy_time(rows["start"].to_numpy(), rows["duration"].to_numpy())
        )


values = st.one_of(
    st.floats(0, 1e12, allow_nan=False),
    st.integers(0, 2**40).map(float),
    st.sampled_from([2.0**53, 2.0**53 + 2, 1e16, float("inf"), 0.1, 1 / 3]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), values), max_size=60))
def test_group_sums_are_pandas_groupby_sums_to_the_bit(rows):
    """`group_sums` (numpy where whole numbers add exactly, else one by one) gives what
    pandas' compensated ``groupby().sum()`` gives, bit for bit: the step figures of the
    metrics stay byte-identical to the pandas path they replace."""
    labels = np.array([g for g, _ in rows], dtype=np.int64)
    numbers = np.array([v for _, v in rows], dtype=np.float64)
    ours = group_sums(numbers, labels, 6)
    theirs = pd.Series(numbers).groupby(labels).sum()
    for label in range(6):
        expected = theirs.get(label, 0.0)
        assert ours[label] == expected or (np.isnan(ours[label]) and np.isnan(expected))


@pytest.mark.parametrize("path", [RESNET, HTA_COMPARE], ids=["resnet_ddp", "hta_gpu"])
def test_step_bounds_are_the_pandas_sums_on_a_real_trace(path):
    """Umax and Lmin of every step of real traces (CPU ranks with nested ops: fractional
    dedicated times; a GPU rank: its device rows) equal, to the bit, the per-resource
    pandas group sums of those rows (`with_dedicated` on the whole spans)."""
    job = detect.load([need(path)])
    frame = with_dedicated(job.trace, job.graphs, transfer_only=False)
    doc = metrics(job)
    fractional = 0
    for step in doc["steps"]:
        graph = job.graphs[step["rank"]]
        device = device_ops(graph)
        rows = frame[(frame["rank"] == step["rank"]) & (frame["iteration"] == step["iteration"])]
        if device is not None:
            rows = rows[[n in device for n in rows["op"]]]
        if not len(rows):  # a step without device work: figures 0 (`step_metrics`)
            assert step["umax"] == step["lmin"] == 0.0
            continue
        fractional += int((rows["dedicated"] % 1 != 0).sum())
        per_resource = rows.groupby("resource")["dedicated"].sum()
        assert step["umax"] == float(per_resource.sum()) / 1e9
        assert step["lmin"] == float(per_resource.max()) / 1e9
    if path == RESNET:  # the compensated path is exercised, not only whole numbers
        assert fractional
