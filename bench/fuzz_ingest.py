"""Run the mutation corpus through the CLI under a memory cap and a timeout; print the tally.

    nice python bench/fuzz_ingest.py [--seed N] [--jobs J] [--mem-gb 2] [--timeout 60]
                                     [--commands analyze,inspect,convert,metrics] [--no-heavy]

The corpus is tests/mutations.py (broken inputs derived at run time from the real traces,
plus the valid look-alikes), with its heavy cases (a 21 MB gzip that inflates to 21 GiB,
read at the default limits). Each (case, command) runs in a process forked from this one
(the planner already imported, so a run costs its own work, not the imports) and is
classified:

- clean: a broken input exits 2 with one stderr line; a valid one exits 0 (or 2 with one
  line when the command cannot run on it, e.g. `metrics` on a GraphDef without timings)
  and writes its output;
- traceback: a Python traceback, or an exit status other than 0/1/2;
- unclear: exit 2 with more or less than one stderr line, or a broken input accepted;
- over-memory: the peak RSS (`wait4`) passed the cap, or the watchdog killed it there
  (a forked run's RSS counts the pages it shares with this process, about 250 MiB of
  imports and corpus: an upper bound);
- over-time: it ran past the timeout and was killed;
- partial output: a refused run left its `-o` (or changed a file `-o` named), or a
  staging/lock file beside it; an accepted one left no output.

Exit status 1 when anything but `clean` was counted. `--json` prints the tally as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from mutations import Case, build_corpus  # noqa: E402

from planner_cli.main import main as planner_main  # noqa: E402

OUTCOMES = ("clean", "traceback", "unclear", "over-memory", "over-time", "partial output")
COMMANDS = ("analyze", "inspect", "convert", "metrics")


@dataclass(frozen=True)
class Run:
    """One (case, command) run: where it happens and what it was given."""

    case: Case
    command: str
    work: Path


def _argv(run: Run, inputs: list[Path], output: Path) -> list[str]:
    names = [str(p) for p in inputs]
    if run.command == "analyze":
        return ["analyze", *names, "-o", str(output)]
    if run.command == "convert":
        return ["convert", *names, "-o", str(output)]
    return [run.command, *names]


def _output_for(run: Run) -> tuple[Path, bytes | None]:
    output, kept = run.case.output_path(run.work / "work")
    if run.command == "convert" and not run.case.output:
        output = output.with_name("trace.json")
    return output, kept


def _child(run: Run, argv: list[str], log: Path) -> None:
    """In the forked process: redirect output, set the case's environment, run the CLI."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(dict(run.case.env))
    code = 0
    try:
        planner_main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 70
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return 0


def _classify(run: Run, code: int, log: str, output: Path, kept: bytes | None) -> str:
    """The outcome of a finished run (see the module docstring)."""
    if "Traceback (most recent call last)" in log or code not in (0, 1, 2):
        return "traceback"
    beside = list(output.parent.iterdir()) if output.parent.is_dir() else []
    if any(p.name.startswith(f".{output.name}.") for p in beside):
        return "partial output"
    writes = run.command in ("analyze", "convert")
    if code == 0:
        if not run.case.valid:
            return "unclear"  # a broken input accepted
        return "clean" if not writes or output.exists() else "partial output"
    if kept is not None:
        taken = output if output.is_file() else output.parent
        if not taken.is_file() or taken.read_bytes() != kept or output.is_dir():
            return "partial output"
    elif writes and output.exists():
        return "partial output"
    lines = [line for line in log.splitlines() if line.strip()]
    if code == 2 and len(lines) == 1 and lines[0].startswith("planner: error: "):
        return "clean"
    return "unclear"


def run_all(runs: list[Run], jobs: int, cap_kib: int, timeout: float) -> list[dict]:
    """Run everything, `jobs` at a time; one result row per run."""
    pending = list(runs)
    active: dict[int, tuple[Run, float, Path, Path, bytes | None]] = {}
    killed: dict[int, str] = {}
    rows: list[dict] = []
    while pending or active:
        while pending and len(active) < jobs:
            run = pending.pop(0)
            inputs, _ = run.case.write(run.work / "in")
            output, kept = _output_for(run)
            argv = _argv(run, inputs, output)
            log = run.work / f"{run.command}.log"
            pid = os.fork()
            if pid == 0:
                _child(run, argv, log)
            active[pid] = (run, time.monotonic(), log, output, kept)
        time.sleep(0.02)
        for pid, (run, start, log, output, kept) in list(active.items()):
            done, status, usage = os.wait4(pid, os.WNOHANG)
            elapsed = time.monotonic() - start
            if done == 0:
                if elapsed > timeout and pid not in killed:
                    killed[pid] = "over-time"
                    os.kill(pid, signal.SIGKILL)
                elif _rss_kib(pid) > cap_kib and pid not in killed:
                    killed[pid] = "over-memory"
                    os.kill(pid, signal.SIGKILL)
                continue
            del active[pid]
            code = os.waitstatus_to_exitcode(status)
            text = log.read_text(errors="replace") if log.exists() else ""
            if pid in killed:
                outcome = killed.pop(pid)
            elif usage.ru_maxrss > cap_kib:
                outcome = "over-memory"
            else:
                outcome = _classify(run, code, text, output, kept)
            rows.append(
                {
                    "case": run.case.name,
                    "family": run.case.family,
                    "command": run.command,
                    "outcome": outcome,
                    "exit": code,
                    "seconds": round(elapsed, 2),
                    "peak_mib": round(usage.ru_maxrss / 1024, 1),
                    "stderr": text.strip().splitlines()[-1][:200] if text.strip() else "",
                }
            )
            shutil.rmtree(run.work, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("PLANNER_CORPUS_SEED", 0)))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--mem-gb", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--commands", default=",".join(COMMANDS))
    parser.add_argument("--no-heavy", action="store_true", help="leave out the 21 GiB bomb")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    commands = [c for c in args.commands.split(",") if c]
    started = time.monotonic()
    cases = build_corpus(args.seed, heavy=not args.no_heavy)
    root = Path(tempfile.mkdtemp(prefix="planner-fuzz-"))
    runs = [
        Run(case, command, root / f"{i:04d}-{command}")
        for i, case in enumerate(cases)
        for command in commands
        if not case.output
        or command == "analyze"
        or (case.output, command) == ("below-file", "convert")
    ]  # `convert -o FILE` over an existing file replaces it, as intended
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    rows = run_all(runs, args.jobs, int(args.mem_gb * (1 << 20)), args.timeout)
    shutil.rmtree(root, ignore_errors=True)
    tally = Counter(row["outcome"] for row in rows)
    summary = {
        "seed": args.seed,
        "cases": len(cases),
        "broken": sum(not c.valid for c in cases),
        "runs": len(rows),
        "commands": commands,
        "mem_cap_gb": args.mem_gb,
        "timeout_s": args.timeout,
        "tally": {name: tally.get(name, 0) for name in OUTCOMES},
        "slowest_s": max((row["seconds"] for row in rows), default=0),
        "peak_mib": max((row["peak_mib"] for row in rows), default=0),
        "wall_s": round(time.monotonic() - started, 1),
        "not_clean": [row for row in rows if row["outcome"] != "clean"],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"corpus seed {args.seed}: {summary['cases']} inputs ({summary['broken']} broken), "
            f"{summary['runs']} runs of {', '.join(commands)}; cap {args.mem_gb:g} GB, "
            f"{args.timeout:g} s per run; {summary['wall_s']} s in all"
        )
        for name in OUTCOMES:
            print(f"  {name:<15} {tally.get(name, 0):>5}")
        print(f"  slowest run {summary['slowest_s']} s, largest peak RSS {summary['peak_mib']} MiB")
        for row in summary["not_clean"]:
            print(f"  {row['outcome']}: {row['case']} [{row['command']}] exit {row['exit']}: "
                  f"{row['stderr']}")  # fmt: skip
    sys.exit(1 if summary["not_clean"] else 0)


if __name__ == "__main__":
    main()
