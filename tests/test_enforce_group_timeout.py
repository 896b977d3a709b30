"""`register_plan_hook` bounds the timeout of DDP's own process group by the gate timeout.

One gloo rank on 127.0.0.1 (the timeouts themselves, read back from torch); the faults
they end are tests/test_enforce_faults.py (real 2-process jobs).
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from planner.enforce import plan_from_groups  # noqa: E402
from planner.enforce.group_timeout import bound_group_timeout, group_timeout  # noqa: E402
from planner.enforce.torch_ddp import groups_of_model, register_plan_hook  # noqa: E402

DEFAULT = datetime.timedelta(minutes=30)  # the timeout these tests start the groups with


@pytest.fixture
def world() -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=DEFAULT)  # fmt: skip
    yield
    dist.destroy_process_group()


def _ddp(group: object = None, find_unused: bool = True) -> torch.nn.Module:
    """A DDP that keeps its first buckets (find_unused_parameters): decided at once."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    return torch.nn.parallel.DistributedDataParallel(
        model, process_group=group, find_unused_parameters=find_unused
    )


def _own_plan(ddp: torch.nn.Module) -> object:
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    return plan_from_groups([[names[id(p)] for p in b.parameters()]
                             for b in ddp.reducer._get_zeros_like_grad_buckets()])  # fmt: skip


def _seconds(group: object) -> float | None:
    value = group_timeout(group)
    return None if value is None else value.total_seconds()


def test_no_hook_bounds_ddp_own_group_not_the_default(
    world: None, caplog: pytest.LogCaptureFixture
) -> None:
    group = dist.new_group([0], timeout=DEFAULT)
    ddp = _ddp(group)
    with caplog.at_level(logging.INFO, logger="planner.enforce"):
        hook = register_plan_hook(ddp, _own_plan(ddp), timeout=7)
    assert hook.applied_by == "ddp"
    assert _seconds(group) == 7.0  # DDP's group: bounded by the gate timeout
    assert _seconds(None) == DEFAULT.total_seconds()  # the default group: untouched
    said = [r.getMessage() for r in caplog.records if "timeout" in r.getMessage()]
    assert any("timeout 0:30:00 -> 0:00:07" in m and "every collective" in m for m in said)
    hook.close()


def test_the_hook_path_bounds_by_twice_the_gate_timeout_and_opt_out_keeps_it(
    world: None,
) -> None:
    ddp = _ddp()
    names = [[n] for n, _ in reversed(list(ddp.module.named_parameters()))]  # not DDP's
    gated = register_plan_hook(ddp, plan_from_groups(names), timeout=7)
    assert gated.applied_by == "hook"
    assert _seconds(None) == 14.0  # the watchdog fails the step first, at 7 s
    gated.close()
    other = _ddp()
    kept = register_plan_hook(other, _own_plan(other), timeout=3, pg_timeout=False)
    assert kept.applied_by == "ddp" and _seconds(None) == 14.0
    kept.close()


def test_a_plan_found_to_differ_at_the_rebuild_relaxes_to_the_hook_bound(world: None) -> None:
    """DDP rebuilds its buckets after step 0: the plan looked like DDP's order at
    registration (bounded by the gate timeout), is not, gets the hook (twice it)."""
    ddp = _ddp(find_unused=False)
    layers = groups_of_model(ddp.module, reverse=True)
    assert len(ddp.reducer._get_zeros_like_grad_buckets()) == 1  # DDP: one bucket, two groups
    hook = register_plan_hook(ddp, plan_from_groups(layers), timeout=5)
    assert hook.applied_by == "pending" and _seconds(None) == 5.0
    for _ in range(3):
        ddp(torch.randn(3, 8)).sum().backward()
    assert hook.applied_by == "hook" and _seconds(None) == 10.0
    hook.close()


def test_never_lengthens_a_shorter_timeout_of_the_user(world: None) -> None:
    group = dist.new_group([0], timeout=datetime.timedelta(seconds=4))
    assert bound_group_timeout(group, 30.0) == datetime.timedelta(seconds=4)
    assert _seconds(group) == 4.0
    # relaxing after an earlier bound stops at the user's own value (the ceiling)
    bound_group_timeout(group, 2.0)
    assert _seconds(group) == 2.0
    bound_group_timeout(group, 60.0, ceiling=datetime.timedelta(seconds=4))
    assert _seconds(group) == 4.0


def test_without_torch_private_api_it_warns_and_the_timeout_stays(
    world: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(dist.distributed_c10d, "_set_pg_timeout")
    ddp = _ddp()
    with caplog.at_level(logging.WARNING, logger="planner.enforce"):
        hook = register_plan_hook(ddp, _own_plan(ddp), timeout=7)
    assert _seconds(None) == DEFAULT.total_seconds()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "torch.distributed.distributed_c10d._set_pg_timeout is missing in torch" in warning
    assert "stays 0:30:00" in warning
    hook.close()


def test_explain_names_only_failed_collectives(world: None) -> None:
    ddp = _ddp()
    hook = register_plan_hook(ddp, _own_plan(ddp), timeout=7)
    ddp(torch.randn(3, 8)).sum().backward()
    ddp(torch.randn(3, 8)).sum().backward()
    assert hook.explain(ValueError("a bug in the loss")) is None
    closed = hook.explain(RuntimeError("Application timeout caused pair closure"))
    assert "step 1: a planned transfer failed on rank 0" in str(closed)
    gloo = RuntimeError(
        "[/x/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 7000ms for recv "
        "operation to complete"
    )
    line = str(hook.explain(gloo))
    assert line.startswith("step 1: a planned transfer failed on rank 0: one of the 1 planned")
    assert line.endswith(": Timed out waiting 7000ms for recv operation to complete: a peer "
                         "rank stalled or died")  # fmt: skip
    hook.close()
