"""Parameters of DDP jobs: which collective carries which gradient, and its first read.

Ground truth: the generated runs' meta_rank*.json (parameter table and DDP's rebuilt
buckets, ``rebuilt_per_bucket_param_indices`` in bucket order); the planner never reads it.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from planner.ingest.execution_trace import _arg_names
from planner.ingest.kineto import load_kineto
from planner.measure.allreduce import allreduce_metrics, collective_first_reads, rank_windows
from planner.model.trace import Job
from tests.conftest import missing_reason

GENERATED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "generated" / "torch"
RUNS = ["resnet_ddp", "resnet_ddp_bucket1mb", "transformer_ddp"]
RANKS = ["rank0", "rank1"]


@cache
def _job(run: str, with_et: bool) -> Job:
    d = GENERATED / run
    if not (d / "rank0.json.gz").exists():
        pytest.skip(missing_reason(d))
    ets = [d / f"et_{r}.json.gz" for r in RANKS] if with_et else None
    return load_kineto([d / f"{r}.json.gz" for r in RANKS], ets)


def _truth(run: str, rank: str) -> tuple[list[int], list[list[dict]]]:
    """Bucket sizes and the parameters of each bucket, in DDP's order."""
    meta = json.loads((GENERATED / run / f"meta_{rank}.json").read_text())
    ddp = meta["ddp_logging_data"]
    sizes = [int(x) for x in ddp["rebuilt_bucket_sizes"].split(",")]
    buckets = ddp["rebuilt_per_bucket_param_indices"].split(",")
    return sizes, [[meta["parameters"][int(i)] for i in b.split()] for b in buckets]


def _buckets(job: Job, rank: str) -> list[str]:
    """The gradient all-reduces of a rank, in bucket order."""
    ops = job.graphs[rank].ops.values()
    found = [o for o in ops if o.kind == "collective" and (o.param or "").startswith("bucket")]
    return [o.name for o in sorted(found, key=lambda o: int(o.param[len("bucket") :]))]


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("rank", RANKS)
def test_et_parameters_match_ddp_buckets(run: str, rank: str) -> None:
    job = _job(run, True)
    sizes, truth = _truth(run, rank)
    params = job.meta["parameters"][rank]
    assert job.meta["parameter_source"][rank] == "execution_trace"
    assert len(params) == sum(len(b) for b in truth)
    graph = job.graphs[rank]
    buckets = _buckets(job, rank)
    assert [graph.ops[b].nbytes for b in buckets] == sizes
    for bucket, size, want in zip(buckets, sizes, truth, strict=True):
        got = sorted(
            (p for p in params if p["collective"] == bucket), key=lambda p: p["bucket_offset"]
        )
        assert Counter(p["nbytes"] for p in got) == Counter(w["bytes"] for w in want)
        assert sum(p["nbytes"] for p in got) == size
        # the bucket's layout is DDP's parameter order: shapes in the same sequence
        assert [p["shape"] for p in got] == [w["shape"] for w in want]
        offsets = np.cumsum([0] + [p["nbytes"] for p in got[:-1]])
        assert [p["bucket_offset"] for p in got] == offsets.tolist()
    assert len({p["name"] for p in params}) == len(params)
    json.dumps(params)  # JSON-friendly


@pytest.mark.parametrize("run", RUNS)
def test_first_reads_are_forward_ops(run: str) -> None:
    job = _job(run, True)
    for rank in RANKS:
        ops = job.graphs[rank].ops
        for p in job.meta["parameters"][rank]:
            op = ops[p["first_read_op"]]
            assert op.phase == "forward" and op.kind == "compute"
            assert p["name"].startswith(op.name.split("/", 1)[1])


@pytest.mark.parametrize("run", RUNS)
def test_windows_end_at_the_first_read_of_own_parameters(run: str) -> None:
    job = _job(run, True)
    for rank in RANKS:
        rows = job.trace.of(rank)
        ops = job.graphs[rank].ops
        forward = rows[[ops[n].phase == "forward" for n in rows["op"]]]
        conservative = forward.groupby("iteration")["start"].min()
        forward_end = (forward["start"] + forward["duration"]).groupby(forward["iteration"]).max()
        own = collective_first_reads(job, rank)
        assert set(own) == set(_buckets(job, rank))
        windows = rank_windows(job, rank)
        checked = 0
        for row in windows.itertuples(index=False):
            nxt = int(row.iteration) + 1
            if nxt not in conservative.index:
                assert np.isnan(row.window_end)
                continue
            if row.op in own:
                reads = {p["first_read_op"] for p in job.meta["parameters"][rank]
                         if p["collective"] == row.op}  # fmt: skip
                at = rows[(rows["iteration"] == nxt) & rows["op"].isin(reads)]["start"].min()
                assert row.window_end == at
                assert conservative[nxt] <= row.window_end <= forward_end[nxt]
                checked += 1
            else:  # no parameters (broadcasts): the conservative end
                assert row.window_end == conservative[nxt]
        assert checked == len(own) * (len(conservative) - 1)
    # the bucket holding the last layers is read last in the forward pass
    if run == "resnet_ddp":
        own = collective_first_reads(job, "rank0")
        step = min(own["net/all_reduce#0"])
        assert own["net/all_reduce#0"][step] > own["net/all_reduce#1"][step]


def test_metrics_carry_parameter_counts() -> None:
    job = _job("resnet_ddp", True)
    doc = allreduce_metrics(job)
    counts = {t["name"]: t["parameters"] for t in doc["transfers"] if t["rank"] == "rank0"}
    assert counts["net/all_reduce#0"] + counts["net/all_reduce#1"] == 62
    assert counts["net/broadcast#0"] is None


@pytest.mark.parametrize("run", ["resnet_ddp", "resnet_ddp_bucket1mb"])
def test_no_et_assigns_by_sizes_when_unambiguous(run: str) -> None:
    job = _job(run, False)
    for rank in RANKS:
        sizes, truth = _truth(run, rank)
        assert job.meta["parameter_source"][rank] == "bucket_sizes"
        params = job.meta["parameters"][rank]
        for bucket, size, want in zip(_buckets(job, rank), sizes, truth, strict=True):
            got = [p["nbytes"] for p in params if p["collective"] == bucket]
            assert Counter(got) == Counter(w["bytes"] for w in want)
            assert sum(got) == size
        ops = job.graphs[rank].ops
        assert all(ops[p["first_read_op"]].phase == "forward" for p in params)
    assert any("from their sizes" in n for n in job.notes)


def test_no_et_stays_per_bucket_when_sizes_do_not_fit() -> None:
    """The transformer's positional table is read by no layer op: bytes differ, no guess."""
    job = _job("transformer_ddp", False)
    for rank in RANKS:
        assert job.meta["parameters"][rank] == []
        assert job.meta["parameter_source"][rank] == "bucket"
        assert collective_first_reads(job, rank) == {}
        windows = rank_windows(job, rank)
        rows = job.trace.of(rank)
        ops = job.graphs[rank].ops
        forward = rows[[ops[n].phase == "forward" for n in rows["op"]]]
        conservative = forward.groupby("iteration")["start"].min().to_dict()
        ends = [conservative.get(int(i) + 1, np.nan) for i in windows["iteration"]]
        np.testing.assert_array_equal(windows["window_end"].to_numpy(), np.array(ends, float))
    assert any("parameters stay per DDP bucket" in n for n in job.notes)


def test_schema_argument_names() -> None:
    schema = (
        "aten::conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] stride=[1, 1], "
        "SymInt[2] padding=[0, 0], SymInt[2] dilation=[1, 1], SymInt groups=1) -> Tensor"
    )
    assert _arg_names(schema)[:3] == ["input", "weight", "bias"]
    assert _arg_names("aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1)") == [
        "self",
        "other",
        "alpha",
    ]
    assert _arg_names("") == []
