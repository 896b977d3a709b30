"""A plan that is DDP's own order is applied by DDP itself: no hook, no per-step cost.

Real 2-process DDP jobs on gloo (127.0.0.1, CPU) from examples/train_ddp.py: plain DDP;
the plan of DDP's own buckets (one group per layer, backward order, depth 1), which
installs no hook once DDP's buckets are final; and a plan that looks like DDP's order at
registration (consecutive layers, depth 1) but pairs layers DDP keeps apart, so the
hook is installed at the step where DDP's buckets become final and gates from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from planner.enforce import load_plan, plan_from_groups  # noqa: E402
from planner.enforce.ddp_order import ddp_order_difference, may_be_ddp_order  # noqa: E402
from planner.job.verify import verify  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
STEPS = 5


def _example_model() -> torch.nn.Module:
    import runpy

    return runpy.run_path(str(EXAMPLE))["make_model"]()


def _layers(model: torch.nn.Module) -> list[list[str]]:
    """One group per Linear layer, in backward (gradient-ready) order."""
    from planner.enforce.torch_ddp import groups_of_model

    return groups_of_model(model, reverse=True)


def _write(path: Path, groups: list[list[str]]) -> Path:
    entries = [{"name": f"g{i}", "params": g, "depth": 1} for i, g in enumerate(groups)]
    doc = {"schema": "planner.bucket_plan/1", "algorithm": path.stem, "groups": entries}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp_order")
    layers = _layers(_example_model())
    _write(out / "own.json", layers)
    _write(out / "pairs.json", [layers[i] + layers[i + 1] for i in range(0, len(layers), 2)])
    argv = [sys.executable, str(EXAMPLE), "--nproc", "2", "--steps", str(STEPS), "--out",
            str(out), "--timeout", "150", "--gate-timeout", "30"]  # fmt: skip
    for variant in ("none", "hook:own.json", "hook:pairs.json"):
        argv += ["--variant", variant]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=out, timeout=200, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _steps(runs: Path, variant: str, rank: int) -> list[dict]:
    return json.loads((runs / variant / f"steps_rank{rank}.json").read_text())


def test_ddp_own_order_installs_no_hook_and_is_followed(runs: Path) -> None:
    for rank in (0, 1):
        steps = _steps(runs, "hook-own", rank)
        # DDP rebuilds its buckets in the second forward: decided then, no hook after
        assert [s["applied_by"] for s in steps] == ["pending"] + ["ddp"] * (STEPS - 1)
        assert all(s["order"] == [] for s in steps)  # no hook: nothing launched by us
    # no planner.transfer ranges, and a plan of parameter names only (no traced
    # all-reduces to match, as `analyze` writes them: tests/test_enforce_loop.py): verify
    # says it checked nothing rather than passing it
    report = verify(runs / "own.json", [runs / "hook-own" / f"rank{r}.json" for r in (0, 1)])
    assert not report["matched"] and report["compliance"] == 0.0
    assert len(report["unmatched"]) == 12


def test_a_plan_that_differs_from_ddp_gets_the_hook_once_buckets_are_final(runs: Path) -> None:
    order = load_plan(runs / "pairs.json").order
    for rank in (0, 1):
        steps = _steps(runs, "hook-pairs", rank)
        assert [s["applied_by"] for s in steps] == ["pending"] + ["hook"] * (STEPS - 1)
        assert [tuple(s["order"]) for s in steps] == [()] + [order] * (STEPS - 1)
    report = verify(runs / "pairs.json", [runs / "hook-pairs" / f"rank{r}.json" for r in (0, 1)])
    assert report["matched"] and report["compliance"] == 1.0


def test_gradients_are_bitwise_those_of_plain_ddp(runs: Path) -> None:
    reference = torch.load(runs / "none" / "params_rank0.pt")
    for variant in ("hook-own", "hook-pairs"):
        for rank in (0, 1):
            params = torch.load(runs / variant / f"params_rank{rank}.pt")
            assert all(torch.equal(params[n], v) for n, v in reference.items()), (variant, rank)


def test_which_plans_may_be_ddp_order_on_the_example_model() -> None:
    model = _example_model()
    names = [n for n, _ in model.named_parameters()]
    layers = _layers(model)

    def owner(groups: list[list[str]]) -> dict[str, str]:
        return {p: f"group{i}" for i, g in enumerate(groups) for p in g}

    assert may_be_ddp_order(plan_from_groups(layers), owner(layers), names)
    pairs = [layers[0] + layers[1], *layers[2:]]
    assert may_be_ddp_order(plan_from_groups(pairs), owner(pairs), names)
    assert not may_be_ddp_order(plan_from_groups(layers[::-1]), owner(layers[::-1]), names)
    deep = plan_from_groups(layers, depths=[2] + [1] * 5)
    assert not may_be_ddp_order(deep, owner(layers), names)
    missing = layers[1:]  # the last layer in no group (a lenient binding)
    assert not may_be_ddp_order(plan_from_groups(missing), owner(missing), names)


def test_ddp_order_difference_names_the_first_one() -> None:
    layers = _layers(_example_model())
    own = plan_from_groups(layers)
    owner = {p: f"group{i}" for i, g in enumerate(layers) for p in g}
    nbytes = [1050624] * 6
    assert ddp_order_difference(own, owner, layers, nbytes) is None
    swapped = [layers[1], layers[0], *layers[2:]]
    assert ddp_order_difference(own, owner, swapped, nbytes) == (
        "DDP bucket 0 holds parameters of 'group1', the plan's transfer at order_index 0 is "
        "'group0'"
    )
    merged = [layers[0] + layers[1], *layers[2:]]
    assert "DDP has 5 bucket(s), the plan 6" in str(
        ddp_order_difference(own, owner, merged, nbytes[:5])
    )
    split = [[layers[0][0]], [layers[0][1]], *layers[1:5]]
    assert ddp_order_difference(own, owner, split, nbytes) == (
        "transfer 'group0' spans more than DDP bucket 0"
    )


@pytest.fixture
def single_rank() -> object:
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def test_ddp_that_never_rebuilds_is_decided_at_registration(single_rank: object) -> None:
    """find_unused_parameters: DDP keeps its first buckets, so the check needs no step."""
    from planner.enforce.torch_ddp import register_plan_hook

    def ddp_of(model: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    names = {id(p): n for n, p in model.named_parameters()}
    ddp = ddp_of(model)
    buckets = [[names[id(p)] for p in b.parameters()]
               for b in ddp.reducer._get_zeros_like_grad_buckets()]  # fmt: skip
    hook = register_plan_hook(ddp, plan_from_groups(buckets))  # DDP's own buckets
    assert hook.applied_by == "ddp"
    each = [[n] for n, _ in reversed(list(model.named_parameters()))]  # finer than DDP's
    other = ddp_of(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)))
    assert len(each) > len(buckets)
    gated = register_plan_hook(other, plan_from_groups(each), timeout=10)
    assert gated.applied_by == "hook"
    other(torch.randn(3, 8)).sum().backward()
    assert gated.launched_last == plan_from_groups(each).order
    gated.close()
    hook.close()
