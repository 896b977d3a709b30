"""Options and input loading shared by every `planner` command."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from planner.api import resolve, runs_of
from planner.errors import InputError
from planner_cli import render

if TYPE_CHECKING:
    from planner.model.trace import Job

F = TypeVar("F", bound=Callable[..., Any])

ALGORITHMS = ("tic", "tac", "caramel")
"""The schedulers (`planner.job.analysis.ALGORITHMS`, spelled here so that parsing options
imports no scheduler)."""


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")(func)


def paths_argument(required: bool = True) -> Callable[[F], F]:
    return click.argument(
        "paths", nargs=-1, required=required, type=click.Path(path_type=Path), metavar="PATH..."
    )


def load(paths: Sequence[Path], as_json: bool) -> Job:
    """Ingest with a progress bar on a terminal, silently otherwise. Globs are expanded;
    a folder of runs is an error that lists them (see `each_option`)."""
    from planner.ingest import detect

    files = resolve(paths)
    with render.progress(enabled=not as_json, what="reading") as advance:
        return detect.load(files, progress=advance)


def select_ranks(job: Job, rank: str | None) -> Job:
    """The job restricted to one rank (`--rank`); an unknown rank names the ones there are."""
    from planner.model.trace import Job

    if rank is None:
        return job
    if rank not in job.graphs:
        raise InputError(None, f"no rank {rank!r} in the input (ranks: {', '.join(job.ranks)})")
    return Job(job.framework, {rank: job.graphs[rank]}, job.trace, job.sources, job.notes, job.meta)


class Duration(click.ParamType):
    """A duration given in ms, or with its unit (``us``/``µs``, ``ms``, ``s``), returned in
    seconds (the library's unit): every display of a time is in ms or finer."""

    name = "MS"
    UNITS = (("us", 1e-6), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0))

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value).strip().lower()
        scale = 1e-3
        for unit, factor in self.UNITS:
            if text.endswith(unit):
                text, scale = text.removesuffix(unit).strip(), factor
                break
        try:
            number = float(text)
        except ValueError:
            number = float("nan")
        if not number >= 0 or number == float("inf"):
            self.fail(f"{value!r}: expected a time such as 5, 5ms, 500us or 0.5s", param, ctx)
        return number * scale


rank_option = click.option("--rank", default=None, help="Analyse only this rank (e.g. worker0).")


def _network(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> Any:
    if value is None:
        return None
    from planner.ingest import netbench
    from planner.ingest.demos import named

    return netbench.read_model(named(value))


network_option = click.option(
    "--network",
    type=click.Path(path_type=Path, dir_okay=False),
    callback=_network,
    help="A benchmark network model (bench-network CSV or fit-network --json) for Caramel "
    "when the trace's own fit does not hold.",
)


def network_notes(document: dict[str, Any], as_json: bool) -> None:
    """Say which network model each Caramel plan used, when it is not the trace's fit, and
    which process groups it planned and left alone, on a job of several."""
    inputs = [e.get("inputs", {}) for e in document.get("ranks", [])]
    notes = {i.get("network_note") for i in inputs} - {None}
    notes |= {(i.get("process_groups") or {}).get("note") for i in inputs} - {None}
    for line in sorted(notes):
        render.note(f"caramel: {line}", as_json)


def each_option(output_dir: bool = False, single_files: tuple[str, ...] = ()) -> Callable[[F], F]:
    """`--each`: PATH is a folder of runs; run the command on every run in it.

    Text output gets one heading per run; `--json` prints one `planner.runs/1` document
    holding each run's document. With `output_dir`, `-o DIR` becomes `DIR/<run>` per run;
    options in `single_files` name one file and cannot be combined with `--each`. Exit 1
    when any run's gate failed.
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(**kwargs: Any) -> None:
            if not kwargs.pop("each"):
                return func(**kwargs)
            runs = runs_of(kwargs["paths"])
            if runs is None:
                raise click.UsageError("--each needs one PATH: a folder of runs")
            for name in (*single_files, *(() if output_dir else ("output",))):
                if kwargs.get(name) is not None:
                    flag = "--" + name.replace("_", "-")
                    raise click.UsageError(f"{flag} names one file; it cannot go with --each")
            root = Path(kwargs["paths"][0])
            documents, failed = [], False
            for run in runs:
                args = {**kwargs, "paths": (run,)}
                label = run.relative_to(root) if run.is_relative_to(root) else Path(run.name)
                if output_dir and kwargs.get("output") is not None:
                    args["output"] = Path(kwargs["output"]) / label
                if not kwargs.get("as_json"):
                    render.out().rule(f"run {run}")
                buffer = io.StringIO()
                with contextlib.redirect_stdout(buffer) if kwargs.get("as_json") else _same():
                    try:
                        func(**args)
                    except SystemExit as exc:
                        if exc.code != 1:
                            raise
                        failed = True
                if kwargs.get("as_json"):
                    documents.append({"path": str(run), "result": json.loads(buffer.getvalue())})
            if kwargs.get("as_json"):
                render.emit({"schema": "planner.runs/1", "runs": documents}, True, print)
            if failed:
                sys.exit(1)

        return click.option(
            "--each", is_flag=True, help="PATH is a folder of runs: analyse every run in it."
        )(wrapper)  # type: ignore[return-value]

    return decorate


@contextlib.contextmanager
def _same() -> Any:
    yield
