"""Where planner's DDP hook spends its time in a replayed step (`planner.planning.hook_calls`
says what its calls and its passes over a plan's groups cost): on the ops that launch
the plan's collectives, so that the replay and the comparison count it where the traced
step would have run it."""

from __future__ import annotations

import numpy as np

from planner.model.plan import Plan
from planner.planning import hook_calls
from planner.prediction.compiled import Compiled


def launch_costs(
    compiled: Compiled, plan: Plan, byte_seconds: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(op indices, seconds) to add to the ops of `compiled` that launch `plan`'s hooked
    collectives: each group's `hook_calls.group_seconds` (its calls, and its pass over its
    bytes at `byte_seconds` a byte: `hook_calls.copy_rate`), shared among its
    collectives, on the op that launched each in the trace, its latest predecessor on
    another resource (DDP's last gradient of the bucket, whose ready hook runs the comm
    hook). Empty for a plan with no hooked call, or whose collectives have no launcher."""
    groups = hook_calls.hooked_groups(plan)
    added: dict[int, float] = {}
    for group in groups:
        ops = [compiled.index[o] for o in group.get("params") or () if o in compiled.index]
        if not ops:
            continue
        share = hook_calls.group_seconds(group, byte_seconds) / len(ops)
        for i in ops:
            before = compiled.src[
                (compiled.dst == i) & (compiled.res[compiled.src] != compiled.res[i])
            ]
            if len(before):
                launcher = int(before[np.argmax(compiled.topological_position[before])])
                added[launcher] = added.get(launcher, 0.0) + share
    index = np.fromiter(added, dtype=np.int64, count=len(added))
    return index, np.fromiter(added.values(), dtype=float, count=len(added))


def hook_time(
    compiled: Compiled, plan: Plan, seconds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """`launch_costs` of `plan` at the rate DDP's copies ran at in `seconds` (the op
    times, `hook_calls.copy_rate`), and the hook's whole time per step
    (`hook_calls.step_seconds`): what the replay and the comparison add for a plan the
    hook runs."""
    rate = hook_calls.copy_rate(compiled.names, seconds, plan)
    return (*launch_costs(compiled, plan, rate), hook_calls.step_seconds(plan, rate))
