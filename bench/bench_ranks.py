"""`planner metrics` / `schedule -a caramel` / `simulate` / `analyze` on jobs of 8 / 64 /
256 / 1,024 ranks: one process vs -j 1, -j 2, Dask.

Input: the 2 real Kineto rank traces of ../shared/traces/generated/torch/transformer_ddp
(gloo DDP), copied to N ranks: rank r is a copy of the real rank r % 2 with
``distributedInfo`` renamed (rank r of a job of `WORLD` ranks: the 8- and 64-rank sets
are the first ranks of that job, as HTA's sampled-rank traces are), its clock shifted by
a random offset (0-2 s) and each step delayed by a random 0-20 ms, so that the ranks'
stragglers and collective orders differ. Built once under bench/_data/ranks (git-ignored).

Each configuration runs as a whole process (interpreter start-up and imports included,
what a user waits for), interleaved over --repeat rounds; figures are medians. The
planner packages timed are byte-compiled first, as `pip install` leaves an installed
package (and HTA's): a checkout on a machine with PYTHONDONTWRITEBYTECODE set would
otherwise compile its modules from source in every process (about 0.1 s).
``one process`` is the joint path (`detect.load` of every rank into one Job, then
`analysis.metrics`; `analysis.schedule(job, "caramel")` with ``--command schedule``;
`analysis.simulation` of the Caramel plan, 100 samples, with ``--command simulate`` (a
PyTorch all-reduce job's ranks replayed one by one; a baseline from before it runs the
whole-job `simulate.simulation`);
`analysis.analyze`, the whole report, with ``--command analyze``);
``-j 1``, ``-j 2`` and ``dask`` (a LocalCluster of 2 worker processes, started inside
the timed process) run `planner.job.parallel.metrics_ranks` / `schedule_ranks` /
`simulate_ranks` / `planner.job.rank_analysis.report_ranks`, whose
document is checked byte-identical to the one-process document where both ran.
CPU s: the user and system seconds of the timed process and every process it started
(its pool's workers included): steadier than wall time on a shared machine. Parent RSS:
the timed process's peak; worker RSS: the largest peak of the processes that
ran the rank tasks (ru_maxrss, MiB); ``x file``: worker peak / the largest rank file
inflated (its JSON text), the factor by which a worker's memory follows the rank size.
Job MiB: the peak of the memory of the timed process and every process it started,
taken together (psutil, sampled every 100 ms): the sum of their proportional set sizes,
which counts a page that forked workers share with the parent once, where the sum of
their RSS would count it in each. The figure to hold against HTA's, whatever the
number of processes.

``--baseline DIR`` (a checkout of other code, e.g. ``git worktree add DIR main``) runs
every mode also on DIR's `planner` package, interleaved, as ``<mode> @base``: a
same-run baseline for a speed change (its documents must be the same too).

``planner analyze -j 2`` (``--command analyze``) is what a user runs: the CLI in the timed
process, report.json, report.html with its plots and the plan files written to a temporary
folder (its report.json also lists those files, so it has no document hash here); its
worker MiB is the largest of its pool's processes.

``hta load`` (``--modes ... "hta load"``; ``pip install -e '.[bench]'``) times HTA 0.5.0's
``TraceAnalysis(trace_dir=...)`` on the same folder, interleaved with the others; its
worker MiB is the largest of its parsing subprocesses.

Usage: nice python bench/bench_ranks.py [--sizes 8 64] [--repeat 3] [--modes ...]
                                        [--command metrics|schedule|simulate|analyze]
                                        [--baseline DIR]
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import hashlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from bisect import bisect_right
from concurrent.futures import ProcessPoolExecutor
from functools import cache, partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "shared" / "traces" / "generated" / "torch" / "transformer_ddp"
DATA = HERE / "_data" / "ranks"
WORLD = 1024
MODES = ("one process", "-j 1", "-j 2", "dask")
HTA = "hta load"
CLI = "planner analyze -j 2"
BASE = "@base"

CHILD = r"""
import hashlib, json, resource, sys
from pathlib import Path
mode, folder, command = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
# the checkout timed (the process starts in it) alone: an editable install's finder would
# fill in the subpackages a --baseline lacks (planner.job, ...) from the installed checkout
sys.meta_path[:] = [f for f in sys.meta_path if "Editable" not in getattr(f, "__name__", "")]
files = sorted(folder.glob("rank*.json.gz"))
if mode == "hta load":
    import contextlib, io, logging
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
    with contextlib.redirect_stdout(io.StringIO()):
        TraceAnalysis(trace_dir=str(folder))
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"sha": None, "parent_mib": own, "worker_mib": max(own, kids), "workers": 0}))
    sys.exit(0)
if mode.startswith("planner "):  # the command a user runs, report files written
    import contextlib, importlib.util, io, os, tempfile
    # the CLI of the checkout timed (its folder `cli` is the package `planner_cli`), not
    # the one an editable install maps
    cli = os.path.join(os.getcwd(), "cli")
    spec = importlib.util.spec_from_file_location(
        "planner_cli", os.path.join(cli, "__init__.py"), submodule_search_locations=[cli])
    sys.modules["planner_cli"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["planner_cli"])
    from planner_cli.main import main
    out = tempfile.mkdtemp(prefix="bench-ranks-")
    sys.argv = [*mode.split(), str(folder), "-o", out, "--json"]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main()
        except SystemExit as exc:
            if exc.code:
                raise
    import shutil
    shutil.rmtree(out)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"sha": None, "parent_mib": own, "worker_mib": kids, "workers": 2}))
    sys.exit(0)
try:  # the stage packages (docs/architecture.md); a --baseline from before has them flat
    from planner.job import analysis, parallel, rank_analysis
    from planner.prediction import simulate
except ImportError:
    from planner import analysis, parallel, rank_analysis, simulate
if mode == "one process":
    from planner.ingest import detect
    job = detect.load(files)
    if command == "schedule":
        plans = analysis.schedule(job, "caramel")
        document, usage = analysis.plan_document(plans, job.graphs, job.meta), []
    elif command == "analyze":
        document, usage = analysis.analyze(job), []
    elif command == "simulate":
        plans = {"caramel": analysis.schedule(job, "caramel")}
        knobs = {"bandwidth_scale": 1.0, "compute_scale": 1.0, "latency": 0.0, "channels": 1}
        # the API's and the CLI's one-process path (a baseline from before it: the joint one)
        run = getattr(analysis, "simulation", simulate.simulation)
        document, usage = run(job, plans, **knobs), []
    else:
        document, usage = analysis.metrics(job), []
else:
    ranks = parallel.rank_inputs(files)
    workers, dask = (2, "local") if mode == "dask" else (int(mode.split()[-1]), None)
    if command == "analyze":
        document, _, usage = rank_analysis.report_ranks(ranks, workers, dask)
    else:
        run = {"schedule": parallel.schedule_ranks, "simulate": parallel.simulate_ranks}.get(
            command, parallel.metrics_ranks)
        document, usage = run(ranks, workers=workers, dask_address=dask)
# the document's hash, its text (the bytes `planner` writes) read piece by piece: this
# process's peak is the analysis', not a copy of the text made here
try:
    from planner.export.files import json_pieces
except ImportError:  # code from before json_pieces
    from planner.export.files import dumps
    json_pieces = lambda document: [dumps(document)]
digest = hashlib.sha256()
for piece in json_pieces(document):
    digest.update(piece.encode())
parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({
    "sha": digest.hexdigest(),
    "parent_mib": parent,
    "worker_mib": max((u["peak_rss_mib"] for u in usage), default=parent),
    "workers": len({u["pid"] for u in usage}) or 1,
}))
"""


def build(size: int) -> Path:
    """bench/_data/ranks/N: N jittered rank copies (made once, reused).

    Rank r's file depends only on r (and `WORLD`), so a rank already built for another
    size is hard-linked, not made again; the others are made on 2 processes, each file
    written under a temporary name and renamed, so an interrupted build leaves none half
    written."""
    folder = DATA / str(size)
    folder.mkdir(parents=True, exist_ok=True)
    missing = []
    for rank in range(size):
        target = folder / f"rank{rank}.json.gz"
        if target.exists():
            continue
        built = [p for p in DATA.glob(f"*/rank{rank}.json.gz") if p.parent != folder]
        if built:
            os.link(built[0], target)
        else:
            missing.append(rank)
    if missing:
        with ProcessPoolExecutor(max_workers=2) as pool:
            list(pool.map(partial(_make_rank, folder), missing))
    return folder


def _make_rank(folder: Path, rank: int) -> None:
    """One jittered copy: rank `rank` of a job of `WORLD` ranks (the events copied
    shallowly, only their ``ts`` changed; one-shot `json.dumps`, the C encoder)."""
    source = _source(rank % 2)
    rng = random.Random(rank)
    info = {**source["distributedInfo"], "rank": rank, "world_size": WORLD}
    info["pg_config"] = [
        {**group, "pg_size": WORLD, "ranks": list(range(WORLD))}
        for group in info.get("pg_config", [])
    ]
    events = source["traceEvents"]
    steps = sorted(e["ts"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    offset = rng.uniform(0, 2e6)  # µs
    delays, total = [0.0], 0.0
    for _ in steps:
        total += rng.uniform(0, 2e4)
        delays.append(total)
    trace = {
        **source,
        "distributedInfo": info,
        "traceEvents": [
            {**e, "ts": e["ts"] + offset + delays[bisect_right(steps, e["ts"])]}
            if "ts" in e and e.get("ph") != "M"
            else e
            for e in events
        ],
    }
    part = folder / f".rank{rank}.json.gz.part"
    part.write_bytes(gzip.compress(json.dumps(trace).encode(), compresslevel=1))
    part.replace(folder / f"rank{rank}.json.gz")


@cache
def _source(rank: int) -> dict[str, Any]:
    """A real rank's trace, parsed once per process."""
    return json.loads(gzip.decompress((SOURCE / f"rank{rank}.json.gz").read_bytes()))


def largest_rank_mib(folder: Path) -> float:
    """The largest rank file of `folder` inflated (MiB of JSON text)."""
    biggest = max(folder.glob("rank*.json.gz"), key=lambda p: p.stat().st_size)
    return len(gzip.decompress(biggest.read_bytes())) / 2**20


def run(mode: str, folder: Path, command: str, code: Path = HERE.parent) -> dict[str, Any]:
    """One configuration as a whole process: wall seconds and its figures. `code`: the
    checkout whose `planner` package runs (the process starts in it, so that its
    package comes first on the path)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(folder), command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=code,
    )
    peak, done_sampling = [0.0], threading.Event()
    sampler = threading.Thread(target=_sample_job, args=(process.pid, peak, done_sampling))
    sampler.start()
    stdout, stderr = process.communicate()
    seconds = time.perf_counter() - t0
    done_sampling.set()
    sampler.join()
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{mode} on {folder}: {done.stderr.strip().splitlines()[-1]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {"seconds": seconds, "cpu": cpu, "job_mib": peak[0], **figures}


def _sample_job(pid: int, peak: list[float], done: threading.Event) -> None:
    """`peak[0]`: the largest sum of the proportional set sizes (MiB) of `pid` and its
    descendants, sampled every 100 ms until `done`."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not done.wait(0.1):
        total = 0
        try:
            family = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in family:
            try:
                total += process.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        peak[0] = max(peak[0], total / 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=[*MODES, HTA, CLI])
    parser.add_argument(
        "--command", choices=["metrics", "schedule", "simulate", "analyze"], default="metrics"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of other code (git worktree add DIR main): each mode also runs on "
        "its planner package, interleaved, as '<mode> @base'",
    )
    args = parser.parse_args()
    if CLI in args.modes and args.command != "analyze":
        parser.error(f"--modes '{CLI}' needs --command analyze")
    print(
        f"planner {args.command}{' -a caramel' if args.command == 'schedule' else ''}"
        f"{' (Caramel plan, 100 samples)' if args.command in ('simulate', 'analyze') else ''}; "
        f"source: {SOURCE} (2 real ranks), copies jittered; medians of {args.repeat} runs"
    )
    print(
        f"{'ranks':>6} {'mode':<21} {'total s':>8} {'s/rank':>7} {'CPU s':>7} "
        f"{'parent MiB':>10} "
        f"{'worker MiB':>10} {'x file':>6} {'job MiB':>7} {'procs':>5}  same document"
    )
    for code in {HERE.parent, args.baseline or HERE.parent}:
        for package in ("planner", "cli"):
            compileall.compile_dir(code / package, quiet=1)
    for size in args.sizes:
        folder = build(size)
        file_mib = largest_rank_mib(folder)
        codes = {m: HERE.parent for m in args.modes}
        if args.baseline is not None:
            codes.update({f"{m} {BASE}": args.baseline for m in args.modes if m != HTA})
        got: dict[str, list[dict[str, Any]]] = {m: [] for m in codes}
        for _ in range(args.repeat):
            for mode, code in codes.items():  # interleaved: each round runs every mode once
                got[mode].append(run(mode.removesuffix(f" {BASE}"), folder, args.command, code))
        shas = {r["sha"] for runs in got.values() for r in runs if r["sha"] is not None}
        for mode, runs in got.items():
            total = statistics.median(r["seconds"] for r in runs)
            cpu = statistics.median(r["cpu"] for r in runs)
            parent = statistics.median(r["parent_mib"] for r in runs)
            worker = statistics.median(r["worker_mib"] for r in runs)
            job = statistics.median(r["job_mib"] for r in runs)
            same = "-" if runs[0]["sha"] is None else "yes" if len(shas) == 1 else "NO"
            print(
                f"{size:>6} {mode:<21} {total:>8.2f} {total / size:>7.3f} {cpu:>7.2f} "
                f"{parent:>10.0f} {worker:>10.0f} {worker / file_mib:>6.1f} {job:>7.0f} "
                f"{runs[0]['workers']:>5}  {same}"
            )
        digest = hashlib.sha256("".join(sorted(shas)).encode()).hexdigest()[:12]
        print(f"{size:>6} documents: {len(shas)} distinct ({digest})")
        print(f"{size:>6} largest rank file: {file_mib:.1f} MiB of JSON")


if __name__ == "__main__":
    main()
