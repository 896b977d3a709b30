"""Caramel §3.1 figures, transfer windows and stragglers on real traces."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from planner.ingest.kineto import load_kineto
from planner.job.analysis import metrics
from planner.measure.allreduce import allreduce_metrics
from planner.measure.metrics import caramel_figures
from planner.model.waits import split_waits, straggler_times
from tests.conftest import needs

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
GENERATED = SHARED / "generated" / "torch"
DLRM = SHARED / "public/param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"
SMALL = REPO / "traces" / "torch" / "hta_trace_compare_base.json.gz"


def test_hand_computation_on_small_trace():
    """ProfilerStep#1009 of the HTA trace, by hand from its events (µs).

    The trace is trimmed: of its 18 GPU events on stream 7 only two keep their launch.
    A stream runs in issue order, so the GPU work of step 1009 is the kernel at 422491
    (4 µs, launched at 365315, inside the step's CPU range) and what follows it on the
    stream up to the next launched kernel (539619, launched in step 1010): the kernel at
    422501 (207), memsets at 429325 (1) and 536906 (4), a memcpy at 539474 (4). The 9
    events before 422491 (265125-311209) were issued before profiling: no step.
    C counts compute kernels only (memcpy/memset move data): 4 + 207 = 211.
    N: nccl:all_reduce at 357836, 66 µs (no NCCL kernel in the trace: the record).
    Busy: 211 + 66 = 277, disjoint. T: the step's device work, 357836 to 539478.
    """
    doc = allreduce_metrics(load_kineto([SMALL]))
    step = next(s for s in doc["steps"] if s["iteration"] == 1009)
    assert step["compute"] == pytest.approx(211e-6)
    assert step["network"] == pytest.approx(66e-6)
    assert step["busy_time"] == pytest.approx(277e-6)
    assert step["iteration_time"] == pytest.approx((539478 - 357836) * 1e-6)
    assert step["rho"] == pytest.approx(66 / 211)
    assert step["alpha"] == pytest.approx(0.0)
    assert step["utilization"] == pytest.approx(211 / 277)
    transfer = next(t for t in doc["transfers"] if t["iteration"] == 1009)
    assert transfer["nbytes"] == 4432073 * 4
    assert transfer["duration"] == pytest.approx(66e-6)


def test_caramel_formula_cases():
    # full overlap of the smaller part: utilization = C / max(C, N)
    assert caramel_figures(2.0, 1.0, 2.0) == pytest.approx((0.5, 1.0, 1.0))
    assert caramel_figures(1.0, 2.0, 2.0) == pytest.approx((2.0, 1.0, 0.5))
    # no overlap: T = C + N
    assert caramel_figures(3.0, 1.0, 4.0) == pytest.approx((1 / 3, 0.0, 0.75))
    assert caramel_figures(1.0, 0.0, 1.0) == (0.0, 1.0, 1.0)


@needs(GENERATED)
@pytest.mark.parametrize("run", ["resnet_ddp", "transformer_ddp"])
def test_ranges_and_cross_check_with_efficiency(run):
    job = load_kineto([GENERATED / run])
    doc = allreduce_metrics(job)
    assert doc["schema"] == "planner.allreduce/1"
    assert len(doc["steps"]) == 10
    for s in doc["steps"]:
        assert 0 <= s["alpha"] <= 1 + 1e-9
        assert s["rho"] > 0
        assert 0 < s["utilization"] <= 1
        assert s["busy_time"] <= s["iteration_time"] + 1e-12
        assert s["utilization"] == pytest.approx(s["compute"] / s["busy_time"])
    tictac = {(s["rank"], s["iteration"]): s for s in metrics(job)["steps"]}
    for s in doc["steps"]:
        e = tictac[(s["rank"], s["iteration"])]
        assert 0 <= e["efficiency"] <= 1
        # two resources (the main thread, net) and N < C: E reduces to Caramel's alpha
        if s["network"] < s["compute"]:
            assert e["efficiency"] == pytest.approx(s["alpha"], abs=1e-9)
    # windows: every backward all-reduce of steps 3..6 ends before the next forward
    for t in doc["transfers"]:
        if t["param"].startswith("bucket") and t["iteration"] < 7:
            assert t["window"] > 0
            assert t["ready"] <= t["start"]
            end = t["start"] + t["duration"]
            assert t["slack"] == pytest.approx(t["window"] - (end - t["ready"]))
            assert t["slack"] >= 0  # DDP waits for the gradients before the optimizer
        if t["iteration"] == 7:
            assert t["window"] is None
    assert all(r["distinct_transfer_orders"] >= 1 for r in doc["ranks"])


@needs(DLRM)
def test_dlrm_per_rank_and_stragglers():
    doc = allreduce_metrics(load_kineto([DLRM]))
    assert [r["rank"] for r in doc["ranks"]] == [f"rank{i}" for i in range(8)]
    for r in doc["ranks"]:
        assert r["collectives_per_step"] == 8
        assert 0 < r["utilization_mean"] <= 1
        assert 0 <= r["alpha_mean"] <= 1
    (straggler,) = doc["stragglers"]
    assert straggler["iteration"] == 10 and straggler["collectives"] == 8
    waits = straggler["waits"]
    assert sorted(waits) == [f"rank{i}" for i in range(8)]
    assert straggler["straggler_time"] == max(waits.values()) > 0
    assert waits[straggler["slowest_rank"]] == min(waits.values())
    assert doc["job"]["ranks"] == 8


def test_straggler_time_definition():
    """Per step, each rank's wait is the union of its wait intervals (never more than
    the step); the straggler time is the largest; the others waited for the rank that
    waited least. z runs on one rank only: no peer, no wait."""
    rows = pd.DataFrame(
        {
            "rank": ["a", "b", "a", "b", "a"],
            "iteration": [1, 1, 1, 1, 1],
            "op": ["x", "x", "y", "y", "z"],
            "start": [0, 3_000, 1_000, 500, 20_000],
            "duration": [5_000, 2_000, 3_000, 4_000, 9_000],
            "wait": [3_000, 0, 0, 500, 0],
        }
    )
    (row,) = straggler_times(rows).to_dict("records")
    assert row["waits"] == {"a": 3e-6, "b": 0.5e-6}
    assert row["straggler_time"] == pytest.approx(3e-6)
    assert row["fastest_rank"] == "a" and row["slowest_rank"] == "b"
    # overlapping waits on one rank count once
    rows.loc[2, "wait"] = 2_500  # y on a: [1000, 3500) overlaps x's [0, 3000)
    (row,) = straggler_times(rows).to_dict("records")
    assert row["waits"]["a"] == pytest.approx(3.5e-6)


def test_split_waits_on_shifted_clocks():
    """Two ranks whose clocks differ by 1 ms: the offset is found from the ends, and
    each rank waits from its start until the later rank started."""
    shift = 1_000_000
    rows = pd.DataFrame(
        {
            "rank": ["r0", "r1", "r0", "r1"],
            "iteration": [0, 0, 0, 0],
            "op": ["x", "x", "y", "y"],
            "start": [0, 4_000 + shift, 20_000 + shift // 2 * 0, 21_000 + shift],
            "duration": [10_000, 6_000, 5_000, 4_000],
        }
    )
    wait, alignment = split_waits(rows)
    assert alignment.offsets == {"r0": 0, "r1": shift}
    assert alignment.residual_max == 0
    assert wait.tolist() == [4_000, 0, 1_000, 0]


CPU_ONLY = (
    SHARED
    / "public/HolisticTraceAnalysis/tests/data/cpu_only"
    / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
)


@needs(CPU_ONLY)
def test_a_step_of_collectives_only_has_no_ratios_and_no_traceback():
    """HTA's cpu_only rank 34 (gloo, 300 ranks): its step holds two overlapping
    gloo:all_reduce records (union 178.78 ms, counted from the JSON) and no compute, so
    rho is n/a; the means skip it instead of failing on it."""
    doc = allreduce_metrics(load_kineto([CPU_ONLY]))
    (step,) = doc["steps"]
    assert step["compute"] == 0 and step["network"] == pytest.approx(0.17877742700195313)
    assert step["rho"] is None
    (rank,) = doc["ranks"]
    assert rank["rho_mean"] is None and rank["compute_mean"] == 0


HTA_TEST = SHARED / "public/HolisticTraceAnalysis/tests/data/trace_compare/test/test.json.gz"


@needs(HTA_TEST)
def test_window_ends_are_exact_past_2_to_the_53_ns():
    """A trace whose ns since the epoch pass 2**53 (a float64 no longer holds each ns):
    a transfer's window end, the next step's first forward read (without phases: the
    next step's start) less this step's start, is the exact integer difference, not one
    rounded through float64."""
    job = load_kineto([HTA_TEST])
    timings, spans = job.trace.timings, job.trace.spans
    assert int(timings["start"].max()) > 2**53
    assert not any((job.meta.get("parameters") or {}).values())  # ends: forward reads
    doc = allreduce_metrics(job)
    checked = 0
    for t in doc["transfers"]:
        graph = job.graphs[t["rank"]]
        rows = timings[timings["rank"] == t["rank"]]
        own = spans[spans["rank"] == t["rank"]].set_index("iteration")["start"]
        forward = rows[[graph.ops[n].phase == "forward" for n in rows["op"]]]
        reads = forward.groupby("iteration")["start"].min() if len(forward) else own
        if t["iteration"] + 1 in reads.index:
            exact = int(reads[t["iteration"] + 1]) - int(own[t["iteration"]])
            assert t["window_end"] == exact / 1e9
            checked += 1
        else:
            assert t["window_end"] is None
    assert checked
