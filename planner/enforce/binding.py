"""Bind a plan to the live model: which of its parameters each planned transfer carries.

Torch-free: the model is given as ``(name, nbytes, shape)`` per trainable parameter in
registration order (``model.named_parameters()``).

- A plan that names parameters (``params``) is bound by name; a leading ``module.`` is
  ignored.
- A plan made from a PyTorch trace names DDP buckets instead (``buckets``, from the
  trace's all-reduces; the Execution Trace, or the layer ops' shapes, tell their
  tensors apart). DDP fills its buckets in gradient-ready order, roughly the reverse of
  registration, and reduces them in index order. The binding walks the planned buckets
  in index order and gives each planned tensor the last-registered parameter left with
  its shape (or, without shapes, its bytes); a bucket without tensors takes parameters
  in reverse registration order until its bytes are full. When those bytes do not fall
  on a boundary, `BoundariesUnknown`: only DDP's own buckets can tell (the DDP hook then
  binds planned bucket k to DDP's rebuilt bucket k by bytes, at run time).

A plan for another model is refused with `PlanMismatch`, one line naming the first
difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.enforce.gate import GateError
from planner.enforce.plan_file import TransferPlan

ModelParam = tuple[str, int, tuple[int, ...]]  # name, bytes, shape


class PlanMismatch(GateError):
    """The plan was made for another model (the first difference is in the message)."""


class BoundariesUnknown(PlanMismatch):
    """A plan without tensors whose bucket boundaries do not fall on the reverse
    registration order: only DDP's own (rebuilt) buckets can tell (the DDP hook binds
    them at run time; `GradSync` cannot)."""


@dataclass(frozen=True)
class Binding:
    """parameter name -> planned transfer, and how it was found (``names``, ``buckets``)."""

    owner: dict[str, str]
    method: str
    mapping: tuple[str, ...] = ()  # one line per planned bucket: bucket <- parameters


def bind(plan: TransferPlan, params: Sequence[ModelParam], strict: bool = True) -> Binding:
    """Bind `plan` to the model's trainable `params` (see the module doc)."""
    if any(t.buckets for t in plan.transfers):
        return _by_buckets(plan, params)
    return _by_names(plan, [name for name, _, _ in params], strict)


def _by_names(plan: TransferPlan, names: Sequence[str], strict: bool) -> Binding:
    owner = {p.removeprefix("module."): t.name for t in plan.transfers for p in t.params}
    if strict:
        missing = [n for n in names if n not in owner]
        if missing:
            raise PlanMismatch(
                f"{len(missing)} parameter(s) are in no planned group, e.g. {missing[0]!r}; "
                "is the plan for another model?"
            )
        unknown = sorted(set(owner) - set(names))
        if unknown:
            raise PlanMismatch(f"the plan names parameters the model lacks, e.g. {unknown[0]!r}")
    return Binding(owner, "names")


def _by_buckets(plan: TransferPlan, params: Sequence[ModelParam]) -> Binding:
    buckets = sorted(
        ((b, t.name) for t in plan.transfers for b in t.buckets), key=lambda x: x[0].index
    )
    planned = sum(b.nbytes for b, _ in buckets)
    total = sum(n for _, n, _ in params)
    if planned != total:
        raise PlanMismatch(
            f"the plan's DDP buckets hold {planned} bytes of gradients, the model's "
            f"{len(params)} trainable parameters {total} bytes: is the plan for another model?"
        )
    tensors = sum(len(b.tensors) for b, _ in buckets)
    if tensors and tensors != len(params):
        raise PlanMismatch(
            f"the plan's DDP buckets hold {tensors} tensors, the model has {len(params)} "
            "trainable parameters: is the plan for another model?"
        )
    left = list(range(len(params)))  # registration order; taken from the end
    owner: dict[str, str] = {}
    mapping = []
    for bucket, transfer in buckets:
        mine: list[int] = []
        if bucket.tensors:
            for t in bucket.tensors:
                i = _last_like(params, left, t.nbytes, t.shape)
                if i is None:
                    shape = list(t.shape) if t.shape is not None else f"{t.nbytes} bytes"
                    raise PlanMismatch(
                        f"planned tensor {t.name!r} ({shape}) of DDP bucket {bucket.index} "
                        "matches no parameter of the model left: is the plan for another model?"
                    )
                left.remove(i)
                mine.append(i)
        else:
            filled = 0
            while left and filled < bucket.nbytes:
                i = left.pop()
                mine.append(i)
                filled += params[i][1]
            if filled != bucket.nbytes:
                at = params[mine[-1]][0] if mine else "-"
                raise BoundariesUnknown(
                    f"DDP bucket {bucket.index} of the plan holds {bucket.nbytes} bytes; the "
                    f"model's parameters in reverse order fill {filled} (up to {at!r}): is "
                    "the plan for another model, or another bucket_cap_mb?"
                )
        for i in mine:
            owner[params[i][0]] = transfer
        names = ", ".join(params[i][0] for i in mine)
        mapping.append(f"DDP bucket {bucket.index} ({transfer}) <- {names}")
    return Binding(owner, "buckets", tuple(mapping))


def _last_like(
    params: Sequence[ModelParam], left: list[int], nbytes: int, shape: tuple[int, ...] | None
) -> int | None:
    """The last-registered parameter left with this shape (or these bytes)."""
    for i in reversed(left):
        _, n, s = params[i]
        if n == nbytes and (shape is None or tuple(s) == shape):
            return i
    return None
