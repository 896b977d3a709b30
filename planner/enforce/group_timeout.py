"""Bound a process group's timeout by the gate timeout, so that a hung peer ends the step.

A plan that is DDP's own order runs with no hook (`planner.enforce.ddp_order`), so no
watchdog of ours sees its all-reduces: a peer that hangs alive holds the survivors for
the process group's timeout (30 minutes for gloo by default, 10 for NCCL). Lowering
that timeout after DDP is built makes DDP's own C++ all-reduce fail instead
(``Timed out waiting 6000ms for recv operation to complete`` from ``backward()``),
with no Python per step. It is the group's timeout, so it applies to every collective
on that group, not only DDP's (a checkpoint barrier, an evaluation all-gather).

Uses torch's private ``distributed_c10d._set_pg_timeout`` (gloo and NCCL backends);
where it is missing or sets nothing, a warning says so and the timeout stays.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("planner.enforce")
SETTER = "torch.distributed.distributed_c10d._set_pg_timeout"


def _backends(group: Any) -> list[Any]:
    """The group's backends (None: the default group's), each once (devices share one)."""
    group = group if group is not None else dist.distributed_c10d._get_default_group()  # noqa: SLF001
    found: dict[int, Any] = {}
    for device in getattr(group, "_device_types", []):
        try:
            backend = group._get_backend(torch.device(device))  # noqa: SLF001
        except RuntimeError:  # no backend for that device
            continue
        found.setdefault(id(backend), backend)
    return list(found.values())


def group_timeout(group: Any) -> datetime.timedelta | None:
    """The timeout of `group` (None: the default group; the shortest of its backends'),
    None when torch hides it."""
    timeouts = []
    for backend in _backends(group):
        value = getattr(getattr(backend, "options", None), "_timeout", None)
        if isinstance(value, datetime.timedelta):
            timeouts.append(value)
    return min(timeouts) if timeouts else None


def _label(group: Any) -> str:
    try:
        return repr(dist.distributed_c10d._get_process_group_name(group))  # noqa: SLF001
    except Exception:  # noqa: BLE001 (a name for a log line only)
        return "<unnamed>"


def bound_group_timeout(
    group: Any, seconds: float, ceiling: datetime.timedelta | None = None
) -> datetime.timedelta | None:
    """Set the timeout of process group `group` (None: the default group) to `seconds`,
    or to `ceiling` when shorter.

    `ceiling`: the longest timeout allowed (default: the group's timeout now; pass the
    value an earlier call returned to bound the user's own timeout again). Logs what
    was set and the previous value; logs a warning naming the missing API when torch
    cannot set it. Returns the timeout the group had (None when torch does not tell).
    """
    group = group if group is not None else dist.distributed_c10d._get_default_group()  # noqa: SLF001
    previous = group_timeout(group)
    top = ceiling if ceiling is not None else previous
    wanted = datetime.timedelta(seconds=seconds)
    if top is not None and top < wanted:
        wanted = top  # never lengthen the user's own timeout
    if previous == wanted:
        log.info("process group %s: timeout stays %s", _label(group), previous)
        return previous
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        log.warning("%s is missing in torch %s: the timeout of process group %s stays %s, so "
                    "a peer that hangs alive holds this rank that long", SETTER,
                    torch.__version__, _label(group), previous or "as set")  # fmt: skip
        return previous
    setter(wanted, group)
    now = group_timeout(group)
    if now != wanted:
        log.warning("%s did not set the timeout of process group %s (backend %s): it stays "
                    "%s", SETTER, _label(group), dist.get_backend(group),
                    now or previous or "as set")  # fmt: skip
        return previous
    log.info("process group %s: timeout %s -> %s (bounded by the gate timeout; applies to "
             "every collective on this group)", _label(group), previous, wanted)  # fmt: skip
    return previous
