"""The FSDP what-if across the runs of `traces/torch/fsdp`: docs/validation.md's tables.

    python bench/fsdp_crossrun.py

Per run: the measured step (the slowest rank's ProfilerStep span, median over the
steps), the replay of the recorded setting (own and typical collective times), the
replay error, the overlap the trace shows (compute beside the collectives from issue to
completion, calls issued ahead) and the recommendation; per run also its median step
split into the collectives' time, their waits from issue (c10d call) to start (gloo
record) and the rest (compute, Python, other waits). Across runs:
one run's trace with one setting changed against the run recorded with that setting,
predicted by the what-if as it is (``model``: serialised where the trace shows no
overlap) and with the overlap always assumed (``overlap``, the model before it read the
overlap: `MIN_OVERLAP` set to 0). Reads only the repository's traces; ~10 s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.ingest import detect  # noqa: E402
from planner.model.trace import rank_meta  # noqa: E402
from planner.prediction import fsdp_whatif as whatif  # noqa: E402

FSDP = ROOT / "traces" / "torch" / "fsdp"
PAIRS = [  # (trace of, setting, value, run recorded with it)
    ("fsdp2_reshard", "reshard_after_forward", False, "fsdp2_noreshard"),
    ("fsdp2_reshard", "prefetch", 2, "fsdp2_prefetch"),
    ("fsdp2_reshard", "units", 2, "fsdp2_units2"),
    ("fsdp2_noreshard", "reshard_after_forward", True, "fsdp2_reshard"),
    ("fsdp2_prefetch", "prefetch", 0, "fsdp2_reshard"),
    ("fsdp1_prefetch", "prefetch", 0, "fsdp1_noprefetch"),
    ("fsdp1_noprefetch", "prefetch", 1, "fsdp1_prefetch"),
    ("fsdp1_prefetch", "reshard_after_forward", False, "fsdp1_grad_op"),
]


def documents(min_overlap: float) -> dict[str, dict[str, Any]]:
    """Run -> its what-if document with `MIN_OVERLAP` set to `min_overlap`, and its
    ``leads``: (rank, step) -> the ns its collectives waited from issue to start."""
    kept = whatif.MIN_OVERLAP
    whatif.MIN_OVERLAP = min_overlap
    out = {}
    try:
        for run in sorted(p.name for p in FSDP.iterdir() if p.is_dir()):
            job = detect.load([FSDP / run])
            out[run] = whatif.fsdp_whatif(job)
            out[run]["leads"] = {
                (rank, int(step)): sum(c[2] for c in ops.values())
                for rank in job.ranks
                for step, ops in rank_meta(job, rank)["in_flight"].items()
            }
    finally:
        whatif.MIN_OVERLAP = kept
    return out


def split(document: dict[str, Any]) -> tuple[float, float, float]:
    """The job's median step (the slowest rank's per step, the median of the steps; the
    lower of the middle two) split as (its collectives' time, their waits from issue
    to start, the rest), s."""
    by_step: dict[int, tuple[float, float, float]] = {}
    for rank in document["ranks"]:
        for row in rank["steps"]:
            it = row["iteration"]
            lead = document["leads"].get((rank["rank"], it), 0) / 1e9
            if it not in by_step or row["measured"] > by_step[it][0]:
                by_step[it] = (row["measured"], row["collectives"], lead)
    steps = sorted(by_step.values())
    measured, collectives, lead = steps[(len(steps) - 1) // 2]
    return collectives, lead, measured - collectives - lead


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.2f} ms"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _setting(document: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    return next(s for s in document["settings"] if (s["setting"], s["value"]) == (name, value))


def tables(model: dict[str, dict[str, Any]], overlap: dict[str, dict[str, Any]]) -> list[str]:
    """The two tables as Markdown lines."""
    lines = [
        "| run | measured step | collectives / issue-to-start / rest "
        "| replayed (typical times) | replay error (median / worst) | compute beside collectives "
        "| issued ahead | recommended |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, d in model.items():
        o, best = d["overlap"], d["recommendation"]
        coll, lead, rest = split(d)
        rec = (
            "none"
            if best is None
            else f"{best['setting']} = {best['value']} ({_pct(best['gain'])})"
        )
        lines.append(
            f"| `{run}` | {_ms(d['measured'])} "
            f"| {coll * 1e3:.1f} / {lead * 1e3:.1f} / {rest * 1e3:.1f} ms "
            f"| {_ms(d['typical'])} ({_pct(d['typical'] / d['measured'] - 1)}) "
            f"| {d['replay_error']:.1%} / {d['replay_error_worst']:.1%} "
            f"| {o['share']:.1%} | {o['ahead']} of {o['calls']} "
            f"| {rec} |"
        )
    lines += [
        "",
        "| from the trace of | setting | predicted (model) | gain | recommended "
        "| predicted (overlap assumed) | measured step of | measured | error (model) "
        "| error (overlap assumed) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for src, name, value, dst in PAIRS:
        s, a = _setting(model[src], name, value), _setting(overlap[src], name, value)
        measured = model[dst]["measured"]
        lines.append(
            f"| `{src}` ({_ms(model[src]['measured'])}) | {name} = {value} "
            f"| {_ms(s['predicted'])} | {_pct(s['gain'])} | {'yes' if s['recommended'] else 'no'} "
            f"| {_ms(a['predicted'])} | `{dst}` | {_ms(measured)} "
            f"| {_pct(s['predicted'] / measured - 1)} | {_pct(a['predicted'] / measured - 1)} |"
        )
    return lines


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    model, overlap = documents(whatif.MIN_OVERLAP), documents(0.0)
    print("\n".join(tables(model, overlap)))
    for run, d in model.items():
        print(f"{run}: {d['overlap']['note']}")


if __name__ == "__main__":
    main()
