"""`planner` command line: parse options, call the library, render the result.

Exit status: 0 ok, 1 a `--min-*` gate failed, 2 bad input or usage (one line on
stderr, no traceback, no output file written).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from planner.api import resolve
from planner.errors import InputError, WorkerDied
from planner.export.files import dumps, file_names, write_atomic
from planner.version import __version__
from planner_cli import caramel as caramel_commands
from planner_cli import docs as docs_commands
from planner_cli import enforce as enforce_commands
from planner_cli import model as model_commands
from planner_cli import parallel as parallel_commands
from planner_cli import render
from planner_cli import report as report_commands
from planner_cli import simulate as simulate_commands
from planner_cli.options import (
    ALGORITHMS,
    Duration,
    each_option,
    json_option,
    load,
    network_notes,
    network_option,
    paths_argument,
    rank_option,
    select_ranks,
)

# the library's names for them (`planner.ingest.kineto.STEP_MARKER_ENV`,
# `planner.ingest.kineto_comms.PATTERNS_ENV`), spelt here so that start-up imports no ingest
STEP_MARKER_ENV = "PLANNER_STEP_MARKER"
PATTERNS_ENV = "PLANNER_COMM_PATTERNS"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="planner")
@click.option("--no-color", is_flag=True, help="Plain text, no colours.")
@click.option(
    "--detail",
    is_flag=True,
    help="Every table and paragraph, not only those that answer the command's question.",
)
@click.option(
    "--wide",
    is_flag=True,
    help="Every column of every table, however wide (else columns are left out to fit "
    "the terminal, or COLUMNS).",
)
@click.option(
    "--step-marker",
    envvar=STEP_MARKER_ENV,
    metavar="NAME",
    help=(
        "PyTorch traces without ProfilerStep#N: the annotation that marks the steps (its "
        "ranges, or, where they cover little of the loop, from one start to the next)."
    ),
)
@click.option(
    "--comm-patterns",
    envvar=PATTERNS_ENV,
    type=click.Path(path_type=Path, dir_okay=False),
    help="A JSON pattern file naming more communication kernels (planner docs formats).",
)
def cli(
    no_color: bool, detail: bool, wide: bool, step_marker: str | None, comm_patterns: Path | None
) -> None:
    """Communication-scheduling planner for data-parallel DNN training.

    A trace is a file, a folder or a quoted glob; `demo` (a TF parameter-server worker)
    and `demo-ddp` (a PyTorch DDP run of two ranks) name the bundled demos. The manual:
    planner docs."""
    render.configure(no_color=no_color, detail=detail, wide=wide)
    click.get_current_context().call_on_close(render.closing_line)
    # the ingest reads them from the environment, as do the worker processes of -j/Dask
    for name, value in ((STEP_MARKER_ENV, step_marker), (PATTERNS_ENV, comm_patterns)):
        if value:
            os.environ[name] = str(value)


@cli.command("inspect")
@paths_argument()
@rank_option
@json_option
@each_option()
def inspect_command(paths: tuple[Path, ...], rank: str | None, as_json: bool) -> None:
    """What is in the input: devices, op counts, transfers with sizes, steps."""
    from planner.measure import inspection

    job = select_ranks(load(paths, as_json), rank)
    document = inspection.inspect(job)
    render.emit(document, as_json, render.inspect_view)


@cli.command("schedule")
@paths_argument()
@click.option(
    "--algorithm",
    "-a",
    type=click.Choice(ALGORITHMS),
    default="tac",
    show_default=True,
    help="tic or tac: a parameter-server job's transfers (TicTac); caramel: all-reduce.",
)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write the plan here.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "csv", "tictac"]),
    default="json",
    show_default=True,
    help="tictac: `name<TAB>order_index` lines, one file per rank.",
)
@rank_option
@network_option
@parallel_commands.parallel_options
@json_option
@each_option()
def schedule_command(
    paths: tuple[Path, ...],
    algorithm: str,
    output: Path | None,
    fmt: str,
    rank: str | None,
    network: Any,
    workers: int | None,
    dask_address: str | None,
    as_json: bool,
) -> None:
    """Order the transfers of each rank with TIC or TAC (parameter server) or Caramel
    (all-reduce).

    Caramel on the PyTorch traces of several ranks reads one rank per process (-j,
    --dask); the plan is the same as in one process."""
    from planner.job import analysis, parallel

    ranks = None
    if rank is None and algorithm == "caramel":
        ranks = parallel.rank_inputs(resolve(paths))
    if ranks is not None:
        document, _ = parallel.schedule_ranks(
            ranks, workers=workers, dask_address=dask_address, network=network
        )
    else:
        if dask_address is not None:
            render.note(
                "--dask: one rank, not PyTorch or not Caramel: read in this process", as_json
            )
        job = select_ranks(load(paths, as_json), rank)
        plans = analysis.schedule(job, algorithm, network=network)
        document = analysis.plan_document(plans, job.graphs, job.meta)
        if algorithm == "caramel" and document["ranks"]:  # a Horovod timeline: fusion advice
            from planner.job.horovod_advice import fusion_advice

            advice = fusion_advice(job, document["ranks"][0].get("inputs") or {})
            if advice is not None:
                document["horovod"] = advice
    network_notes(document, as_json)
    files = plan_files(document, fmt, output)
    for path, text in files.items():
        write_atomic(path, text)
    if output is None and not as_json and fmt != "json":
        click.echo("".join(files.values()) if files else _plan_text(document, fmt), nl=False)
        return
    render.emit(document, as_json, render.plan_view)
    for path in files:
        render.note(f"wrote {path}", as_json)


def _plan_text(document: dict[str, Any], fmt: str) -> str:
    from planner.export import priorities

    if fmt == "csv":
        return priorities.to_csv(document)
    parts = []
    for entry in document["ranks"]:
        parts.append(f"# rank {entry['rank']}\n{priorities.to_tictac(document, entry['rank'])}")
    return "".join(parts)


def plan_files(document: dict[str, Any], fmt: str, output: Path | None) -> dict[Path, str]:
    """The files a plan is written to (none without -o)."""
    from planner.export import priorities

    if output is None:
        return {}
    if fmt == "json":
        return {output: dumps(document)}
    if fmt == "csv":
        return {output: priorities.to_csv(document)}
    ranks = [entry["rank"] for entry in document["ranks"]]
    if len(ranks) == 1:
        return {output: priorities.to_tictac(document, ranks[0])}
    parts = file_names(ranks)  # rank names come from the inputs
    return {
        output.with_name(f"{output.stem}.{parts[r]}{output.suffix}"): priorities.to_tictac(
            document, r
        )
        for r in ranks
    }


@cli.command("metrics")
@paths_argument()
@click.option(
    "--min-efficiency",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Exit 1 when any step's scheduling efficiency E is below this.",
)
@click.option(
    "--max-straggler",
    type=Duration(),
    default=None,
    help="Exit 1 when a step's straggler time exceeds this, in ms (or with a unit: 500us, "
    "0.5s) (all-reduce).",
)
@click.option(
    "--min-utilization",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Exit 1 when a step's all-reduce utilization is below this.",
)
@click.option(
    "--junit",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write JUnit XML here: one test case per step and rank.",
)
@click.option(
    "--markdown",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write a Markdown summary table here (for a CI job page).",
)
@rank_option
@parallel_commands.parallel_options
@json_option
@each_option(single_files=("junit", "markdown"))
def metrics_command(
    paths: tuple[Path, ...],
    min_efficiency: float | None,
    max_straggler: float | None,
    min_utilization: float | None,
    junit: Path | None,
    markdown: Path | None,
    rank: str | None,
    workers: int | None,
    dask_address: str | None,
    as_json: bool,
) -> None:
    """Per-step Umax, Lmin, efficiency E and speedup bound S (TicTac §3.2); for
    all-reduce jobs also C, N, overlap, utilization and stragglers (Caramel §3.1).

    PyTorch traces of several ranks are read one rank per process (-j, --dask); the
    figures are the same as in one process."""
    from planner.job import analysis, parallel
    from planner.reporting.ci import Thresholds, failures, junit_xml, markdown_summary, unchecked

    ranks = parallel.rank_inputs(resolve(paths)) if rank is None else None
    if ranks is not None:
        document, _ = parallel.metrics_ranks(ranks, workers=workers, dask_address=dask_address)
    else:
        if dask_address is not None:
            render.note("--dask: one rank or not PyTorch: read in this process", as_json)
        document = analysis.metrics(select_ranks(load(paths, as_json), rank))
    gate = Thresholds(min_efficiency, max_straggler, min_utilization)
    failed = failures(document, gate)
    if gate.given():
        document["gate"] = {
            **gate.given(),
            "failed": [
                {"rank": f.rank, "iteration": f.iteration, "metric": f.metric, "value": f.value}
                for f in failed
            ],
        }
    files = {}
    if junit is not None:
        files[junit] = junit_xml(document, gate)
    if markdown is not None:
        files[markdown] = markdown_summary(document, gate)
    for path, text in files.items():
        write_atomic(path, text)
    render.emit(document, as_json, render.metrics_view)
    for line in document.get("notes", []):
        render.note(line, as_json)
    for name in unchecked(document, gate):
        render.note(f"{name}: not available for this input, not checked", as_json)
    for path in files:
        render.note(f"wrote {path}", as_json)
    if failed:
        lines = "; ".join(f"{f.rank} step {f.iteration}: {f.message()}" for f in failed)
        render.note(f"gate failed: {lines}", as_json, error=True)
        sys.exit(1)


@cli.command("analyze")
@paths_argument(required=False)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Directory for the results.")
@click.option("--force", is_flag=True, help="Replace the earlier results in the -o directory.")
@rank_option
@network_option
@click.option(
    "--untraced-step-time",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="The job's step time without the profiler, at the traced configuration (from "
    "its training log): the DDP bucket advice takes the profiler's own cost out of the "
    "traced steps.",
)
@click.option(
    "--bucket-reference",
    type=click.Path(path_type=Path),
    default=None,
    metavar="PATH",
    help="The same job traced with one DDP bucket (a bucket_cap_mb above its gradients' "
    "size): the bucket advice measures from it how much the collectives slowed the "
    "backward pass, apart from how much it slowed them (a CPU job).",
)
@click.option(
    "--reference-untraced-step-time",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="The reference configuration's step time without the profiler.",
)
@parallel_commands.parallel_options
@json_option
@each_option(output_dir=True)
def analyze_command(
    paths: tuple[Path, ...],
    output: Path | None,
    force: bool,
    rank: str | None,
    network: Any,
    untraced_step_time: float | None,
    bucket_reference: Path | None,
    reference_untraced_step_time: float | None,
    workers: int | None,
    dask_address: str | None,
    as_json: bool,
) -> None:
    """Inspect, plan (TIC/TAC or Caramel), metrics and simulation; no PATH: the demo.

    With -o DIR: report.json and report.html, the priority files of every plan,
    Caramel's control dependencies and bucket plan, and timeline.json (Chrome trace of
    the traced step and the best plan's predicted schedule, per rank), written as one
    set: all of them or, on any failure, none (an earlier set needs --force).

    The PyTorch traces of several all-reduce ranks are read one rank per process (-j,
    --dask); the report is the same as in one process (above 16 ranks its timelines
    are those of the slowest, the fastest and the last-arriving rank: planner docs parallel).
    """
    from planner.export.files import check_set_target, holds_demo_results, write_set
    from planner.ingest.demos import DEMOS, demo_trace

    if output is not None:
        # the quick start (no PATH, or a bundled demo) replaces its own earlier output
        given = [p.resolve() for p in resolve(paths)] if paths else [demo_trace().resolve()]
        demos = {demo_trace(name).resolve() for name in DEMOS}
        quick = len(given) == 1 and given[0] in demos
        force = force or (quick and holds_demo_results(output, given[0]))
        check_set_target(output, force)
    if reference_untraced_step_time is not None and bucket_reference is None:
        raise click.UsageError("--reference-untraced-step-time needs --bucket-reference")
    from planner.job import analysis, parallel, rank_analysis
    from planner.reporting.outputs import analysis_files

    reference = load((bucket_reference,), as_json) if bucket_reference is not None else None
    ranks, skipped = parallel.split_ranks(resolve(paths)) if paths and rank is None else (None, [])
    done = None
    if ranks is not None:
        with render.progress(enabled=not as_json, what="analysing") as advance:
            advance(f"{len(ranks)} ranks, one per task")
            done = rank_analysis.report_ranks(
                ranks,
                workers,
                dask_address,
                network=network,
                notes=skipped,
                untraced_step_time=untraced_step_time,
                reference=reference,
                reference_untraced_step_time=reference_untraced_step_time,
            )
    if done is not None:
        report, graphs, _ = done
    else:
        if dask_address is not None:
            render.note("--dask: one rank, not PyTorch all-reduce: read in this process", as_json)
        job = select_ranks(load(paths or (demo_trace(),), as_json), rank)
        with render.progress(enabled=not as_json, what="analysing") as advance:
            report = analysis.analyze(
                job,
                progress=advance,
                network=network,
                untraced_step_time=untraced_step_time,
                reference=reference,
                reference_untraced_step_time=reference_untraced_step_time,
            )
        graphs = job.graphs
    network_notes(report["plans"].get("caramel", {}), as_json)
    if reference is not None and not (report.get("bucket_sweep") or {}).get("caps"):
        render.note("--bucket-reference: no DDP bucket advice for this job, not used", as_json)
    files = analysis_files(report, graphs, output) if output is not None else {}
    if output is not None:
        write_set(output, {path.name: text for path, text in files.items()}, force=force)
    render.emit(
        report, as_json, lambda r: render.analyze_view(r, simulate_commands.simulation_view)
    )
    for path in files:
        render.note(f"wrote {path}", as_json)


@cli.command("convert")
@paths_argument()
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), help="Write the trace here (else stdout)."
)
@rank_option
@json_option
def convert_command(
    paths: tuple[Path, ...], output: Path | None, rank: str | None, as_json: bool
) -> None:
    """Write any supported input as a planner JSON trace (planner docs formats).

    Without -o, or with --json, the `planner.trace/1` document goes to stdout."""
    from planner.ingest import planner_json

    job = select_ranks(load(paths, as_json), rank)
    text = dumps(planner_json.to_document(job))
    if output is not None:
        write_atomic(output, text)
    if as_json or output is None:
        click.echo(text, nl=False)
    lost = planner_json.left_out(job)
    if lost is not None:
        render.note(f"note: {lost}", as_json)
    if output is not None:
        render.note(f"wrote {output}", as_json)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: run the group, turn bad input and usage errors into exit 2.

    Without `argv` (the `planner` command: the process's own arguments, and the process
    ends with this call) the objects left are frozen first (`gc.freeze`): the
    interpreter's last collection would walk them all to free what the exit frees
    anyway (0.15 s after `analyze`, 0.5 s with the simulator's compiled loop loaded).
    Every file is written and closed before, stdout is flushed at exit as always."""
    try:
        _run(argv)
    finally:
        if argv is None:
            gc.freeze()


GLOBAL_FLAGS = frozenset({"--no-color", "--detail", "--wide"})
GLOBAL_VALUED = frozenset({"--step-marker", "--comm-patterns"})
"""The group's own options (`cli`): a user may give them after the command too."""


def hoist_globals(args: Sequence[str]) -> list[str]:
    """`args` with the group's options moved before the command, wherever they were given
    (``planner metrics X --no-color`` as ``planner --no-color metrics X``), their order
    kept; nothing after ``--`` is touched."""
    found: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name = arg.split("=", 1)[0]
        if arg in GLOBAL_FLAGS or (name in GLOBAL_VALUED and "=" in arg):
            found.append(arg)
        elif arg in GLOBAL_VALUED and i + 1 < len(args):
            found += args[i : i + 2]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return found + rest


def _run(argv: Sequence[str] | None) -> None:
    args = hoist_globals(sys.argv[1:] if argv is None else list(argv))
    try:
        cli.main(args=args, standalone_mode=False)
    except InputError as exc:
        render.error(str(exc))
        sys.exit(2)
    except WorkerDied as exc:  # not the input's fault: the machine's
        render.error(str(exc))
        sys.exit(1)
    except click.UsageError as exc:
        render.error(exc.format_message())
        sys.exit(2)
    except click.exceptions.Abort:
        render.error("aborted")
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        render.error(exc.format_message())
        sys.exit(2)
    except BrokenPipeError:
        sys.exit(0)


for command in (
    simulate_commands.simulate,
    caramel_commands.bench_network,
    caramel_commands.fit_network,
    model_commands.model_command,
    enforce_commands.export_command,
    enforce_commands.verify_command,
    report_commands.report_command,
    parallel_commands.analyze_ranks_command,
    docs_commands.docs_command,
):
    cli.add_command(command)
