"""Options and input loading shared by every `planner` command."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from planner.errors import InputError
from planner.ingest import detect
from planner.trace import Job
from planner_cli import render

F = TypeVar("F", bound=Callable[..., Any])


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")(func)


def paths_argument(required: bool = True) -> Callable[[F], F]:
    return click.argument(
        "paths", nargs=-1, required=required, type=click.Path(path_type=Path), metavar="PATH..."
    )


def load(paths: Sequence[Path], as_json: bool) -> Job:
    """Ingest with a progress bar on a terminal, silently otherwise."""
    with render.progress(enabled=not as_json, what="reading") as advance:
        return detect.load(paths, progress=advance)


def select_ranks(job: Job, rank: str | None) -> Job:
    if rank is None:
        return job
    if rank not in job.graphs:
        raise InputError(None, f"no rank {rank!r} in the input (ranks: {', '.join(job.ranks)})")
    return Job(job.framework, {rank: job.graphs[rank]}, job.trace, job.sources, job.notes, job.meta)


rank_option = click.option("--rank", default=None, help="Analyse only this rank (e.g. worker0).")


def _network(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> Any:
    from planner import netbench

    return None if value is None else netbench.read_model(value)


network_option = click.option(
    "--network",
    type=click.Path(path_type=Path, dir_okay=False),
    callback=_network,
    help="A benchmark network model (bench-network CSV or fit-network --json) for Caramel "
    "when the trace's own fit does not hold.",
)


def network_notes(document: dict[str, Any], as_json: bool) -> None:
    """Say which network model each Caramel plan used, when it is not the trace's fit."""
    notes = {e.get("inputs", {}).get("network_note") for e in document.get("ranks", [])} - {None}
    for line in sorted(notes):
        render.note(f"caramel: {line}", as_json)
