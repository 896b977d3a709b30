"""Load time and peak memory of the Kineto ingest vs Holistic Trace Analysis's loader.

Data sets: the 8-rank DLRM set under ../shared/traces and the large trace that
``bench/make_large_trace.py`` profiles (a 2-rank gloo DDP run, many steps; git-ignored
under bench/_data). Give directories to bench others.

Method, the same for both loaders: every measurement is a fresh subprocess that
imports its loader, then loads the directory once. Runs alternate between the two
loaders (machine noise hits both alike); time is the best of REPEAT runs.
Peak memory is measured two ways: ``rss`` = growth of the process's maximum resident
set during the load (ru_maxrss; what the OS sees, allocator slack included), and
``traced`` = tracemalloc's peak during the load in a separate run (Python and numpy
allocations only, no allocator noise). Both include what the loader returns.
HTA is bench-only: ``pip install holistictraceanalysis``; it runs with
``use_multiprocessing=False`` (one process, like ours).

Usage: python bench/bench_ingest_torch.py [--repeat N] [DIR ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DLRM = (
    HERE.parents[1]
    / "shared/traces/public/param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"
)
LARGE = HERE / "_data" / "ddp_large"

CHILD = r"""
import json, resource, sys, time, tracemalloc
which, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if which == "planner":
    from pathlib import Path
    from planner.ingest.kineto import load_kineto
    load = lambda: load_kineto([Path(path)])
else:
    import logging
    logging.disable(logging.CRITICAL)
    from hta.common.trace import Trace
    def load():
        t = Trace(trace_dir=path)
        t.parse_traces(use_multiprocessing=False)
        return t
if mode == "traced":
    tracemalloc.start()
    result = load()
    print(json.dumps({"traced_mib": tracemalloc.get_traced_memory()[1] / 2**20}))
else:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    result = load()
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"seconds": elapsed, "rss_mib": peak / 1024}))
"""

LOADERS = ("planner", "HTA")


def _child(which: str, path: Path, mode: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, which.lower(), str(path), mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(path: Path, repeat: int) -> dict[str, dict[str, float] | str]:
    """Per loader: best seconds and smallest rss over `repeat` alternating runs, + traced."""
    runs: dict[str, list[dict[str, float]]] = {w: [] for w in LOADERS}
    failed: dict[str, str] = {}
    for _ in range(repeat):
        for which in LOADERS:
            if which in failed:
                continue
            try:
                runs[which].append(_child(which, path, "timed"))
            except subprocess.CalledProcessError as exc:
                failed[which] = (exc.stderr.strip().splitlines() or ["?"])[-1]
    result: dict[str, dict[str, float] | str] = dict(failed)
    for which, items in runs.items():
        if which in failed or not items:
            continue
        traced = _child(which, path, "traced")["traced_mib"]
        result[which] = {
            "seconds": min(r["seconds"] for r in items),
            "rss_mib": min(r["rss_mib"] for r in items),
            "traced_mib": traced,
        }
    return result


def report(path: Path, repeat: int) -> None:
    files = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
    size = sum(p.stat().st_size for p in files) / 2**20
    print(f"\n{path}: {len(files)} files, {size:.1f} MiB on disk")
    res = measure(path, repeat)
    print(f"{'loader':<10} {'seconds':>9} {'rss MiB':>9} {'traced MiB':>11}")
    for which in LOADERS:
        r = res.get(which)
        if isinstance(r, dict):
            line = f"{r['seconds']:>9.3f} {r['rss_mib']:>9.1f} {r['traced_mib']:>11.1f}"
            print(f"{which:<10} {line}")
        else:
            print(f"{which:<10} failed: {r}")
    ours, hta = res.get("planner"), res.get("HTA")
    if isinstance(ours, dict) and isinstance(hta, dict):
        print(
            f"speed-up x{hta['seconds'] / ours['seconds']:.2f} (target >= 3); memory ratio "
            f"rss {ours['rss_mib'] / max(hta['rss_mib'], 1e-9):.2f}, "
            f"traced {ours['traced_mib'] / max(hta['traced_mib'], 1e-9):.2f} (target <= 0.33)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="default: DLRM set + large trace")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dirs = args.dirs or [DLRM, LARGE]
    for path in dirs:
        if not path.is_dir():
            hint = " (run bench/make_large_trace.py)" if path == LARGE else ""
            print(f"\n{path}: missing{hint}")
            continue
        report(path, args.repeat)


if __name__ == "__main__":
    main()
