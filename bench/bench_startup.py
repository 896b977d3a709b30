"""What a user feels: whole `planner` processes, start-up included, against HTA.

    nice python bench/bench_startup.py [--repeats 7]

Every figure is a median over `--repeats` fresh interpreters, and the processes that are
compared run interleaved (A, B, A, B, ...) so that load on the machine hits both alike.
Peak memory is each child's own peak RSS (``wait4``), not this process's.

1. Start-up: `planner --version`, `planner --help` (target < 0.3 s), and the fixed cost of a
   command (`planner inspect` of a 1.6 KB trace, and `planner metrics` of the 5-step TF
   demo: the imports its input needs, and no more; target < 0.5 s and < 80 MiB).
2. Ingest against HTA, process against process: `planner inspect DIR --json` vs a process
   that runs HTA's `TraceAnalysis(trace_dir=DIR)` (its ingest: parse, align, index every
   rank), on the 8-rank DLRM set and the 2-rank DDP set (targets: planner >= 3x faster, at
   <= 1/3 of HTA's peak RSS). Beside them, the in-process time of each (imports done), the
   same work without the interpreter start and the imports.

HTA is `pip install holistictraceanalysis`; without it, or without ../shared, those rows
are skipped with the reason. The children run without PYTHONDONTWRITEBYTECODE, so that the
warm-up leaves the planner's compiled modules (.pyc) as any install has them (pip compiles
HTA's at install; an editable planner under that variable would recompile every module
in every process, which no user's run does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
DLRM = SHARED / "public/param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"
DDP = ROOT / "traces" / "torch" / "resnet_ddp"
TINY = ROOT / "traces" / "torch" / "hta_trace_compare_base.json.gz"
DEMO = ROOT / "traces" / "demo"
PLANNER = [str(Path(sys.executable).parent / "planner")]  # the console script users run
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

HTA_PROCESS = """
import resource, sys, time
start = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
imported = time.perf_counter()
TraceAnalysis(trace_dir=sys.argv[1])
done = time.perf_counter()
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"INPROC {done - imported:.6f} IMPORTS {imported - start:.6f} WORKERS {workers:.1f}")
"""

PLANNER_PROCESS = """
import sys, time
start = time.perf_counter()
from planner.measure import inspection
from planner.ingest import detect
imported = time.perf_counter()
inspection.inspect(detect.load([sys.argv[1]]))
done = time.perf_counter()
print(f"INPROC {done - imported:.6f} IMPORTS {imported - start:.6f}")
"""


def run(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one child process."""
    start = time.perf_counter()
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, text=True, env=ENV
    )
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} exited {child.returncode}")
    return wall, usage.ru_maxrss / 1024, out


def interleaved(cases: dict[str, list[str]], repeats: int) -> dict[str, dict[str, float]]:
    """Median wall time, RSS and in-process time of each case, runs interleaved."""
    samples: dict[str, list[tuple[float, float, str]]] = {name: [] for name in cases}
    for argv in cases.values():  # one warm-up each: page cache, .pyc, numba cache
        run(argv)
    for _ in range(repeats):
        for name, argv in cases.items():
            samples[name].append(run(argv))
    result = {}
    for name, runs in samples.items():
        inproc = [float(o.split()[1]) for _, _, o in runs if o.startswith("INPROC")]
        imports = [float(o.split()[3]) for _, _, o in runs if o.startswith("INPROC")]
        workers = [float(o.split()[5]) for _, _, o in runs if o.startswith("INPROC") and
                   len(o.split()) > 5]  # fmt: skip
        result[name] = {
            "wall": statistics.median(w for w, _, _ in runs),
            "rss": statistics.median(r for _, r, _ in runs),
            "inproc": statistics.median(inproc) if inproc else float("nan"),
            "imports": statistics.median(imports) if imports else float("nan"),
            "workers": statistics.median(workers) if workers else 0.0,
        }
    return result


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def startup(repeats: int) -> None:
    cases = {
        "planner --version": [*PLANNER, "--version"],
        "planner --help": [*PLANNER, "--help"],
        "planner inspect --help": [*PLANNER, "inspect", "--help"],
        "planner inspect (1.6 KB trace)": [*PLANNER, "inspect", str(TINY), "--json"],
        "planner metrics (TF demo)": [*PLANNER, "metrics", str(DEMO), "--json"],
        "python -c pass (interpreter)": [sys.executable, "-c", "pass"],
    }
    figures = interleaved(cases, repeats)
    print(f"start-up, median of {repeats} fresh processes (interleaved):")
    for name, f in figures.items():
        target = ""
        if "--" in name:
            target = f"  target < 0.3 s: {verdict(f['wall'] < 0.3)}"
        elif name.startswith("planner inspect"):
            ok = f["wall"] < 0.5 and f["rss"] < 80
            target = f"  fixed cost target < 0.5 s, < 80 MiB: {verdict(ok)}"
        print(f"  {name:<32} {f['wall']:6.3f} s  peak RSS {f['rss']:6.1f} MiB{target}")


def hta_available() -> str | None:
    """None when HTA can be run, else why not."""
    done = subprocess.run(
        [sys.executable, "-c", "import hta.trace_analysis"], capture_output=True, text=True
    )
    return (
        None if done.returncode == 0 else "HTA is not installed (pip install holistictraceanalysis)"
    )


def against_hta(repeats: int) -> None:
    why = hta_available()
    if why:
        print(f"ingest vs HTA: skipped, {why}")
        return
    sets = {"DLRM, 8 ranks (V100, NCCL)": DLRM, "resnet DDP, 2 ranks (gloo)": DDP}
    for label, folder in sets.items():
        if not folder.is_dir():
            print(f"ingest vs HTA on {label}: skipped, {folder} is not present")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            # HTA reads every JSON of the folder as a rank: give it the profiler traces only
            ranks = [p for p in sorted(folder.iterdir()) if not p.name.startswith(("et_", "meta"))]
            ranks = [p for p in ranks if p.name.endswith((".json", ".json.gz"))]
            ranks = [p for p in ranks if p.name != "summary.json"]
            for p in ranks:
                (Path(tmp) / p.name).symlink_to(p)
            cases = {
                "planner inspect (process)": [*PLANNER, "inspect", tmp, "--json"],
                "HTA TraceAnalysis (process)": [sys.executable, "-c", HTA_PROCESS, tmp],
                "planner load+inspect (in-process)": [sys.executable, "-c", PLANNER_PROCESS, tmp],
            }
            figures = interleaved(cases, repeats)
        ours = figures["planner inspect (process)"]
        hta = figures["HTA TraceAnalysis (process)"]
        inproc = figures["planner load+inspect (in-process)"]
        print(f"ingest vs HTA on {label} ({len(ranks)} files), median of {repeats}, interleaved:")
        print(f"  planner inspect       {ours['wall']:6.3f} s  peak RSS {ours['rss']:6.1f} MiB")
        print(
            f"  HTA TraceAnalysis()   {hta['wall']:6.3f} s  peak RSS {hta['rss']:6.1f} MiB "
            f"(its largest worker process: {hta['workers']:.1f} MiB, not added)"
        )
        speed = hta["wall"] / ours["wall"]
        memory = ours["rss"] / hta["rss"]
        print(
            f"  process vs process: planner {speed:.1f}x faster (target >= 3x: "
            f"{verdict(speed >= 3)}), at {memory:.2f} of HTA's peak RSS (target <= 1/3: "
            f"{verdict(memory <= 1 / 3)})"
        )
        print(
            f"  in-process (imports done): planner {inproc['inproc']:.3f} s "
            f"(imports {inproc['imports']:.3f} s), HTA {hta['inproc']:.3f} s "
            f"(imports {hta['imports']:.3f} s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-hta", action="store_true")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    startup(args.repeats)
    if not args.skip_hta:
        against_hta(args.repeats)


if __name__ == "__main__":
    main()
