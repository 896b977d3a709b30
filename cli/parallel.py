"""`planner analyze-ranks`: one input per rank, analysed in parallel, job-level figures."""

from __future__ import annotations

from pathlib import Path

import click

from planner.api import expand_globs, rank_files
from planner.export.files import dumps, write_atomic
from planner_cli import render
from planner_cli.options import json_option


@click.command("analyze-ranks")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--workers", "-j", type=click.IntRange(min=1), default=None, help="Processes (default: CPUs)."
)
@click.option("--dask", "dask_address", default=None, help="Dask scheduler address (tcp://H:P).")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False), help="JSON here.")
@json_option
def analyze_ranks_command(
    paths: tuple[Path, ...],
    workers: int | None,
    dask_address: str | None,
    output: Path | None,
    as_json: bool,
) -> None:
    """Metrics of many ranks in parallel: each PATH is one rank (a trace file or a folder),
    or one PATH is a run folder holding one profiler trace per rank.

    Each worker loads one rank and returns only its figures; the job-level efficiency,
    iteration time and stragglers are reduced from those (`planner.ranks/1`).
    """
    from planner import parallel

    inputs = expand_globs(paths)
    ranks = rank_files(inputs[0]) if len(inputs) == 1 else None
    document, _ = parallel.analyze_ranks(
        ranks or [[p] for p in inputs], workers=workers, dask_address=dask_address
    )
    if output is not None:
        write_atomic(output, dumps(document))
    if as_json:
        click.echo(dumps(document), nl=False)
    else:
        job = document["job"]
        render.out().print(
            f"{job['ranks']} ranks, {job['common_iterations']} common iterations; "
            f"efficiency mean {job['mean_efficiency']}, min {job['min_efficiency']}; "
            f"mean iteration {job['mean_iteration']} s; max straggler {job['max_straggler']} s"
        )
    if output is not None:
        render.note(f"wrote {output}", as_json)
