"""Terminal tables of a Horovod timeline: its tensors and fused buffers (`inspect`), wait
vs transfer per iteration (`metrics`), and the fusion advice of a Caramel plan
(`schedule -a caramel`)."""

from __future__ import annotations

from typing import Any

from planner_cli.render import bytes_text, new_table, out, seconds_text
from planner_cli.terminal import number_column, show, text_column


def _percent(value: float) -> str:
    return f"{value * 100:+.1f}%"


def horovod_view(h: dict[str, Any], per_iteration: bool = False) -> None:
    """Per tensor its all-reduces, negotiation, wait and transfer; the fused buffers;
    with `per_iteration`, each iteration's wait vs transfer."""
    console = out()
    tensors = new_table(
        title=f"Horovod: {h['ranks']} ranks, {h['iterations']} iterations, "
        f"{bytes_text(h.get('bytes_per_iteration', 0))} all-reduced per iteration"
    )
    columns = ("tensor", "bytes", "all-reduces", "negotiation", "wait", "transfer", "wire")
    text_column(tensors, columns[0])
    for column in columns[1:]:
        number_column(tensors, column)
    for t in h["tensors"]:
        tensors.add_row(
            t["tensor"], bytes_text(t["nbytes"]), str(t["allreduces"]),
            *(seconds_text(t[k]) for k in ("negotiate", "wait", "transfer", "wire")),
        )  # fmt: skip
    show(tensors, secondary=("wire", "negotiation"))
    fused = new_table(title=f"Fused all-reduces ({h['fused']['allreduces']} in all)")
    text_column(fused, "tensors")
    for column in ("times", "bytes", "time"):
        number_column(fused, column)
    for g in h["fused"]["groups"]:
        fused.add_row("\n".join(g["tensors"]), str(g["count"]), bytes_text(g["nbytes"]),
                      seconds_text(g["time"]))  # fmt: skip
    if h["fused"]["groups"]:
        show(fused)
    if per_iteration:
        steps = new_table(title="Horovod: negotiation wait vs transfer per iteration")
        columns = ("iteration", "tensors", "wait", "wait covered", "transfer",
                   "transfer covered", "span")  # fmt: skip
        for column in columns:
            number_column(steps, column)
        for s in h["steps"]:
            steps.add_row(
                str(s["iteration"]), str(s["tensors"]),
                *(seconds_text(s[k]) for k in ("wait", "wait_covered", "transfer",
                                               "transfer_covered", "span")),
            )  # fmt: skip
        show(steps, secondary=("transfer covered", "wait covered"))
        console.print(
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
    for column in ("fusion threshold (B)", "cycle (ms)", "span", "gain", "gain %"):
        number_column(table, column)
    for c in h["candidates"]:
        table.add_row(str(c["HOROVOD_FUSION_THRESHOLD"]), f"{c['HOROVOD_CYCLE_TIME']:g}",
                      seconds_text(c["predicted_span"]), seconds_text(c["gain"]),
                      _percent(c["gain_fraction"]))  # fmt: skip
    show(table, secondary=("gain",))
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
