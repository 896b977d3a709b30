"""Judge this checkout's predictions against a lab run's measurements, without running
the lab again: `planner analyze` on each DDP run's stored trace (with its stored
bench-network CSV), its predictions against the configurations the lab measured; on a
TF run's stored trace, each plan's replayed gain in each enforcement mode
(`bench.lab.tf_lab.replayed_gains`) against the exported plans the lab measured.

    python -m bench.lab.repredict LABDIR                    # untraced step: the trace phase's
    python -m bench.lab.repredict LABDIR --anchor measured  # ... the measured plain median
    python -m bench.lab.repredict bench/lab/results/ddp-grid --json

A model change is judged here on measured runs of the configurations it predicts, in
seconds rather than the hours the measurements took. ``--anchor measured`` tells
planner the untraced step time of the traced configuration as the interleaved
measurement timed it, which is what a user's training log gives: the lab's trace phase
runs in another process, whose steps were 1-37% off the measured plain median on the
same machine (docs/validation.md), an error before any model.

Per run, the lab's table (`run.table`) with these predictions, and a line: how many
predictions lie within 5% of their measured median or inside the 95% interval of their
ratio to plain (issue #44's test), Spearman of the caps, the recommended cap against
the fastest.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lab import run as lab  # noqa: E402
from bench.lab import tf_lab  # noqa: E402

WITHIN = 0.05
"""A prediction within this of its measured median passes (issue #44)."""


def rows_judged(summary: dict) -> list[dict]:
    """Per configuration with a prediction: its error, predicted and measured ratio to
    plain with the ratio's interval, and whether it passes (`WITHIN`, or inside it)."""
    rows = summary["rows"]
    plain = rows[lab.PLAIN]
    out = []
    for label, row in rows.items():
        if not row.get("predicted_s"):
            continue
        predicted_ratio = row["predicted_s"] / plain["predicted_s"] if label != lab.PLAIN else 1.0
        inside = "ratio" in row and row["ratio_low"] <= predicted_ratio <= row["ratio_high"]
        out.append(
            {
                "config": label,
                "error": row["error"],
                "predicted_ratio": predicted_ratio,
                "measured_ratio": row.get("ratio", 1.0),
                "ratio_interval": [row.get("ratio_low"), row.get("ratio_high")],
                "passes": abs(row["error"]) <= WITHIN or inside,
            }
        )
    return out


def _groups(document: dict | None) -> list[list[tuple[tuple[str, ...], int]]]:
    """Per rank, each group of a ``planner.bucket_plan/1`` document: its ops and depth."""
    return [
        [(tuple(g["transfers"]), int(g["depth"])) for g in rank["groups"]]
        for rank in (document or {}).get("ranks", [])
    ]


def same_plan(where: Path, document: dict | None) -> bool:
    """Whether the Caramel plan the lab measured (stored beside the run's trace,
    ``plan/bucket_plan*.json``) is the one this checkout makes (`document`, its report's
    bucket plan): the same groups at the same depths. Only then is its measurement this
    checkout's prediction's to be judged by."""
    stored = sorted(where.glob("plan/bucket_plan*.json"))
    if not stored or not document:
        return False
    return _groups(json.loads(stored[0].read_text())) == _groups(document)


def repredict(lab_dir: Path, anchor: str, benchmark: bool = True) -> list[dict]:
    """Each run of `lab_dir` (its ``lab.json``) with a stored trace, re-predicted by this
    checkout's planner: the run's record with ``predicted`` and ``summary`` replaced,
    and the judged rows. Without `benchmark`, a DDP run's bench-network CSV is not
    given: the network is the one planner fits from the trace."""
    document = json.loads((lab_dir / "lab.json").read_text())
    threshold = document.get("foreign_threshold_cores", 0.10)
    args = argparse.Namespace(foreign_threshold=threshold, discard_loaded=False)
    out = []
    for record in document["runs"]:
        kind = lab.JOBS.get(record.get("job"), {}).get("kind")
        where = lab_dir / record["job"] / record["rate"]
        untraced = (
            record["summary"]["rows"][lab.PLAIN]["median_s"]
            if anchor == "measured"
            else record["trace"]["untraced_s"]
        )
        again = copy.deepcopy(record)
        if kind == "tf" and (where / "trace" / "run").is_dir():
            with tempfile.TemporaryDirectory() as tmp:
                gains = tf_lab.replayed_gains(where / "trace" / "run", Path(tmp), lab)
            labels = [c["label"] for c in record["configs"]]
            again["predicted"] = {
                "configs": tf_lab.predicted_configs(gains, untraced, labels),
                "sweep": {},
            }
        elif kind == "ddp":
            csv = where / "net.csv"
            net = {"csv": str(csv)} if benchmark and csv.exists() else None
            with tempfile.TemporaryDirectory() as tmp:
                report, notes = lab.analyze(where / "trace" / "ranks", Path(tmp), net, untraced)
            again["notes"] = notes
            again.pop("predicted_trace_fit", None)  # the first run's, not this checkout's
            again["predicted"] = lab.predictions(report, untraced)
            if not same_plan(where, (report.get("exports") or {}).get("bucket_plan")):
                again["configs"] = [c for c in record["configs"] if c["label"] != lab.CARAMEL]
        else:
            continue
        again["summary"] = lab.summarize(again, args)
        again["judged"] = rows_judged(again["summary"])
        out.append(again)
    return out


def verdict_line(record: dict) -> str:
    """How many predictions pass, the worst error, Spearman, recommended vs fastest."""
    judged, s = record["judged"], record["summary"]
    worst = max(judged, key=lambda r: abs(r["error"]))
    within = s["recommended_within_interval_of_fastest"]
    return (
        f"{record['job']} at {record['rate']}: {sum(r['passes'] for r in judged)} of "
        f"{len(judged)} predictions within {WITHIN:.0%} or inside the measured interval; "
        f"worst {worst['config']} {worst['error']:+.1%}; Spearman of the caps "
        f"{lab._fmt(s['spearman_caps'], '+.2f') or 'n/a'}; recommended "
        f"{s['recommended'] or 'none'}, fastest {s['fastest_cap']}"
        + ("" if within is None else f" (within its interval: {'yes' if within else 'no'})")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lab_dir", type=Path, help="a lab --out folder (lab.json, traces)")
    parser.add_argument("--anchor", choices=("trace", "measured"), default="trace")
    parser.add_argument(
        "--no-benchmark", action="store_true",
        help="leave out each run's bench-network CSV: predict with the trace's own network fit",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="the judged rows as JSON")
    args = parser.parse_args(argv)
    if not (args.lab_dir / "lab.json").exists():
        print(f"repredict: {args.lab_dir}: no lab.json", file=sys.stderr)
        return 2
    records = repredict(args.lab_dir, args.anchor, not args.no_benchmark)
    if args.json:
        rows = [
            {"job": r["job"], "rate": r["rate"], "judged": r["judged"], "summary": r["summary"]}
            for r in records
        ]
        print(json.dumps(rows, indent=1))
        return 0
    threshold = json.loads((args.lab_dir / "lab.json").read_text()).get(
        "foreign_threshold_cores", 0.10
    )
    for record in records:
        print(lab.table(record["rate"], record.get("check"), record, threshold))
    for record in records:
        print(verdict_line(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
