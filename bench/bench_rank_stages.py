"""CPU per rank of each stage of `planner analyze` on many ranks: where a worker's time goes.

A worker of `planner.job.rank_analysis.report_ranks` reads a rank and runs the first pass
(`rank_analysis.analysis_summary`: oracle, metrics with the all-reduce figures, the ready
times of the replay's step models, inspection and order, bucket profile, the rank kept
on disk), then, after the parent's joins, the second pass (`rank_analysis.rank_report`:
the kept rank read back, its replay and the comparison of 100 samples of the Caramel plan
and the baseline). This bench times each stage apart in one warm process, with
`time.process_time` (CPU, so that other work on a shared machine counts less than in wall
time), over the first --ranks ranks of the 64-rank set of `bench_ranks.py` (built there
once), and prints per stage the median ms per rank (the first rank left out: imports,
caches and the simulator's compiled code load there).

``--baseline DIR`` (a checkout of other code, e.g. ``git worktree add --detach DIR
main``) runs the same in DIR's `planner`, interleaved over --repeat rounds: a same-run
baseline for a speed change.

Usage: nice python bench/bench_rank_stages.py [--ranks 12] [--repeat 2] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_ranks import build  # noqa: E402

CHILD = r"""
import collections, json, statistics, sys, tempfile, time
from pathlib import Path
from planner.job import pipeline, rank_analysis, rank_store, stages, summaries
from planner.planning import buckets
from planner.job.summaries import load_one_rank, summary_of
from planner.job.rank_replay import ready_summary, releases, simulation_of
files = sorted(Path(sys.argv[1]).glob("rank*.json.gz"), key=lambda p: int(p.name[4:-8]))
files = files[: int(sys.argv[2])]
spent = collections.defaultdict(list)
def timed(name, f, *args):
    t0 = time.process_time()
    out = f(*args)
    spent[name].append(time.process_time() - t0)
    return out
store = tempfile.mkdtemp()
for f in files:
    paths = [str(f)]
    job = timed("read the trace", load_one_rank, paths)
    oracle = timed("oracle", stages.oracles, job)
    summary = timed("metrics, bounds, plan terms", summary_of, job, paths, True, oracle)
    timed("ready times (step models)", ready_summary, job, paths, summary)
    timed("inspection and order", lambda: (stages.inspect(job, oracle),
                                           stages.observed_orders(job)))
    timed("bucket profile", buckets.rank_profile, job, job.ranks[0])
    timed("keep the rank", rank_store.save, store, paths, job)
folded = summaries.Folded()
fold = summaries.fold(folded)
ranks = pipeline.checked([fold(rank_analysis.analysis_summary([str(f)])) for f in files])
waits = pipeline.job_waits(ranks)
planned, inputs = pipeline.caramel_inputs(ranks, folded.times, waits, {})
plan = pipeline.reference_plan(planned[0]["inputs"], **inputs, benchmark=None)["plan"]
_, waited, _ = waits
ready = releases(ranks)
options = {"samples": 100, "seed": 0, "sweep_knob": None, "sweep_values": [], "knobs": {}}
for r in ranks:
    job = timed("read the kept rank", rank_store.load, store, r["inputs"])
    timed("replay and comparison", simulation_of, job, waited.get(r["rank"], {}),
          ready.get(r["rank"], {}), plan, options)
print(json.dumps({k: statistics.median(v[1:]) * 1e3 for k, v in spent.items()}))
"""


def run(folder: Path, ranks: int, code: Path) -> dict[str, float]:
    """Stage -> median CPU ms per rank, in a process started in `code` (whose `planner`
    package comes first on the path)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(ranks)],
        capture_output=True,
        text=True,
        cwd=code,
    )
    if done.returncode != 0:
        raise SystemExit(f"stages in {code}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="a checkout of other code")
    args = parser.parse_args()
    folder = build(64)
    codes = {"this code": HERE.parent}
    if args.baseline is not None:
        codes["@base"] = args.baseline
    got: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    for _ in range(args.repeat):
        for name, code in codes.items():  # interleaved: each round runs every code once
            got[name].append(run(folder, args.ranks, code))
    stages = list(got["this code"][0])
    print(
        f"CPU ms per rank (time.process_time; ranks 2-{args.ranks} of {folder}, median over "
        f"ranks, then over {args.repeat} rounds)"
    )
    print(f"{'stage':<30}" + "".join(f"{name:>12}" for name in codes))
    totals = dict.fromkeys(codes, 0.0)
    for stage in stages:
        cells = ""
        for name in codes:
            ms = statistics.median(r[stage] for r in got[name])
            totals[name] += ms
            cells += f"{ms:>12.1f}"
        print(f"{stage:<30}{cells}")
    print(f"{'all stages':<30}" + "".join(f"{totals[name]:>12.1f}" for name in codes))


if __name__ == "__main__":
    main()
