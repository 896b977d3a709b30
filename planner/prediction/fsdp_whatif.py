"""FSDP what-if: each traced step replayed with a setting FSDP exposes changed, beside the
replay of the traced setting and its error against the measured steps.

Each step is the program `planner.prediction.fsdp_steps.rank_programs` reads: the rank's
compute as one thread of segments, each collective a transfer on its lane (one at a
time, in release order) released at one point of the compute and waited for at another.
The replay runs it as a DAG through the event loop (`event_loop.run`): segment j ->
segment j + 1, the segment ending at a release -> the collective, the collective -> the
segment starting at its need. A step with its own collective times replays as it ran
(``rebuilt``: what the program misses of the measured wall span, the check of its
construction); each setting is replayed so, changing only what the setting changes, and
its gain is over that replay of the same step. The same step with each collective at
its typical time instead (the median over the rank's other steps; its own where no
other step has it) is the replay's ``error``: how far a step falls from what the
rank's other steps predict of it, the noise every prediction of a step carries.

The settings, one at a time against the traced one:

- ``prefetch`` depth k (0, 1, 2; forward and backward alike): the all-gather of the
  phase's unit i is released where unit i - k's compute starts (the need point of its
  all-gather), the first k at the phase's first release; 0: at its own need point.
- ``reshard_after_forward``: off drops the backward all-gathers of units gathered in the
  forward (their transfers and their waits: the backward waits only on compute); on
  (a trace without them) adds one per unit of its forward all-gather's time, needed
  where the unit's backward starts (the backward's start, then each reduce-scatter's
  release in backward order) and released with FSDP's default backward prefetch (at
  the previous unit's need point).
- ``units`` n: adjacent units (in forward order) merged into n groups (the first ones
  larger): a group's collectives of one kind and phase become one, of the bytes and
  times added less one `latency` per merged call; an all-gather released and needed at
  its group's first, a reduce-scatter at its group's last. Finer units are not
  predicted: the trace holds no point inside a unit where its compute could be split.

A setting is recommended only where its gain over the traced setting's replay exceeds
the replay's error (the median over every rank's steps of |typical / measured - 1|).

Overlap (`overlap_of`). The replay above lets a released collective run on its lane
beside the compute: what prefetching buys. The trace shows whether the host gave it
that: per rank, the compute its collectives had beside them from issue to completion
(rank meta ``in_flight``), as a share of their time. Where that share is under
`MIN_OVERLAP` although some of them were issued ahead (in FSDP's prefetch), the host
had no core to run them beside the compute (``traces/torch/fsdp``: two ranks, each a
Python thread and gloo threads, on two cores: 0.4-1.2% beside, prefetching or not;
cf. `planner.prediction.host` for processes sharing a core): each collective is then
replayed on the compute's resource (``serialised``), delaying the compute by its time
wherever it is released, so prefetch depth gains nothing there; resharding and unit
count still change the calls and their times. Where none was issued ahead the trace
cannot tell, and the overlap is assumed (said so in ``overlap.note``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from planner.model.graph import Op, OpGraph
from planner.model.trace import Job
from planner.prediction.compiled import compile_graph
from planner.prediction.event_loop import run
from planner.prediction.fsdp_steps import is_fsdp, rank_programs

Program = dict[str, Any]
MIN_OVERLAP = 0.05  # share of the collectives' time with compute beside them that shows overlap
NOT_PREDICTED = (
    "finer units: not predicted (the trace holds no point inside a unit where its compute "
    "could be split)"
)


def replay_program(
    program: Program, collectives: Sequence[Mapping[str, Any]], serialised: bool = False
) -> float:
    """The step time (s) of one step's `program` with `collectives` (each ``release``,
    ``need``, ``seconds``, ``lane``), through the event loop; `serialised`: each on the
    compute's resource, not beside it on its lane (the module's docstring)."""
    total = float(program["compute"])
    points = {0, round(total * 1e9)}
    for c in collectives:
        points.update((round(c["release"] * 1e9), round(c["need"] * 1e9)))
    at = sorted(p for p in points if p <= round(total * 1e9))
    index = {p: j for j, p in enumerate(at)}  # segment j starts at at[j]; the last: the end
    ops = {f"main/{j}": Op(f"main/{j}", "compute", "main") for j in range(len(at))}
    seconds = [(at[j + 1] - at[j]) / 1e9 for j in range(len(at) - 1)] + [0.0]
    src = list(range(len(at) - 1))
    dst = list(range(1, len(at)))
    order = sorted(range(len(collectives)), key=lambda k: (collectives[k]["release"], k))
    priority = list(range(len(at))) + [0] * len(collectives)
    for rank, k in enumerate(order):
        c = collectives[k]
        me = len(ops)
        lane = "main" if serialised else f"lane:{c['lane']}"
        ops[f"net/{k}"] = Op(f"net/{k}", "collective", lane)
        seconds.append(float(c["seconds"]))
        priority[me] = rank
        released = index.get(min(round(c["release"] * 1e9), at[-1]), 0)
        needed = index.get(min(round(c["need"] * 1e9), at[-1]), len(at) - 1)
        if released > 0:  # issued when the segment before its release point ends
            src.append(released - 1)
            dst.append(me)
        src.append(me)
        dst.append(needed)
    graph = OpGraph(
        ops, np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64),
        np.zeros(len(src), dtype=bool),
    )  # fmt: skip
    ran = run(compile_graph(graph), np.array(seconds), np.array(priority, dtype=np.int64))
    return float(ran.makespan[0])


def typical(programs: Mapping[int, Program]) -> dict[int, list[dict[str, Any]]]:
    """Step -> its collectives with ``seconds`` the median of the same op's in the rank's
    other steps (its own where no other step has it)."""
    seen: dict[str, dict[int, float]] = {}
    for it, program in programs.items():
        for c in program["collectives"]:
            seen.setdefault(c["op"], {})[it] = c["seconds"]
    out = {}
    for it, program in programs.items():
        out[it] = []
        for c in program["collectives"]:
            others = [s for step, s in seen[c["op"]].items() if step != it]
            out[it].append({**c, "seconds": float(np.median(others)) if others else c["seconds"]})
    return out


def _all_gathers(collectives: Sequence[Mapping[str, Any]], phase: str) -> list[int]:
    return [
        k for k, c in enumerate(collectives) if c["kind"] == "all_gather" and c["phase"] == phase
    ]


def with_prefetch(collectives: Sequence[Mapping[str, Any]], depth: int) -> list[dict[str, Any]]:
    """`collectives` with each phase's all-gathers released `depth` units ahead."""
    out = [dict(c) for c in collectives]
    for phase in ("forward", "backward"):
        gathers = _all_gathers(collectives, phase)
        for i, k in enumerate(gathers):
            if i >= depth:
                point = collectives[gathers[i - depth]]["need"]
            else:
                point = collectives[gathers[0]]["release"]
            out[k]["release"] = min(point, out[k]["need"])
    return out


def without_reshard(collectives: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`collectives` less the backward all-gathers of units gathered in the forward."""
    forward = {c["unit"] for c in collectives if c["kind"] == "all_gather"
               and c["phase"] == "forward"}  # fmt: skip
    return [
        dict(c)
        for c in collectives
        if not (c["kind"] == "all_gather" and c["phase"] == "backward" and c["unit"] in forward)
    ]


def with_reshard(
    program: Program, collectives: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """`collectives` with a backward all-gather added per unit that has a forward one and
    a reduce-scatter but no backward all-gather (see the module's docstring)."""
    out = [dict(c) for c in collectives]
    forward = {c["unit"]: c for c in collectives if c["kind"] == "all_gather"
               and c["phase"] == "forward"}  # fmt: skip
    present = {c["unit"] for c in collectives if c["kind"] == "all_gather"
               and c["phase"] == "backward"}  # fmt: skip
    scatters = [c for c in collectives if c["kind"] == "reduce_scatter"]
    start = program["backward_at"]
    if start is None:
        return out
    need_prev = None
    for j, rs in enumerate(scatters):
        need = start if j == 0 else scatters[j - 1]["release"]
        unit = rs["unit"]
        if unit in forward and unit not in present:
            ag = forward[unit]
            release = need if need_prev is None else min(need_prev, need)
            out.append({**ag, "op": f"{ag['op']} (backward)", "phase": "backward",
                        "release": release, "need": need})  # fmt: skip
        need_prev = need
    return out


def unit_order(collectives: Sequence[Mapping[str, Any]]) -> list[str]:
    """The units of one step in forward order (of their forward all-gathers)."""
    order: list[str] = []
    for k in _all_gathers(collectives, "forward"):
        if collectives[k]["unit"] not in order:
            order.append(collectives[k]["unit"])
    return order


def merged_units(
    collectives: Sequence[Mapping[str, Any]], groups: int, latency: float
) -> list[dict[str, Any]]:
    """`collectives` with the units merged into `groups` adjacent groups (see the
    module's docstring); collectives of no unit in forward order stay as they are."""
    units = unit_order(collectives)
    group = {u: g for g, part in enumerate(np.array_split(np.arange(len(units)), groups))
             for u in (units[i] for i in part)}  # fmt: skip
    kept, joined = [], {}
    for c in collectives:
        if c["unit"] not in group or c["kind"] not in ("all_gather", "reduce_scatter"):
            kept.append(dict(c))
            continue
        joined.setdefault((group[c["unit"]], c["kind"], c["phase"]), []).append(c)
    for (_, kind, _phase), parts in joined.items():
        pick = min if kind == "all_gather" else max
        seconds = sum(c["seconds"] for c in parts) - latency * (len(parts) - 1)
        kept.append(
            {
                **parts[0],
                "op": "+".join(c["op"] for c in parts),
                "unit": "+".join(c["unit"] for c in parts),
                "bytes": sum(c["bytes"] for c in parts),
                "seconds": max(seconds, max(c["seconds"] for c in parts)),
                "release": pick(c["release"] for c in parts),
                "need": pick(c["need"] for c in parts),
            }
        )
    kept.sort(key=lambda c: c["release"])
    return kept


def latency_of(steps: Mapping[int, Sequence[Mapping[str, Any]]]) -> float:
    """The per-call latency (s) the rank's collectives show: the intercept of the least
    squares line of their times over their bytes, within [0, the shortest time]."""
    pairs = [(c["bytes"], c["seconds"]) for cs in steps.values() for c in cs]
    if len(pairs) < 2 or len({b for b, _ in pairs}) < 2:
        return 0.0
    x, y = np.array(pairs, dtype=np.float64).T
    slope, intercept = np.polyfit(x, y, 1)
    return float(min(max(intercept, 0.0), y.min()))


def settings_of(
    program: Program, collectives: Sequence[Mapping[str, Any]], latency: float
) -> list[tuple[str, Any, list[dict[str, Any]]]]:
    """(setting, value, the step's collectives under it) for each setting the what-if
    tries on one step: prefetch 0-2, ``reshard_after_forward`` flipped, fewer units."""
    out: list[tuple[str, Any, list[dict[str, Any]]]] = [
        ("prefetch", depth, with_prefetch(collectives, depth)) for depth in (0, 1, 2)
    ]
    if _all_gathers(collectives, "backward"):
        out.append(("reshard_after_forward", False, without_reshard(collectives)))
    else:
        out.append(("reshard_after_forward", True, with_reshard(program, collectives)))
    n = len(unit_order(collectives))
    for groups in sorted({1, 2, -(-n // 2)} & set(range(1, n))):
        out.append(("units", groups, merged_units(collectives, groups, latency)))
    return out


def changes(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> dict[str, int]:
    """What a setting changed of one step's collectives: calls removed, added (merged
    calls count as removed and added), released earlier, released later."""
    was = {c["op"]: c for c in before}
    now = {c["op"]: c for c in after}
    moved = [(was[o]["release"], now[o]["release"]) for o in now if o in was]
    return {
        "removed": sum(o not in now for o in was),
        "added": sum(o not in was for o in now),
        "earlier": sum(b < a - 1e-9 for a, b in moved),
        "later": sum(b > a + 1e-9 for a, b in moved),
    }


def overlap_of(programs: Mapping[int, Program]) -> dict[str, Any]:
    """What one rank's trace shows of its collectives running beside its compute:
    ``seconds`` (their time), ``beside`` (the compute they had beside them from issue to
    completion, s), ``share`` (beside / seconds, None without collectives), ``calls``,
    ``ahead`` (those issued in a prefetch), ``steps`` and ``serialised`` (the replay
    runs them on the compute: share under `MIN_OVERLAP` with some issued ahead)."""
    cs = [c for p in programs.values() for c in p["collectives"]]
    seconds = float(sum(c["seconds"] for c in cs))
    beside = float(sum(min(c["beside"], c["seconds"]) for c in cs))
    share = beside / seconds if seconds > 0 else None
    ahead = sum(bool(c["ahead"]) for c in cs)
    return {
        "seconds": seconds,
        "beside": beside,
        "share": share,
        "calls": len(cs),
        "ahead": ahead,
        "steps": len(programs),
        "serialised": bool(share is not None and share < MIN_OVERLAP and ahead > 0),
    }


def _rank_rows(
    job: Job, rank: str
) -> tuple[list[dict[str, Any]], dict[str, Any], float, dict[str, Any]]:
    """One rank's steps and, per setting, its changes of the rank's first step; the
    rank's latency estimate. Per step: ``measured``; ``collectives``, their traced time
    (s); ``replayed``, the traced setting
    with the step's own collective times (``rebuilt``: its miss, what the program does
    not reproduce); ``typical``, with their typical times (``error``: its miss, the
    noise a prediction of a step carries); per setting its replay with the step's own
    times (the setting's effect on that step, not the other steps' noise); all of them
    `serialised` where the rank's overlap (`overlap_of`) says so."""
    programs = rank_programs(job, rank)
    overlap = overlap_of(programs)
    serial = overlap["serialised"]
    steps = typical(programs)
    latency = latency_of({it: p["collectives"] for it, p in programs.items()})
    rows, changed = [], {}
    for it, program in programs.items():
        own, measured = program["collectives"], program["measured"]
        replayed = replay_program(program, own, serial)
        guess = replay_program(program, steps[it], serial)
        row = {
            "iteration": it,
            "measured": measured,
            "collectives": float(sum(c["seconds"] for c in own)),
            "replayed": replayed,
            "rebuilt": replayed / measured - 1.0 if measured > 0 else None,
            "typical": guess,
            "error": guess / measured - 1.0 if measured > 0 else None,
            "settings": {},
        }
        for name, value, collectives in settings_of(program, own, latency):
            key = f"{name}={value}"
            row["settings"][key] = replay_program(program, collectives, serial)
            changed.setdefault(key, {"setting": name, "value": value,
                                     **changes(own, collectives)})  # fmt: skip
        rows.append(row)
    return rows, changed, latency, overlap


def rank_whatif(job: Job, rank: str) -> dict[str, Any] | None:
    """One rank's part of the what-if (`join`): its steps, per setting its changes, its
    latency estimate, its overlap (`overlap_of`); None unless the rank reduce-scatters
    (FSDP, ZeRO)."""
    if not is_fsdp(job, rank):
        return None
    rows, changed, latency, overlap = _rank_rows(job, rank)
    return {"rank": rank, "latency": latency, "steps": rows, "changed": changed,
            "overlap": overlap}  # fmt: skip


def fsdp_whatif(job: Job) -> dict[str, Any] | None:
    """The FSDP what-if document of `job` (`join` of its ranks' `rank_whatif`)."""
    return join(rank_whatif(job, rank) for rank in job.ranks)


def join(parts: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The job's FSDP what-if from its ranks' `rank_whatif` (None where none
    reduce-scatters): the job's step per iteration the slowest rank's, its median over
    the iterations for the measured steps, the traced setting's replay and each
    setting; each setting's ``gain`` (traced replay / setting - 1) and ``recommended``
    (its gain above ``replay_error_worst``, the largest |typical / measured - 1| of a
    rank's step; ``replay_error`` is their median): a few profiled steps that vary by a
    quarter from one another (2 CPU ranks of gloo) gave median errors of 3-10% under
    gains the runs of the setting did not show (docs/validation.md, FSDP what-if);
    ``rebuilt``: the largest |replayed / measured - 1| of a step; the settings it cannot
    predict (``not_predicted``)."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    changed: dict[str, Any] = {}
    by_step: dict[int, dict[str, float]] = {}
    for part in parts:
        for key, entry in part["changed"].items():
            changed.setdefault(key, entry)
        for row in part["steps"]:
            slot = by_step.setdefault(row["iteration"], {})
            pairs = [(k, row[k]) for k in ("measured", "replayed", "typical")]
            for key, value in (*pairs, *row["settings"].items()):
                slot[key] = max(slot.get(key, 0.0), value)
    rows = [r for part in parts for r in part["steps"]]
    errors = [r["error"] for r in rows if r["error"] is not None]
    error = float(np.median(np.abs(errors))) if errors else None
    worst = float(np.max(np.abs(errors))) if errors else None
    step = {key: float(np.median([s[key] for s in by_step.values() if key in s]))
            for key in {k for s in by_step.values() for k in s}}  # fmt: skip
    settings = []
    for key, entry in changed.items():
        gain = step["replayed"] / step[key] - 1.0 if step.get(key, 0) > 0 else None
        settings.append(
            {**entry, "predicted": step.get(key), "gain": gain,
             "recommended": bool(gain is not None and worst is not None and gain > worst)}
        )  # fmt: skip
    best = max((s for s in settings if s["recommended"]), key=lambda s: s["gain"], default=None)
    rebuilt = [abs(r["rebuilt"]) for r in rows if r["rebuilt"] is not None]
    return {
        "measured": step.get("measured"),
        "replayed": step.get("replayed"),
        "typical": step.get("typical"),
        "replay_error": error,
        "replay_error_median": float(np.median(errors)) if errors else None,
        "replay_error_worst": worst,
        "rebuilt": max(rebuilt, default=None),
        "settings": settings,
        "recommendation": None
        if best is None
        else {k: best[k] for k in ("setting", "value", "gain")},
        "not_predicted": [NOT_PREDICTED],
        "overlap": job_overlap(p.get("overlap") for p in parts),
        "ranks": [{k: v for k, v in p.items() if k != "changed"} for p in parts],
    }


def job_overlap(parts: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The ranks' `overlap_of` summed: ``share`` (the compute beside the collectives over
    their time), ``per_step`` (their time per rank and step, s), ``calls``, ``ahead``,
    ``serialised`` (the ranks replayed so) and ``note``, what the replay made of it;
    None without collectives."""
    parts = [p for p in parts if p and p["calls"]]
    if not parts:
        return None
    seconds = sum(p["seconds"] for p in parts)
    share = sum(p["beside"] for p in parts) / seconds if seconds > 0 else 0.0
    calls, ahead = sum(p["calls"] for p in parts), sum(p["ahead"] for p in parts)
    per_step = seconds / max(sum(p["steps"] for p in parts), 1)
    serialised = sum(bool(p["serialised"]) for p in parts)
    seen = (f"the ranks computed {share:.1%} of their {per_step * 1e3:.2f} ms a step "
            "beside them, from issue to completion")  # fmt: skip
    if serialised:
        note = (
            f"collectives never overlapped compute in this trace: {seen}, though {ahead} of "
            f"{calls} were issued ahead (prefetched): the host gave them no core beside the "
            "compute, so each is replayed delaying the compute by its time and no prefetch "
            "depth can gain"
        )
    elif share < MIN_OVERLAP:
        note = (
            f"collectives never overlapped compute in this trace ({seen}) and none was issued "
            "ahead: whether this host runs a prefetched one beside the compute is not shown; "
            "the prefetch settings assume it does"
        )
    else:
        note = f"collectives overlapped compute in this trace: {seen}"
    return {"share": share, "per_step": per_step, "calls": calls, "ahead": ahead,
            "serialised": serialised, "note": note}  # fmt: skip
