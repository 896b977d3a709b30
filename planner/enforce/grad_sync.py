"""`GradSync`: the full Caramel plan (batching, order, depth) in PyTorch without DDP.

Per-parameter post-accumulate-grad hooks all-reduce exactly the plan's groups, in plan
order through the `PriorityGate`, with the planned depth; ``optimizer.step()`` waits
for them. Apart from the DDP hook (`planner.enforce.ddp_hook`), which must work within
DDP's buckets instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.enforce.gate import GateError, PriorityGate
from planner.enforce.plan_file import TransferPlan, plan_digest
from planner.enforce.torch_transfers import (
    TransferFailed,
    agree_on_plan,
    bind_model,
    cut_chunks,
    launch_chunks,
    never_ready,
    one_line,
    process_group_of,
    trainable_parameters,
)


class GradSync:
    """All-reduce exactly the plan's groups, in plan order, with the planned depth.

    Use on a plain model (no DDP) replicated on every rank: call `broadcast_parameters`
    once, `attach(optimizer)` so that ``step()`` waits for the gradients, and run one
    backward per step.
    """

    def __init__(
        self,
        model: nn.Module,
        plan: TransferPlan,
        group: Any = None,
        strict: bool = True,
        timeout: float = 30.0,
        gate: PriorityGate | None = None,
        agree: bool = True,
    ) -> None:
        self.model = model
        self.plan = plan
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.gate = gate or PriorityGate(plan, timeout=timeout, strict=strict)
        self.strict = self.gate.strict
        named = trainable_parameters(model)
        self.binding = bind_model(plan, named, self.strict)
        self.owner = dict(self.binding.owner)
        self.digest = agree_on_plan(plan, group) if agree else plan_digest(plan)
        self.members: dict[str, list[nn.Parameter]] = {t.name: [] for t in plan.transfers}
        for name, p in named:
            if name in self.owner:
                self.members[self.owner[name]].append(p)
        for name, p in named:
            if name not in self.owner:  # lenient: an unplanned transfer of its own
                self.members[f"unplanned:{name}"] = [p]
                self.owner[name] = f"unplanned:{name}"
        self.depth = {t.name: t.depth for t in plan.transfers}
        self._remaining: dict[str, int] = {}
        self._inflight: list[tuple[str, torch.Tensor, list[torch.futures.Future]]] = []
        self._lock = threading.Lock()
        self.launched: list[str] = []
        self.last_order: tuple[str, ...] = ()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for _, p in named]
        self._name_of = {id(p): n for n, p in named}
        self._reset()

    def _reset(self) -> None:
        self._remaining = {t: len(ps) for t, ps in self.members.items() if ps}
        self._inflight = []
        self.launched = []

    def _on_grad(self, param: torch.Tensor) -> None:
        transfer = self.owner[self._name_of[id(param)]]
        with self._lock:
            self._remaining[transfer] -= 1
            complete = self._remaining[transfer] == 0
        if complete:
            self.gate.submit(transfer, lambda: self._launch(transfer))

    def _launch(self, transfer: str) -> None:
        params = self.members[transfer]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self.launched.append(transfer)
        chunks = cut_chunks(flat, self.depth.get(transfer, 1))
        futures = launch_chunks(chunks, flat, self.world, process_group_of(self.group), transfer)
        self._inflight.append((transfer, flat, futures))

    def wait(self) -> tuple[str, ...]:
        """Block until every group of this step is averaged into ``.grad``; returns the
        launch order. Raises GateTimeout (strict) when a planned group never became ready."""
        if not self.launched and all(r == len(self.members[t]) for t, r in self._remaining.items()):
            return ()  # no backward since the last step
        incomplete = [t for t, r in self._remaining.items() if r > 0]
        try:
            if incomplete and self.strict:
                raise never_ready(self.gate, incomplete[0])
            self.gate.flush()
        except GateError:
            self.gate.reset()
            self._reset()
            raise
        deadline = time.monotonic() + self.gate.timeout
        for transfer, flat, futures in self._inflight:
            self._wait(transfer, futures, deadline)
            at = 0
            for p in self.members[transfer]:
                p.grad.copy_(flat[at : at + p.numel()].view_as(p.grad))
                at += p.numel()
        self.last_order = tuple(self.launched)
        self._reset()
        return self.last_order

    def _wait(
        self, transfer: str, futures: Sequence[torch.futures.Future], deadline: float
    ) -> None:
        """Wait for one transfer's chunks until `deadline`; a failure or a stall raises."""
        where = f"transfer {transfer!r} (order_index {self.gate.index.get(transfer, -1)})"
        while not all(f.done() for f in futures):
            if time.monotonic() > deadline:
                self._reset()
                raise TransferFailed(
                    f"{where} did not finish on rank {self.rank} within {self.gate.timeout:g}"
                    " s: a peer rank stalled or died"
                )
            time.sleep(0.0005)
        for f in futures:
            try:
                f.value()
            except Exception as exc:
                self._reset()
                raise TransferFailed(
                    f"{where} failed on rank {self.rank}: {one_line(exc)}"
                ) from None

    def attach(self, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        """Make ``optimizer.step()`` wait for the gradients; returns a remover."""

        def before_step(*_: Any) -> None:
            self.wait()

        handle = optimizer.register_step_pre_hook(before_step)
        return handle.remove

    def broadcast_parameters(self, src: int = 0) -> None:
        """Start every rank from rank `src`'s parameters and buffers (DDP does this itself)."""
        with torch.no_grad():
            for t in [*self.model.parameters(), *self.model.buffers()]:
                dist.broadcast(t, src=src, group=self.group)

    def close(self) -> None:
        """Remove the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []
