"""`planner bench-network` and `planner fit-network`: Caramel's network model (§4.2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from planner.errors import InputError
from planner.export.files import write_atomic
from planner_cli import render
from planner_cli.options import json_option


def _sizes(text: str | None) -> tuple[int, ...]:
    from planner.ingest import netbench

    if text is None:
        return netbench.DEFAULT_SIZES
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of byte counts") from None
    if not sizes or any(s < 1 for s in sizes):
        raise click.BadParameter("sizes must be positive byte counts")
    return sizes


@click.command("bench-network")
@click.option(
    "--world-size",
    "-n",
    type=click.IntRange(2, 64),
    default=2,
    show_default=True,
    help="Processes all-reducing (local, gloo).",
)
@click.option(
    "--sizes",
    default=None,
    help="Comma-separated message sizes in bytes (default: 64 B to 4 MiB, x4 steps).",
)
@click.option(
    "--repeats",
    type=click.IntRange(1, 10_000),
    default=10,
    show_default=True,
    help="Timed all-reduces per size.",
)
@click.option(
    "--warmup",
    type=click.IntRange(0, 1000),
    default=2,
    show_default=True,
    help="Untimed all-reduces per size before them.",
)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write the CSV here.")
@json_option
def bench_network(
    world_size: int,
    sizes: str | None,
    repeats: int,
    warmup: int,
    output: Path | None,
    as_json: bool,
) -> None:
    """Time gloo all-reduce per message size with real torch.distributed processes."""
    from planner.ingest import netbench

    try:
        rows = netbench.bench_allreduce(_sizes(sizes), world_size, repeats, warmup)
    except ImportError as exc:
        raise InputError(None, str(exc)) from None
    except RuntimeError as exc:
        raise InputError(None, f"benchmark failed: {exc}") from None
    text = netbench.to_csv(rows)
    if output is not None:
        write_atomic(output, text)
    if as_json:
        render.emit({"schema": "planner.netbench/1", "rows": rows}, True, lambda _d: None)
    elif output is None:
        click.echo(text, nl=False)
    else:
        _bench_view(rows)
        render.note(f"wrote {output}", as_json)


def _bench_view(rows: list[dict[str, Any]]) -> None:
    table = render.new_table(title="all-reduce time per size (gloo, 127.0.0.1)")
    for column in ("bytes", "median (µs)", "min (µs)", "repeats"):
        render.number_column(table, column)
    for r in rows:
        table.add_row(
            str(r["nbytes"]), f"{r['seconds'] * 1e6:.1f}", f"{r['seconds_min'] * 1e6:.1f}",
            str(r["repeats"]),
        )  # fmt: skip
    render.show(table)


@click.command("fit-network")
@click.argument("csv_path", type=click.Path(path_type=Path), metavar="CSV")
@json_option
def fit_network(csv_path: Path, as_json: bool) -> None:
    """Fit f(d) = a + b*d; print R^2, residuals, batching threshold and depth table."""
    from planner.ingest import netbench
    from planner.planning.batching import fit_report

    try:
        text = csv_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(csv_path, f"cannot read ({exc})") from None
    try:
        sizes, seconds = netbench.read_csv(text)
        report = fit_report(sizes, seconds)
    except ValueError as exc:
        raise InputError(csv_path, str(exc)) from None
    report["source"] = str(csv_path)
    render.emit(report, as_json, _fit_view)


def _fit_view(report: dict[str, Any]) -> None:
    console = render.out()
    console.print(
        f"f(d) = {report['a'] * 1e6:.3f} µs + d x {report['b'] * 1e9:.4f} ns/B"
        f"   R^2 = {report['r2']:.4f}   ({report['points']} points)"
    )
    residuals = render.new_table(title="Residuals")
    render.number_column(residuals, "bytes")
    for column in ("measured", "predicted", "residual"):
        render.number_column(residuals, render.with_unit(column, "µs"))
    for r in report["residuals"]:
        residuals.add_row(
            str(r["nbytes"]),
            f"{r['seconds'] * 1e6:.1f}",
            f"{r['predicted'] * 1e6:.1f}",
            f"{r['residual'] * 1e6:+.1f}",
        )
    render.show(residuals)
    limit = report["threshold_bytes"]
    console.print(
        "batching threshold (min x with f(2x)/(2f(x)) > 0.8, i.e. x > 1.5a/b): "
        + ("none (b = 0)" if limit is None else f"{limit} bytes")
    )
    table = render.new_table(title="Depth per transfer size (Caramel §4.4)")
    for column in ("depth", "from bytes", "to bytes (excl.)"):
        render.number_column(table, column)
    for row in report["depth_table"]:
        high = row["max_bytes"]
        table.add_row(str(row["depth"]), str(row["min_bytes"]), "-" if high is None else str(high))
    render.show(table)
