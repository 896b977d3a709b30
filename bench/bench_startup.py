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

3. The answer (issue 46, point 8): `planner analyze` of the demo and of the 2-rank DDP job
   `traces/torch/resnet_ddp`, as `--json` and as `-o DIR` (the HTML report too): wall
   time, CPU time (user + sys of the process and every process it waited for) and peak
   RSS (its largest process); target: the whole process under 1.0 s. With
   `--baseline PYTHONPATH`, the same commands of another checkout (its `planner` and
   `planner_cli` on that path) run interleaved with them, for a before/after table.
4. Against HTA on every single-rank trace of ../shared/traces/public/external (a folder
   holding one Kineto trace; the others are listed with why not): `planner analyze
   FOLDER --json` vs a process that runs HTA's `TraceAnalysis(trace_dir=...)` and
   `get_temporal_breakdown()`; targets: planner faster, at no more peak RSS.

    nice python bench/bench_startup.py --only analyze external [--baseline DIR/.pp:DIR]

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
EXTERNAL = SHARED / "public" / "external"
PLANNER = [str(Path(sys.executable).parent / "planner")]  # the console script users run
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
BASELINE = "baseline: "
"""A case whose name starts so runs with `--baseline`'s PYTHONPATH (`run`)."""

HTA_BREAKDOWN = """
import contextlib, io, logging, sys, warnings
logging.disable(logging.CRITICAL)
warnings.filterwarnings("ignore")
from hta.common import trace as hta_trace
from hta.trace_analysis import TraceAnalysis
original = hta_trace.transform_correlation_to_index
def widened(df, symbol_table):  # bench_vs_hta.widen_hta_correlation: HTA 0.5 under pandas 3
    if "correlation" in df.columns:
        df["correlation"] = df["correlation"].astype("int64")
    return original(df, symbol_table)
hta_trace.transform_correlation_to_index = widened
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    breakdown = TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
print(len(breakdown))
"""

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


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str, float]:
    """(wall seconds, peak RSS MiB, stdout, CPU seconds) of one child process: its RSS is
    that of its largest process, its CPU time that of it and every process it waited for."""
    start = time.perf_counter()
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, text=True,
        env=env or ENV,
    )  # fmt: skip
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} exited {child.returncode}")
    return wall, usage.ru_maxrss / 1024, out, usage.ru_utime + usage.ru_stime


def interleaved(
    cases: dict[str, list[str]], repeats: int, baseline: str | None = None
) -> dict[str, dict[str, float]]:
    """Median wall time, RSS, CPU and in-process time of each case, runs interleaved; a
    case named ``BASELINE ...`` runs with PYTHONPATH `baseline`."""
    samples: dict[str, list[tuple[float, float, str, float]]] = {name: [] for name in cases}
    envs = {
        name: {**ENV, "PYTHONPATH": baseline} if baseline and name.startswith(BASELINE) else ENV
        for name in cases
    }
    for name, argv in cases.items():  # one warm-up each: page cache, .pyc, numba cache
        run(argv, envs[name])
    for _ in range(repeats):
        for name, argv in cases.items():
            samples[name].append(run(argv, envs[name]))
    result = {}
    for name, runs in samples.items():
        inproc = [float(o.split()[1]) for _, _, o, _ in runs if o.startswith("INPROC")]
        imports = [float(o.split()[3]) for _, _, o, _ in runs if o.startswith("INPROC")]
        workers = [float(o.split()[5]) for _, _, o, _ in runs if o.startswith("INPROC") and
                   len(o.split()) > 5]  # fmt: skip
        result[name] = {
            "wall": statistics.median(w for w, _, _, _ in runs),
            "rss": statistics.median(r for _, r, _, _ in runs),
            "cpu": statistics.median(c for _, _, _, c in runs),
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


def figures(f: dict[str, float]) -> str:
    return f"{f['wall']:6.3f} s wall {f['cpu']:6.3f} s CPU {f['rss']:6.1f} MiB"


def the_answer(repeats: int, baseline: str | None) -> None:
    """`planner analyze` of the demo and of a 2-rank DDP job, --json and -o DIR."""
    with tempfile.TemporaryDirectory() as tmp:
        cases = {}
        for job, paths in (("demo", []), ("resnet_ddp", [str(DDP)])):
            outputs = (("--json", ["--json"]), ("-o DIR", ["-o", f"{tmp}/{job}", "--force"]))
            for mode, extra in outputs:
                argv = [*PLANNER, "analyze", *paths, *extra]
                cases[f"{job} {mode}"] = argv
                if baseline:
                    cases[f"{BASELINE}{job} {mode}"] = argv
        result = interleaved(cases, repeats, baseline)
    print(f"planner analyze, median of {repeats} fresh processes (interleaved), whole process:")
    for name, f in result.items():
        if name.startswith(BASELINE):
            continue
        line = f"  {name:<18} {figures(f)}  target < 1.0 s: {verdict(f['wall'] < 1.0)}"
        before = result.get(BASELINE + name)
        if before:
            line += f"\n  {'  before':<18} {figures(before)}"
        print(line)


def single_rank_traces() -> tuple[dict[str, Path], list[str]]:
    """(name -> the one Kineto trace of each folder of ../shared/traces/public/external
    that holds one, the other folders with why not)."""
    from planner.ingest.files import read_head
    from planner.ingest.sniffers import is_kineto

    found, others = {}, []
    for folder in sorted(p for p in EXTERNAL.iterdir() if p.is_dir()):
        traces = [p for p in sorted(folder.rglob("*")) if p.name.endswith((".json", ".json.gz"))]
        kineto = [p for p in traces if is_kineto(read_head(p))]
        if len(kineto) == 1 and len(traces) == 1:
            found[folder.name] = kineto[0]
        else:
            why = "no Kineto trace" if not kineto else f"{len(traces)} trace files"
            others.append(f"{folder.name} ({why})")
    return found, others


def external(repeats: int, baseline: str | None) -> None:
    """planner analyze vs HTA's load + temporal breakdown on each single-rank trace."""
    if not EXTERNAL.is_dir():
        print(f"external traces: skipped, {EXTERNAL} is not present")
        return
    why = hta_available()
    if why:
        print(f"external traces vs HTA: skipped, {why}")
        return
    found, others = single_rank_traces()
    print(
        f"single-rank traces of {EXTERNAL.relative_to(SHARED.parent)}: `planner analyze DIR "
        f"--json` vs HTA TraceAnalysis(trace_dir=DIR) + get_temporal_breakdown(), median of "
        f"{repeats}, interleaved (not single-rank: {', '.join(others)}):"
    )
    for name, trace in found.items():
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / trace.name).symlink_to(trace)
            cases = {
                "planner": [*PLANNER, "analyze", tmp, "--json"],
                "HTA": [sys.executable, "-c", HTA_BREAKDOWN, tmp],
            }
            if baseline:
                cases[BASELINE + "planner"] = cases["planner"]
            result = interleaved(cases, repeats, baseline)
        ours, hta = result["planner"], result["HTA"]
        faster, leaner = ours["wall"] < hta["wall"], ours["rss"] <= hta["rss"]
        print(f"  {name}")
        print(f"    planner analyze  {figures(ours)}")
        if baseline:
            print(f"      before         {figures(result[BASELINE + 'planner'])}")
        print(f"    HTA              {figures(hta)}")
        print(
            f"    planner {hta['wall'] / ours['wall']:.2f}x faster (target > 1: "
            f"{verdict(faster)}), at {ours['rss'] / hta['rss']:.2f} of HTA's peak RSS "
            f"(target <= 1: {verdict(leaner)})"
        )


SECTIONS = ("startup", "ingest", "analyze", "external")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-hta", action="store_true")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument(
        "--baseline",
        metavar="PYTHONPATH",
        help="Also run the analyze rows with this PYTHONPATH (another checkout), interleaved.",
    )
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    if "startup" in args.only:
        startup(args.repeats)
    if "ingest" in args.only and not args.skip_hta:
        against_hta(args.repeats)
    if "analyze" in args.only:
        the_answer(args.repeats, args.baseline)
    if "external" in args.only and not args.skip_hta:
        external(args.repeats, args.baseline)


if __name__ == "__main__":
    main()
