"""The planned transfers as torch collectives: what the DDP hook (`planner.enforce.
ddp_hook`) and `GradSync` (`planner.enforce.grad_sync`) share.

Binding a plan to a torch model and proving that every rank holds it, cutting a group's
flat gradient into its planned depth of chunks and all-reduces them (the hot path,
marked ``planner.transfer:<name>`` while a profiler records), and the watchdog and
future helpers that fail a step naming its transfer instead of hanging. Apart from
both users so that neither imports the other.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.enforce.binding import Binding, PlanMismatch, bind
from planner.enforce.gate import GateError, PriorityGate
from planner.enforce.plan_file import TransferPlan, canonical, first_difference, plan_digest

TRANSFER_PREFIX = "planner.transfer:"
log = logging.getLogger("planner.enforce")


class TransferFailed(GateError):
    """A planned all-reduce failed or did not finish in time (a peer died or stalled)."""


def trainable_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
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


def one_line(exc: BaseException) -> str:
    """The first sentence of an error, without gloo's ``[file.cc:123]`` prefix."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". ", 1)[0]


def cut_chunks(flat: torch.Tensor, depth: int) -> tuple[torch.Tensor, ...]:
    """`flat` cut into `depth` non-empty views (fewer when it has fewer elements)."""
    parts = torch.tensor_split(flat, max(1, min(depth, flat.numel())))
    return tuple(c for c in parts if c.numel())


def launch_chunks(
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


def process_group_of(group: Any) -> Any:
    """The process group object itself (None: the default group)."""
    return group if group is not None else dist.distributed_c10d._get_default_group()  # noqa: SLF001


class Watchdog:
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
                fail_future(future, error)

    def close(self) -> None:
        self._closed.set()


def when_all(futures: Sequence[torch.futures.Future]) -> torch.futures.Future:
    """One future done when all `futures` are (the future itself when there is one)."""
    return futures[0] if len(futures) == 1 else torch.futures.collect_all(list(futures))


def fail_future(future: torch.futures.Future, error: BaseException) -> None:
    with contextlib.suppress(RuntimeError):  # already completed
        future.set_exception(error)


def complete_future(future: torch.futures.Future, value: torch.Tensor) -> None:
    with contextlib.suppress(RuntimeError):  # failed by the watchdog meanwhile
        future.set_result(value)


def never_ready(gate: PriorityGate, transfer: str) -> GateError:
    return GateError(
        f"planned transfer {transfer!r} (order_index {gate.index.get(transfer, -1)}) never "
        "became ready this iteration: some of its parameters got no gradient"
    )
