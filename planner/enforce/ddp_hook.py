"""The DDP communication hook that applies a plan (`PlanCommHook`), and
`register_plan_hook`, which binds it to a DDP model or leaves a plan that is DDP's own
bucket order to DDP itself (the overview is in `planner.enforce.torch_ddp`).

Apart from `GradSync` (`planner.enforce.grad_sync`): the hook works on DDP's buckets,
which it cuts into the plan's groups per bucket layout, while GradSync all-reduces the
groups of a model without DDP.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.enforce.binding import Binding, BoundariesUnknown, PlanMismatch
from planner.enforce.ddp_order import ddp_order_difference, may_be_ddp_order
from planner.enforce.gate import GateError, PriorityGate
from planner.enforce.group_timeout import bound_group_timeout
from planner.enforce.plan_file import TransferPlan, plan_digest
from planner.enforce.torch_transfers import (
    TransferFailed,
    Watchdog,
    agree_on_plan,
    bind_model,
    complete_future,
    cut_chunks,
    fail_future,
    launch_chunks,
    never_ready,
    one_line,
    process_group_of,
    trainable_parameters,
    when_all,
)

log = logging.getLogger("planner.enforce")


@dataclass
class _BucketState:
    buffer: torch.Tensor
    future: torch.futures.Future
    outstanding: int = 0


@dataclass
class _Piece:
    """Part of a planned group that lies in one DDP bucket: a slice of its flat buffer."""

    bucket: _BucketState
    offset: int
    numel: int


@dataclass(frozen=True)
class _Route:
    """How one DDP bucket (a layout DDP keeps until it rebuilds) maps to planned transfers.

    `pieces`: per transfer, its parameter count in the bucket and its (offset, numel)
    slices. `whole`: the bucket is exactly one planned transfer, all-reduced in place
    through `chunks` (views of the bucket buffer, cut to the planned depth).
    """

    pieces: tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...]
    whole: str | None = None
    chunks: tuple[torch.Tensor, ...] = ()
    provisional: bool = False  # DDP's first-step buckets, before the binding (ungated)


@dataclass
class _Step:
    remaining: dict[str, int]
    pieces: dict[str, list[_Piece]] = field(default_factory=dict)
    provisional: bool = False


class PlanCommHook:
    """State of the DDP communication hook (see `planner.enforce.torch_ddp`); register with
    `register_plan_hook`."""

    def __init__(
        self,
        ddp: nn.parallel.DistributedDataParallel,
        plan: TransferPlan,
        gate: PriorityGate | None = None,
        group: Any = None,
        strict: bool = True,
        timeout: float = 30.0,
        agree: bool = True,
    ) -> None:
        self.plan = plan
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._pg = process_group_of(group)
        self.gate = gate or PriorityGate(plan, timeout=timeout, strict=strict)
        self.strict = self.gate.strict
        named = trainable_parameters(ddp)
        self._by_bucket: dict[int, tuple[str, int]] | None = None
        try:
            self.binding = bind_model(plan, named, self.strict)
        except BoundariesUnknown as exc:  # bind to DDP's own buckets once it rebuilds them
            log.info("plan %s: %s; binding DDP's rebuilt buckets by index and bytes",
                     plan.source or "<plan>", exc)  # fmt: skip
            self.binding = Binding({}, "ddp_buckets")
            self._by_bucket = {b.index: (t.name, b.nbytes) for t in plan.transfers
                               for b in t.buckets}  # fmt: skip
        self.owner = self.binding.owner
        self._steps_done = 0
        self.digest = agree_on_plan(plan, group) if agree else plan_digest(plan)
        self.names = {id(p): n for n, p in named}
        self.depth = {t.name: t.depth for t in plan.transfers}
        self.size = {t.name: 0 for t in plan.transfers}  # units: parameters, or buckets
        for name, _ in named:
            if name in self.owner:
                self.size[self.owner[name]] += 1
        if self._by_bucket is not None:
            self.size = {t.name: len(t.buckets) for t in plan.transfers}
        self._routes: dict[tuple[int, int, int], _Route] = {}
        self._step: _Step | None = None
        self._lock = threading.Lock()
        self._watchdog = Watchdog(self.gate.timeout, self._stuck)
        self.launched: list[str] = []  # this iteration, in launch order
        self.launched_last: tuple[str, ...] = ()
        self._failure: TransferFailed | None = None
        self.applied_by = "hook"  # or "ddp" (DDP's own order), "pending" (not decided yet)
        self._ddp: nn.parallel.DistributedDataParallel | None = None
        self._probe: Any = None
        self._synced_forwards = 0  # forwards that sync gradients: the step counter, no hook
        self._pg_ceiling: Any = None  # the group's timeout before `bound_timeout`
        self._pg_bounded = False

    @property
    def failure(self) -> TransferFailed | None:
        """The error that failed a step (DDP re-raises it wrapped; this is the plain one)."""
        return self._failure or self._watchdog.failure

    @failure.setter
    def failure(self, error: TransferFailed) -> None:
        self._failure = error

    # ---------------------------------------------------------------- registration-time work

    def install(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        """Register this hook on `ddp` (DDP takes one communication hook, for good)."""
        ddp.register_comm_hook(self, _hook)
        self.applied_by = "hook"

    def may_be_ddp_order(self, ddp: nn.parallel.DistributedDataParallel) -> bool:
        """Whether the plan can be DDP's own order (`planner.enforce.ddp_order`)."""
        owner = None if self._by_bucket is not None else self.owner
        return may_be_ddp_order(self.plan, owner, [n for n, _ in trainable_parameters(ddp)])

    def defer(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        """Decide between DDP itself and the hook on DDP's final buckets: now when DDP
        will not rebuild them, else at the first forward after it did. A forward
        pre-hook on the wrapped module makes the check and, while DDP applies the plan,
        counts the steps (one call per forward, none per bucket; `explain` names the
        step); it is removed if the hook is installed."""
        self._ddp = ddp
        self.applied_by = "pending"
        self._probe = ddp.module.register_forward_pre_hook(self._before_forward)
        if ddp.find_unused_parameters and not ddp.static_graph:  # DDP never rebuilds
            self._decide()

    def _before_forward(self, *_: Any) -> None:
        ddp = self._ddp
        if ddp is None or not (torch.is_grad_enabled() and ddp.require_backward_grad_sync):
            return
        self._synced_forwards += 1
        if self.applied_by != "pending":
            return
        # DDP rebuilds its buckets in the forward after the first synced backward
        if getattr(ddp, "_has_rebuilt_buckets", False) or self._synced_forwards >= 2:
            self._decide()

    def _decide(self) -> None:
        ddp = self._ddp
        assert ddp is not None
        buckets = ddp.reducer._get_zeros_like_grad_buckets()  # noqa: SLF001 (once)
        names = [[self.names.get(id(p), "?") for p in b.parameters()] for b in buckets]
        nbytes = [b.buffer().numel() * b.buffer().element_size() for b in buckets]
        owner = None if self._by_bucket is not None else self.owner
        difference = ddp_order_difference(self.plan, owner, names, nbytes)
        source = self.plan.source or "<plan>"
        if difference is None:
            self.applied_by = "ddp"
            self._watchdog.close()
            log.info("plan %s is DDP's own bucket order (%d buckets, depth 1): DDP applies it "
                     "itself, no hook installed", source, len(buckets))  # fmt: skip
            return
        log.info("plan %s is not DDP's own order (%s): the hook applies it from this step on",
                 source, difference)  # fmt: skip
        if self._probe is not None:
            self._probe.remove()
            self._probe = None
        self._ddp = None
        self._steps_done = max(self._steps_done, 1)  # DDP's buckets are final
        self.install(ddp)
        if self._pg_bounded:  # the watchdog speaks first now: the bound is a backstop
            self.bound_timeout()

    def bound_timeout(self) -> None:
        """Bound the process group's timeout by the gate timeout (`planner.enforce.
        group_timeout`), so that a peer that hangs alive ends the step on this rank:
        the gate timeout while DDP applies the plan itself (nothing else watches it),
        twice it under the hook (whose watchdog fails the step first, naming the
        transfer; the group's timeout then frees the collective still waiting)."""
        seconds = self.gate.timeout * (2 if self.applied_by == "hook" else 1)
        before = bound_group_timeout(self._pg, seconds, self._pg_ceiling)
        if not self._pg_bounded:
            self._pg_ceiling = before
            self._pg_bounded = True

    def explain(self, error: BaseException) -> TransferFailed | None:
        """The one-line error for `error`, raised by a step of this DDP (``backward()``);
        None when it is not a failed transfer.

        Under the hook: `failure`, which names the transfer. Without a hook (the plan
        is DDP's own order) DDP raises the backend's error from its C++ all-reduce, and
        says neither the step nor the bucket; this names the rank, the step (the
        forwards counted) and the planned transfers that could not all complete. DDP
        waits for its buckets in index order, so the failed one is the first of them
        not yet reduced; which that is, DDP does not tell without a hook, so all the
        step's transfers are named, in that order.
        """
        if self.failure is not None or self.applied_by == "hook":
            return self.failure
        text = " ".join(str(error).split()).lower()
        if not any(mark in text for mark in _COLLECTIVE_FAILURES):
            return None
        step = max(0, self._synced_forwards - 1)
        cause = one_line(error)
        if self.applied_by == "pending":
            return TransferFailed(
                f"step {step}: DDP's all-reduce of its first-step buckets (the plan applies "
                f"from DDP's final buckets on) failed on rank {self.rank}: {cause}: a peer "
                "rank stalled or died"
            )
        order = self.plan.order
        listed = ", ".join(repr(t) for t in order[:4]) + (", ..." if len(order) > 4 else "")
        return TransferFailed(
            f"step {step}: a planned transfer failed on rank {self.rank}: one of the "
            f"{len(order)} planned transfers {listed} (DDP buckets 0 to {len(order) - 1}, "
            "reduced in that order; without a hook DDP does not tell which): "
            f"{cause}: a peer rank stalled or died"
        )

    def _bucket_route(self, bucket: dist.GradBucket, buffer: torch.Tensor) -> _Route:
        """A plan bound to DDP's buckets: planned bucket k is DDP's bucket k, same bytes."""
        if self._steps_done == 0:  # DDP's first-step layout: it rebuilds after it
            return _Route((), provisional=True)
        k, nbytes = bucket.index(), buffer.numel() * buffer.element_size()
        planned = (self._by_bucket or {}).get(k)
        if planned is None or planned[1] != nbytes:
            raise PlanMismatch(
                f"DDP bucket {k} holds {nbytes} bytes, the plan's bucket {k} "
                f"{planned[1] if planned else 'does not exist'}"
                f"{' bytes' if planned else ''}: is the plan for another model, or another "
                "bucket_cap_mb?"
            )
        transfer = planned[0]
        names = ", ".join(self.names.get(id(p), "?") for p in bucket.parameters())
        log.info("DDP bucket %d (%s) <- %s", k, transfer, names)
        pieces = ((transfer, 1, ((0, buffer.numel()),)),)
        if self.size[transfer] == 1:
            return _Route(pieces, transfer, cut_chunks(buffer, self.depth.get(transfer, 1)))
        return _Route(pieces)

    def _route(self, bucket: dist.GradBucket, buffer: torch.Tensor) -> _Route:
        """Cut a bucket layout into planned transfers (once per layout, not per step)."""
        if self._by_bucket is not None:
            return self._bucket_route(bucket, buffer)
        spans: dict[str, list[tuple[int, int]]] = {}
        counts: dict[str, int] = {}
        offset = 0
        for param in bucket.parameters():
            name = self.names.get(id(param), f"<unnamed {tuple(param.shape)}>")
            transfer = self.owner.get(name, f"unplanned:bucket{bucket.index()}")
            mine = spans.setdefault(transfer, [])
            if mine and mine[-1][0] + mine[-1][1] == offset:  # contiguous: one slice
                mine[-1] = (mine[-1][0], mine[-1][1] + param.numel())
            else:
                mine.append((offset, param.numel()))
            counts[transfer] = counts.get(transfer, 0) + 1
            offset += param.numel()
        if offset != buffer.numel():
            raise GateError(f"DDP bucket {bucket.index()}: parameters do not tile its buffer")
        pieces = tuple((t, counts[t], tuple(spans[t])) for t in spans)
        if len(pieces) == 1 and counts[pieces[0][0]] == self.size.get(pieces[0][0], -1):
            t = pieces[0][0]
            return _Route(pieces, t, cut_chunks(buffer, self.depth.get(t, 1)))
        log.info("DDP bucket %d is cut into %d planned transfer(s): %s", bucket.index(),
                 len(pieces), ", ".join(t for t, _, _ in pieces))  # fmt: skip
        return _Route(pieces)

    # ---------------------------------------------------------------- per step (hot path)

    def __call__(self, bucket: dist.GradBucket) -> torch.futures.Future:
        buffer = bucket.buffer()
        key = (bucket.index(), buffer.data_ptr(), buffer.numel())
        route = self._routes.get(key)
        if route is None:
            route = self._route(bucket, buffer)
            if not route.provisional:  # DDP may keep its first layout: decide again then
                self._routes[key] = route
        step = self._step
        if step is None:
            step = self._step = _Step(dict(self.size))
        out: torch.futures.Future = torch.futures.Future()
        if route.provisional:  # reduced at once, as DDP would; this step is not gated
            step.provisional = True
            self._watchdog.watch(out, f"DDP bucket {bucket.index()}")
            futures = launch_chunks((buffer,), buffer, self.world, self._pg, None)
            futures[0].add_done_callback(
                partial(self._settled, f"DDP bucket {bucket.index()}", futures,
                        partial(complete_future, out, buffer), (out,))
            )  # fmt: skip
        elif route.whole is not None:
            self._watchdog.watch(out, route.whole)
            step.remaining[route.whole] = 0
            self.gate.submit(route.whole, partial(self._launch_whole, route, buffer, out))
        else:
            self._watchdog.watch(out, route.pieces[0][0])
            state = _BucketState(buffer, out, sum(len(spans) for _, _, spans in route.pieces))
            for transfer, count, spans in route.pieces:
                parts = step.pieces.setdefault(transfer, [])
                parts.extend(_Piece(state, o, n) for o, n in spans)
                left = step.remaining.get(transfer, count) - count
                step.remaining[transfer] = left
                if left == 0:
                    self.gate.submit(transfer, partial(self._launch_pieces, transfer, step))
        if bucket.is_last():
            self._end_iteration(step)
        return out

    def _launch_whole(self, route: _Route, buffer: torch.Tensor, out: torch.futures.Future) -> None:
        transfer = route.whole or ""
        self.launched.append(transfer)
        futures = launch_chunks(route.chunks, buffer, self.world, self._pg, transfer)
        when_all(futures).add_done_callback(
            partial(self._settled, transfer, futures, partial(complete_future, out, buffer), (out,))
        )

    def _launch_pieces(self, transfer: str, step: _Step) -> None:
        pieces = step.pieces[transfer]
        flat = torch.cat([p.bucket.buffer[p.offset : p.offset + p.numel] for p in pieces])
        self.launched.append(transfer)
        chunks = cut_chunks(flat, self.depth.get(transfer, 1))
        futures = launch_chunks(chunks, flat, self.world, self._pg, transfer)

        def scatter() -> None:
            at = 0
            finished = []
            with self._lock:
                for p in pieces:
                    p.bucket.buffer[p.offset : p.offset + p.numel].copy_(flat[at : at + p.numel])
                    at += p.numel
                    p.bucket.outstanding -= 1
                    if p.bucket.outstanding == 0:
                        finished.append(p.bucket)
            for b in finished:
                complete_future(b.future, b.buffer)

        outs = [p.bucket.future for p in pieces]
        when_all(futures).add_done_callback(
            partial(self._settled, transfer, futures, scatter, outs)
        )

    def _settled(
        self,
        transfer: str,
        futures: Sequence[torch.futures.Future],
        then: Callable[[], None],
        outs: Sequence[torch.futures.Future],
        _: torch.futures.Future,
    ) -> None:
        """Called once every chunk's all-reduce has ended: fail the step on an error,
        else run `then`."""
        for f in futures:
            try:
                f.value()
            except Exception as exc:  # a failed collective fails the step, as in DDP
                error = TransferFailed(
                    f"transfer {transfer!r} (order_index {self.gate.index.get(transfer, -1)}) "
                    f"failed on rank {self.rank}: {one_line(exc)}"
                )
                self.failure = error
                for out in outs:
                    fail_future(out, error)
                return
        then()

    def _stuck(self, transfer: str) -> str:
        """The one-line error for a step that did not finish within the gate timeout."""
        waiting = self.gate.pending
        if waiting:
            at = self.gate.counter
            name = self.gate.order[at] if at < len(self.gate.order) else waiting[0]
            return (
                f"planned transfer {name!r} (order_index {at}) never arrived on rank "
                f"{self.rank} within {self.gate.timeout:g} s ({len(waiting)} transfer(s) queued "
                "behind it)"
            )
        name = self.launched[-1] if self.launched else transfer
        return (
            f"transfer {name!r} (order_index {self.gate.index.get(name, -1)}) did not finish "
            f"on rank {self.rank} within {self.gate.timeout:g} s: a peer rank stalled or died"
        )

    def _end_iteration(self, step: _Step) -> None:
        """After the last bucket nothing more can arrive: every group must have launched."""
        self._step = None
        self._steps_done += 1
        if step.provisional:
            self.launched_last = ()
            return
        incomplete = [t for t, left in step.remaining.items() if left > 0]
        try:
            if incomplete and self.strict:
                raise never_ready(self.gate, incomplete[0])
            for t in incomplete:  # lenient: reduce what arrived
                if step.pieces.get(t):
                    self.gate.submit(t, partial(self._launch_pieces, t, step))
            self.gate.flush(timeout=0.0)
        except GateError as exc:
            for parts in step.pieces.values():
                for p in parts:
                    fail_future(p.bucket.future, exc)
            self.gate.reset()
            raise
        self.launched_last = tuple(self.launched)
        self.launched = []

    def close(self) -> None:
        """Stop the watchdog thread (and the pending check of DDP's order)."""
        if self._probe is not None:
            self._probe.remove()
            self._probe = None
        self._watchdog.close()


_COLLECTIVE_FAILURES = ("gloo", "nccl", "processgroup", "connection closed", "connection reset",
                        "timed out", "timeout", "broken pipe", "pair closure")  # fmt: skip
"""Words (lower case) of the errors a failed or timed-out collective raises (gloo, NCCL,
c10d); gloo's include ``Timed out waiting 6000ms for recv operation to complete``,
``Application timeout caused pair closure`` (another op of the step timed out first)
and ``Connection reset by peer``."""


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
    agree: bool = True,
    ddp_order: bool = True,
    pg_timeout: bool = True,
) -> PlanCommHook:
    """Apply `plan` on `ddp`: the gated, depth-splitting all-reduce hook; returns its state.

    Binds the plan to the model (refusing one made for another model) and, with `agree`,
    checks over the process group that every rank holds the same plan. A step whose
    transfers do not all finish within `timeout` seconds (a peer stalled or died, a
    bucket never arrived) or whose all-reduce fails raises `GateError` from backward.

    With `ddp_order` (and no `gate` of the caller's), a plan that is DDP's own order gets
    no hook: DDP applies it by itself at no cost (``state.applied_by`` is ``"ddp"``; it
    is ``"pending"`` until DDP's buckets are final, ``"hook"`` otherwise).

    With `pg_timeout`, the timeout of DDP's process group is bounded by `timeout` (twice
    it under the hook; `PlanCommHook.bound_timeout`): for every collective on that
    group, so that a peer that hangs alive ends the step, not only DDP's.
    """
    state = PlanCommHook(ddp, plan, gate=gate, group=ddp.process_group, strict=strict,
                         timeout=timeout, agree=agree)  # fmt: skip
    if ddp_order and gate is None and state.may_be_ddp_order(ddp):
        state.defer(ddp)
    else:
        state.install(ddp)
    if pg_timeout:
        state.bound_timeout()
    return state
