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

This module is where training scripts import them from: `register_plan_hook` and
`PlanCommHook` are defined in `planner.enforce.ddp_hook`, `GradSync` in
`planner.enforce.grad_sync`, `TransferFailed` and what both share (binding, the digest
exchange, the chunked all-reduce, the watchdog) in `planner.enforce.torch_transfers`.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.enforce.needs import require

require("torch", "planner.enforce.torch_ddp")  # what to install, not "No module named torch"

from torch import nn  # noqa: E402 (after the check above)

from planner.enforce.ddp_hook import PlanCommHook, register_plan_hook  # noqa: E402
from planner.enforce.grad_sync import GradSync  # noqa: E402
from planner.enforce.plan_file import TransferPlan  # noqa: E402
from planner.enforce.torch_transfers import TransferFailed  # noqa: E402

__all__ = [
    "GradSync",
    "PlanCommHook",
    "TransferFailed",
    "groups_of_model",
    "order_in_steps",
    "register_plan_hook",
]


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
