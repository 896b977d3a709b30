"""Terminal tables of a job's communication (`inspect`, `metrics`): per process group
with its role, and per group, kind and phase, each with the time per step and its
exposed part."""

from __future__ import annotations

from typing import Any

from planner.ingest.kineto_groups import ROLES
from planner_cli.render import new_table, out
from planner_cli.terminal import number_column, show, text_column, time_cell, time_unit, with_unit


def role_text(group: dict[str, Any]) -> str:
    """``data parallel``; ``(inferred)`` where the trace does not state the role."""
    role = ROLES.get(group.get("role") or "unknown", str(group.get("role")))
    return role if group.get("role_source") == "trace" else f"{role} (inferred)"


def _hidden(entry: dict[str, Any]) -> str:
    """The hidden share of a total's time, "-" where the exposure is unknown."""
    if entry.get("exposed") is None or not entry["time"]:
        return "-"
    return f"{1 - entry['exposed'] / entry['time']:.0%}"


def communication_view(c: dict[str, Any]) -> None:
    """Per group (role, ranks, collectives, time and exposed time per step, hidden share)
    and per group, kind and phase."""
    groups = c["groups"]
    unit = time_unit(e.get(k) for e in c["by_group_kind_phase"]
                     for k in ("time_per_step", "exposed_per_step"))  # fmt: skip
    time, exposed = with_unit("time/step", unit), with_unit("exposed/step", unit)
    table = new_table(title="Communication per process group")
    for column in ("group", "role", "ranks"):
        text_column(table, column)
    for column in ("count", time, exposed, "hidden"):
        number_column(table, column)
    for e in c["by_group"]:
        g = groups.get(e["group"], {})
        ranks = g.get("ranks")
        table.add_row(
            e["group"], role_text(g), ",".join(map(str, ranks)) if ranks else "?",
            str(e["count"]), time_cell(e["time_per_step"], unit),
            time_cell(e["exposed_per_step"], unit), _hidden(e),
        )  # fmt: skip
    show(table, secondary=("ranks",))
    table = new_table(title="Communication per group, kind and phase")
    for column in ("group", "kind", "phase"):
        text_column(table, column)
    for column in ("count", time, exposed, "hidden"):
        number_column(table, column)
    for e in c["by_group_kind_phase"]:
        table.add_row(
            e["group"], e["kind"], e["phase"], str(e["count"]),
            time_cell(e["time_per_step"], unit), time_cell(e["exposed_per_step"], unit),
            _hidden(e),
        )  # fmt: skip
    show(table, secondary=("count",))
    notes = ["time/step: the collectives' traced time per step of the ranks in the group; "
             "exposed: the part in which the rank computed nothing"]  # fmt: skip
    if any(g.get("assigned") == "inferred" for g in groups.values()):
        notes.append(
            "the trace names no group per collective: each was given the group whose "
            "description states the role of what its backend's worker threads ran"
        )
    for line in notes:
        out().print(line)


def fsdp_view(f: dict[str, Any]) -> None:
    """Per FSDP unit, kind and phase: count, time and exposed time per step, hidden share."""
    rows = f["by_unit_kind_phase"]
    unit = time_unit(e.get(k) for e in rows for k in ("time_per_step", "exposed_per_step"))
    table = new_table(title="FSDP units: all-gathers exposed, reduce-scatters hidden")
    for column in ("unit", "kind", "phase"):
        text_column(table, column)
    for column in ("count", with_unit("time/step", unit), with_unit("exposed/step", unit),
                   "hidden"):  # fmt: skip
        number_column(table, column)
    for e in rows:
        table.add_row(
            e["unit"], e["kind"], e["phase"], str(e["count"]),
            time_cell(e["time_per_step"], unit), time_cell(e["exposed_per_step"], unit),
            _hidden(e),
        )  # fmt: skip
    show(table, secondary=("count",))
    out().print(
        "an all-gather's exposed time is the compute waiting for its unit's parameters; a "
        "reduce-scatter's hidden share is its overlap with the backward's compute"
    )
    if any(u["source"] == "inferred" for u in f["units"]):
        out().print("the trace names no FSDP unit (FSDP1): units are told apart by their bytes")


def fsdp_whatif_view(w: dict[str, Any]) -> None:
    """The FSDP what-if: per setting its predicted step, gain over the traced setting's
    replay and whether it is recommended (its gain above the replay's error)."""
    settings = w["settings"]
    unit = time_unit([w["measured"], w["replayed"], *(s["predicted"] for s in settings)])
    table = new_table(title="FSDP what-if (the replay of each traced step, one setting changed)")
    text_column(table, "setting")
    for column in (with_unit("step", unit), "gain", "calls -/+", "released earlier/later"):
        number_column(table, column)
    text_column(table, "recommended")
    table.add_row("traced (replayed)", time_cell(w["replayed"], unit), "", "", "", "")
    for s in settings:
        table.add_row(
            f"{s['setting']} = {s['value']}", time_cell(s["predicted"], unit),
            _signed(s["gain"]), f"{s['removed']}/{s['added']}",
            f"{s['earlier']}/{s['later']}", "yes" if s["recommended"] else "no",
        )  # fmt: skip
    show(table, secondary=("released earlier/later", "calls -/+"))
    error = "none" if w["replay_error"] is None else f"{w['replay_error']:.1%}"
    worst = w.get("replay_error_worst")
    worst_text = "none" if worst is None else f"{worst:.1%}"
    measured = f"{w['measured'] * 1e3:.2f} ms" if w["measured"] is not None else "none"
    out().print(
        f"measured step {measured} (the slowest rank's, median over the steps); replay error "
        f"median {error}, worst {worst_text} (a step against the replay from the rank's "
        "other steps): a setting is recommended only above the worst"
    )
    best = w["recommendation"]
    if best is None:
        out().print("no setting is recommended: none gains more than the replay's worst error")
    else:
        out().print(f"recommended: {best['setting']} = {best['value']} ({_signed(best['gain'])})")
    if (w.get("overlap") or {}).get("note"):
        out().print(w["overlap"]["note"])
    for line in w["not_predicted"]:
        out().print(line)


def _signed(value: float | None) -> str:
    return "" if value is None else f"{value:+.1%}"
