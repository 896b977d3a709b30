"""Op identity across steps: time and peak memory of `aligned_occurrence` on large lanes.

Each case is one lane of S steps of N ops over 40 op names; all steps but the reference
differ from it by a few calls (one inserted near the start, one deleted in the middle,
one inserted near the end: the differences an edit alignment must carry across the whole
lane). The baseline, run beside it in the same process, is counting occurrences
(`cumcount`, what the ingest did before the alignment). Peak memory is tracemalloc's
peak over the call (numpy and Python allocations); rapidfuzz's C++ buffers are not seen
there, so the growth of the resident set over the call is printed too (a fresh child
sampling /proc/self/statm every millisecond). Medians of REPEAT interleaved runs.

Usage: python bench/bench_identity.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.ingest.kineto_identity import aligned_occurrence  # noqa: E402
from planner.ingest.kineto_steps import cumcount  # noqa: E402

CASES = [(1_000, 40), (10_000, 20), (100_000, 4), (200_000, 3)]  # (ops per step, steps)

CHILD = r"""
import os, sys, threading, time, numpy as np
sys.path.insert(0, sys.argv[1])
from bench_identity import lane
from planner.ingest.kineto_identity import aligned_occurrence
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
step, name = lane(int(sys.argv[2]), int(sys.argv[3]))
base, peak, done = rss(), [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.001)
watcher = threading.Thread(target=sample)
watcher.start()
aligned_occurrence(step, np.zeros(len(step), dtype=np.int64), name)
done.set()
watcher.join()
print(max(0, max(peak[0], rss()) - base) / 2**20)
"""


def lane(n: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(step, name code) of one lane: the reference twice, then steps that differ."""
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 40, n)
    seqs = [ref, ref]
    for _ in range(steps - 2):
        seq = np.insert(ref, 3, 41)
        seq = np.delete(seq, n // 2)
        seqs.append(np.insert(seq, len(seq) - 3, 42))
    step = np.concatenate([np.full(len(s), i) for i, s in enumerate(seqs)]).astype(np.int64)
    return step, np.concatenate(seqs).astype(np.int64)


def _timed(fn, *args) -> tuple[float, float]:
    """(seconds, tracemalloc peak MB) of one call."""
    tracemalloc.start()
    t = time.perf_counter()
    fn(*args)
    took = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return took, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'ops/step':>9} {'steps':>5} {'aligned s':>10} {'count s':>8} {'ratio':>6} "
          f"{'ops/s':>11} {'peak MB':>8} {'RSS MB':>7}")  # fmt: skip
    for n, steps in CASES:
        step, name = lane(n, steps)
        lanes = np.zeros(len(step), dtype=np.int64)
        aligned, counted, peaks = [], [], []
        for _ in range(args.repeat):
            t, peak = _timed(aligned_occurrence, step, lanes, name)
            aligned.append(t)
            peaks.append(peak)
            counted.append(_timed(cumcount, step, lanes, name)[0])
        rss = subprocess.run(
            [sys.executable, "-c", CHILD, str(Path(__file__).parent), str(n), str(steps)],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout.strip()  # fmt: skip
        a, c = statistics.median(aligned), statistics.median(counted)
        print(f"{n:>9} {steps:>5} {a:>10.3f} {c:>8.4f} {a / c:>6.0f} {len(step) / a:>11,.0f} "
              f"{statistics.median(peaks):>8.1f} {float(rss):>7.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
