"""Plan files written for a PyTorch job bind to the traced model unedited (torch-free).

The real generated DDP runs in ../shared/traces carry, beside the traces, the model's own
parameter table (``meta_rank0.json``: ``named_parameters()`` order, shapes, bytes): the
plan written from the trace must bind every one of them, bucket by bucket, and a plan
from another model must be refused with one line naming the first mismatch.
"""

from __future__ import annotations

import json
from functools import cache

import pytest

from planner.enforce.binding import PlanMismatch, bind
from planner.enforce.plan_file import TransferPlan, parse_plan
from planner.export.caramel_files import bucket_plan_document
from planner.ingest import detect
from planner.job import analysis
from tests.conftest import SHARED, need

RUNS = ("resnet_ddp", "resnet_ddp_bucket1mb", "transformer_ddp")


@cache
def _written(run: str) -> tuple[str, str]:
    """The bucket plan and the priorities file `analyze` writes for a run (JSON text)."""
    job = detect.load([need(SHARED / "generated" / "torch" / run)])
    plans = analysis.schedule(job, "caramel", analysis.oracles(job))
    bucket_plan = bucket_plan_document(plans, job.graphs, job.meta)
    priorities = analysis.plan_document(plans, job.graphs, job.meta)
    return json.dumps(bucket_plan), json.dumps(priorities)


def _model(run: str) -> list[tuple[str, int, tuple[int, ...]]]:
    meta = json.loads(need(SHARED / "generated" / "torch" / run / "meta_rank0.json").read_text())
    return [(p["name"], int(p["bytes"]), tuple(p["shape"])) for p in meta["parameters"]]


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("kind", [0, 1], ids=["bucket_plan", "priorities"])
def test_written_plan_binds_every_parameter_of_the_traced_model(run: str, kind: int) -> None:
    plan = parse_plan(_written(run)[kind], rank="rank0")
    model = _model(run)
    binding = bind(plan, model)
    assert binding.method == "buckets"
    assert set(binding.owner) == {name for name, _, _ in model}
    nbytes = dict((n, b) for n, b, _ in model)
    for t in plan.transfers:  # each transfer carries exactly its buckets' bytes
        bound = sum(nbytes[n] for n, owner in binding.owner.items() if owner == t.name)
        assert bound == sum(b.nbytes for b in t.buckets) > 0
    assert len(binding.mapping) == sum(len(t.buckets) for t in plan.transfers)


def test_plan_of_another_model_is_refused_naming_the_first_mismatch() -> None:
    plan = parse_plan(_written("resnet_ddp")[0], rank="rank0")
    with pytest.raises(
        PlanMismatch, match=r"^the plan's DDP buckets hold \d+ bytes.*another model"
    ):
        bind(plan, _model("transformer_ddp"))
    model = _model("resnet_ddp")
    name, nbytes, shape = model[0]  # same bytes, another shape: named by the planned tensor
    changed = [(name, nbytes, (shape[0], -1)), *model[1:]]
    with pytest.raises(PlanMismatch, match=r"planned tensor '.*' \(\[.*\]\) of DDP bucket \d"):
        bind(plan, changed)


def test_plans_differ_in_digest_and_name_the_first_difference() -> None:
    from planner.enforce.plan_file import canonical, first_difference, plan_digest

    a = parse_plan(_written("resnet_ddp_bucket1mb")[0], rank="rank0")
    b = parse_plan(_written("resnet_ddp_bucket1mb")[0], rank="rank1")
    assert plan_digest(a) == plan_digest(b)  # the rank label is not part of the plan
    flipped = TransferPlan(a.transfers[::-1])
    assert plan_digest(flipped) != plan_digest(a)
    assert first_difference(a, canonical(flipped)).startswith("transfer at order_index 0")


def test_verify_matches_the_plan_only_against_its_own_model(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The traced (unenforced) run matches every planned bucket by op and bytes; the run
    of another model with as many buckets matches none: exit 1, each listed."""
    from tests.conftest import run_cli
    from tests.test_schemas import validate

    plan = tmp_path / "bucket_plan.json"
    plan.write_text(_written("resnet_ddp")[0])
    own = SHARED / "generated" / "torch" / "resnet_ddp"
    code, out, _ = run_cli(["verify", plan, own, "--json"], capsys)
    report = json.loads(out)
    validate(report)
    assert code == 0 and report["matched"] and report["unmatched"] == []
    other = need(SHARED / "generated" / "torch" / "transformer_ddp")
    code, out, err = run_cli(["verify", plan, other, "--json", "--min-compliance", "0"], capsys)
    report = json.loads(out)
    validate(report)
    assert code == 1 and not report["matched"] and report["compliance"] == 0.0
    planned = [t.name for t in parse_plan(plan.read_text(), rank="rank0").transfers]
    assert report["unmatched"] == [{"rank": r, "transfer": n} for r in ("rank0", "rank1")
                                   for n in planned]  # fmt: skip
    assert f"{2 * len(planned)} planned transfer(s) matched nothing" in err
