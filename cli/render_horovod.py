"""Terminal tables of a Horovod timeline: its tensors and fused buffers (`inspect`), wait
vs transfer per iteration (`metrics`), and the fusion advice of a Caramel plan
(`schedule -a caramel`)."""

from __future__ import annotations

from typing import Any

from planner_cli.render import bytes_text, counted, new_table, out, seconds_text
from planner_cli.terminal import (
    number_column,
    show,
    text_column,
    time_cell,
    time_unit,
    with_unit,
)


def _percent(value: float) -> str:
    return f"{value * 100:+.1f}%"


def horovod_view(h: dict[str, Any], per_iteration: bool = False) -> None:
    """Per tensor its all-reduces, negotiation, wait and transfer; the fused buffers;
    with `per_iteration`, each iteration's wait vs transfer."""
    tensors = new_table(
        title=f"Horovod: {counted(h['ranks'], 'rank')}, {counted(h['iterations'], 'iteration')}, "
        f"{bytes_text(h.get('bytes_per_iteration', 0))} all-reduced per iteration"
    )
    keys = ("negotiate", "wait", "transfer", "wire")
    unit = time_unit(t[k] for t in h["tensors"] for k in keys)
    times = [with_unit(c, unit) for c in ("negotiation", "wait", "transfer", "wire")]
    text_column(tensors, "tensor")
    for column in ("bytes", "all-reduces", *times):
        number_column(tensors, column)
    for t in h["tensors"]:
        tensors.add_row(
            t["tensor"], bytes_text(t["nbytes"]), str(t["allreduces"]),
            *(time_cell(t[k], unit) for k in keys),
        )  # fmt: skip
    show(tensors, secondary=(times[3], times[0]))
    fused = new_table(title=f"Fused all-reduces ({h['fused']['allreduces']} in all)")
    unit = time_unit(g["time"] for g in h["fused"]["groups"])
    text_column(fused, "tensors")
    for column in ("times", "bytes", with_unit("time", unit)):
        number_column(fused, column)
    for g in h["fused"]["groups"]:
        fused.add_row("\n".join(g["tensors"]), str(g["count"]), bytes_text(g["nbytes"]),
                      time_cell(g["time"], unit))  # fmt: skip
    if h["fused"]["groups"]:
        show(fused)
    if per_iteration:
        _per_iteration(h["steps"])


def _per_iteration(rows: list[dict[str, Any]]) -> None:
    """Each iteration's negotiation wait and transfer, summed and covered."""
    steps = new_table(title="Horovod: negotiation wait vs transfer per iteration")
    keys = ("wait", "wait_covered", "transfer", "transfer_covered", "span")
    unit = time_unit(s[k] for s in rows for k in keys)
    times = [with_unit(c, unit) for c in ("wait", "wait covered", "transfer",
                                          "transfer covered", "span")]  # fmt: skip
    for column in ("iteration", "tensors", *times):
        number_column(steps, column)
    for s in rows:
        steps.add_row(
            str(s["iteration"]), str(s["tensors"]), *(time_cell(s[k], unit) for k in keys)
        )
    show(steps, secondary=(times[3], times[1]))
    out().print(
        "wait: from the first to the last rank's request, summed over the tensors "
        "(covered: the time it spans); transfer: the ALLREDUCE spans likewise"
    )


def fusion_view(h: dict[str, Any]) -> None:
    """Caramel's threshold against Horovod's buffers, the settings replayed, the verdict."""
    console = out()
    net = h["network"]
    threshold = h["threshold_bytes"]
    console.print(
        "Caramel batching threshold: "
        + (bytes_text(threshold) if threshold is not None else "none (no per-byte cost)")
        + f" (network f(d) = {net['a'] * 1e3:.3f} ms + {net['b'] * 1e9:.3f} ns/B, "
        f"R² {net.get('r2', float('nan')):.3f})"
    )
    rows = new_table(title="Horovod's all-reduces against the threshold")
    text_column(rows, "tensors")
    for column in ("per iteration", "bytes", "vs threshold"):
        number_column(rows, column)
    for r in h["fused"]["allreduces"]:
        rows.add_row("\n".join(r["tensors"]), f"{r['per_iteration']:.2f}",
                     bytes_text(r["nbytes"]), r["vs_threshold"] or "-")  # fmt: skip
    show(rows)
    fused = h["fused"]
    console.print(
        f"per iteration: {fused['small_alone_per_iteration']:.2f} all-reduce(s) of one tensor "
        f"below the threshold (Caramel would batch them), "
        f"{fused['fused_above_threshold_per_iteration']:.2f} fused buffer(s) above it"
    )
    assumed, error = h["assumed"], h["replay_error"]
    console.print(
        f"replay of Horovod's loop as the job ran (assumed defaults: "
        f"HOROVOD_FUSION_THRESHOLD={assumed['HOROVOD_FUSION_THRESHOLD']}, "
        f"HOROVOD_CYCLE_TIME={assumed['HOROVOD_CYCLE_TIME']} ms; loop period "
        f"{seconds_text(assumed['cycle_period'])} as its CYCLE_START marks): median "
        f"{_percent(error['median'])}, worst {_percent(error['worst'])} of the traced span "
        f"(median {seconds_text(h['measured_span'])}); buffers as traced in "
        f"{error['buffers_matched']:.0%} of the iterations"
    )
    table = new_table(title="Fusion settings replayed (gain: per iteration, median)")
    unit = time_unit(c[k] for c in h["candidates"] for k in ("predicted_span", "gain"))
    span, gain = with_unit("span", unit), with_unit("gain", unit)
    for column in ("fusion threshold (B)", "cycle (ms)", span, gain, "gain %"):
        number_column(table, column)
    for c in h["candidates"]:
        table.add_row(str(c["HOROVOD_FUSION_THRESHOLD"]), f"{c['HOROVOD_CYCLE_TIME']:g}",
                      time_cell(c["predicted_span"], unit), time_cell(c["gain"], unit),
                      _percent(c["gain_fraction"]))  # fmt: skip
    show(table, secondary=(gain,))
    best, chosen = h["best"], h["recommended"]
    if chosen is not None:
        console.print(
            f"recommended: HOROVOD_FUSION_THRESHOLD={chosen['HOROVOD_FUSION_THRESHOLD']} "
            f"HOROVOD_CYCLE_TIME={chosen['HOROVOD_CYCLE_TIME']:g}: predicted gain "
            f"{seconds_text(chosen['gain'])} per iteration ({_percent(chosen['gain_fraction'])}),"
            f" beyond the replay error {error['median_abs']:.1%}"
        )
    else:
        console.print(
            f"no setting recommended: the best replayed gain, {seconds_text(best['gain'])} per "
            f"iteration ({_percent(best['gain_fraction'])}), is within the replay error "
            f"{error['median_abs']:.1%}: keep the job's settings"
        )
