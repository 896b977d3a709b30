"""PyTorch enforcement end to end: a real 2-process DDP job on gloo (127.0.0.1, CPU).

The example script (examples/train_ddp.py) runs four ways in the same two processes: no
hook, the gated hook with the good plan, with a deliberately bad order, and the
gradient-sync module; each is profiled with torch.profiler and checked by `verify`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from planner.enforce import GateError, load_plan, plan_from_groups  # noqa: E402
from planner.job.verify import predict_orders, verify  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
VARIANTS = ("none", "hook-good", "hook-bad", "gradsync-good")
STEPS = 6


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, str(EXAMPLE), "--write-plans", str(out / "plans")],
        check=True,
        timeout=60,
        env=env,
    )
    argv = [sys.executable, str(EXAMPLE), "--nproc", "2", "--steps", str(STEPS),
            "--out", str(out), "--timeout", "150"]  # fmt: skip
    for v in ("none", "hook:plans/good.json", "hook:plans/bad.json", "gradsync:plans/good.json"):
        argv += ["--variant", v]
    done = subprocess.run(argv, cwd=out, timeout=180, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _traces(runs: Path, variant: str) -> list[Path]:
    return [runs / variant / f"rank{r}.json" for r in (0, 1)]


def test_hook_enforces_plan_order_in_every_step_on_both_ranks(runs: Path) -> None:
    for variant, plan in (("hook-good", "good"), ("hook-bad", "bad"), ("gradsync-good", "good")):
        report = verify(runs / "plans" / f"{plan}.json", _traces(runs, variant))
        assert [r["rank"] for r in report["ranks"]] == ["rank0", "rank1"]
        for r in report["ranks"]:
            assert r["steps"] == STEPS - 2  # the profiled steps
            assert r["compliance"] == 1.0, r["first_violation"]
            assert r["first_violation"] is None
        # the split into the planned depth is visible: 2 all-reduce calls per big group
        assert all(s["depth_as_planned"] for s in report["steps"])
        order = load_plan(runs / "plans" / f"{plan}.json").order
        for rank in (0, 1):  # every step, unprofiled ones too, as the hook saw it
            steps = json.loads((runs / variant / f"steps_rank{rank}.json").read_text())
            assert [tuple(s["order"]) for s in steps] == [order] * STEPS


def test_verify_catches_a_run_that_is_not_in_the_plan_order(runs: Path) -> None:
    report = verify(runs / "plans" / "good.json", _traces(runs, "hook-bad"))
    assert report["compliance"] == 0.0
    first = report["ranks"][0]["first_violation"]
    assert first["position"] == 0
    assert first["expected"] == load_plan(runs / "plans" / "good.json").order[0]
    assert first["observed"] == load_plan(runs / "plans" / "bad.json").order[0]


def test_no_gradient_is_lost_or_changed(runs: Path) -> None:
    """Bitwise: the hook and GradSync average exactly as DDP does (CPU, 2 ranks)."""
    reference = torch.load(runs / "none" / "params_rank0.pt")
    for variant in VARIANTS:
        for rank in (0, 1):
            params = torch.load(runs / variant / f"params_rank{rank}.pt")
            assert params.keys() == reference.keys()
            for name, value in reference.items():
                assert torch.equal(params[name], value), (variant, name)
    untrained = __import__("runpy").run_path(str(EXAMPLE))["make_model"]()
    moved = dict(untrained.named_parameters())
    assert any(not torch.equal(moved[n], v) for n, v in reference.items())  # it did train


def test_planner_predicts_the_bad_order_slower_and_times_are_measured(runs: Path) -> None:
    from planner.ingest import detect

    job = detect.load(_traces(runs, "none"))
    buckets = [n for n in job.graphs["rank0"].transfers if "all_reduce" in n]
    assert len(buckets) == 6  # one DDP bucket per layer at a 1 MB cap, in backward order
    predicted = predict_orders(job, "rank0", {"good": buckets, "bad": buckets[::-1]})
    assert predicted["bad"] > predicted["good"]
    measured = {
        v: verify(runs / "plans" / "good.json", _traces(runs, v))["ranks"][0][
            "measured_iteration_time"
        ]
        for v in ("none", "hook-good", "hook-bad")
    }
    assert all(t > 0 for t in measured.values())
    print(f"predicted {predicted}; measured {measured}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def single_rank() -> object:
    """A one-process gloo group on 127.0.0.1 (for the error paths)."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    yield dist
    dist.destroy_process_group()


def test_plan_for_another_model_is_refused(single_rank: object) -> None:
    from planner.enforce.torch_ddp import GradSync, register_plan_hook

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    with pytest.raises(GateError, match="in no planned group"):
        register_plan_hook(ddp, plan_from_groups([["0.weight", "0.bias"]]))
    with pytest.raises(GateError, match="lacks"):
        GradSync(model, plan_from_groups([["0.weight", "0.bias", "1.weight", "1.bias", "x"]]))


def test_group_that_never_gets_a_gradient_raises_instead_of_hanging(single_rank: object) -> None:
    from planner.enforce.torch_ddp import GradSync

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    plan = plan_from_groups([["1.weight", "1.bias"], ["0.weight", "0.bias"]], names=["b", "a"])
    sync = GradSync(model, plan, timeout=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync.attach(opt)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # complete: both groups all-reduced in plan order
    assert sync.last_order == ("b", "a")
    model[1](torch.randn(3, 4)).sum().backward()  # layer 0 gets no gradient
    with pytest.raises(GateError, match="'a'"):
        opt.step()
    sync.close()


class _Swapped(torch.nn.Module):
    """Registration order differs from execution order: DDP's gradient-ready order (and
    so its rebuilt buckets) is not the reverse of ``named_parameters()``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.late = torch.nn.Linear(64, 8)  # 2080 bytes, runs last: ready first
        self.early = torch.nn.Linear(32, 64)  # 8448 bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.late(self.early(x))


def _bucket_plan(sizes: list[tuple[int, int]]) -> object:
    """A plan as `analyze` writes it from a trace without shapes: (DDP bucket, bytes)."""
    from planner.enforce import parse_plan

    groups = [{"order_index": i, "name": f"b{k}", "params": [f"bucket{k}"], "depth": 1,
               "transfers": [f"net/all_reduce#{k}"], "nbytes": n,
               "buckets": [{"bucket": k, "nbytes": n, "tensors": []}]}
              for i, (k, n) in enumerate(sizes)]  # fmt: skip
    return parse_plan(json.dumps({"schema": "planner.bucket_plan/1", "groups": groups}))


def _swapped_ddp() -> tuple[torch.nn.Module, object]:
    model = _Swapped()
    cap = 2080 / 2**20  # one bucket per layer once DDP rebuilds them
    return model, torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)


def test_plan_without_tensors_binds_to_ddp_rebuilt_buckets(single_rank: object) -> None:
    """No tensors and boundaries off the reverse registration order: the hook runs the
    first step as DDP would, then binds planned bucket k to DDP's bucket k by bytes and
    gates them in plan order (here bucket 1 before bucket 0)."""
    from planner.enforce.binding import BoundariesUnknown, bind
    from planner.enforce.torch_ddp import register_plan_hook

    plan = _bucket_plan([(1, 8448), (0, 2080)])
    model, ddp = _swapped_ddp()
    with pytest.raises(BoundariesUnknown):  # what GradSync would say
        bind(plan, [(n, p.numel() * 4, tuple(p.shape)) for n, p in model.named_parameters()])
    hook = register_plan_hook(ddp, plan, timeout=10)
    plain_model, plain = _swapped_ddp()
    for step in range(3):
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(step))
        ddp(x).sum().backward()
        plain(x).sum().backward()
        assert hook.launched_last == (() if step == 0 else ("b1", "b0"))
        for (n, p), q in zip(model.named_parameters(), plain_model.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), (step, n)
            p.grad = q.grad = None
    hook.close()


def test_plan_whose_buckets_differ_from_ddp_is_refused_at_the_rebuilt_step(
    single_rank: object,
) -> None:
    from planner.enforce.binding import PlanMismatch
    from planner.enforce.torch_ddp import register_plan_hook

    model, ddp = _swapped_ddp()
    with pytest.raises(
        PlanMismatch,
        match="hold 10080 bytes of gradients, the model's 4 trainable parameters 10528",
    ):
        register_plan_hook(ddp, _bucket_plan([(0, 2080), (1, 8000)]))  # another model
    hook = register_plan_hook(ddp, _bucket_plan([(0, 2336), (1, 8192)]), timeout=10)
    ddp(torch.randn(4, 32)).sum().backward()  # DDP's first step: reduced as DDP would
    with pytest.raises(RuntimeError, match="DDP bucket 0 holds 2080 bytes, the plan's bucket 0"):
        ddp(torch.randn(4, 32)).sum().backward()
    hook.close()
