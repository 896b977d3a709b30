"""`planner simulate`: replay the trace, compare plans by simulation, what-if sweeps."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from planner.export.files import dumps, write_atomic
from planner_cli import render
from planner_cli.options import (
    each_option,
    json_option,
    load,
    paths_argument,
    rank_option,
    select_ranks,
)
from planner_cli.parallel import parallel_options

if TYPE_CHECKING:
    from planner.model.plan import Plan
    from planner.model.trace import Job

PLAN_CHOICES = ("baseline", "observed", "tic", "tac", "caramel", "all")
KNOB_NAMES = {
    "bandwidth-scale": "bandwidth_scale",
    "compute-scale": "compute_scale",
    "latency": "latency",
    "channels": "channels",
}
"""`--sweep` knob spellings (`planner.prediction.comparison.KNOBS`, spelled here so that parsing
options imports no simulator)."""


def parse_sweep(text: str | None) -> tuple[str, list[float]] | None:
    """``KNOB=a:b:n`` -> (knob, n values from a to b); None without a sweep."""
    if text is None:
        return None
    name, sep, spec = text.partition("=")
    knob = KNOB_NAMES.get(name.strip().replace("_", "-"))
    parts = spec.split(":")
    if not sep or knob is None or len(parts) != 3:
        raise click.BadParameter(
            f"{text!r}: want KNOB=a:b:n with KNOB one of {', '.join(KNOB_NAMES)}",
            param_hint="--sweep",
        )
    try:
        a, b, n = float(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
        raise click.BadParameter(f"{text!r}: a, b must be numbers, n an integer") from None
    if n < 1:
        raise click.BadParameter(f"{text!r}: n must be >= 1", param_hint="--sweep")
    import numpy as np

    return knob, np.linspace(a, b, n).tolist()


def build_plans(job: Job, which: str, channels: int = 1) -> dict[str, dict[str, Plan]]:
    """The scheduler plans to simulate besides baseline and observed.

    With ``all``: TIC and TAC where the ranks have recvs (parameter server), Caramel
    where they have collectives (all-reduce).
    """
    from planner.job import analysis
    from planner.prediction.comparison import REFERENCE_PLANS

    if which in REFERENCE_PLANS:
        return {}
    names = analysis.algorithms_for(job) if which == "all" else [which]
    return {name: analysis.schedule(job, name, channels=channels) for name in names}


@click.command("simulate")
@paths_argument()
@click.option(
    "--plan",
    type=click.Choice(PLAN_CHOICES),
    default="all",
    show_default=True,
    help="Plan to simulate; baseline (random order) and observed are always shown.",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Replays per plan, each op's time drawn from its traced steps; the predicted step "
    "time is over these samples.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the samples and of the random-order baseline: the same seed, the same output.",
)
@click.option(
    "--bandwidth-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Network bandwidth x this (transfer times / this).",
)
@click.option(
    "--compute-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Compute speed x this (compute times / this).",
)
@click.option(
    "--latency",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds added to every transfer.",
)
@click.option(
    "--channels",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Concurrent transfers per network resource.",
)
@click.option(
    "--enforce",
    type=click.Choice(["arrival", "sender"]),
    default="arrival",
    show_default=True,
    help="TF: replay each plan as planner export --enforce MODE applies it.",
)
@click.option("--sweep", "sweep_spec", metavar="KNOB=a:b:n", help="Compare over n knob values.")
@click.option(
    "--timeline",
    type=click.Path(path_type=Path),
    help="Write the simulated schedules and the traced step as Chrome trace JSON.",
)
@rank_option
@parallel_options
@json_option
@each_option(single_files=("timeline",))
def simulate(
    paths: tuple[Path, ...],
    plan: str,
    samples: int,
    seed: int,
    bandwidth_scale: float,
    compute_scale: float,
    latency: float,
    channels: int,
    enforce: str,
    sweep_spec: str | None,
    timeline: Path | None,
    rank: str | None,
    workers: int | None,
    dask_address: str | None,
    as_json: bool,
) -> None:
    """Replay the traced steps (with their error) and predict each plan's iteration time.

    The PyTorch traces of several ranks are read one rank per process (-j, --dask; not
    with --timeline, --rank or --plan tic/tac); the document is the same as in one
    process."""
    from planner.api import resolve
    from planner.export.chrome_trace import chrome_trace
    from planner.job import analysis, parallel
    from planner.prediction.replay import require_timings

    sweep = parse_sweep(sweep_spec)
    knobs = {
        "bandwidth_scale": bandwidth_scale,
        "compute_scale": compute_scale,
        "latency": latency,
        "channels": channels,
    }
    ranks = None
    if rank is None and timeline is None and plan not in ("tic", "tac"):
        ranks = parallel.rank_inputs(resolve(paths))
    if ranks is not None:
        document, _ = parallel.simulate_ranks(
            ranks, workers, dask_address, plan, samples=samples, seed=seed,
            sweep_knob=sweep[0] if sweep else None, sweep_values=sweep[1] if sweep else (),
            **knobs,
        )  # fmt: skip
        render.emit(document, as_json, simulation_view)
        return
    if dask_address is not None:
        render.note(
            "--dask: one rank, not PyTorch, or --timeline/--rank/TIC/TAC: read in this process",
            as_json,
        )
    job = select_ranks(load(paths, as_json), rank)
    require_timings(job)  # before the plans: a GraphDef alone cannot be simulated
    document = analysis.simulation(
        job,
        build_plans(job, plan, channels),
        samples=samples,
        seed=seed,
        sweep_knob=sweep[0] if sweep else None,
        sweep_values=sweep[1] if sweep else (),
        timelines=timeline is not None,
        enforce=enforce,
        **knobs,
    )
    schedules = document.pop("timelines", None)
    if timeline is not None and schedules is not None:
        for schedule in schedules:
            schedule["graph"] = job.graphs[schedule["rank"]]
        meta = {
            "planner": "simulate",
            "samples": samples,
            "seed": seed,
            **document["comparison"]["knobs"],
        }
        write_atomic(timeline, dumps(chrome_trace(schedules, meta)))
    render.emit(document, as_json, simulation_view)
    if timeline is not None:
        render.note(f"wrote {timeline}", as_json)


_TF_ENFORCE = (
    "; a TF plan as planner export --enforce applies it in the mode beside its gain: "
    "arrival, one transfer of a rank at a time and a control message each; sender, the "
    "PS's reads in order"
)
"""What the replayed column means of a TF plan: said on a TF job only."""


def _replayed(replayed: dict | None) -> str:
    """The replayed gain of a plan, or why there is none."""
    if not replayed:
        return "-"
    if replayed["gain"] is None:
        return "cannot run"
    mode = replayed.get("enforce")
    return f"{_pct(replayed['gain'])} ({mode})" if mode else _pct(replayed["gain"])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


DEFAULT_KNOBS = {"bandwidth_scale": 1.0, "compute_scale": 1.0, "latency": 0.0, "channels": 1}
"""The what-if knobs at which a simulation is the traced configuration: not restated."""


def simulation_view(document: dict[str, Any], replay: bool = True) -> None:
    """The replay per step (`replay`), the plans' predicted times per rank, a sweep's
    curve."""
    if replay:
        _replay_table(document["replay"]["ranks"])
    comparison = document["comparison"]
    changed = {k: v for k, v in comparison["knobs"].items() if DEFAULT_KNOBS.get(k) != v}
    knobs = "".join(f", {k} {v:g}" for k, v in changed.items())
    for r in comparison["ranks"]:
        _comparison_table(r, f"{comparison['samples']} samples{knobs}", document)
    sweep = document.get("sweep")
    if sweep:
        for r in sweep["ranks"]:
            _sweep_table(sweep["knob"], r)
    if document.get("fsdp_whatif"):
        from planner_cli.render_communication import fsdp_whatif_view

        fsdp_whatif_view(document["fsdp_whatif"])


def _replay_table(ranks: list[dict[str, Any]]) -> None:
    """Each traced step replayed in its observed order, against its measured time."""
    keys = ("measured", "predicted", "wall", "idle")
    unit = render.time_unit(s.get(k) for r in ranks for s in r["steps"] for k in (*keys, "span"))
    headers = {k: render.with_unit(k, unit) for k in keys}
    table = render.new_table(
        title="Replay of the observed order (replay_error = predicted/measured - 1)"
    )
    render.text_column(table, "rank")
    render.number_column(table, "step")
    for column in (headers["measured"], headers["predicted"], "replay_error", headers["wall"],
                   "wall_error", headers["idle"]):  # fmt: skip
        render.number_column(table, column)
    for r in ranks:
        for s in r["steps"]:
            table.add_row(
                r["rank"],
                render.step_text(s),
                render.time_cell(s["measured"], unit),
                render.time_cell(s["predicted"], unit),
                _pct(s["replay_error"]),
                render.time_cell(s.get("wall", s["span"]), unit),
                _pct(s.get("wall_error")),
                render.time_cell(s["idle"], unit),
            )
    render.show(table, secondary=(headers["idle"], "wall_error", headers["wall"]))


PLAN_COLUMNS = ("predicted", "p5", "p50", "p95", "max")


def _comparison_table(r: dict[str, Any], what: str, document: dict[str, Any]) -> None:
    """One rank's plans: predicted iteration time (mean, percentiles), gains over the
    baseline and the observed order, the gain replayed on the traced steps."""
    unit = render.time_unit(p[c] for p in r["plans"] for c in PLAN_COLUMNS)
    table = render.new_table(
        title=f"Predicted iteration time of {r['rank']} ({what})", caption=_caption(r, document)
    )
    times = [render.with_unit(c, unit) for c in ("mean", *PLAN_COLUMNS[1:])]
    render.text_column(table, "plan")
    for column in (*times, "vs base", "vs obs", "replayed", "E", "alpha"):
        render.number_column(table, column)
    for p in r["plans"]:
        name = p["plan"].upper() if p["plan"] in ("tic", "tac") else p["plan"]
        if p["plan"] == r["best_plan"]:
            name = f"[bold]{name}[/bold]"
        table.add_row(
            name,
            *(render.time_cell(p[c], unit) for c in PLAN_COLUMNS),
            _pct(p["speedup_vs_baseline"]),
            _pct(p["speedup_vs_observed"]),
            _replayed(p.get("replayed")),
            _num(p["efficiency"]),
            _num(p["alpha"]),
        )
    render.show(table, secondary=("alpha", "E", times[4], times[2], "vs base"))
    for key in ("warning", "cpu_warning", "comparison_warning"):
        if r.get(key):
            render.note(f"{r['rank']}: {r[key]}", False, error=True)
    cautions = {(p.get("replayed") or {}).get("caution") for p in r["plans"]} - {None}
    for caution in sorted(cautions):
        render.note(f"{r['rank']}: replayed: {caution}", False, error=True)


def _caption(r: dict[str, Any], document: dict[str, Any]) -> str:
    """The replay errors under a rank's plans; what `replayed` means with `--detail`."""
    text = (
        f"replay error on the observed run: median {_pct(r['replay_error_median'])}, "
        f"worst {_pct(r['replay_error_max'])} (wall-clock: median "
        f"{_pct(r.get('wall_error_median'))}, worst {_pct(r.get('wall_error_max'))}); "
        "comparison on the observed order: busy time "
        f"{_pct(r.get('comparison_error'))} against the measured busy time, wall-clock "
        f"{_pct(r.get('comparison_wall_error'))} against the measured wall-clock time"
    )
    if not render.detail("what the plans' figures mean"):
        return text
    return (
        f"{text}; replayed: the plan's gain over the observed order, each traced step "
        "replayed both ways (the replay error above is its error"
        + (_TF_ENFORCE if document.get("framework") == "tensorflow" else "")
        + f"); Umax {render.seconds_text(r['umax'])}, Lmin {render.seconds_text(r['lmin'])}"
    )


def _sweep_table(knob: str, r: dict[str, Any]) -> None:
    """A rank's predicted time and speedup over the baseline per plan at each knob value."""
    names = list(r["points"][0]["plans"]) if r["points"] else []
    unit = render.time_unit(p["plans"][n]["predicted"] for p in r["points"] for n in names)
    table = render.new_table(
        title=f"Sweep of {knob} on {r['rank']}: predicted time (speedup vs baseline)"
    )
    render.number_column(table, knob)
    render.number_column(table, "rho")
    for name in names:
        render.text_column(table, render.with_unit(name, unit))
        table.columns[-1].justify = "right"
    for point in r["points"]:
        table.add_row(
            f"{point['value']:g}",
            _num(point["rho"]),
            *(
                f"{render.time_cell(point['plans'][n]['predicted'], unit)} "
                f"({_pct(point['plans'][n]['speedup_vs_baseline'])})"
                for n in names
            ),
        )
    render.show(table)
