"""Where planner's DDP hook spends its calls in a replayed step (`planner.planning.hook_calls`
says how many a plan makes and what each costs): on the ops that launch the plan's
collectives, so that the replay and the comparison count them where the traced step
would have run them."""

from __future__ import annotations

import numpy as np

from planner.model.plan import Plan
from planner.planning import hook_calls
from planner.prediction.compiled import Compiled


def launch_costs(compiled: Compiled, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(op indices, seconds) to add to the ops of `compiled` that launch `plan`'s hooked
    collectives: each group's calls (its depth x `hook_calls.CALL_SECONDS`, shared among its
    collectives) on the op that launched each in the trace, its latest predecessor on
    another resource (DDP's last gradient of the bucket, whose ready hook runs the comm
    hook). Empty for a plan with no hooked call, or whose collectives have no launcher."""
    groups = plan.inputs.get("groups") or ()
    if not hook_calls.calls(plan):
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    added: dict[int, float] = {}
    for group in groups:
        ops = [compiled.index[o] for o in group.get("params") or () if o in compiled.index]
        if not ops or group.get("nbytes", 1) <= 0:
            continue
        share = int(group.get("depth", 1)) * hook_calls.CALL_SECONDS / len(ops)
        for i in ops:
            before = compiled.src[
                (compiled.dst == i) & (compiled.res[compiled.src] != compiled.res[i])
            ]
            if len(before):
                launcher = int(before[np.argmax(compiled.topological_position[before])])
                added[launcher] = added.get(launcher, 0.0) + share
    index = np.fromiter(added, dtype=np.int64, count=len(added))
    return index, np.fromiter(added.values(), dtype=float, count=len(added))
