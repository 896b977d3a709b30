"""Whether a CPU rank's trace was taken while other processes wanted its cores.

A CPU op that shares its core with another runnable process is stretched by whole
scheduler slices in some steps and not in others. In a data-parallel step nothing of the
job's own runs beside the forward pass (DDP's all-reduces end before the optimizer step;
the backward pass is where gloo's reduction shares the cores, which the bucket sweep's
``kappa`` models), so the forward ops' stretch over their own median is the trace's
sign of foreign load. Measured on the lab's 2-rank gloo jobs on 2 cores: 0.12-0.24
quiet, 0.49 with 1.4 foreign cores busy (docs/algorithms.md, "Foreign load").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.model.graph import on_gpu
from planner.model.trace import Job, op_flags

FOREIGN_STRETCH = 0.35
"""`forward_stretch` above this: the trace is taken as recorded under foreign CPU load."""
MIN_STEPS = 3
"""Fewer traced steps than this tell no op's usual duration."""


def forward_stretch(job: Job, rank: str) -> dict[str, Any] | None:
    """The time a CPU rank's forward-pass ops took beyond their own median over the traced
    steps, as a share of their time (``stretch``), with the ops and steps it is taken
    over; None on a GPU rank (its CPU ops wait on the device's queue, not on cores) or
    with fewer than `MIN_STEPS` steps of forward ops."""
    graph = job.graphs[rank]
    if any(on_gpu(op.resource) for op in graph.ops.values()):
        return None
    names, codes = job.trace.op_codes
    rows = job.trace.rows_of(rank)
    (forward,) = op_flags(graph, names, codes[rows],
                          lambda o: o.kind == "compute" and o.phase == "forward")  # fmt: skip
    rows = rows[forward]
    if not len(rows):
        return None
    code = codes[rows]
    duration = job.trace.table["duration"][rows].astype(np.float64)
    steps = len(np.unique(job.trace.table["iteration"][rows]))
    if steps < MIN_STEPS:
        return None
    order = np.argsort(code, kind="stable")
    code, duration = code[order], duration[order]
    cuts = np.flatnonzero(np.diff(code)) + 1
    groups = [g for g in np.split(duration, cuts) if len(g) >= MIN_STEPS]
    total = float(sum(g.sum() for g in groups))
    if total <= 0:
        return None
    beyond = sum(float(np.clip(g - np.median(g), 0, None).sum()) for g in groups)
    return {"stretch": beyond / total, "ops": len(groups), "steps": steps}


def is_loaded(stretch: dict[str, Any] | None) -> bool:
    """Whether `forward_stretch`'s figure says foreign load."""
    return stretch is not None and stretch["stretch"] > FOREIGN_STRETCH


def load_line(stretch: dict[str, Any]) -> str:
    """The finding in words, for a note or a refused recommendation."""
    return (
        f"the trace looks taken under foreign CPU load: its forward ops ran "
        f"{stretch['stretch']:.0%} beyond their own median over {stretch['steps']} steps "
        f"(above {FOREIGN_STRETCH:.0%}: other processes held the cores), so its compute "
        f"times and contention carry that load; trace it again on a quiet machine"
    )
