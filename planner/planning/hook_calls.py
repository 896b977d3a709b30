"""What planner's DDP communication hook costs: a plan's price for running through it
(issue #44: a hooked plan's predicted gain must be net of the hook).

A Caramel plan is applied by `planner.enforce.torch_ddp.register_plan_hook`: unless the
plan is DDP's own bucket order (each group one traced all-reduce, in the order DDP
issued them, at depth 1: `own_order`), DDP hands each ready bucket to the hook, whose
gate launches the plan's all-reduce calls (a group's `depth` chunks) from Python on the
thread that runs the backward pass. There the hook costs, time the traced step never
spent:

- each call `CALL_SECONDS` (a GIL hand-off and the gate's bookkeeping);
- each group one more pass over its bytes. The hook averages the group in place before
  its all-reduce; DDP without a hook divides each gradient while copying it into its
  bucket (the reducer's fused ``mul_out``), and with one only copies. The pass runs at
  the rate the trace shows for DDP's copies of the buckets back into the gradients
  (`copy_rate`; on a GPU both are kernels the CPU only launches).

Where that time goes is the predictions': on the op that launched each collective in
the replay (`planner.prediction.hook_cost`), after each bucket's last gradient in the
bucket sweep (`bucket_replay.replay`, ``hook``), so that it delays the rest of the
backward pass and the collective's start, and costs the step nothing where the step
waits for the wire. The lab measured 0.24 ms a call on the mlp's CPU-bound step (256
KiB buckets), 0.03 ms where the link was the bottleneck, and 0.90 and 0.54 ms on the
wide model's 4 MiB buckets unshaped, predicted 1.42 and 0.81 with the pass, 0.62 and
0.23 without it (bench/lab, docs/validation.md, "The hook's cost").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from planner.model.plan import Plan

CALL_SECONDS = 2.3e-4
"""Seconds per all-reduce call the gated hook launches (see the module docstring)."""

_CALL = re.compile(r"^(?P<kind>.*)#(?P<k>\d+)$")


def own_order(groups: Sequence[Mapping[str, Any]]) -> bool:
    """Whether Caramel `groups` (a plan's ``inputs["groups"]``, in plan order) are DDP's
    own order, which DDP applies without the hook: each group one traced op, at depth
    1, and the ops of each kind (``net/all_reduce#k``: the k-th such call of the step)
    in the order the step issued them. The prediction's side of the runtime's test
    (`planner.enforce.ddp_order`), which judges a plan file against DDP's real buckets;
    here only the traced ops are known."""
    last: dict[str, int] = {}
    for group in groups:
        ops = list(group.get("params") or ())
        if len(ops) != 1 or int(group.get("depth", 1)) != 1:
            return False
        found = _CALL.match(ops[0])
        if found is None:
            return False
        kind, k = found["kind"], int(found["k"])
        if k <= last.get(kind, -1):
            return False
        last[kind] = k
    return True


def calls(plan: Plan) -> int:
    """The all-reduce calls the hook launches per step for `plan`: the depths of its
    groups of gradients (a barrier's all-reduce, 0 bytes, is DDP's, not the hook's); 0
    for a plan that is not a Caramel plan of groups, or is DDP's own order."""
    groups = plan.inputs.get("groups") or ()
    if plan.algorithm != "caramel" or not groups or own_order(groups):
        return 0
    return sum(int(g.get("depth", 1)) for g in groups if g.get("nbytes", 1) > 0)


def hooked_groups(plan: Plan) -> list[Mapping[str, Any]]:
    """The groups of `plan` the hook launches (`calls` counts their calls): none for a
    plan the hook does not run."""
    if not calls(plan):
        return []
    return [g for g in plan.inputs.get("groups") or () if g.get("nbytes", 1) > 0]


def group_seconds(group: Mapping[str, Any], byte_seconds: float = 0.0) -> float:
    """The seconds the hook spends on one hooked `group` on the backward pass's thread:
    its calls (its depth x `CALL_SECONDS`) and its pass over its bytes at `byte_seconds`
    a byte."""
    nbytes = float(group.get("nbytes") or 0)
    return int(group.get("depth", 1)) * CALL_SECONDS + nbytes * byte_seconds


def step_seconds(plan: Plan, byte_seconds: float = 0.0) -> float:
    """The seconds the hook takes per step of `plan` on the backward pass's thread:
    `group_seconds` of every group it launches."""
    return sum(group_seconds(g, byte_seconds) for g in hooked_groups(plan))


def copy_rate(names: Sequence[str], seconds: Sequence[float], plan: Plan) -> float:
    """Seconds a byte of a pass over the gradients, as the traced step ran DDP's copies
    of the buckets back into them (``copy_bucket_to_grad``; `seconds` per op of
    `names`), over the bytes of `plan`'s groups; 0 where the trace has no such copy or
    the plan no bytes."""
    total = sum(float(g.get("nbytes") or 0) for g in plan.inputs.get("groups") or ())
    copied = sum(t for n, t in zip(names, seconds, strict=True) if "copy_bucket_to_grad" in n)
    return copied / total if total > 0 else 0.0
