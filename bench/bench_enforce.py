"""Measured iteration times of the 2-rank DDP job (gloo, CPU) three ways, with the
planner's prediction for the good and the bad order.

    python bench/bench_enforce.py --steps 30
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.ingest import detect
from planner.verify import predict_orders, verify

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        subprocess.run([sys.executable, str(EXAMPLE), "--write-plans", "plans"], cwd=out,
                       check=True)  # fmt: skip
        argv = [sys.executable, str(EXAMPLE), "--nproc", "2", "--steps", str(args.steps),
                "--out", ".", "--timeout", "580"]  # fmt: skip
        for v in (
            "none",
            "hook:plans/good.json",
            "hook:plans/bad.json",
            "gradsync:plans/good.json",
        ):
            argv += ["--variant", v]
        subprocess.run(argv, cwd=out, check=True, capture_output=True, timeout=600)
        job = detect.load([out / "none" / f"rank{r}.json" for r in (0, 1)])
        buckets = [n for n in job.graphs["rank0"].transfers if "all_reduce" in n]
        predicted = predict_orders(job, "rank0", {"good": buckets, "bad": buckets[::-1]})
        print(f"predicted (planner.simulate, no-hook DAG): good {predicted['good'] * 1e3:.2f} ms,"
              f" bad {predicted['bad'] * 1e3:.2f} ms")  # fmt: skip
        for variant, plan in (("none", "good"), ("hook-good", "good"), ("hook-bad", "bad"),
                              ("gradsync-good", "good")):  # fmt: skip
            report = verify(out / "plans" / f"{plan}.json",
                            [out / variant / f"rank{r}.json" for r in (0, 1)])  # fmt: skip
            times = [s["duration"] for s in report["steps"] if s["rank"] == "rank0"]
            median, mean = statistics.median(times) * 1e3, statistics.mean(times) * 1e3
            print(f"{variant:14s} steps {len(times):3d}  median {median:7.2f} ms  "
                  f"mean {mean:7.2f} ms  in plan order {report['compliance']:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
