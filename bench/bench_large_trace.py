"""Load time and peak memory of the Kineto ingest on multi-GB traces (linear? < 1x size?).

Source: the real long profiling run of ``bench/make_large_trace.py`` (a 2-rank gloo DDP
job, 200 profiled steps per rank; run it first, or this script does). Its rank-0 trace
is tiled into larger ones: the real events repeated back to back, each copy shifted by
the run's span and its ``ProfilerStep#N`` renumbered, streamed to an uncompressed
``.pt.trace.json`` under bench/_data/large (git-ignored). Each size is loaded in a fresh
subprocess (``load_kineto``); peak memory = the growth of the child's resident set over
the load (sampled every 5 ms from /proc/self/statm, so an import-time peak does not hide
it; what the loader returns is included), and its ratio to the file size.

Usage: python bench/bench_large_trace.py [--sizes-gb 0.25,0.5,1,2] [--keep]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_data" / "ddp_large"
OUT = HERE / "_data" / "large"

CHILD = r"""
import json, os, sys, threading, time
from pathlib import Path
from planner.ingest.kineto import load_kineto

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

base = peak = rss()
done = False
def sample():
    global peak
    while not done:
        peak = max(peak, rss())
        time.sleep(0.005)
thread = threading.Thread(target=sample, daemon=True)
thread.start()
t0 = time.perf_counter()
job = load_kineto([Path(sys.argv[1])])
seconds = time.perf_counter() - t0
done = True
thread.join()
peak = max(peak, rss())
steps = int(job.trace.spans.shape[0])
print(json.dumps({"seconds": seconds, "peak_bytes": peak - base, "steps": steps}))
"""


def source_trace() -> Path:
    """The real long run's rank-0 trace, profiled now if it is not there yet."""
    found = sorted(SOURCE.glob("rank0.*.pt.trace.json.gz"))
    if not found:
        subprocess.run([sys.executable, str(HERE / "make_large_trace.py")], check=True)
        found = sorted(SOURCE.glob("rank0.*.pt.trace.json.gz"))
    return found[0]


def tile(source: Path, target: Path, size: int) -> int:
    """Write copies of the source's events (shifted, steps renumbered) until `size` bytes."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    first = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - first + 1000.0
    steps = [
        int(e["name"].split("#")[1])
        for e in events
        if e.get("name", "").startswith("ProfilerStep#")
    ]
    step_span = max(steps) - min(steps) + 1
    head = json.dumps(doc)[:-1] + ', "traceEvents": [\n'
    written = 0
    with target.open("w") as out:
        out.write(head)
        copy = 0
        while written < size:
            parts = []
            for event in events:
                e = dict(event)
                if copy and "ts" in e and isinstance(e["ts"], (int, float)):
                    e["ts"] = round(e["ts"] + copy * span, 3)
                name = e.get("name", "")
                if copy and isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + copy * step_span}"
                parts.append(json.dumps(e))
            text = ("" if copy == 0 else ",\n") + ",\n".join(parts)
            out.write(text)
            written += len(text)
            copy += 1
        out.write("\n]}\n")
    return target.stat().st_size


def measure(path: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-gb", default="0.25,0.5,1,2")
    parser.add_argument("--keep", action="store_true", help="keep the generated traces")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    source = source_trace()
    print(f"source: {source.relative_to(HERE.parent)} (real 2-rank DDP run, rank 0)")
    print(f"{'size':>9} {'load s':>8} {'s/GB':>6} {'peak MiB':>9} {'peak/size':>9} {'steps':>6}")
    for gb in (float(x) for x in args.sizes_gb.split(",")):
        target = OUT / f"rank0.tiled-{gb:g}GB.pt.trace.json"
        size = tile(source, target, int(gb * 2**30))
        try:
            got = measure(target)
        finally:
            if not args.keep:
                target.unlink()
        print(
            f"{size / 2**30:7.2f}GB {got['seconds']:8.1f} {got['seconds'] / (size / 2**30):6.1f} "
            f"{got['peak_bytes'] / 2**20:9.0f} {got['peak_bytes'] / size:9.2f} {got['steps']:6d}",
            flush=True,
        )


if __name__ == "__main__":
    main()
