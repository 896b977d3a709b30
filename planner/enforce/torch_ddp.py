"""PyTorch enforcement: a DDP communication hook and a gradient-sync module, both gated.

- `PlanCommHook` (``register_plan_hook(ddp, plan)``): DDP calls it once per bucket. A
  bucket is identified by its parameters, not its index (DDP rebuilds buckets after the
  first iteration), and cut into the plan's groups. A group is all-reduced when all of
  its parameters are ready, through the `PriorityGate`, so groups reach the network in
  plan order on every rank, split into the planned `depth` of chunks all-reduced
  concurrently and reassembled. Never blocks the autograd thread: a group that is not
  yet next is queued (`PriorityGate.submit`). Works with ``gradient_as_bucket_view``.
- `GradSync`: without DDP (which takes only size caps, not groups), per-parameter
  post-accumulate-grad hooks all-reduce exactly the plan's groups in plan order with the
  planned depth; `attach(optimizer)` makes ``optimizer.step()`` wait for them: the full
  Caramel plan (batching, order, depth) in PyTorch.

Each launch is recorded as a profiler range ``planner.transfer:<name>`` so that
`planner verify` can read the order back from a torch.profiler trace.
Gradients are averaged (divided by the world size, then summed), as DDP's default.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.enforce.gate import GateError, PriorityGate
from planner.enforce.plan_file import TransferPlan

TRANSFER_PREFIX = "planner.transfer:"


def _param_names(module: nn.Module) -> dict[int, str]:
    """id(parameter) -> its name in the (unwrapped) model."""
    inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
    return {id(p): name for name, p in inner.named_parameters()}


def _group_of(plan: TransferPlan, names: Iterable[str], strict: bool) -> dict[str, str]:
    """parameter name -> planned transfer; every trainable parameter must be in the plan."""
    owner = {p.removeprefix("module."): t.name for t in plan.transfers for p in t.params}
    missing = [n for n in names if n not in owner]
    if missing and strict:
        raise GateError(
            f"{len(missing)} parameter(s) are in no planned group, e.g. {missing[0]!r}; "
            "is the plan for another model?"
        )
    unknown = set(owner) - set(names)
    if unknown and strict:
        raise GateError(f"the plan names parameters the model lacks, e.g. {sorted(unknown)[0]!r}")
    return owner


def _launch_chunks(
    flat: torch.Tensor, depth: int, world: int, group: Any, name: str
) -> torch.futures.Future:
    """Average `flat` across ranks in `depth` chunks all-reduced concurrently (in place)."""
    with torch.profiler.record_function(f"{TRANSFER_PREFIX}{name}"):
        flat.div_(world)
        parts = torch.tensor_split(flat, max(1, min(depth, flat.numel())))
        chunks = [c for c in parts if c.numel()]
        works = [dist.all_reduce(c, group=group, async_op=True) for c in chunks]
    return torch.futures.collect_all([w.get_future() for w in works])


@dataclass
class _Piece:
    """Part of a planned group that lies in one DDP bucket: a slice of its flat buffer."""

    bucket: _BucketState
    offset: int
    numel: int


@dataclass
class _BucketState:
    buffer: torch.Tensor
    future: torch.futures.Future
    outstanding: int = 0


@dataclass
class _GroupState:
    remaining: int
    pieces: list[_Piece] = field(default_factory=list)


class PlanCommHook:
    """State of the DDP communication hook (see the module doc); register with
    `register_plan_hook`."""

    def __init__(
        self,
        ddp: nn.parallel.DistributedDataParallel,
        plan: TransferPlan,
        gate: PriorityGate | None = None,
        group: Any = None,
        strict: bool = True,
        timeout: float = 30.0,
    ) -> None:
        self.plan = plan
        self.group = group
        self.world = dist.get_world_size(group)
        self.gate = gate or PriorityGate(plan, timeout=timeout, strict=strict)
        self.strict = self.gate.strict
        self.names = _param_names(ddp)
        trainable = [self.names[id(p)] for p in ddp.parameters() if p.requires_grad]
        self.owner = _group_of(plan, trainable, self.strict)
        self.depth = {t.name: t.depth for t in plan.transfers}
        self.size = {t.name: 0 for t in plan.transfers}
        for name in trainable:
            if name in self.owner:
                self.size[self.owner[name]] += 1
        self._lock = threading.Lock()
        self._groups: dict[str, _GroupState] = {}
        self.launched: list[str] = []  # this iteration, in launch order

    def _new_iteration(self) -> None:
        self._groups = {
            name: _GroupState(remaining=count) for name, count in self.size.items() if count
        }
        self.launched = []

    def __call__(self, bucket: dist.GradBucket) -> torch.futures.Future:
        if not self._groups and not self.launched:
            self._new_iteration()
        buffer = bucket.buffer()
        state = _BucketState(buffer, torch.futures.Future())
        offset = 0
        ready: list[str] = []
        pieces: dict[str, list[_Piece]] = {}
        for param in bucket.parameters():
            name = self.names.get(id(param), f"<unnamed {tuple(param.shape)}>")
            transfer = self.owner.get(name, f"unplanned:bucket{bucket.index()}")
            pieces.setdefault(transfer, []).append(_Piece(state, offset, param.numel()))
            offset += param.numel()
        if offset != buffer.numel():
            raise GateError(f"bucket {bucket.index()}: parameters do not tile its buffer")
        state.outstanding = sum(len(parts) for parts in pieces.values())
        for transfer, parts in pieces.items():
            if transfer not in self._groups:  # unplanned: one transfer of its own
                self._groups[transfer] = _GroupState(remaining=len(parts))
            g = self._groups[transfer]
            g.pieces.extend(parts)
            g.remaining -= len(parts)
            if g.remaining == 0:
                ready.append(transfer)
        for transfer in ready:
            self.gate.submit(transfer, lambda t=transfer: self._launch(t))
        if bucket.is_last():
            self._end_iteration()
        return state.future

    def _launch(self, transfer: str) -> None:
        g = self._groups[transfer]
        flat = torch.cat([p.bucket.buffer[p.offset : p.offset + p.numel] for p in g.pieces])
        self.launched.append(transfer)
        fut = _launch_chunks(flat, self.depth.get(transfer, 1), self.world, self.group, transfer)

        def scatter(_: torch.futures.Future) -> None:
            at = 0
            finished = []
            with self._lock:
                for p in g.pieces:
                    p.bucket.buffer[p.offset : p.offset + p.numel].copy_(flat[at : at + p.numel])
                    at += p.numel
                    p.bucket.outstanding -= 1
                    if p.bucket.outstanding == 0:
                        finished.append(p.bucket)
            for b in finished:
                b.future.set_result(b.buffer)

        fut.then(scatter)

    def _end_iteration(self) -> None:
        """After the last bucket nothing more can arrive: every group must have launched."""
        incomplete = [t for t, g in self._groups.items() if g.remaining > 0]
        try:
            if incomplete and self.strict:
                raise _never_ready(self.gate, incomplete[0])
            for t in incomplete:  # lenient: reduce what arrived
                if self._groups[t].pieces:
                    self.gate.submit(t, lambda t=t: self._launch(t))
            self.gate.flush(timeout=0.0)
        except GateError as exc:
            for g in self._groups.values():
                for p in g.pieces:
                    if not p.bucket.future.done():
                        p.bucket.future.set_exception(exc)
            self.gate.reset()
            self._groups = {}
            raise
        self._groups = {}
        self.launched_last = tuple(self.launched)
        self.launched = []


def _never_ready(gate: PriorityGate, transfer: str) -> GateError:
    return GateError(
        f"planned transfer {transfer!r} (order_index {gate.index.get(transfer, -1)}) never "
        "became ready this iteration: some of its parameters got no gradient"
    )


def _hook(state, bucket):  # type: ignore[no-untyped-def]
    """The comm hook DDP calls per bucket (real annotations set below: DDP checks them)."""
    return state(bucket)


_hook.__annotations__ = {
    "state": PlanCommHook,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def register_plan_hook(
    ddp: nn.parallel.DistributedDataParallel,
    plan: TransferPlan,
    strict: bool = True,
    timeout: float = 30.0,
    gate: PriorityGate | None = None,
) -> PlanCommHook:
    """Register the gated, depth-splitting all-reduce hook on `ddp`; returns its state."""
    state = PlanCommHook(ddp, plan, gate=gate, group=ddp.process_group, strict=strict,
                         timeout=timeout)  # fmt: skip
    ddp.register_comm_hook(state, _hook)
    return state


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
    ) -> None:
        self.model = model
        self.plan = plan
        self.group = group
        self.world = dist.get_world_size(group)
        self.gate = gate or PriorityGate(plan, timeout=timeout, strict=strict)
        self.strict = self.gate.strict
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.owner = _group_of(plan, [n for n, _ in named], self.strict)
        by_name = dict(named)
        self.members: dict[str, list[nn.Parameter]] = {
            t.name: [by_name[p.removeprefix("module.")] for p in t.params
                     if p.removeprefix("module.") in by_name]
            for t in plan.transfers
        }  # fmt: skip
        for name, p in named:
            if name not in self.owner:  # lenient: an unplanned transfer of its own
                self.members[f"unplanned:{name}"] = [p]
                self.owner[name] = f"unplanned:{name}"
        self.depth = {t.name: t.depth for t in plan.transfers}
        self._remaining: dict[str, int] = {}
        self._inflight: list[tuple[str, torch.Tensor, torch.futures.Future]] = []
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
        fut = _launch_chunks(flat, self.depth.get(transfer, 1), self.world, self.group, transfer)
        self._inflight.append((transfer, flat, fut))

    def wait(self) -> tuple[str, ...]:
        """Block until every group of this step is averaged into ``.grad``; returns the
        launch order. Raises GateTimeout (strict) when a planned group never became ready."""
        if not self.launched and all(r == len(self.members[t]) for t, r in self._remaining.items()):
            return ()  # no backward since the last step
        incomplete = [t for t, r in self._remaining.items() if r > 0]
        try:
            if incomplete and self.strict:
                raise _never_ready(self.gate, incomplete[0])
            self.gate.flush()
        except GateError:
            self.gate.reset()
            self._reset()
            raise
        for transfer, flat, fut in self._inflight:
            fut.wait()
            at = 0
            for p in self.members[transfer]:
                p.grad.copy_(flat[at : at + p.numel()].view_as(p.grad))
                at += p.numel()
        self.last_order = tuple(self.launched)
        self._reset()
        return self.last_order

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


def groups_of_model(model: nn.Module, per: str = "module", reverse: bool = True) -> list[list[str]]:
    """Parameter groups of a model: one per leaf module (``per="module"``) or one per
    parameter, in backward (gradient-ready) order when `reverse`, else forward order.

    A plan of last resort for examples and tests; a real plan comes from `planner`.
    """
    groups: list[list[str]] = []
    if per == "parameter":
        groups = [[n] for n, p in model.named_parameters() if p.requires_grad]
    else:
        for mod_name, mod in model.named_modules():
            own = [f"{mod_name}.{n}" if mod_name else n
                   for n, p in mod.named_parameters(recurse=False) if p.requires_grad]  # fmt: skip
            if own:
                groups.append(own)
    return groups[::-1] if reverse else groups


def order_in_steps(orders: Sequence[Sequence[str]], plan: TransferPlan) -> float:
    """Fraction of `orders` (one per step) equal to the plan's order."""
    if not orders:
        return 0.0
    return sum(tuple(o) == plan.order for o in orders) / len(orders)
