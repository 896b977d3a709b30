"""`planner analyze-ranks`: one input per rank, analysed in parallel, job-level figures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from planner.api import expand_globs, rank_files
from planner.export.files import dumps, write_atomic
from planner_cli import render
from planner_cli.options import json_option

F = TypeVar("F", bound=Callable[..., Any])


def parallel_options(func: F) -> F:
    """`-j N` and `--dask ADDRESS|local`: where the per-rank tasks run."""
    func = click.option(
        "--dask",
        "dask_address",
        default=None,
        metavar="ADDRESS|local",
        help="Run the per-rank tasks on this Dask scheduler (tcp://H:P), or `local`: a "
        "local cluster of -j workers (needs planner[dask]).",
    )(func)
    return click.option(
        "--workers",
        "-j",
        type=click.IntRange(min=1),
        default=None,
        help="Processes, one rank each at a time (default: the CPUs; 1: this process).",
    )(func)


@click.command("analyze-ranks")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@parallel_options
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
    from planner.job import parallel

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
            f"{job['ranks']} ranks, "
            f"{render.counted(job['common_iterations'], 'common iteration')}; "
            f"efficiency E mean {_ratio(job['mean_efficiency'])}, "
            f"min {_ratio(job['min_efficiency'])}; "
            f"mean iteration {render.seconds_text(job['mean_iteration'])}; "
            f"max straggler {render.seconds_text(job['max_straggler'])}"
        )
    if output is not None:
        render.note(f"wrote {output}", as_json)


def _ratio(value: float | None) -> str:
    """An efficiency to 3 decimals, as `planner metrics` prints it; "-" when it does not
    apply."""
    return "-" if value is None else f"{value:.3f}"
