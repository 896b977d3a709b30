"""The network model fitted on a trace's transfer parts against a fresh benchmark.

A CPU DDP job whose buckets come in four sizes is traced (`bench/ddp_layers_job.py`:
16, 8, 2 and 0.5 MiB, gloo, 2 ranks on 127.0.0.1), and `planner bench-network` times
gloo all-reduce at exactly those sizes, once before the job and once after (a whole
`planner` process each, as a user runs it), so that the benchmark brackets the job in
time. The trace fit (`trace_network_model`: each size's fastest transfer part, shared
out among the all-reduces in flight with it) is held against the range both runs span:
from the fit of their fastest repeats to the fit of their median repeats.

Printed per round: each size's trace fit, that range, and trace fit / benchmark fastest;
then, over the rounds, each size's median ratio and in how many rounds the trace fit
lay within 20% of the range (at least 0.8x the fastest fit, at most 1.2x the median
fit).

Why a benchmark and not a test: on this 2-core VM the same all-reduce runs up to 2x
slower a minute later (16 MiB: fastest repeat 7.8 ms in one round, 15.9 ms in the next),
so one comparison is a draw; as a unit test it failed about one run in ten, with the
trace fit's 0.5 MiB point 0.3-0.4 ms against a fastest benchmark of 0.46-0.63 ms (the
line through four sizes is set by the 8-16 MiB transfers there).

Run: ``nice python bench/bench_network_agreement.py [--rounds 3]`` from the repo root
(needs torch). Exit status 1 when some size lies outside the band in half the rounds
or more.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddp_layers_job import WIDTHS  # noqa: E402  (beside this file)

from planner.ingest.kineto import load_kineto  # noqa: E402
from planner.model.oracle import NetworkModel, fit_network_model  # noqa: E402
from planner.planning.caramel import network_problem, trace_network_model  # noqa: E402

JOB = Path(__file__).with_name("ddp_layers_job.py")
SIZES = sorted((a * b + b) * 4 for a, b in zip(WIDTHS, WIDTHS[1:], strict=False))
TOLERANCE = 0.20
CLI = "import sys; from planner_cli.main import main; sys.argv[0] = 'planner'; main()"


def bench_fits(out: Path, repeats: int) -> dict[str, NetworkModel]:
    """`planner bench-network` at `SIZES` in a process of its own: the fits of its
    fastest and of its median repeats."""
    argv = [sys.executable, "-c", CLI, "bench-network", "--sizes", ",".join(map(str, SIZES)),
            "--repeats", str(repeats), "-o", str(out)]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, timeout=600)
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    nbytes = np.array([float(r["nbytes"]) for r in rows])
    fits = {c: fit_network_model(nbytes, np.array([float(r[c]) for r in rows])) for c in
            ("seconds_min", "seconds")}  # fmt: skip
    return {c: f for c, f in fits.items() if f is not None}


def one_round(work: Path, repeats: int) -> tuple[NetworkModel, list[tuple[float, float]]] | str:
    """(the trace fit, per size the benchmark's (fastest, median) range) or why not."""
    before = bench_fits(work / "before.csv", repeats)
    subprocess.run([sys.executable, str(JOB), str(work)], check=True, capture_output=True,
                   timeout=600)  # fmt: skip
    after = bench_fits(work / "after.csv", repeats)
    job = load_kineto([work / "rank0.json", work / "rank1.json"])
    graph = job.graphs["rank0"]
    sizes = sorted({graph.ops[n].nbytes for n in graph.transfers if graph.ops[n].nbytes > 0})
    if sizes != SIZES:
        return f"the job's buckets are {sizes}, not the sizes benchmarked"
    fit = trace_network_model(graph, job.trace.timings)
    if fit is None or network_problem(fit) is not None:
        return f"trace fit: {network_problem(fit)}"
    ranges = [
        (min(b["seconds_min"].time(n) for b in (before, after)),
         max(b["seconds"].time(n) for b in (before, after)))
        for n in SIZES
    ]  # fmt: skip
    return fit, ranges


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15, help="bench-network repeats")
    args = parser.parse_args()
    ratios: list[list[float]] = []
    inside: list[list[bool]] = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            got = one_round(Path(tmp), args.repeats)
        if isinstance(got, str):
            print(f"round {r + 1}: {got}")
            continue
        fit, ranges = got
        print(f"round {r + 1}: trace fit a = {fit.a * 1e6:.0f} us, b = {fit.b * 1e9:.3f} ns/B, "
              f"R² {fit.r2:.3f}")  # fmt: skip
        row_ratio, row_in = [], []
        for n, (low, high) in zip(SIZES, ranges, strict=True):
            t = fit.time(n)
            ok = (1 - TOLERANCE) * low <= t <= (1 + TOLERANCE) * high
            row_ratio.append(t / low)
            row_in.append(ok)
            print(f"  {n:>9} B: trace fit {t * 1e3:7.3f} ms, bench {low * 1e3:7.3f}.."
                  f"{high * 1e3:7.3f} ms, trace / bench fastest {t / low:5.2f}"
                  f"{'' if ok else '  (outside the band)'}")  # fmt: skip
        ratios.append(row_ratio)
        inside.append(row_in)
    if not ratios:
        print("no round gave a trace fit to compare")
        return 1
    table, agree = np.array(ratios), np.array(inside)
    print(
        f"\nover {len(ratios)} round(s), per size: trace fit / benchmark fastest fit "
        "(median), and the rounds within the band"
    )
    ok = True
    for j, n in enumerate(SIZES):
        median = float(np.median(table[:, j]))
        print(f"  {n:>9} B: {median:5.2f}, within the band in {int(agree[:, j].sum())} of "
              f"{len(agree)} rounds")  # fmt: skip
        ok &= bool(agree[:, j].sum() * 2 > len(agree))
    print("agree" if ok else "disagree: some size lies outside the band in most rounds")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
