"""Measured step times of the generated TF PS job (1 ps + 2 workers on 127.0.0.1, CPU)
run as traced, with a TIC plan enforced by arrival edges, and by the sender-side chain;
the fraction of steps in plan order, the planner's prediction for each, and how close
the replay of the plan on the traced run, as each mode applies it, comes to the run
that enforced it. Needs the ``tf`` extra and ../shared/traces.

    python bench/bench_enforce_tf.py --steps 20
    python bench/bench_enforce_tf.py --rounds 4 --steps 8 --tf-python /path/to/tf/python

``--rounds K`` runs the three graphs K times, interleaved on one cluster, so that a slow
spell of the host falls on every mode alike. Per round and rank: the median step as
traced (first to last record of the RunMetadata, what the replay times) of each mode,
and the TIC plan replayed on that round's traced run (``planner.prediction.replay.replay``) in
each mode and with its priorities alone, against the enforced run's median step.
``--tf-python`` runs the cluster with another interpreter (one with TensorFlow, where
this one has planner's dependencies). ``--keep DIR`` keeps the recorded rounds there;
``--judge DIR`` judges rounds kept so, recording nothing, so that two checkouts of the
replay are judged on the same runs:

    python bench/bench_enforce_tf.py --rounds 4 --steps 8 --keep /tmp/enforce-runs
    python bench/bench_enforce_tf.py --judge /tmp/enforce-runs
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.ingest import detect
from planner.job.verify import verify
from planner.model.plan import from_priorities
from planner.prediction.comparison import replayed_plan
from planner.prediction.replay import replay
from planner_cli.main import main as planner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tf_ps_job.py"
GRAPH = ROOT.parent / "shared" / "traces" / "generated" / "tf" / "cnn_ps_ingraph" / "graph.pb"
MODES = ("arrival", "sender")


def _planner(*argv: str) -> None:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            planner(list(argv))
    except SystemExit as exc:
        if exc.code:
            raise


def _median_walls(folder: Path) -> dict[str, float]:
    """Rank -> median traced step (s) of the RunMetadata files in `folder`."""
    document = replay(detect.load([str(folder)]))
    return {
        r["rank"]: statistics.median(s["wall"] for s in r["steps"] if not s.get("partial"))
        for r in document["ranks"]
    }


def judge(out: Path, plan: Path, rounds: int) -> None:
    """Per round and rank, each mode's replay on the traced run against its enforced run."""
    plans = {"tic": from_priorities(json.loads(plan.read_text()))}
    errors: dict[str, list[float]] = {"arrival": [], "sender": [], "priorities": []}
    print(f"\n{'round':5s} {'rank':8s} {'traced':>8s} {'arrival':>8s} {'sender':>8s}   "
          f"replayed: arrival / priorities alone vs arrival run; sender vs sender run")  # fmt: skip
    for k in range(1, rounds + 1):
        traced = detect.load([str(out / f"none{k}")])
        measured = {m: _median_walls(out / f"{m}{k}") for m in MODES}
        ran = _median_walls(out / f"none{k}")
        replayed = {
            label: {
                r["rank"]: replayed_plan(r["steps"], "tic")["predicted_wall"]
                for r in replay(traced, plans=plans, enforce=mode)["ranks"]
            }
            for label, mode in (("arrival", "arrival"), ("sender", "sender"), ("priorities", None))
        }
        for rank in sorted(ran):
            against = {"arrival": "arrival", "sender": "sender", "priorities": "arrival"}
            error = {
                label: replayed[label][rank] / measured[against[label]][rank] - 1.0
                for label in errors
            }
            for label, e in error.items():
                errors[label].append(e)
            walls = " ".join(
                f"{w * 1e3:6.2f}ms" for w in (ran[rank], *(measured[m][rank] for m in MODES))
            )
            print(f"{k:5d} {rank:8s} {walls}   {error['arrival']:+.1%} / "
                  f"{error['priorities']:+.1%}; {error['sender']:+.1%}")  # fmt: skip
    for label, values in errors.items():
        against = "sender" if label == "sender" else "arrival"
        middle = statistics.median(abs(e) for e in values)
        print(f"replayed {label:10s} vs the {against} runs: median |error| {middle:.1%} "
              f"over {len(values)} rank-rounds")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tf-python", default=sys.executable)
    parser.add_argument("--keep", type=Path, help="keep the recorded rounds in this folder")
    parser.add_argument("--judge", type=Path, help="judge the rounds kept in this folder")
    args = parser.parse_args()
    if args.judge is not None:
        rounds = len(list(args.judge.glob("none[0-9]*")))
        judge(args.judge, args.judge / "tic.json", rounds)
        return
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            out = args.keep
        else:
            out = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        plan = out / "tic.json"
        _planner("schedule", "-a", "tic", str(GRAPH), "-o", str(plan), "--json")
        graphs = {"none": GRAPH}
        for mode in MODES:
            graphs[mode] = out / f"{mode}.pb"
            _planner("export", "--graphdef", str(GRAPH), "--plan", str(plan), "-o",
                     str(graphs[mode]), "--enforce", mode, "--json")  # fmt: skip
        argv = [args.tf_python, str(EXAMPLE), "--steps", str(args.steps), "--out", str(out)]
        for k in range(1, args.rounds + 1):
            for label, path in graphs.items():
                argv += ["--graph", f"{label}{k}={path}"]
        subprocess.run(argv, check=True, capture_output=True, timeout=900 * args.rounds)
        print(f"{'enforcement':12s} {'steps':>5s} {'median span':>12s} {'busy':>9s} "
              f"{'predicted':>9s} {'in plan order':>14s}")  # fmt: skip
        for label in graphs:
            runs = sorted(str(p) for p in (out / f"{label}1").glob("run_metadata_step*.pb"))
            report = verify(plan, runs)
            wall = [s["duration"] for s in report["steps"] if s["rank"] == "worker0"]
            rank = report["ranks"][0]
            print(f"{label:12s} {len(wall):5d} {statistics.median(wall) * 1e3:9.2f} ms "
                  f"{rank['measured_busy_time'] * 1e3:6.2f} ms "
                  f"{rank['predicted_iteration_time'] * 1e3:6.2f} ms "
                  f"{report['compliance']:13.0%}")  # fmt: skip
        judge(out, plan, args.rounds)


if __name__ == "__main__":
    main()
