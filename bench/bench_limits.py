"""Whole-process time and peak memory of the input limits (issue 17, point 2).

    nice python bench/bench_limits.py [--repeat 3]

Each figure is the median of `--repeat` runs of the `planner` CLI in a fresh process,
interleaved with a baseline run (`planner inspect traces/demo`: start-up and imports)
in the same loop, and its peak RSS (`wait4`):

- a 300,000-node GraphDef chain, `inspect` (target: < 10 s, < 1 GB);
- the same chain, `simulate` (must refuse, no timings, before any heavy work);
- a 21 MB gzip that inflates to 21 GiB (Kineto-shaped), `inspect` at the default limits:
  refused at the 8 GiB limit with memory bounded by the streaming piece;
- a Kineto file whose one event holds a 48 MiB string (an unsplittable stretch): read
  in linear time (the pending buffer is re-parsed only when it has doubled).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_SCRIPT = """
import re, sys
from pathlib import Path
from planner_cli.main import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
status = Path("/proc/self/status").read_text()
print("PEAK", re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1), file=sys.stderr)
sys.exit(code)
"""
CLI = [sys.executable, "-c", _SCRIPT]
"""The CLI in a fresh process that reports its own peak RSS (VmHWM: ru_maxrss would count
the parent's memory, inherited through the fork before exec)."""


def chain_graphdef(path: Path, nodes: int = 300_000) -> Path:
    """A GraphDef of `nodes` Identity ops in one chain on one worker."""
    from planner.ingest.proto import tf_subset_pb2 as tfpb

    graph = tfpb.GraphDef()
    device = "/job:worker/replica:0/task:0/device:CPU:0"
    for i in range(nodes):
        node = graph.node.add(name=f"n{i}", op="Identity", device=device)
        if i:
            node.input.append(f"n{i - 1}")
    path.write_bytes(graph.SerializeToString())
    return path


def bomb(path: Path, gib: int = 21) -> Path:
    """A Kineto-shaped gzip: the header, then `gib` GiB of spaces (members concatenated)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (1 << 20)
    member = b"".join(packer.compress(block) for _ in range(1024)) + packer.flush()
    head = gzip.compress(b'{"schemaVersion": 1, "traceEvents": [', mtime=0)
    with path.open("wb") as handle:
        handle.write(head)
        for _ in range(gib):
            handle.write(member)
    return path


def long_event(path: Path, mib: int = 48) -> Path:
    """The repo's HTA trace with one event whose args hold a `mib` MiB string."""
    doc = json.loads(gzip.decompress((REPO / "traces/torch/hta_trace_compare_base.json.gz")
                                     .read_bytes()))  # fmt: skip
    event = next(e for e in doc["traceEvents"] if e.get("ph") == "X")
    event.setdefault("args", {})["note"] = "x" * (mib << 20)
    path.write_text(json.dumps(doc))
    return path


def run(args: list[str]) -> tuple[float, float, int, str]:
    """(seconds, peak RSS MiB, exit status, last stderr line) of one CLI process."""
    start = time.perf_counter()
    done = subprocess.run([*CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    err = done.stderr.decode(errors="replace")
    peak = re.search(r"PEAK (\d+)", err)
    lines = [line for line in err.strip().splitlines() if not line.startswith("PEAK ")]
    last = lines[-1] if lines else ""
    return seconds, int(peak.group(1)) / 1024 if peak else float("nan"), done.returncode, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="planner-bench-limits-"))
    cases = {
        "GraphDef chain 300k nodes, inspect": ["inspect", str(chain_graphdef(work / "chain.pb"))],
        "GraphDef chain 300k nodes, simulate": ["simulate", str(work / "chain.pb")],
        "gzip bomb 21 MB -> 21 GiB, inspect": ["inspect", str(bomb(work / "rank0.json.gz"))],
        "Kineto event of 48 MiB, inspect": ["inspect", str(long_event(work / "rank0.json"))],
    }
    baseline_args = ["inspect", str(REPO / "traces" / "demo")]
    sizes = {name: Path(a[1]).stat().st_size for name, a in cases.items()}
    results: dict[str, list[tuple[float, float, int, str]]] = {n: [] for n in cases}
    baseline: list[tuple[float, float, int, str]] = []
    for _ in range(args.repeat):
        for name, argv in cases.items():
            baseline.append(run(baseline_args))
            results[name].append(run(argv))
    base_s = statistics.median(r[0] for r in baseline)
    base_mib = statistics.median(r[1] for r in baseline)
    print(f"baseline (inspect traces/demo): median {base_s:.2f} s, peak {base_mib:.0f} MiB")
    for name, rows in results.items():
        seconds = statistics.median(r[0] for r in rows)
        peak = max(r[1] for r in rows)
        print(
            f"{name}: median {seconds:.2f} s (baseline {base_s:.2f} s), peak {peak:.0f} MiB, "
            f"input {sizes[name] / 1e6:.1f} MB, exit {rows[-1][2]}"
        )
        if rows[-1][3]:
            print(f"    {rows[-1][3][:160]}")
    for path in work.iterdir():
        path.unlink()
    work.rmdir()


if __name__ == "__main__":
    main()
