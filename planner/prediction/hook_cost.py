"""Where planner's DDP hook spends its calls in a replayed step (`planner.planning.hook_calls`
says how many a plan makes and what each costs): on the ops that launch the plan's
collectives, so that the replay and the comparison count them where the traced step
would have run them."""

from __future__ import annotations

import numpy as np

from planner.model.plan import Plan
from planner.planning import hook_calls
from planner.prediction.compiled import Compiled


def launch_costs(
    compiled: Compiled, plan: Plan, seconds: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(op indices, seconds) to add to the ops of `compiled` that launch `plan`'s hooked
    collectives: each group's `hook_calls.group_seconds` (its calls, and its pass over its
    bytes at the rate DDP's copies ran at in `seconds`, the op times:
    `hook_calls.copy_rate`; no pass without them), shared among its collectives, on the
    op that launched each in the trace, its latest predecessor on another resource
    (DDP's last gradient of the bucket, whose ready hook runs the comm hook). Empty for
    a plan with no hooked call, or whose collectives have no launcher."""
    groups = hook_calls.hooked_groups(plan)
    rate = hook_calls.copy_rate(compiled.names, seconds, plan) if seconds is not None else 0.0
    added: dict[int, float] = {}
    for group in groups:
        ops = [compiled.index[o] for o in group.get("params") or () if o in compiled.index]
        if not ops:
            continue
        share = hook_calls.group_seconds(group, rate) / len(ops)
        for i in ops:
            before = compiled.src[
                (compiled.dst == i) & (compiled.res[compiled.src] != compiled.res[i])
            ]
            if len(before):
                launcher = int(before[np.argmax(compiled.topological_position[before])])
                added[launcher] = added.get(launcher, 0.0) + share
    index = np.fromiter(added, dtype=np.int64, count=len(added))
    return index, np.fromiter(added.values(), dtype=float, count=len(added))
