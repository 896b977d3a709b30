"""The DDP hook's cost counted in every prediction of a plan that runs through it (issue
#44, point 3): a Caramel plan the hook applies is predicted slower by its calls' time,
in the comparison and in the replay the verdict judges it by; a plan that is DDP's own
order, which DDP applies without the hook, is not."""

from __future__ import annotations

import numpy as np
import pytest

from planner import api
from planner.ingest.netbench import read_model
from planner.job import analysis
from planner.model.plan import Plan
from planner.planning import hook_calls
from planner.prediction import hook_cost
from planner.prediction.compiled import compile_graph
from tests.conftest import REPO

LAB_3000 = REPO / "bench" / "lab" / "results" / "ddp-grid" / "mlp" / "ddp-mlp" / "3000mbit"


def _groups(*entries: tuple[str, int, int]) -> list[dict]:
    return [{"params": [op], "depth": depth, "nbytes": nbytes} for op, depth, nbytes in entries]


def test_ddp_own_order_needs_no_hook() -> None:
    own = _groups(("net/barrier#0", 1, 0), ("net/all_reduce#0", 1, 8), ("net/all_reduce#1", 1, 8))
    assert hook_calls.own_order(own)
    assert not hook_calls.own_order(list(reversed(own)))  # all_reduce#1 before #0
    assert not hook_calls.own_order(_groups(("net/all_reduce#0", 2, 8)))  # split in two
    merged = [{"params": ["net/all_reduce#0", "net/all_reduce#1"], "depth": 1, "nbytes": 16}]
    assert not hook_calls.own_order(merged)


def test_the_hook_launches_each_chunk_of_each_group_of_gradients() -> None:
    groups = _groups(
        ("net/barrier#0", 1, 0), ("net/all_reduce#0", 2, 8), ("net/all_reduce#1", 8, 8)
    )
    plan = Plan("caramel", "rank0", {}, (), inputs={"groups": groups})
    assert hook_calls.calls(plan) == 10  # the barrier's all-reduce is DDP's, not the hook's
    assert hook_calls.step_seconds(plan) == pytest.approx(10 * hook_calls.CALL_SECONDS)
    assert hook_calls.calls(Plan("tac", "worker0", {}, (), inputs={"groups": groups})) == 0
    own = Plan("caramel", "rank0", {}, (), inputs={"groups": _groups(("net/all_reduce#0", 1, 8))})
    assert hook_calls.calls(own) == 0


def _caramel(job: object) -> dict:
    """The Caramel plans analyze makes of the lab run with its bench-network CSV: DDP's
    2 buckets at depths 2 and 8."""
    return analysis.schedule(job, "caramel", network=read_model(LAB_3000 / "net.csv"))


def _caramel_entries(monkeypatch: pytest.MonkeyPatch, hook: bool) -> list[dict]:
    if not hook:  # as if DDP applied the plan itself
        monkeypatch.setattr(hook_calls, "calls", lambda plan: 0)
    job = api.load(LAB_3000 / "trace" / "ranks")
    document = analysis.simulation(job, {"caramel": _caramel(job)}, samples=20)
    ranks = document["comparison"]["ranks"]
    return [next(p for p in r["plans"] if p["plan"] == "caramel") for r in ranks]


def _copy_seconds(rank: str) -> float:
    """The mean over the traced steps of the time `rank` spent in DDP's copies of the
    buckets back into the gradients, summed from the raw events."""
    rows = api.load(LAB_3000 / "trace" / "ranks").trace.timings
    rows = rows[(rows["rank"] == rank) & rows["op"].str.contains("copy_bucket_to_grad")]
    return float(rows.groupby("iteration")["duration"].sum().mean()) / 1e9


def test_the_calls_land_on_the_ops_that_launched_the_collectives() -> None:
    """In the trace, each bucket's all-reduce follows its last gradient's AccumulateGrad
    on the backward pass's thread: the hook runs there, so its calls are added there."""
    job = api.load(LAB_3000 / "trace" / "ranks")
    plan = _caramel(job)["rank0"]
    compiled = compile_graph(job.graphs["rank0"])
    index, seconds = hook_cost.launch_costs(compiled, plan)
    landed = {compiled.names[i]: s for i, s in zip(index.tolist(), seconds.tolist(), strict=True)}
    acc = "main/autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    assert landed == pytest.approx(
        {f"{acc}#7": 2 * hook_calls.CALL_SECONDS, f"{acc}#47": 8 * hook_calls.CALL_SECONDS}
    )


def test_each_group_also_costs_a_pass_over_its_bytes_at_the_copies_rate() -> None:
    """The hook averages each group in place before its all-reduce; DDP without it
    divides while copying each gradient into its bucket. That pass runs at the rate of
    DDP's copies of the buckets back into the gradients: over the plan's groups (every
    gradient), as long as the traced step's copies took."""
    job = api.load(LAB_3000 / "trace" / "ranks")
    plan = _caramel(job)["rank0"]
    compiled = compile_graph(job.graphs["rank0"])
    rows = job.trace.timings.query("rank == 'rank0'")
    times = (rows.groupby("op")["duration"].mean() / 1e9).to_dict()  # each op's mean time
    seconds = np.array([times.get(n, 0.0) for n in compiled.names])
    rate = hook_calls.copy_rate(compiled.names, seconds, plan)
    nbytes = sum(g["nbytes"] for g in plan.inputs["groups"])
    assert rate * nbytes == pytest.approx(_copy_seconds("rank0"), rel=1e-6)
    _, without = hook_cost.launch_costs(compiled, plan)
    _, added = hook_cost.launch_costs(compiled, plan, rate)
    assert added.sum() - without.sum() == pytest.approx(_copy_seconds("rank0"), rel=1e-6)
    assert hook_calls.step_seconds(plan, rate) == pytest.approx(added.sum())


def test_a_hooked_plan_is_predicted_slower_by_at_most_its_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lab's DDP mlp at 3000 Mbit/s: Caramel keeps DDP's 2 buckets at depths 2 and
    8, so the hook launches 10 calls a step and makes a pass over the 6 MiB of
    gradients. Its comparison prediction and its replayed step grow, by no more than
    that time (the backward pass's thread is delayed; the wire may hide part of it),
    and its replayed gain falls below zero."""
    hooked = _caramel_entries(monkeypatch, True)
    free = _caramel_entries(monkeypatch, False)
    for rank, a, b in zip(("rank0", "rank1"), free, hooked, strict=True):
        assert "hook_seconds" not in a
        passes = b["hook_seconds"] - 10 * hook_calls.CALL_SECONDS
        assert passes == pytest.approx(_copy_seconds(rank), rel=0.05)
        grew = b["predicted"] - a["predicted"]
        assert 0.0 < grew <= b["hook_seconds"] + 1e-9
        grew = b["replayed"]["predicted_wall"] - a["replayed"]["predicted_wall"]
        assert 0.0 < grew <= b["hook_seconds"] + 1e-9
        assert b["replayed"]["gain"] < a["replayed"]["gain"] <= 0.0
        assert b["replayed"]["gain"] < 0.0
