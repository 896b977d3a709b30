"""The process group of each collective of one rank, and what each group is for.

A collective's group is the trace's where the trace names it (``Process Group Name`` on
an NCCL record or kernel), or the one group a rank of one group has. A CPU gloo trace
names none: ``distributedInfo.pg_config`` lists the rank's groups (name, description,
ranks), but a ``gloo:*`` record says nothing of its group. Each gloo process group runs
its collectives on worker threads of its own (``pt_gloo_runloop``), so the records of
one thread are of one group: the threads are told apart by what their collectives do
(`infer_role`) and matched to the listed group whose description states that role
(``group_desc="dp"``, DeviceMesh's ``mesh_tp``). Such a group is ``assigned``
``"inferred"``; where no match is unique, the threads of one role form a group named
by it (``gloo:tensor_parallel``), of no known ranks.

The collectives of a group whose description states its role run on ``net:<desc>``
(`net_lanes`): the same op names on every rank of that role, whichever group instance
a rank is in, so that one plan serves them all; the waits for peers are still split
within each group (`planner.model.waits`, by the ``group`` of each row).

A group's ``role`` (`ROLES`) is what its description states (``role_source``
``"trace"``), else what its collectives show (``"inferred"``): a reduce-scatter is
FSDP's sharding, DDP's bucket all-reduces run from autograd's ``AccumulateGrad`` hook,
an all-reduce inside the forward pass is tensor parallelism's, an all-to-all expert
parallelism's, send/recv alone pipeline parallelism's.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from planner.ingest.kineto_calls import group_info
from planner.ingest.kineto_comms import BACKEND, Collectives
from planner.ingest.kineto_events import RankEvents
from planner.ingest.kineto_steps import BACKWARD, FORWARD, OPTIMIZER, by_lane

ROLES: dict[str, str] = {
    "data_parallel": "data parallel",
    "fsdp_shard": "FSDP shard",
    "fsdp_replicate": "FSDP replicate",
    "tensor_parallel": "tensor parallel",
    "pipeline_parallel": "pipeline parallel",
    "expert_parallel": "expert parallel",
    "context_parallel": "context parallel",
    "unknown": "unknown",
}
"""Role -> how a person reads it."""
DATA_ROLES = frozenset({"data_parallel"})
"""The roles whose all-reduces are DDP's gradient buckets, which the schedulers and the
bucket advice plan."""

SHARDED_NOTE = (
    "its gradients are reduce-scattered (FSDP/ZeRO): Caramel and the DDP bucket advice "
    "order and size DDP's gradient all-reduces, which it does not have; FSDP orders its "
    "all-gathers and reduce-scatters per unit (see communication and fsdp in metrics)"
)
"""The note of a rank that shards its gradients: why no scheduler plans it."""

_WORDS: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"shard", "fsdp", "zero"}), "fsdp_shard"),
    (frozenset({"replicate", "hsdp"}), "fsdp_replicate"),
    (frozenset({"pp", "pipeline", "pipe", "stage"}), "pipeline_parallel"),
    (frozenset({"ep", "expert", "experts", "moe"}), "expert_parallel"),
    (frozenset({"cp", "context", "sp", "sequence"}), "context_parallel"),
    (frozenset({"tp", "tensor", "mp", "model"}), "tensor_parallel"),
    (frozenset({"dp", "ddp", "data"}), "data_parallel"),
)
_ACCUMULATE = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


def net_lanes(groups: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Group name -> the resource its collectives run on: ``net`` for the default group,
    ``net:<desc>`` for a group whose description states its role and is the rank's only
    one of that description (``net:tp``: rank 0's group 1 and rank 2's group 2 are the
    same place in the job, so their collectives are the same ops and a plan made on one
    rank is every rank's), else ``net:<name>``."""
    descs = [str(g.get("desc") or "") for g in groups.values()]
    out = {}
    for name, group in groups.items():
        desc = str(group.get("desc") or "")
        label = re.sub(r"[^A-Za-z0-9_.-]", "_", desc)[:40]
        if name in ("0", "default_pg", ""):
            out[name] = "net"
        elif stated_role(desc) is not None and descs.count(desc) == 1 and label:
            out[name] = f"net:{label}"
        else:
            out[name] = f"net:{name}"
    return out


def stated_role(desc: Any) -> str | None:
    """The role a group's description states (``"dp"``, ``"mesh_tp"``,
    ``"mesh_dp_shard"``), None where it states none (``default_pg``, ``undefined``)."""
    if not isinstance(desc, str):
        return None
    words = set(re.split(r"[^a-z0-9]+", desc.lower()))
    return next((role for keys, role in _WORDS if keys & words), None)


def infer_role(
    kinds: list[str], phases: list[int], hooked: list[bool], rank_hooked: bool, shards: bool
) -> str:
    """The role of a group by its collectives (their kinds, the phase each was called in
    and whether DDP's hook called it); `rank_hooked`: some collective of the rank was
    called by DDP's hook; `shards`: some group of the rank reduce-scatters (FSDP)."""
    found = set(kinds)
    if "reduce_scatter" in found:
        return "fsdp_shard"
    if "all_to_all" in found:
        return "expert_parallel"
    if found and found <= {"send", "recv", "send_recv"}:
        return "pipeline_parallel"
    reduces = [(p, h) for k, p, h in zip(kinds, phases, hooked, strict=True) if k == "all_reduce"]
    if any(h for _, h in reduces):
        return "fsdp_replicate" if shards else "data_parallel"
    if any(p == FORWARD for p, _ in reduces) or (rank_hooked and reduces):
        return "tensor_parallel"
    if any(p in (BACKWARD, OPTIMIZER) for p, _ in reduces):
        return "fsdp_replicate" if shards else "data_parallel"
    return "unknown"


def hooked_calls(ev: RankEvents, coll: Collectives) -> list[bool]:
    """Per collective: its c10d op ran inside autograd's ``AccumulateGrad`` function, where
    DDP's Reducer launches each gradient bucket's all-reduce."""
    rows = np.flatnonzero(ev.name_flags(_ACCUMULATE.__eq__))
    lanes = by_lane(rows, ev.lane, ev.ts)
    out = []
    for call in coll.call:
        starts, found = lanes.get(int(ev.lane[call]), (None, None)) if call >= 0 else (None, None)
        if starts is None:
            out.append(False)
            continue
        j = int(np.searchsorted(starts, ev.ts[call], side="right")) - 1
        out.append(j >= 0 and bool(ev.end[found[j]] >= ev.end[call]))
    return out


def assign_groups(ev: RankEvents, coll: Collectives, phase: np.ndarray) -> None:
    """Set each collective's group (``coll.pg``) and describe every group used
    (``coll.groups``: `group_info` with ``role``, ``role_source`` and ``assigned``), as
    the module's docstring says. `phase`: the phase code of every event row."""
    if not len(coll):
        return
    call = np.array(coll.call, dtype=np.int64)
    anchor = np.array(coll.anchor, dtype=np.int64)
    called = phase[np.where(call >= 0, call, anchor)].tolist()
    hooked = hooked_calls(ev, coll)
    config = [g for g in ev.distributed.get("pg_config") or [] if isinstance(g, dict)]
    assigned = {pg: "trace" for pg, named in zip(coll.pg, coll.named, strict=True) if named}
    unnamed = [i for i, named in enumerate(coll.named) if not named]
    if len(config) > 1 and unnamed:
        _by_threads(ev, coll, unnamed, config, (called, hooked), assigned)
    for i in unnamed:
        assigned.setdefault(coll.pg[i], "assumed" if len(config) > 1 else "trace")
    shards = "reduce_scatter" in coll.kind
    rank_hooked = any(hooked)
    found, coll.groups = coll.groups, {}
    for pg in sorted(set(coll.pg)):
        mine = [i for i, g in enumerate(coll.pg) if g == pg]
        info = found.get(pg) or group_info(ev, pg, [])
        if pg.startswith("gloo:"):
            info = {"name": pg}
        role = stated_role(info.get("desc"))
        kinds = [coll.kind[i] for i in mine]
        if role == "data_parallel" and "reduce_scatter" in kinds:
            role = "fsdp_shard"
        if role == "fsdp_replicate" and not shards:
            role = "data_parallel"
        source = "trace"
        if role is None:
            source = "inferred"
            role = infer_role(kinds, [called[i] for i in mine], [hooked[i] for i in mine],
                              rank_hooked, shards)  # fmt: skip
        coll.groups[pg] = {**info, "role": role, "role_source": source, "assigned": assigned[pg]}


def _by_threads(
    ev: RankEvents,
    coll: Collectives,
    unnamed: list[int],
    config: list[dict[str, Any]],
    evidence: tuple[list[int], list[bool]],
    assigned: dict[str, str],
) -> None:
    """The groups of the `unnamed` collectives that gloo ran on a worker thread: each
    thread's role (`infer_role`), the threads of one role one group, matched to the
    listed group that states that role (`assign_groups`)."""
    called, hooked = evidence
    backend = ev.name_flags(BACKEND.match)
    threads: dict[int, list[int]] = {}
    for i in unnamed:
        a, c = coll.anchor[i], coll.call[i]
        if backend[a] and c >= 0 and ev.lane[c] != ev.lane[a]:
            threads.setdefault(int(ev.lane[a]), []).append(i)
    if not threads:
        return
    shards = "reduce_scatter" in coll.kind
    rank_hooked = any(hooked)
    by_role: dict[str, list[int]] = {}
    for lane, mine in sorted(threads.items()):
        role = infer_role([coll.kind[i] for i in mine], [called[i] for i in mine],
                          [hooked[i] for i in mine], rank_hooked, shards)  # fmt: skip
        by_role.setdefault(role, []).append(lane)
    stated = {str(g.get("pg_name")): stated_role(g.get("pg_desc")) for g in config}
    for role, lanes in sorted(by_role.items()):
        match = [pg for pg, r in stated.items() if r == role]
        name = match[0] if len(match) == 1 else f"gloo:{role}"
        for lane in lanes:
            for i in threads[lane]:
                coll.pg[i] = name
        assigned[name] = "inferred"
