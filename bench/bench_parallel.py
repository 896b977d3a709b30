"""Speedup of `planner.job.parallel.analyze_ranks` from 1 to 2 workers, and memory per worker.

Input: the 2 rank traces of the real long DDP run (``bench/make_large_trace.py``,
git-ignored under bench/_data/ddp_large; profiled first if absent), or the folders /
files given. Each configuration runs in a fresh interpreter; time is the best of
--repeat runs of the whole call (pool start-up included). Memory per worker: each task's
peak RSS (ru_maxrss of the process that loaded and analysed that rank).

Usage: python bench/bench_parallel.py [--repeat 2] [RANK_INPUT ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_data" / "ddp_large"

CHILD = r"""
import json, sys, time
from planner.job.parallel import analyze_ranks
workers, paths = int(sys.argv[1]), sys.argv[2:]
t0 = time.perf_counter()
document, usage = analyze_ranks([[p] for p in paths], workers=workers)
print(json.dumps({"seconds": time.perf_counter() - t0, "usage": usage,
                  "efficiency": document["job"]["mean_efficiency"]}))
"""


def run(workers: int, paths: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(workers), *paths],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("paths", nargs="*")
    args = parser.parse_args()
    paths = args.paths or [str(p) for p in sorted(SOURCE.glob("rank*.pt.trace.json.gz"))]
    if not paths:
        subprocess.run([sys.executable, str(HERE / "make_large_trace.py")], check=True)
        paths = [str(p) for p in sorted(SOURCE.glob("rank*.pt.trace.json.gz"))]
    size = sum(Path(p).stat().st_size for p in paths) / 2**20
    print(f"{len(paths)} rank inputs, {size:.1f} MiB on disk")
    best: dict[int, dict] = {}
    for _ in range(args.repeat):
        for workers in (1, 2):
            got = run(workers, paths)
            if workers not in best or got["seconds"] < best[workers]["seconds"]:
                best[workers] = got
    for workers, got in best.items():
        rss = ", ".join(f"{u['rank']} {u['peak_rss_mib']:.0f} MiB" for u in got["usage"])
        mode = "in-process" if workers == 1 else "process pool"
        print(f"workers={workers} ({mode}): {got['seconds']:.2f} s; peak RSS per task: {rss}")
    assert best[1]["efficiency"] == best[2]["efficiency"]
    print(f"speedup 1 -> 2 workers: {best[1]['seconds'] / best[2]['seconds']:.2f}x")


if __name__ == "__main__":
    main()
