"""Caramel §3.1 figures, transfer windows and stragglers on real traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from planner.allreduce import allreduce_metrics
from planner.analysis import metrics
from planner.ingest.kineto import load_kineto
from planner.metrics import caramel_figures, straggler_times
from tests.conftest import needs

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
GENERATED = SHARED / "generated" / "torch"
DLRM = SHARED / "public/param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"
SMALL = REPO / "traces" / "torch" / "hta_trace_compare_base.json.gz"


def test_hand_computation_on_small_trace():
    """ProfilerStep#1009 of the HTA trace, by hand from its events (µs).

    GPU compute (the device that counts for C): memcpy 9, kernel 5, memcpy 476,
    memset 11, memset 5, memcpy 3, kernel 4, kernel 208, memset 2, and the kernel at
    422491 (4) launched at 365315, inside the step: C = 727, disjoint intervals.
    Network: nccl:all_reduce at 357836, 66 µs, overlapping nothing: N = 66.
    T: step start 265087 to the last op end 422495 = 157408.
    """
    doc = allreduce_metrics(load_kineto([SMALL]))
    step = next(s for s in doc["steps"] if s["iteration"] == 1009)
    assert step["compute"] == pytest.approx(727e-6)
    assert step["network"] == pytest.approx(66e-6)
    assert step["busy_time"] == pytest.approx(793e-6)
    assert step["iteration_time"] == pytest.approx(157408e-6)
    assert step["rho"] == pytest.approx(66 / 727)
    assert step["alpha"] == pytest.approx(0.0)
    assert step["utilization"] == pytest.approx(727 / 793)
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
    rows = pd.DataFrame(
        {
            "rank": ["a", "b", "a", "b", "a"],
            "iteration": [1, 1, 1, 1, 1],
            "op": ["x", "x", "y", "y", "z"],  # z only on one rank: not comparable
            "duration": [5_000, 2_000, 1_000, 4_000, 9_000],
        }
    )
    (row,) = straggler_times(rows).to_dict("records")
    assert row["waits"] == {"a": 3e-6, "b": 3e-6}
    assert row["straggler_time"] == pytest.approx(3e-6)
    assert np.isclose(sum(row["waits"].values()), 6e-6)
