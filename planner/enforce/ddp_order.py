"""Is a plan DDP's own order? Then DDP applies it by itself, and no hook is needed.

DDP's reducer all-reduces its buckets strictly in bucket-index order (a ready bucket
waits for every lower-indexed one), each bucket whole, in one all-reduce. A plan whose
transfers, in plan order, are exactly DDP's buckets in index order, each at depth 1,
asks for nothing more: `register_plan_hook` then installs no communication hook and the
job runs at plain DDP's speed (any Python hook costs a GIL hand-off per bucket).

DDP rebuilds its buckets after the first backward, in gradient-ready order, so the
check is made twice: `may_be_ddp_order` at registration (cheap, on the plan and the
model), and `ddp_order_difference` on DDP's final buckets. Torch-free: buckets are
given as the parameter names, or the bytes, they hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from planner.enforce.plan_file import TransferPlan


def may_be_ddp_order(
    plan: TransferPlan, owner: Mapping[str, str] | None, names: Sequence[str]
) -> bool:
    """Whether `plan` can be DDP's own order: depth 1 everywhere and, when bound by
    parameter names (`owner`: name -> transfer), its transfers, in plan order, cut the
    trainable parameters `names` (registration order) reversed, DDP's first guess of the
    gradient-ready order, into consecutive runs; when bound to DDP's buckets (`owner`
    None), planned transfer i is DDP bucket i."""
    if not plan.transfers or any(t.depth != 1 for t in plan.transfers):
        return False
    if owner is None:
        return all(
            len(t.buckets) == 1 and t.buckets[0].index == i for i, t in enumerate(plan.transfers)
        )
    runs: list[str] = []
    for name in reversed(names):
        transfer = owner.get(name)
        if transfer is None:  # a parameter in no planned group: the hook handles it
            return False
        if not runs or runs[-1] != transfer:
            runs.append(transfer)
    return runs == list(plan.order)


def ddp_order_difference(
    plan: TransferPlan,
    owner: Mapping[str, str] | None,
    buckets: Sequence[Sequence[str]],
    bucket_bytes: Sequence[int],
) -> str | None:
    """None when DDP's buckets (in index order: the parameter names of each, and its
    bytes) are the plan's transfers in plan order, at depth 1; else the first
    difference, one line. `owner` as in `may_be_ddp_order`."""
    if any(t.depth != 1 for t in plan.transfers):
        deep = next(t for t in plan.transfers if t.depth != 1)
        return f"transfer {deep.name!r} has depth {deep.depth}"
    if len(buckets) != len(plan.transfers):
        return f"DDP has {len(buckets)} bucket(s), the plan {len(plan.transfers)} transfer(s)"
    members = Counter((owner or {}).values())
    for k, (t, names, nbytes) in enumerate(zip(plan.transfers, buckets, bucket_bytes, strict=True)):
        if owner is None:
            planned = t.buckets[0].nbytes if len(t.buckets) == 1 else -1
            if planned != nbytes:
                return (
                    f"DDP bucket {k} holds {nbytes} bytes, transfer {t.name!r} "
                    f"(order_index {k}) {planned}"
                )
            continue
        holds = {owner.get(n, "") for n in names}
        if holds != {t.name}:
            first = next(iter(sorted(holds - {t.name}) or [""]))
            return (
                f"DDP bucket {k} holds parameters of {first or 'no planned transfer'!r}, "
                f"the plan's transfer at order_index {k} is {t.name!r}"
            )
        if len(names) != members[t.name]:
            return f"transfer {t.name!r} spans more than DDP bucket {k}"
    return None
