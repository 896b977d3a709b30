"""`planner export --graphdef` and `planner verify`: the enforcement side of a plan."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from planner.errors import InputError
from planner.export.files import write_atomic
from planner_cli import render
from planner_cli.options import json_option

MODES = ("arrival", "sender")
"""`planner.export.tf_graph.MODES`, spelled here so that parsing options imports no
protobuf."""

_file = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("export")
@click.option("--graphdef", "graphdef", type=_file, required=True, help="TF GraphDef to rewrite.")
@click.option("--plan", "plan", type=_file, required=True, help="control_deps or ordered plan.")
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), required=True, help="The rewritten GraphDef."
)
@click.option("--rank", default=None, help="Use this rank's edges (default: all ranks').")
@click.option(
    "--drop-cyclic", is_flag=True, help="Leave out (and list) edges that would close a cycle."
)
@click.option(
    "--enforce",
    "mode",
    type=click.Choice(MODES),
    default="arrival",
    show_default=True,
    help="arrival: each transfer leaves the PS after the previous one arrived (the plan's "
    "recv order; one small Identity per transfer on the worker). sender: chain the PS-side "
    "reads (send order only; no new nodes).",
)
@json_option
def export_command(
    graphdef: Path,
    plan: Path,
    output: Path,
    rank: str | None,
    drop_cyclic: bool,
    mode: str,
    as_json: bool,
) -> None:
    """Add a plan's control edges to a GraphDef as ^name inputs (acyclic; every node kept).

    An ordered plan orders, per rank, the PS-side reads that feed that rank's transfers:
    by default each read waits until the previous transfer has arrived on the worker."""
    from planner.export.tf_graph import rewrite_file

    data, rewrite = rewrite_file(graphdef, plan, rank, drop_cyclic, mode)
    write_atomic(output, data)
    document = {**rewrite.as_dict(), "graphdef": str(graphdef), "plan": str(plan),
                "output": str(output), "enforce": mode}  # fmt: skip
    render.emit(document, as_json, _export_view)


def _export_view(document: dict[str, Any]) -> None:
    console = render.out()
    console.print(
        f"{len(document['added'])} control edge(s) added, {len(document['implied'])} already "
        f"implied by the graph, {len(document['dropped'])} left out (cycle), "
        f"{len(document['markers'])} arrival marker(s); wrote {document['output']}"
    )
    for rank, pairs in document["together"].items():
        name, earlier = pairs[0]
        console.print(
            f"{rank}: {len(pairs)} transfer(s) leave the PS with an earlier one from the same "
            f"read (e.g. {name} with {earlier}); the graph moves them up to it"
        )


@click.command("verify")
@click.argument("plan", type=_file)
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--min-compliance",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Exit 1 when a rank's fraction of steps in plan order is below this.",
)
@click.option("--rank", default=None, help="Check only this rank (e.g. rank0).")
@json_option
def verify_command(
    plan: Path,
    traces: tuple[Path, ...],
    min_compliance: float | None,
    rank: str | None,
    as_json: bool,
) -> None:
    """Check a trace taken with enforcement on: steps in plan order, first violation,
    measured vs predicted iteration time. Exits 1 when a planned transfer matched nothing
    in the trace (it was not checked) or, with --min-compliance, a rank is below it."""
    from planner.job import verify as verify_lib

    document = verify_lib.verify(plan, traces)
    if rank is not None:
        ranks = [r["rank"] for r in document["ranks"]]
        if rank not in ranks:
            raise InputError(None, f"no rank {rank!r} in the input (ranks: {', '.join(ranks)})")
        kept = [r for r in document["ranks"] if r["rank"] == rank]
        document = {**document, "ranks": kept, "compliance": kept[0]["compliance"]}
    render.emit(document, as_json, _verify_view)
    failed = False
    if not document["matched"]:
        missing = document["unmatched"]
        shown = ", ".join(f"{u['rank']}:{u['transfer']}" for u in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        render.note(f"{len(missing)} planned transfer(s) matched nothing in the trace: "
                    f"{shown}{more}; not verified", as_json, error=True)  # fmt: skip
        failed = True
    if min_compliance is not None and document["compliance"] < min_compliance:
        render.note(f"compliance {document['compliance']:.3f} below {min_compliance}", as_json,
                    error=True)  # fmt: skip
        failed = True
    if failed:
        sys.exit(1)


def _verify_view(document: dict[str, Any]) -> None:
    console = render.out()
    transfers = render.counted(document["transfers"], "transfer")
    table = render.new_table(title=f"Plan {document['plan']} ({transfers})")
    ranks = document["ranks"]
    busy = any(r.get("measured_busy_time") is not None for r in ranks)
    keys = ("measured_iteration_time", "measured_busy_time", "predicted_iteration_time")
    unit = render.time_unit(r.get(k) for r in ranks for k in keys)
    names = {keys[0]: "measured", keys[1]: "busy", keys[2]: "predicted"}
    headers = {k: render.with_unit(name, unit) for k, name in names.items()}
    render.text_column(table, "rank")
    for column in ("steps", "matched", "in plan"):
        render.number_column(table, column)
    render.text_column(table, "first violation")
    for key in keys[: 1 + busy] + keys[2:]:
        render.number_column(table, headers[key])
    render.number_column(table, "error")
    for r in ranks:
        cells = [
            r["rank"],
            str(r["steps"]),
            f"{r['checked_transfers']}/{r['planned_transfers']}",
            f"{r['compliant_steps']}/{r['steps']} ({r['compliance']:.0%})",
            _first_violation(r["first_violation"]),
            render.time_cell(r["measured_iteration_time"], unit),
        ]
        if busy:
            cells.append(render.time_cell(r["measured_busy_time"], unit))
        error = r["replay_error"]
        cells += [
            render.time_cell(r["predicted_iteration_time"], unit),
            "-" if error is None else f"{error:+.1%}",
        ]
        table.add_row(*cells)
    # the error is the prediction's against the busy time where there is one
    render.show(table, secondary=("steps", *(headers[keys[0]],) * busy))
    for line in document["notes"]:
        console.print(f"[yellow]note:[/yellow] {line}")


def _first_violation(first: dict[str, Any] | None) -> str:
    """Where a rank's steps first left the plan's order ("-": never)."""
    if not first:
        return "-"
    where = f"step {first['iteration']}"
    if "position" in first:
        where += f" #{first['position']}: {first['observed']} for {first['expected']}"
    if "depth_mismatch" in first:
        d = first["depth_mismatch"]
        where += f" ({d['transfer']}: {d['chunks']} chunks, depth {d['depth']})"
    return where
