"""`planner model`: analytic PS / P2P / ring and Omnivore what-if from a trace."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from planner.errors import InputError
from planner_cli import render
from planner_cli.options import json_option, load, paths_argument, rank_option, select_ranks

if TYPE_CHECKING:
    from planner.model.oracle import NetworkModel

MAX_WORKERS = 100_000
ARCHITECTURES = ("ps", "p2p", "ring")
"""`planner.ARCHITECTURES`, spelled here so that parsing options imports no model."""


def parse_workers(text: str) -> list[int]:
    """``1:64`` (inclusive range), ``1:64:4`` (with a step) or ``1,2,4,8``."""
    try:
        if ":" in text:
            parts = [int(x) for x in text.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            start, stop = parts[0], parts[1]
            step = parts[2] if len(parts) == 3 else 1
            if step < 1 or stop < start:
                raise ValueError
            values = list(range(start, stop + 1, step))
        else:
            values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise InputError(
            None, f"--worker-counts {text!r}: expected A:B, A:B:STEP or a,b,c"
        ) from None
    if not values or values[0] < 1 or values[-1] > MAX_WORKERS:
        raise InputError(None, f"--worker-counts {text!r}: counts must be in 1..{MAX_WORKERS}")
    return values


def worker_counts(given: str | None, old: str | None) -> str:
    """The --worker-counts text; the old spelling --workers (a process count in every
    other command) still works, with a warning on stderr."""
    if old is None:
        return "1:64" if given is None else given
    if given is not None:
        raise click.UsageError("give --worker-counts only (--workers is its old name)")
    render.note("planner: warning: model --workers is deprecated; use --worker-counts", False)
    return old


def parse_ps(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise InputError(None, f"--ps {text!r}: expected a list such as 1,2,4") from None
    if not values or values[0] < 1:
        raise InputError(None, f"--ps {text!r}: PS counts must be positive")
    return values


def parse_arch(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in values if x not in ARCHITECTURES]
    if not values or unknown:
        raise InputError(None, f"--arch {text!r}: choose from {', '.join(ARCHITECTURES)}")
    return list(dict.fromkeys(values))


@click.command("model")
@paths_argument()
@click.option(
    "--worker-counts",
    "workers",
    default=None,
    metavar="COUNTS",
    help="The worker counts to model: A:B, A:B:STEP or a,b,c.  [default: 1:64]",
)
@click.option(
    "--workers",
    "old_workers",
    default=None,
    hidden=True,
    help="Deprecated spelling of --worker-counts (elsewhere --workers is a process count).",
)
@click.option("--ps", "ps_text", default="1", show_default=True, help="PS counts, e.g. 1,2,4.")
@click.option(
    "--bandwidth",
    type=float,
    default=None,
    help="Link bandwidth in GB/s (1e9 bytes/s); default: fitted to the trace's transfers.",
)
@click.option(
    "--network",
    "network_csv",
    type=click.Path(path_type=Path),
    default=None,
    help="A `planner bench-network` CSV to fit f(d) = a + b*d from, instead of the trace.",
)
@click.option(
    "--arch",
    "arch_text",
    default="ps,p2p,ring",
    show_default=True,
    help="The architectures to model, comma-separated: ps, p2p, ring.",
)
@click.option(
    "--overlap",
    type=float,
    default=None,
    help="Compute/communication overlap alpha in [0, 1]; 0 = the formulas as printed; "
    "default: the trace's measured alpha.",
)
@click.option("--batch-size", type=int, default=None, help="Per-worker batch (default: metadata).")
@click.option("--dataset-size", type=int, default=None, help="Samples per epoch, for epoch times.")
@click.option(
    "--momentum",
    type=float,
    default=0.9,
    show_default=True,
    help="Target total momentum for Omnivore's explicit momentum.",
)
@rank_option
@json_option
def model_command(
    paths: tuple[Path, ...],
    workers: str | None,
    old_workers: str | None,
    ps_text: str,
    bandwidth: float | None,
    network_csv: Path | None,
    arch_text: str,
    overlap: float | None,
    batch_size: int | None,
    dataset_size: int | None,
    momentum: float,
    rank: str | None,
    as_json: bool,
) -> None:
    """Iteration time and throughput vs workers for PS, P2P and ring all-reduce."""
    from planner.planning import models
    from planner.prediction import calibration

    counts = parse_workers(worker_counts(workers, old_workers))
    ps_counts = parse_ps(ps_text)
    architectures = parse_arch(arch_text)
    if bandwidth is not None and bandwidth <= 0:
        raise InputError(None, f"--bandwidth must be positive, got {bandwidth}")
    if overlap is not None and not 0.0 <= overlap <= 1.0:
        raise InputError(None, f"--overlap must be in [0, 1], got {overlap}")
    for name, value in (("--batch-size", batch_size), ("--dataset-size", dataset_size)):
        if value is not None and value < 1:
            raise InputError(None, f"{name} must be positive, got {value}")
    if not 0.0 <= momentum < 1.0:
        raise InputError(None, f"--momentum must be in [0, 1), got {momentum}")
    network = read_network(network_csv) if network_csv is not None else None
    job = select_ranks(load(paths, as_json), rank)
    cal = models.calibrate(
        job,
        network=network,
        bandwidth=bandwidth * 1e9 if bandwidth is not None else None,
        batch_size=batch_size,
    )
    document = models.model_document(
        job,
        cal,
        counts,
        architectures=architectures,
        ps_counts=ps_counts,
        overlap=overlap,
        dataset_size=dataset_size,
        target_momentum=momentum,
        simulator=calibration.calibrated_simulator if cal.ps == 0 else None,
    )
    render.emit(document, as_json, model_view)


def read_network(path: Path) -> NetworkModel:
    """f(d) fitted to a bench-network CSV; exit 2 when it cannot be read or fitted."""
    import numpy as np

    from planner.ingest import netbench
    from planner.model.oracle import fit_network_model

    try:
        sizes, seconds = netbench.read_csv(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(path, f"cannot read a network benchmark ({exc})") from None
    fitted = fit_network_model(np.array(sizes), np.array(seconds))
    if fitted is None or fitted.b <= 0:
        raise InputError(path, "needs at least two distinct sizes with growing times")
    return fitted


def _rate(value: float | None) -> str:
    """A throughput to 4 significant figures, whole from 1000 up (never ``1.1e+04``)."""
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


SHOWN_ROWS = 16
"""Worker counts a curve table shows in full; beyond, the default output thins it."""


def model_view(document: dict[str, Any]) -> None:
    """Calibration, iteration time and throughput per worker count, the recommendation;
    the calibration's terms, every worker count and Omnivore's groups with `--detail`."""
    console = render.out()
    _calibration_lines(document)
    _curve_tables(document)
    for x in document["crossovers"]:
        console.print(
            f"crossover {x['before']} -> {x['after']} between {x['from_workers']} and "
            f"{x['to_workers']} workers"
        )
    if not document["crossovers"]:
        console.print("no crossover in this range")
    rec, val = document["recommendation"], document["validation"]
    unit = document["assumptions"]["throughput_unit"]
    if rec:
        console.print(
            f"[bold]recommendation:[/bold] {rec['label']} with {rec['workers']} workers: "
            f"{render.seconds_text(rec['iteration_time'])} per iteration, "
            f"{_rate(rec['throughput'])} {unit}, scaling efficiency "
            f"{rec['scaling_efficiency']:.2f} ({rec['reason']})"
        )
    elif val.get("recommendation_withheld"):
        console.print(f"[bold red]no recommendation:[/bold red] {val['recommendation_withheld']}")
    if val.get("network_warning"):
        console.print(f"[bold red]warning:[/bold red] {val['network_warning']}")
    if document["omnivore"] and render.detail("Omnivore's compute groups"):
        _omnivore(document["omnivore"])
    _checks(document)


def _calibration_lines(document: dict[str, Any]) -> None:
    """What the models were fitted to; the calibration's terms with `--detail`."""
    console = render.out()
    cal, assume = document["calibration"], document["assumptions"]
    net = cal["network"]
    bw = assume["bandwidth"]
    console.print(
        f"[bold]Calibration[/bold] ({document['framework']}, {cal['workers']} worker(s), "
        f"{cal['ps']} PS): processing {render.seconds_text(cal['processing_time'])}, update "
        f"{render.seconds_text(cal['update_time'])}, W = {cal['model_bytes']} B, "
        f"bandwidth {bw / 1e9:.3g} GB/s, latency {render.seconds_text(assume['latency'])} "
        f"({net['source']}), measured iteration "
        f"{render.seconds_text(cal['measured_iteration_time'])}"
        if bw
        else "[bold]Calibration[/bold]: no bandwidth"
    )
    val = document["validation"]
    if render.detail("the calibration's terms"):
        console.print(
            f"calibrated on the traced configuration: network x{cal['network_scale']:.3g} the "
            f"formulas' time (measured N {render.seconds_text(cal['network_time'] or 0.0)}), "
            f"overhead {render.seconds_text(cal['overhead_time'])} per step (no modelled op "
            "runs); model "
            + (
                f"{render.seconds_text(val['model_iteration_time'])} vs measured "
                f"{render.seconds_text(val['measured_iteration_time'])} "
                f"({val['model_error']:+.1%})"
                if val["model_error"] is not None
                else "not checked (no measured step)"
            )
        )
    console.print(
        f"overlap alpha = {assume['alpha']:.3f} ({assume['alpha_source']}); throughput in "
        f"{assume['throughput_unit']}; {assume['scaling']}"
    )


def shown_workers(document: dict[str, Any]) -> list[int]:
    """The worker counts the curve tables show: all of a short range; else its ends, the
    powers of 2, both sides of each crossover and the recommended count."""
    counts = document["workers"]
    if len(counts) <= SHOWN_ROWS or render.detail("every worker count"):
        return counts
    keep = {counts[0], counts[-1], *(c for c in counts if c & (c - 1) == 0)}
    for x in document["crossovers"]:
        keep |= {x["from_workers"], x["to_workers"]}
    if document["recommendation"]:
        keep.add(document["recommendation"]["workers"])
    return [c for c in counts if c in keep]


def _curve_tables(document: dict[str, Any]) -> None:
    """Iteration time and throughput per worker count and architecture."""
    curves = document["curves"]
    best = {
        b["workers"]: b["label"]
        for b in (document["recommendation"] or {}).get("best_per_workers", [])
    }
    by_label = {c["label"]: {p["workers"]: p for p in c["points"]} for c in curves}
    workers = shown_workers(document)
    unit = render.time_unit(
        by_label[c["label"]][w]["iteration_time"]
        for c in curves
        for w in workers
        if w in by_label[c["label"]]
    )
    rate = document["assumptions"]["throughput_unit"]
    for title, key in (
        ("Iteration time vs workers (§III)", "iteration_time"),
        (f"Throughput ({rate}) vs workers (§III)", "throughput"),
    ):
        table = render.new_table(title=title)
        render.number_column(table, "workers")
        for label in (c["label"] for c in curves):  # a time's unit under its header
            render.number_column(
                table, label if key == "throughput" else render.with_unit(label, unit)
            )
        if key == "throughput":
            render.number_column(table, "ideal")
        render.text_column(table, "best")
        for w in workers:
            points = [by_label[c["label"]].get(w) for c in curves]
            if key == "throughput":
                cells = [_rate(p[key]) if p else "-" for p in points]
                cells.append(_rate(next((p["ideal_throughput"] for p in points if p), None)))
            else:
                cells = [render.time_cell(p[key], unit) if p else "-" for p in points]
            table.add_row(str(w), *cells, best.get(w, "-"))
        render.show(table)


def _omnivore(omni: dict[str, Any]) -> None:
    """Omnivore's compute groups for the largest worker count, and its assumptions."""
    console = render.out()
    groups = render.new_table(
        title=f"Omnivore compute groups for N = {omni['devices']} (§IV-B, §IV-C)"
    )
    unit = render.time_unit(g[k] for g in omni["groups"] for k in ("t_conv", "hardware_efficiency"))
    for column in ("g", "k", render.with_unit("t_conv(k)", unit), render.with_unit("HE(g)", unit),
                   "FC saturated", "implicit µ", "explicit µ"):  # fmt: skip
        render.number_column(groups, column)
    for g in omni["groups"]:
        groups.add_row(
            str(g["groups"]),
            str(g["group_size"]),
            render.time_cell(g["t_conv"], unit),
            render.time_cell(g["hardware_efficiency"], unit),
            "yes" if g["fc_saturated"] else "no",
            f"{g['implicit_momentum']:.3f}",
            f"{g['explicit_momentum']:.3f}",
        )
    render.show(groups)
    saturates = "saturates the FC phase" if omni["suggestion_saturates"] else "none saturates"
    console.print(f"suggested g = {omni['suggested_groups']} ({saturates}); assuming:")
    for line in omni["assumptions"]:
        console.print(f"  - {line}")


def _checks(document: dict[str, Any]) -> None:
    """The model against the trace, and the ring model against the simulator."""
    console = render.out()
    val = document["validation"]
    if val["model_error"] is not None:
        console.print(
            f"model vs trace ({val['arch']}, {val['workers']} worker(s)): "
            f"{render.seconds_text(val['model_iteration_time'])} vs measured "
            f"{render.seconds_text(val['measured_iteration_time'])} ({val['model_error']:+.1%})"
        )
    check = document["cross_check"]
    if "gap" in check:
        error = check.get("simulator_error")
        beside = "" if error is None else f" (simulator vs measured {error:+.1%})"
        console.print(
            f"ring model vs simulator at {check['workers']} workers: gap {check['gap']:+.1%}"
            + beside
        )
        if check.get("warning"):
            console.print(f"[yellow]warning:[/yellow] {check['warning']}")
    else:
        console.print(f"ring cross-check: {check['status']}")
    for line in document["calibration"]["notes"]:
        console.print(f"[yellow]note:[/yellow] {line}")
