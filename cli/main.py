"""`planner` command line: parse options, call the library, render the result.

Exit status: 0 ok, 1 a `--min-*` gate failed, 2 bad input or usage (one line on
stderr, no traceback, no output file written).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from planner import __version__, analysis
from planner.errors import InputError
from planner.export import priorities
from planner.export.files import dumps, write_atomic
from planner.ingest import detect, planner_json
from planner_cli import render
from planner_cli.options import json_option, load, paths_argument, rank_option, select_ranks


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="planner")
@click.option("--no-color", is_flag=True, help="Plain text, no colours.")
def cli(no_color: bool) -> None:
    """Communication-scheduling planner for data-parallel DNN training."""
    render.configure(no_color=no_color)


@cli.command("inspect")
@paths_argument()
@rank_option
@json_option
def inspect_command(paths: tuple[Path, ...], rank: str | None, as_json: bool) -> None:
    """What is in the input: devices, op counts, transfers with sizes, steps."""
    job = select_ranks(load(paths, as_json), rank)
    document = analysis.inspect(job)
    render.emit(document, as_json, render.inspect_view)


@cli.command("schedule")
@paths_argument()
@click.option(
    "--algorithm", "-a", type=click.Choice(analysis.ALGORITHMS), default="tac", show_default=True
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
@json_option
def schedule_command(
    paths: tuple[Path, ...],
    algorithm: str,
    output: Path | None,
    fmt: str,
    rank: str | None,
    as_json: bool,
) -> None:
    """Order the transfers of each rank with TIC or TAC."""
    job = select_ranks(load(paths, as_json), rank)
    document = analysis.plan_document(analysis.schedule(job, algorithm), job.graphs)
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
    if fmt == "csv":
        return priorities.to_csv(document)
    parts = []
    for entry in document["ranks"]:
        parts.append(f"# rank {entry['rank']}\n{priorities.to_tictac(document, entry['rank'])}")
    return "".join(parts)


def plan_files(document: dict[str, Any], fmt: str, output: Path | None) -> dict[Path, str]:
    """The files a plan is written to (none without -o)."""
    if output is None:
        return {}
    if fmt == "json":
        return {output: dumps(document)}
    if fmt == "csv":
        return {output: priorities.to_csv(document)}
    ranks = [entry["rank"] for entry in document["ranks"]]
    if len(ranks) == 1:
        return {output: priorities.to_tictac(document, ranks[0])}
    return {
        output.with_name(f"{output.stem}.{r}{output.suffix}"): priorities.to_tictac(document, r)
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
@rank_option
@json_option
def metrics_command(
    paths: tuple[Path, ...], min_efficiency: float | None, rank: str | None, as_json: bool
) -> None:
    """Per-step Umax, Lmin, efficiency E and speedup bound S (TicTac §3.2)."""
    job = select_ranks(load(paths, as_json), rank)
    document = analysis.metrics(job)
    failing = []
    if min_efficiency is not None:
        failing = [s for s in document["steps"] if s["efficiency"] < min_efficiency]
        document["gate"] = {
            "min_efficiency": min_efficiency,
            "failed": [{"rank": s["rank"], "iteration": s["iteration"]} for s in failing],
        }
    render.emit(document, as_json, render.metrics_view)
    if failing:
        steps = ", ".join(f"{s['rank']} step {s['iteration']}" for s in failing)
        render.note(f"efficiency below {min_efficiency}: {steps}", as_json, error=True)
        sys.exit(1)


@cli.command("analyze")
@paths_argument(required=False)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Directory for the results.")
@rank_option
@json_option
def analyze_command(
    paths: tuple[Path, ...], output: Path | None, rank: str | None, as_json: bool
) -> None:
    """Inspect + TIC + TAC + metrics; with no PATH, the bundled demo trace."""
    job = select_ranks(load(paths or (detect.demo_trace(),), as_json), rank)
    report = analysis.analyze(job)
    files: dict[Path, str] = {}
    if output is not None:
        files[output / "report.json"] = dumps(report)
        for name, document in report["plans"].items():
            files[output / f"priorities_{name}.json"] = dumps(document)
            for entry in document["ranks"]:
                text = priorities.to_tictac(document, entry["rank"])
                files[output / f"{entry['rank']}.{name}.txt"] = text
    for path, text in files.items():
        write_atomic(path, text)
    render.emit(report, as_json, render.analyze_view)
    for path in files:
        render.note(f"wrote {path}", as_json)


@cli.command("convert")
@paths_argument()
@click.option("--output", "-o", type=click.Path(path_type=Path), required=True)
@rank_option
@json_option
def convert_command(paths: tuple[Path, ...], output: Path, rank: str | None, as_json: bool) -> None:
    """Write any supported input as a planner JSON trace (docs/formats.md)."""
    job = select_ranks(load(paths, as_json), rank)
    write_atomic(output, dumps(planner_json.to_document(job)))
    render.note(f"wrote {output}", as_json)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: run the group, turn bad input and usage errors into exit 2."""
    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except InputError as exc:
        render.error(str(exc))
        sys.exit(2)
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


# Commands defined in their own modules register here, one line each.
