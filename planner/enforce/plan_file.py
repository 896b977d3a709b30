"""Read the plan files the enforcement modules apply: one ordered list of transfers.

Accepted (sniffed from the content, see docs/formats.md and docs/enforcement.md):

- ``planner.priorities/1`` JSON: per rank, transfers with ``name`` and ``order_index``
  (``param`` becomes the transfer's parameter list when present; for a PyTorch DDP job
  ``buckets`` says which traced DDP buckets the transfer carries, with their tensors).
- ``planner.bucket_plan/1`` JSON (Caramel, `planner.export.caramel_files`): per rank,
  ``groups`` with ``order_index``, ``params`` (parameter names), ``depth``, ``nbytes``
  and the plan's ``predicted_iteration_time``; a top-level ``groups`` list is read too.
- TicTac text: one ``name<TAB>order_index`` line per transfer.
- CSV with ``rank,name,...,order_index`` columns.

Torch-free, so the gate, `verify` and the TF rewrite can use it without PyTorch.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.errors import InputError


@dataclass(frozen=True)
class PlannedTensor:
    """One gradient tensor of a traced DDP bucket: its trace label, shape and bytes."""

    name: str
    nbytes: int
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Bucket:
    """A traced DDP bucket: its index (DDP reduces buckets in index order), bytes, and
    its tensors in bucket order (empty when the trace did not tell them apart)."""

    index: int
    nbytes: int
    tensors: tuple[PlannedTensor, ...] = ()


@dataclass(frozen=True)
class Transfer:
    """One planned transfer: its name, its sender-counter index in [0, n), and what it carries.

    `params`: parameter names the transfer moves (a Caramel group; one name for a TicTac
    recv; empty when the plan does not say). `depth`: chunks all-reduced concurrently.
    `buckets`: the traced DDP buckets it carries (PyTorch plans), matched to the live
    model's parameters by order, size and shape at registration.
    """

    name: str
    order_index: int
    params: tuple[str, ...] = ()
    depth: int = 1
    nbytes: int = 0
    buckets: tuple[Bucket, ...] = ()
    ops: tuple[str, ...] = ()  # the traced ops it stands for (a Caramel group's transfers)


@dataclass(frozen=True)
class TransferPlan:
    """The total order of one rank's transfers, as a sender counter enforces it."""

    transfers: tuple[Transfer, ...]
    rank: str | None = None
    algorithm: str = ""
    source: str = ""
    predicted_iteration_time: float | None = None  # seconds, when the planner wrote one

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.transfers)

    def order_index(self) -> dict[str, int]:
        return {t.name: t.order_index for t in self.transfers}

    def __len__(self) -> int:
        return len(self.transfers)


def canonical(plan: TransferPlan) -> list[tuple[Any, ...]]:
    """What every rank must agree on: per transfer in order, name, parameters, depth and
    buckets (not the rank label, the source path or predictions)."""
    return [
        (t.order_index, t.name, t.params, t.depth,
         tuple((b.index, b.nbytes, len(b.tensors)) for b in t.buckets))
        for t in plan.transfers
    ]  # fmt: skip


def plan_digest(plan: TransferPlan) -> str:
    """SHA-256 of `canonical(plan)`: equal on two ranks iff they enforce the same plan."""
    return hashlib.sha256(repr(canonical(plan)).encode("utf-8")).hexdigest()


def first_difference(mine: TransferPlan, other: list[tuple[Any, ...]]) -> str | None:
    """The first place where `mine` differs from another rank's `canonical` plan."""
    ours = canonical(mine)
    fields = ("order_index", "name", "parameters", "depth", "buckets")
    for a, b in zip(ours, other, strict=False):
        if a != b:
            at = next(i for i in range(len(fields)) if a[i] != b[i])
            here, there = a[at], b[at]
            return f"transfer at order_index {a[0]} ({a[1]!r}): {fields[at]} {here!r} here, {there!r} there"  # noqa: E501
    if len(ours) != len(other):
        return f"{len(ours)} transfers here, {len(other)} there"
    return None


def plan_from_groups(
    groups: Sequence[Sequence[str]],
    depths: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    algorithm: str = "",
) -> TransferPlan:
    """A plan from parameter groups in order (group i gets order_index i)."""
    depths = list(depths) if depths is not None else [1] * len(groups)
    names = list(names) if names is not None else [f"group{i}" for i in range(len(groups))]
    if not len(depths) == len(names) == len(groups):
        raise ValueError("groups, depths and names must have the same length")
    transfers = tuple(
        Transfer(name, i, tuple(params), int(depth))
        for i, (name, params, depth) in enumerate(zip(names, groups, depths, strict=True))
    )
    _check(transfers, "groups")
    return TransferPlan(transfers, algorithm=algorithm)


def _ddp_only(transfers: list[Transfer]) -> list[Transfer]:
    """In a plan for a DDP job (some transfers carry buckets), the transfers that carry no
    DDP bucket (a barrier's all-reduce, a buffer broadcast) are not the hook's to order:
    they are left out and the rest renumbered 0..n-1 in plan order."""
    if not any(t.buckets for t in transfers) or all(t.buckets for t in transfers):
        return transfers
    kept = sorted((t for t in transfers if t.buckets), key=lambda t: t.order_index)
    return [replace(t, order_index=i) for i, t in enumerate(kept)]


def _check(transfers: Sequence[Transfer], where: str) -> None:
    names = [t.name for t in transfers]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(where, f"transfer {dup!r} is listed twice")
    indices = sorted(t.order_index for t in transfers)
    if indices != list(range(len(transfers))):
        raise InputError(where, "order_index values are not 0..n-1 (TicTac §5.1 needs [0, n))")
    for t in transfers:
        if t.depth < 1:
            raise InputError(where, f"transfer {t.name!r} has depth {t.depth} (must be >= 1)")
    seen: dict[str, str] = {}
    for t in transfers:
        for p in t.params:
            if p in seen and seen[p] != t.name:
                raise InputError(where, f"parameter {p!r} is in both {seen[p]!r} and {t.name!r}")
            seen[p] = t.name
    owner: dict[int, str] = {}
    for t in transfers:
        for b in t.buckets:
            if b.index in owner:
                raise InputError(where, f"DDP bucket {b.index} is in both {owner[b.index]!r} "
                                 f"and {t.name!r}")  # fmt: skip
            owner[b.index] = t.name


def _buckets(entry: dict[str, Any]) -> tuple[Bucket, ...]:
    """The ``buckets`` of a transfer or group (PyTorch DDP plans); () when absent."""
    out = []
    for b in entry.get("buckets") or ():
        tensors = tuple(
            PlannedTensor(
                str(t["name"]),
                int(t["nbytes"]),
                tuple(int(d) for d in t["shape"]) if t.get("shape") is not None else None,
            )
            for t in b.get("tensors") or ()
        )
        out.append(Bucket(int(b["bucket"]), int(b["nbytes"]), tensors))
    return tuple(out)


def _pick_rank(entries: list[dict[str, Any]], rank: str | None, where: str) -> dict[str, Any]:
    if not entries:
        raise InputError(where, "plan has no ranks")
    if rank is None:
        if len(entries) == 1:
            return entries[0]
        orders = {tuple(t.get("name") for t in e.get("transfers", [])) for e in entries}
        if len({tuple(map(str, (e.get("groups") or []))) for e in entries}) == 1 and (
            len(orders) == 1
        ):
            return entries[0]
        ranks = ", ".join(str(e.get("rank")) for e in entries)
        raise InputError(where, f"plan has several ranks ({ranks}); choose one")
    for e in entries:
        if str(e.get("rank")) == rank:
            return e
    ranks = ", ".join(str(e.get("rank")) for e in entries)
    raise InputError(where, f"no rank {rank!r} in the plan (ranks: {ranks})")


def _from_priorities(doc: dict[str, Any], rank: str | None, where: str) -> TransferPlan:
    entry = _pick_rank(list(doc.get("ranks") or []), rank, where)
    transfers = []
    for t in entry.get("transfers", []):
        try:
            buckets = _buckets(t)
            params = t.get("params") or ([t["param"]] if t.get("param") else [])
            transfers.append(
                Transfer(
                    str(t["name"]),
                    int(t["order_index"]),
                    () if buckets else tuple(map(str, params)),  # DDP: params are labels
                    int(t.get("depth") or 1),
                    int(t.get("nbytes") or 0),
                    buckets,
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(where, f"bad transfer entry {t!r} ({exc})") from None
    transfers.sort(key=lambda t: t.order_index)
    _check(transfers, where)
    transfers = _ddp_only(transfers)
    return TransferPlan(
        tuple(transfers), str(entry.get("rank")), str(entry.get("algorithm", "")), where
    )


def _from_bucket_plan(doc: dict[str, Any], rank: str | None, where: str) -> TransferPlan:
    holder = doc
    if "groups" not in doc and isinstance(doc.get("ranks"), list):
        holder = _pick_rank(doc["ranks"], rank, where)
    groups = holder.get("groups")
    if not isinstance(groups, list):
        raise InputError(where, "bucket plan has no 'groups' list")
    transfers = []
    for i, g in enumerate(groups):
        try:
            index = int(g.get("order_index", i))
            buckets = _buckets(g)
            params = () if buckets else tuple(str(p) for p in g["params"])
            transfers.append(
                Transfer(
                    str(g.get("name") or f"group{index}"),
                    index,
                    params,
                    int(g.get("depth") or 1),
                    int(g.get("nbytes") or g.get("bytes") or 0),
                    buckets,
                    tuple(str(o) for o in g.get("transfers") or ()),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(where, f"bad group {i} ({exc})") from None
    transfers.sort(key=lambda t: t.order_index)
    _check(transfers, where)
    transfers = _ddp_only(transfers)
    algorithm = str(holder.get("algorithm") or doc.get("algorithm") or "caramel")
    predicted = holder.get("predicted_iteration_time")
    return TransferPlan(
        tuple(transfers),
        rank,
        algorithm,
        where,
        float(predicted) if isinstance(predicted, int | float) else None,
    )


def _from_text(text: str, rank: str | None, where: str) -> TransferPlan:
    head = text.lstrip().splitlines()[0] if text.strip() else ""
    if head.startswith("rank,") and "order_index" in head:
        rows = [r for r in csv.DictReader(io.StringIO(text))]
        ranks = sorted({r["rank"] for r in rows})
        if rank is None and len(ranks) > 1:
            raise InputError(where, f"plan has several ranks ({', '.join(ranks)}); choose one")
        chosen = rank if rank is not None else (ranks[0] if ranks else None)
        doc = {
            "ranks": [
                {"rank": chosen, "transfers": [r for r in rows if r["rank"] == chosen]},
            ]
        }
        return _from_priorities(doc, None, where)
    transfers = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 2:
            raise InputError(where, f"line {number}: expected 'name<TAB>order_index'")
        try:
            transfers.append(Transfer(parts[0], int(parts[1])))
        except ValueError:
            raise InputError(
                where, f"line {number}: order_index {parts[1]!r} is no integer"
            ) from None
    transfers.sort(key=lambda t: t.order_index)
    _check(transfers, where)
    return TransferPlan(tuple(transfers), rank, "tictac", where)


def parse_plan(text: str, rank: str | None = None, where: str = "<plan>") -> TransferPlan:
    """Parse plan text of any accepted format (sniffed from the content)."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(where, f"invalid JSON ({exc})") from None
        schema = str(doc.get("schema", ""))
        if schema.startswith("planner.priorities/"):
            return _from_priorities(doc, rank, where)
        if schema.startswith("planner.bucket_plan/") or "groups" in doc:
            return _from_bucket_plan(doc, rank, where)
        raise InputError(where, f"not a plan (schema {schema or 'missing'!r})")
    if not stripped:
        raise InputError(where, "plan file is empty")
    return _from_text(text, rank, where)


def read_plan_file(path: str | Path) -> tuple[str, Any]:
    """A plan file's text, and its parsed JSON document (None when it is text or CSV)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read plan ({exc})") from None
    if not text.lstrip().startswith("{"):
        return text, None
    try:
        return text, json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON ({exc})") from None


def is_control_deps(doc: Any) -> bool:
    """True for a document of explicit edges (`planner.control_deps/1`)."""
    return isinstance(doc, dict) and (
        str(doc.get("schema", "")).startswith("planner.control_deps/") or "edges" in doc
    )


def load_plan(path: str | Path, rank: str | None = None) -> TransferPlan:
    """Read a plan file (priorities JSON, bucket plan JSON, TicTac text or CSV)."""
    text, _doc = read_plan_file(path)
    return parse_plan(text, rank, str(path))


def load_control_edges(path: str | Path, rank: str | None = None) -> list[tuple[str, str]]:
    """Control edges (src, dst) by op name from a plan file.

    ``planner.control_deps/1``: ``edges`` as ``[src, dst]`` pairs or ``{"src", "dst"}``
    objects (top level, or per rank under ``ranks``). Any ordered plan (priorities,
    bucket plan, TicTac text) gives the chain of consecutive transfers in its order.
    """
    where = str(path)
    text, doc = read_plan_file(path)
    if isinstance(doc, dict):
        if is_control_deps(doc):
            holder = doc
            if "edges" not in doc and isinstance(doc.get("ranks"), list):
                entries = doc["ranks"]
                if rank is None:
                    return [e for entry in entries for e in _edges(entry, where)]
                holder = _pick_rank(entries, rank, where)
            return _edges(holder, where)
        if rank is None and isinstance(doc.get("ranks"), list) and len(doc["ranks"]) > 1:
            plans = [parse_plan(text, str(e.get("rank")), where) for e in doc["ranks"]]
            return [e for p in plans for e in zip(p.order[:-1], p.order[1:], strict=True)]
    plan = parse_plan(text, rank, where)
    return list(zip(plan.order[:-1], plan.order[1:], strict=True))


def _edges(holder: dict[str, Any], where: str) -> list[tuple[str, str]]:
    out = []
    for e in holder.get("edges") or []:
        if isinstance(e, dict):
            src, dst = e.get("src"), e.get("dst")
        elif isinstance(e, list | tuple) and len(e) >= 2:
            src, dst = e[0], e[1]
        else:
            src = dst = None
        if not isinstance(src, str) or not isinstance(dst, str):
            raise InputError(where, f"bad control edge {e!r} (want [src, dst])")
        out.append((src, dst))
    return out
