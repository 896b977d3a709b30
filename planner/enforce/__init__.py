"""Runtime side: apply a plan inside the training job.

- `PriorityGate` (here, torch-free): TicTac's per-iteration sender counter.
- `planner.enforce.binding` (torch-free): which model parameters each planned transfer
  carries; plans made for another model are refused.
- `planner.enforce.ddp_order` (torch-free): whether a plan is DDP's own order, which
  DDP applies by itself (then `register_plan_hook` installs no hook).
- `planner.enforce.group_timeout`: bounds a process group's timeout by the gate timeout
  (imports torch), so that a peer hung alive ends a step that no hook watches.
- `planner.enforce.torch_ddp`: a DDP communication hook and a gradient-sync module
  (imports torch; import it explicitly; defined in `ddp_hook`, `grad_sync` and
  `torch_transfers`).
- `planner.export.tf_graph`: a plan's control edges as ``^name`` inputs of a GraphDef.
"""

from planner.enforce.gate import GateError, GateTimeout, PriorityGate, UnknownTransfer, Violation
from planner.enforce.plan_file import (
    Transfer,
    TransferPlan,
    load_control_edges,
    load_plan,
    parse_plan,
    plan_from_groups,
)

__all__ = [
    "GateError",
    "GateTimeout",
    "PriorityGate",
    "Transfer",
    "TransferPlan",
    "UnknownTransfer",
    "Violation",
    "load_control_edges",
    "load_plan",
    "parse_plan",
    "plan_from_groups",
]
