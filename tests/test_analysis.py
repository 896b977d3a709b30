"""`analysis`: the plans that apply to a job, one Caramel order per job, the full report."""

from __future__ import annotations

import math

import pytest
from conftest import SHARED, need

from planner.ingest import detect
from planner.job import analysis

TORCH = SHARED / "generated" / "torch"


@pytest.fixture(scope="module", params=["resnet_ddp", "resnet_ddp_bucket1mb", "transformer_ddp"])
def torch_job(request: pytest.FixtureRequest):
    return detect.load([need(TORCH / request.param)])


def test_caramel_gives_every_rank_the_same_collective_order(torch_job):
    """gloo/NCCL match collectives by issue order, so ranks must share one order."""
    plans = analysis.schedule(torch_job, "caramel")
    assert sorted(plans) == torch_job.ranks == ["rank0", "rank1"]
    orders = {rank: plan.order for rank, plan in plans.items()}
    assert orders["rank0"] == orders["rank1"]
    collectives = {n for n, op in torch_job.graphs["rank0"].ops.items() if op.kind == "collective"}
    assert set(orders["rank0"]) <= collectives
    assert all(p.inputs["planned_on"] == "rank0" for p in plans.values())


def test_report_of_an_allreduce_job(torch_job):
    report = analysis.analyze(torch_job, samples=20)
    assert analysis.algorithms_for(torch_job) == ["caramel"]
    assert set(report["plans"]) == {"caramel"}
    assert set(report["exports"]) == {"control_deps", "bucket_plan"}
    assert report["metrics"]["allreduce"]["schema"] == "planner.allreduce/1"
    replay = report["simulation"]["replay"]
    errors = [s["replay_error"] for r in replay["ranks"] for s in r["steps"]]
    assert len(errors) == 10 and all(math.isfinite(e) for e in errors)
    observed = {o["rank"]: o for o in report["observed_orders"]}
    assert sorted(observed) == ["rank0", "rank1"]
    for entry in observed.values():
        assert entry["iteration"] in (3, 4, 5, 6, 7)
        assert any("all_reduce" in name for name in entry["order"])


def test_ps_job_gets_tic_and_tac_and_no_caramel():
    job = detect.load([need(SHARED / "generated" / "tf" / "cnn_ps_ingraph")])
    assert analysis.algorithms_for(job) == ["tic", "tac"]
    with pytest.raises(Exception, match="Caramel plans all-reduce collectives"):
        analysis.schedule(job, "caramel")
