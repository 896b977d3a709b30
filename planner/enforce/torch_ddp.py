"""PyTorch enforcement: a DDP communication hook and a gradient-sync module, both gated.

- `register_plan_hook(ddp, plan)`: a plan that is DDP's own order (its transfers are
  DDP's buckets in index order, depth 1: `planner.enforce.ddp_order`) is applied by DDP
  itself, with no hook and so no per-step cost; the check is made on DDP's final
  buckets, at the first forward after DDP rebuilds them, and installs the hook then if
  the plan turns out to differ. Any other plan gets the hook at registration.
- `PlanCommHook`: DDP calls it once per bucket. A
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

Both bind the plan to the model at registration (`planner.enforce.binding`: by names,
or a traced job's DDP buckets by order, bytes and shape; a plan for another model is
refused) and prove over the process group that every rank holds the same plan (a
digest exchange). A failed all-reduce, or a step not done within the timeout (a peer
died or stalled, a bucket never arrived), raises on this rank naming the transfer. With
no hook (DDP's own order) nothing of ours watches the all-reduces: the timeout of DDP's
process group is bounded by the gate timeout instead (`planner.enforce.group_timeout`),
and `PlanCommHook.explain` turns DDP's error into one line naming rank, step and the
step's transfers.

Each launch is recorded as a profiler range ``planner.transfer:<name>`` (while a profiler
records) so that `planner verify` can read the order back from a torch.profiler trace.
Gradients are averaged (divided by the world size, then summed), as DDP's default.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.enforce.binding import Binding, BoundariesUnknown, PlanMismatch, bind
from planner.enforce.ddp_order import ddp_order_difference, may_be_ddp_order
from planner.enforce.gate import GateError, PriorityGate
from planner.enforce.group_timeout import bound_group_timeout
from planner.enforce.plan_file import TransferPlan, canonical, first_difference, plan_digest

TRANSFER_PREFIX = "planner.transfer:"
log = logging.getLogger("planner.enforce")


class TransferFailed(GateError):
    """A planned all-reduce failed or did not finish in time (a peer died or stalled)."""


def _trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of the trainable parameters of the (unwrapped) model."""
    inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
    return [(n, p) for n, p in inner.named_parameters() if p.requires_grad]


def bind_model(
    plan: TransferPlan, named: Sequence[tuple[str, nn.Parameter]], strict: bool
) -> Binding:
    """Bind `plan` to the parameters `named` (`planner.enforce.binding`); log the mapping."""
    binding = bind(plan, [(n, p.numel() * p.element_size(), tuple(p.shape)) for n, p in named],
                   strict)  # fmt: skip
    for line in binding.mapping:
        log.info("plan %s: %s", plan.source or "<plan>", line)
    return binding


def agree_on_plan(plan: TransferPlan, group: Any = None) -> str:
    """Prove that every rank of `group` holds the same plan; returns its digest.

    The ranks exchange `plan_digest` and `canonical` over the process group (once, at
    registration); on a difference every rank raises `PlanMismatch` naming the first.
    """
    digest = plan_digest(plan)
    world = dist.get_world_size(group)
    if world == 1:
        return digest
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (digest, canonical(plan)), group=group)
    me = dist.get_rank(group)
    for rank, (other, plan_there) in enumerate(gathered):
        if other != digest:
            where = first_difference(plan, plan_there) or "same transfers, other digest"
            raise PlanMismatch(
                f"rank {me} and rank {rank} hold different plans (digest {digest[:12]} vs "
                f"{other[:12]}): {where}"
            )
    return digest


def _one_line(exc: BaseException) -> str:
    """The first sentence of an error, without gloo's ``[file.cc:123]`` prefix."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". ", 1)[0]


def _chunks(flat: torch.Tensor, depth: int) -> tuple[torch.Tensor, ...]:
    """`flat` cut into `depth` non-empty views (fewer when it has fewer elements)."""
    parts = torch.tensor_split(flat, max(1, min(depth, flat.numel())))
    return tuple(c for c in parts if c.numel())


def _launch_chunks(
    chunks: Sequence[torch.Tensor], flat: torch.Tensor, world: int, pg: Any, name: str | None
) -> list[torch.futures.Future]:
    """Average `flat` (cut into `chunks` views) across ranks: chunks all-reduced concurrently.

    The hot path: straight to the process group `pg`; the profiler range
    ``planner.transfer:<name>`` only while a profiler records (none for `name` None).
    """
    if name is not None and torch.autograd.profiler._is_profiler_enabled:  # noqa: SLF001
        with torch.profiler.record_function(f"{TRANSFER_PREFIX}{name}"):
            flat.div_(world)
            return [pg.allreduce([c]).get_future() for c in chunks]
    flat.div_(world)
    return [pg.allreduce([c]).get_future() for c in chunks]


def _process_group(group: Any) -> Any:
    """The process group object itself (None: the default group)."""
    return group if group is not None else dist.distributed_c10d._get_default_group()  # noqa: SLF001


class _Watchdog:
    """Fails futures not done `timeout` seconds after they were watched (a daemon thread).

    DDP waits for every bucket's future at the end of backward, and gloo waits for a
    peer up to the process group's timeout (30 min): failing the future ends the step on
    this rank within the gate timeout instead, naming the transfer.
    """

    def __init__(self, timeout: float, describe: Callable[[str], str]) -> None:
        self.timeout = timeout
        self.failure: TransferFailed | None = None
        self._describe = describe
        self._items: collections.deque[tuple[float, torch.futures.Future, str]] = (
            collections.deque()
        )
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="planner-watchdog", daemon=True)
        self._thread.start()

    def watch(self, future: torch.futures.Future, transfer: str) -> None:
        self._items.append((time.monotonic() + self.timeout, future, transfer))

    def _run(self) -> None:
        tick = min(1.0, max(0.05, self.timeout / 10))
        while not self._closed.wait(tick):
            now = time.monotonic()
            while self._items and self._items[0][1].done():
                self._items.popleft()
            if not self._items or self._items[0][0] > now:
                continue
            error = self.failure = TransferFailed(self._describe(self._items[0][2]))
            while self._items:
                _, future, _ = self._items.popleft()
                _fail(future, error)

    def close(self) -> None:
        self._closed.set()


def _when_all(futures: Sequence[torch.futures.Future]) -> torch.futures.Future:
    """One future done when all `futures` are (the future itself when there is one)."""
    return futures[0] if len(futures) == 1 else torch.futures.collect_all(list(futures))


def _fail(future: torch.futures.Future, error: BaseException) -> None:
    with contextlib.suppress(RuntimeError):  # already completed
        future.set_exception(error)


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
        agree: bool = True,
    ) -> None:
        self.plan = plan
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._pg = _process_group(group)
        self.gate = gate or PriorityGate(plan, timeout=timeout, strict=strict)
        self.strict = self.gate.strict
        named = _trainable(ddp)
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
        self._watchdog = _Watchdog(self.gate.timeout, self._stuck)
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
        return may_be_ddp_order(self.plan, owner, [n for n, _ in _trainable(ddp)])

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
        cause = _one_line(error)
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
            return _Route(pieces, transfer, _chunks(buffer, self.depth.get(transfer, 1)))
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
            return _Route(pieces, t, _chunks(buffer, self.depth.get(t, 1)))
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
            futures = _launch_chunks((buffer,), buffer, self.world, self._pg, None)
            futures[0].add_done_callback(
                partial(self._settled, f"DDP bucket {bucket.index()}", futures,
                        partial(_complete, out, buffer), (out,))
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
        futures = _launch_chunks(route.chunks, buffer, self.world, self._pg, transfer)
        _when_all(futures).add_done_callback(
            partial(self._settled, transfer, futures, partial(_complete, out, buffer), (out,))
        )

    def _launch_pieces(self, transfer: str, step: _Step) -> None:
        pieces = step.pieces[transfer]
        flat = torch.cat([p.bucket.buffer[p.offset : p.offset + p.numel] for p in pieces])
        self.launched.append(transfer)
        chunks = _chunks(flat, self.depth.get(transfer, 1))
        futures = _launch_chunks(chunks, flat, self.world, self._pg, transfer)

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
                _complete(b.future, b.buffer)

        outs = [p.bucket.future for p in pieces]
        _when_all(futures).add_done_callback(
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
                    f"failed on rank {self.rank}: {_one_line(exc)}"
                )
                self.failure = error
                for out in outs:
                    _fail(out, error)
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
                raise _never_ready(self.gate, incomplete[0])
            for t in incomplete:  # lenient: reduce what arrived
                if step.pieces.get(t):
                    self.gate.submit(t, partial(self._launch_pieces, t, step))
            self.gate.flush(timeout=0.0)
        except GateError as exc:
            for parts in step.pieces.values():
                for p in parts:
                    _fail(p.bucket.future, exc)
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


def _complete(future: torch.futures.Future, value: torch.Tensor) -> None:
    with contextlib.suppress(RuntimeError):  # failed by the watchdog meanwhile
        future.set_result(value)


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
        named = _trainable(model)
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
        chunks = _chunks(flat, self.depth.get(transfer, 1))
        futures = _launch_chunks(chunks, flat, self.world, _process_group(self.group), transfer)
        self._inflight.append((transfer, flat, futures))

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
                    f"{where} failed on rank {self.rank}: {_one_line(exc)}"
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
