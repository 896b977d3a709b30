"""Measured step times of the generated TF PS job (1 ps + 2 workers on 127.0.0.1, CPU)
run as traced, with a TIC plan enforced by arrival edges, and by the sender-side chain;
the fraction of steps in plan order and the planner's prediction for each. Needs the
``tf`` extra and ../shared/traces.

    python bench/bench_enforce_tf.py --steps 20
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.verify import verify
from planner_cli.main import main as planner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tf_ps_job.py"
GRAPH = ROOT.parent / "shared" / "traces" / "generated" / "tf" / "cnn_ps_ingraph" / "graph.pb"


def _planner(*argv: str) -> None:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            planner(list(argv))
    except SystemExit as exc:
        if exc.code:
            raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        plan = out / "tic.json"
        _planner("schedule", "-a", "tic", str(GRAPH), "-o", str(plan), "--json")
        graphs = {"none": GRAPH}
        for mode in ("arrival", "sender"):
            graphs[mode] = out / f"{mode}.pb"
            _planner("export", "--graphdef", str(GRAPH), "--plan", str(plan), "-o",
                     str(graphs[mode]), "--enforce", mode, "--json")  # fmt: skip
        argv = [sys.executable, str(EXAMPLE), "--steps", str(args.steps), "--out", str(out)]
        for label, path in graphs.items():
            argv += ["--graph", f"{label}={path}"]
        subprocess.run(argv, check=True, capture_output=True, timeout=900)
        print(f"{'enforcement':12s} {'steps':>5s} {'median span':>12s} {'busy':>9s} "
              f"{'predicted':>9s} {'in plan order':>14s}")  # fmt: skip
        for label in graphs:
            runs = sorted(str(p) for p in (out / label).glob("run_metadata_step*.pb"))
            report = verify(plan, runs)
            wall = [s["duration"] for s in report["steps"] if s["rank"] == "worker0"]
            rank = report["ranks"][0]
            print(f"{label:12s} {len(wall):5d} {statistics.median(wall) * 1e3:9.2f} ms "
                  f"{rank['measured_busy_time'] * 1e3:6.2f} ms "
                  f"{rank['predicted_iteration_time'] * 1e3:6.2f} ms "
                  f"{report['compliance']:13.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
