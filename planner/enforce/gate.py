"""PriorityGate: TicTac's sender counter (§5.1), per iteration, thread-safe.

Each planned transfer has an index k in [0, n): the number of transfers handed over
before it. The gate hands transfer k over only after the k before it, then counts it.
When all n are handed over the counter wraps for the next iteration.

Two ways to use it:

- blocking, one thread per transfer (TicTac's gRPC sender): ``with gate.turn(name):
  launch()`` waits for the turn, and hands over on exit;
- non-blocking, from a thread that must not wait (a PyTorch autograd hook):
  ``gate.submit(name, launch)`` runs `launch` now if it is the transfer's turn, else
  queues it; it runs in the thread whose hand-over makes it next. ``gate.flush()`` ends
  the iteration once every submitted transfer has been handed over.

A missing or unknown transfer never deadlocks: after `timeout` seconds the waiter raises
`GateTimeout` naming the transfer it waited for, or (``strict=False``) goes on and the
skip is counted in `violations`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from planner.enforce.plan_file import TransferPlan, load_plan


class GateError(RuntimeError):
    """The gate cannot hand a transfer over as planned."""


class GateTimeout(GateError):
    """A transfer waited longer than the timeout for one that was never handed over."""

    def __init__(self, transfer: str, waited_for: str, order_index: int, timeout: float) -> None:
        self.transfer = transfer
        self.waited_for = waited_for
        self.order_index = order_index
        self.timeout = timeout
        super().__init__(
            f"transfer {transfer!r} waited {timeout:g} s for {waited_for!r} "
            f"(order_index {order_index}), which was never handed over: is it missing from "
            "this iteration, or is the plan for another model?"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, int, float]]:
        return (type(self), (self.transfer, self.waited_for, self.order_index, self.timeout))


class UnknownTransfer(GateError):
    """A transfer that is not in the plan (strict mode)."""


ViolationKind = Literal["skipped", "late", "unknown", "missing"]


@dataclass(frozen=True)
class Violation:
    """A departure from the plan that the gate let pass (``strict=False``) or recorded.

    skipped: `waited_for` was not handed over in time and `transfer` went ahead of it;
    late: `transfer` arrived after its slot was skipped; unknown: not in the plan;
    missing: never handed over in the iteration (seen at `flush`).
    """

    iteration: int
    kind: ViolationKind
    transfer: str
    waited_for: str | None = None


@dataclass
class _Iteration:
    handed: set[int] = field(default_factory=set)
    skipped: set[int] = field(default_factory=set)
    order: list[str] = field(default_factory=list)


class PriorityGate:
    """A per-iteration sender counter over the total order of `plan` (names -> [0, n))."""

    def __init__(
        self,
        plan: TransferPlan | Sequence[str],
        timeout: float = 30.0,
        strict: bool = True,
        keep_history: int = 1000,
    ) -> None:
        order = plan.order if isinstance(plan, TransferPlan) else tuple(plan)
        if len(set(order)) != len(order):
            raise ValueError("a transfer is listed twice in the plan")
        self.plan = plan if isinstance(plan, TransferPlan) else None
        self.order: tuple[str, ...] = order
        self.index: dict[str, int] = {name: i for i, name in enumerate(order)}
        self.timeout = timeout
        self.strict = strict
        self._keep = keep_history
        self._cv = threading.Condition(threading.RLock())
        self._it = _Iteration()
        self._pending: dict[int, Callable[[], object]] = {}
        self._next = 0
        self.iteration = 0
        self.violations: list[Violation] = []
        self.history: list[tuple[str, ...]] = []
        self.last_order: tuple[str, ...] = ()

    @classmethod
    def from_file(
        cls, path: str | Path, rank: str | None = None, timeout: float = 30.0, strict: bool = True
    ) -> PriorityGate:
        """A gate over the order of a priority file (see `planner.enforce.plan_file`)."""
        return cls(load_plan(path, rank), timeout=timeout, strict=strict)

    # ------------------------------------------------------------------ state (lock held)

    @property
    def counter(self) -> int:
        """Transfers handed over (or skipped) so far in this iteration, in plan order."""
        with self._cv:
            return self._next

    def handed_order(self) -> tuple[str, ...]:
        """The transfers handed over so far in this iteration, in hand-over order."""
        with self._cv:
            return tuple(self._it.order)

    def _advance(self) -> None:
        handed, skipped = self._it.handed, self._it.skipped
        while self._next in handed or self._next in skipped:
            self._next += 1

    def _end_iteration(self) -> None:
        self.last_order = tuple(self._it.order)
        if self._keep:
            self.history.append(tuple(self._it.order))
            del self.history[: -self._keep]
        self._it = _Iteration()
        self._next = 0
        self.iteration += 1
        self._cv.notify_all()

    def _hand_over(self, name: str, idx: int) -> None:
        self._it.handed.add(idx)
        self._it.order.append(name)
        self._advance()
        self._cv.notify_all()
        if self._next >= len(self.order):
            self._end_iteration()

    def _unknown(self, name: str) -> None:
        if self.strict:
            raise UnknownTransfer(f"transfer {name!r} is not in the plan ({len(self.order)} known)")
        self.violations.append(Violation(self.iteration, "unknown", name))

    def _skip_to(self, name: str, idx: int) -> None:
        """Lenient timeout: mark every slot before `idx` not handed over as skipped."""
        for j in range(self._next, idx):
            if j not in self._it.handed:
                self._it.skipped.add(j)
                self.violations.append(Violation(self.iteration, "skipped", name, self.order[j]))
        self._advance()

    # ------------------------------------------------------------------ blocking use

    def wait(self, name: str, timeout: float | None = None) -> bool:
        """Block until it is `name`'s turn; False for an unknown transfer let pass.

        Raises GateTimeout (strict) naming the transfer at the counter when the turn
        does not come within `timeout` (default: the gate's).
        """
        limit = self.timeout if timeout is None else timeout
        with self._cv:
            if name not in self.index:
                self._unknown(name)
                return False
            idx = self.index[name]
            if idx in self._it.skipped:  # its slot was given away: go now
                self.violations.append(Violation(self.iteration, "late", name))
                return True
            deadline = time.monotonic() + limit

            def ready() -> bool:
                return self._next == idx and idx not in self._it.handed

            while not ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    waited = self.order[self._next]
                    if self.strict:
                        raise GateTimeout(name, waited, self._next, limit)
                    self._skip_to(name, idx)
                    return True
                self._cv.wait(left)
            return True

    def done(self, name: str) -> None:
        """Count `name` as handed over (after `wait`)."""
        with self._cv:
            if name not in self.index:
                return
            idx = self.index[name]
            if idx in self._it.skipped:
                self._it.order.append(name)
                self._it.handed.add(idx)
                self._cv.notify_all()
                return
            self._hand_over(name, idx)

    @contextlib.contextmanager
    def turn(self, name: str, timeout: float | None = None) -> Iterator[None]:
        """Wait for `name`'s turn, run the body (the launch), then hand it over."""
        self.wait(name, timeout)
        try:
            yield
        finally:
            self.done(name)

    # ------------------------------------------------------------------ non-blocking use

    def submit(self, name: str, launch: Callable[[], object]) -> bool:
        """Hand `name` over now if it is its turn, else queue `launch` for its turn.

        Returns True when `launch` ran in this call. Queued launches run, in plan order,
        in the thread whose hand-over makes them next (under the gate's lock, so the
        launches reach the network in plan order whatever the threads).
        """
        with self._cv:
            if name not in self.index:
                self._unknown(name)
                launch()
                return True
            idx = self.index[name]
            if idx in self._pending or idx in self._it.handed:
                raise GateError(f"transfer {name!r} submitted twice in iteration {self.iteration}")
            if idx in self._it.skipped:
                self.violations.append(Violation(self.iteration, "late", name))
                self._it.handed.add(idx)
                self._it.order.append(name)
                launch()
                return True
            if idx == self._next:  # its turn (always, in a plan that is the arrival order)
                try:
                    launch()
                finally:
                    self._hand_over(name, idx)
                self._drain()
                return True
            self._pending[idx] = launch
            return self._drain(idx)

    def _drain(self, mine: int = -1) -> bool:
        ran = False
        while self._next in self._pending:
            idx = self._next
            launch = self._pending.pop(idx)
            try:
                launch()
            finally:
                self._hand_over(self.order[idx], idx)
            ran = ran or idx == mine
        return ran

    @property
    def pending(self) -> tuple[str, ...]:
        """Submitted transfers still waiting for their turn, in plan order."""
        with self._cv:
            return tuple(self.order[i] for i in sorted(self._pending))

    def flush(self, timeout: float | None = None) -> tuple[str, ...]:
        """End the iteration: wait until every submitted transfer is handed over.

        Strict: GateTimeout naming the transfer the counter waits for when that does not
        happen within `timeout`. Lenient: the missing ones are skipped (counted) and the
        queued launches run in plan order. Planned transfers never seen in the iteration
        are counted as ``missing``. Returns the iteration's hand-over order.
        """
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._cv:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    first = min(self._pending)
                    if self.strict:
                        raise GateTimeout(self.order[first], self.order[self._next], self._next,
                                          limit)  # fmt: skip
                    self._skip_to(self.order[first], first)
                    self._drain()
                    continue
                self._cv.wait(left)
            if self._next == 0 and not self._it.order:
                return self.last_order  # the iteration wrapped when its last transfer went
            for j in range(len(self.order)):
                if j not in self._it.handed and j not in self._it.skipped:
                    self.violations.append(Violation(self.iteration, "missing", self.order[j]))
            self._end_iteration()
            return self.last_order

    def reset(self) -> None:
        """Drop this iteration's state (queued launches are discarded) and start afresh."""
        with self._cv:
            self._pending.clear()
            self._end_iteration()
