"""Run the mutation corpus through the CLI under a memory cap and a timeout; print the tally.

    nice python bench/fuzz_ingest.py [--seed N] [--jobs J] [--mem-gb 2] [--timeout 120]
                                     [--only base,numbers,encoding,multirank]
                                     [--commands analyze,inspect,convert,metrics,...]
                                     [--no-heavy] [--json]

The corpus is tests/mutations.py (broken inputs derived at run time from the real traces,
plus the valid look-alikes), in classes (`--only`):

- base: the test corpus, with its heavy cases (a 21 MB gzip that inflates to 21 GiB, read
  at the default limits); each runs through `analyze -o`, `inspect`, `convert`, `metrics`;
- numbers: integers beyond int64 in every numeric field of the Kineto, planner JSON and TF
  timeline readers; encoding: names that are not UTF-8 (plain and gzip); multirank:
  mutations of a multi-rank NCCL GPU job and a gloo CPU job (sizes, launch ids, world
  sizes, ranks shuffled, cut, repeated). These run through every command with `--json`:
  `inspect`, `metrics`, `schedule -a caramel` (TAC for parameter-server inputs),
  `simulate --samples 3` and `analyze -o DIR`; a case of several rank files runs each
  command that has a pool with `-j 1` and with `-j 2`, and the two runs must agree.

Each run happens in a process forked from this one (the planner already imported, so a
run costs its own work, not the imports) and is classified:

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
  staging/lock file beside it; an accepted one left no output;
- j-mismatch: the `-j 2` run of a multi-rank case, clean on its own, differs from its
  `-j 1` run in exit status, stdout or stderr (paths of the run's folder aside), or in
  `analyze`'s report.json.

A valid input refused by `inspect` or `convert` (which run on any trace) counts as
unclear; one refused by another command (with one line) is clean but listed
(`valid_refused`). Exit status 1 when anything but `clean` was counted. `--json` prints
the tally as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
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

from mutations import GROUPS, Case, build_corpus  # noqa: E402

from planner_cli.main import main as planner_main  # noqa: E402

OUTCOMES = (
    "clean", "traceback", "unclear", "over-memory", "over-time", "partial output", "j-mismatch"
)  # fmt: skip
COMMANDS = ("analyze", "inspect", "convert", "metrics")
"""The base class's commands (plain output)."""
JSON_COMMANDS = ("inspect", "metrics", "schedule", "simulate", "analyze")
"""The other classes' commands (`--json`); all but `inspect` have a pool (`-j`)."""
POOLED = frozenset({"metrics", "schedule", "simulate", "analyze"})


@dataclass(frozen=True)
class Run:
    """One (case, command) run: where it happens and what it was given."""

    case: Case
    command: str
    work: Path
    jobs: int | None = None
    """`-j`: None for the base class's commands and `inspect`."""

    @property
    def json(self) -> bool:
        return self.case.group != "base"


def _argv(run: Run, inputs: list[Path], output: Path) -> list[str]:
    names = [str(p) for p in inputs]
    more = ["--json"] if run.json else []
    if run.jobs is not None:
        more += ["-j", str(run.jobs)]
    if run.command == "analyze":
        return ["analyze", *names, "-o", str(output), *more]
    if run.command == "convert":
        return ["convert", *names, "-o", str(output)]
    if run.command == "schedule":
        return ["schedule", *names, "-a", run.case.algorithm, *more]
    if run.command == "simulate":
        return ["simulate", *names, "--samples", "3", *more]
    return [run.command, *names, *more]


def _output_for(run: Run) -> tuple[Path, bytes | None]:
    output, kept = run.case.output_path(run.work / "work")
    if run.command == "convert" and not run.case.output:
        output = output.with_name("trace.json")
    return output, kept


def _child(run: Run, argv: list[str], log: Path) -> None:
    """In the forked process: its own process group (a kill reaches its pool's workers),
    stdout to `log`, stderr to `log`.err, the case's environment; run the CLI."""
    os.setpgid(0, 0)
    for fd, path in ((1, log), (2, log.with_suffix(".err"))):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
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
    if code == 2 and run.case.valid and run.command in ("inspect", "convert"):
        return "unclear"  # a valid input refused where every trace can be read
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


def _kill(pid: int) -> None:
    """SIGKILL the run and its pool's workers (its process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _answer(run: Run, code: int, out: str, err: str, output: Path) -> bytes:
    """What a run answered, its own folder's path written WORK: the exit status, stderr,
    stdout and analyze's report.json (compared between `-j 1` and `-j 2`)."""
    report = output / "report.json"
    parts = [f"exit {code}", err, out, report.read_text() if report.is_file() else ""]
    return "\n\0\n".join(parts).replace(str(run.work), "WORK").encode()


def _first_difference(a: bytes, b: bytes) -> str:
    lines = difflib.unified_diff(
        a.decode(errors="replace").splitlines(), b.decode(errors="replace").splitlines(),
        "-j 1", "-j 2", n=0, lineterm="",
    )  # fmt: skip
    shown = [line[:160] for line in lines if not line.startswith(("---", "+++", "@@"))]
    return " | ".join(shown[:4])


def run_all(runs: list[Run], jobs: int, cap_kib: int, timeout: float, answers: Path) -> list[dict]:
    """Run everything, `jobs` at a time; one result row per run. The answers of pooled
    runs are kept under `answers` (for `pair_up`)."""
    pending = list(runs)
    active: dict[int, tuple[Run, float, Path, Path, bytes | None]] = {}
    killed: dict[int, str] = {}
    rows: list[dict] = []
    answers.mkdir(parents=True, exist_ok=True)
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
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)  # as the child does: no kill before it can miss the group
            active[pid] = (run, time.monotonic(), log, output, kept)
        time.sleep(0.02)
        for pid, (run, start, log, output, kept) in list(active.items()):
            ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            elapsed = time.monotonic() - start
            if ended is None:
                if elapsed > timeout and pid not in killed:
                    killed[pid] = "over-time"
                    _kill(pid)
                elif _rss_kib(pid) > cap_kib and pid not in killed:
                    killed[pid] = "over-memory"
                    _kill(pid)
                continue
            del active[pid]
            _kill(pid)  # pool workers left in its group (the unreaped leader holds the id)
            _, status, usage = os.wait4(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            out = log.read_text(errors="replace") if log.exists() else ""
            err_path = log.with_suffix(".err")
            err = err_path.read_text(errors="replace") if err_path.exists() else ""
            text = out + err
            if pid in killed:
                outcome = killed.pop(pid)
            elif usage.ru_maxrss > cap_kib:
                outcome = "over-memory"
            else:
                outcome = _classify(run, code, text, output, kept)
            err_lines = err.strip().splitlines()
            row = {
                "case": run.case.name,
                "group": run.case.group,
                "family": run.case.family,
                "valid": run.case.valid,
                "command": run.command,
                "jobs": run.jobs,
                "outcome": outcome,
                "exit": code,
                "seconds": round(elapsed, 2),
                "peak_mib": round(usage.ru_maxrss / 1024, 1),
                "stderr_first": err_lines[0][:300] if err_lines else "",
                "stderr": (err_lines or out.strip().splitlines() or [""])[-1][:300],
            }
            if run.case.pooled and run.jobs is not None:
                answer = _answer(run, code, out, err, output)
                stored = answers / f"{run.case.name}.{run.command}.j{run.jobs}"
                stored.write_bytes(answer)
                row["answer"] = str(stored)
                row["digest"] = hashlib.sha256(answer).hexdigest()[:16]
            rows.append(row)
            shutil.rmtree(run.work, ignore_errors=True)
    return rows


def pair_up(rows: list[dict]) -> None:
    """Mark the `-j 2` row `j-mismatch` where it was clean and answered otherwise than the
    `-j 1` run of the same case and command."""
    first = {(r["case"], r["command"]): r for r in rows if r["jobs"] == 1 and "digest" in r}
    for row in rows:
        one = first.get((row["case"], row["command"]))
        if row["jobs"] != 2 or one is None or "digest" not in row:
            continue
        if row["digest"] != one["digest"] and row["outcome"] == "clean":
            row["outcome"] = "j-mismatch"
            row["stderr"] = _first_difference(
                Path(one["answer"]).read_bytes(), Path(row["answer"]).read_bytes()
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("PLANNER_CORPUS_SEED", 0)))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--mem-gb", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--only", default=",".join(GROUPS), help=f"corpus classes, of {','.join(GROUPS)}"
    )
    parser.add_argument(
        "--commands",
        default=",".join(dict.fromkeys(COMMANDS + JSON_COMMANDS)),
        help="the commands to run (each class runs those of its own that are named)",
    )
    parser.add_argument("--no-heavy", action="store_true", help="leave out the 21 GiB bomb")
    parser.add_argument(
        "--match", default="", help="only the cases whose name holds one of these (a,b,...)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    commands = [c for c in args.commands.split(",") if c]
    groups = tuple(g for g in args.only.split(",") if g)
    unknown = sorted(set(groups) - set(GROUPS)) + sorted(
        set(commands) - set(COMMANDS) - set(JSON_COMMANDS)
    )
    if unknown:
        parser.error(f"unknown class or command: {', '.join(unknown)}")
    started = time.monotonic()
    cases = build_corpus(args.seed, heavy=not args.no_heavy, groups=groups)
    parts = [part for part in args.match.split(",") if part] or [""]
    cases = [case for case in cases if any(part in case.name for part in parts)]
    root = Path(tempfile.mkdtemp(prefix="planner-fuzz-"))
    runs = plan_runs(cases, commands, root)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    rows = run_all(runs, args.jobs, int(args.mem_gb * (1 << 20)), args.timeout, root / "answers")
    pair_up(rows)
    shutil.rmtree(root, ignore_errors=True)
    for row in rows:
        row.pop("answer", None)
    summary = summarize(rows, cases, args, commands, groups, started)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    sys.exit(1 if summary["not_clean"] else 0)


def plan_runs(cases: list[Case], commands: list[str], root: Path) -> list[Run]:
    """Every (case, command[, -j]) run: the base class's commands once each; the others'
    with `--json`, twice (`-j 1`, `-j 2`) where the case has several ranks and the command
    a pool, else once (`-j 2`: one rank never starts a pool)."""
    runs: list[Run] = []
    for i, case in enumerate(cases):
        if case.group == "base":
            for command in (c for c in COMMANDS if c in commands):
                if (
                    not case.output
                    or command == "analyze"
                    or (case.output, command) == ("below-file", "convert")
                ):  # `convert -o FILE` over an existing file replaces it, as intended
                    runs.append(Run(case, command, root / f"{i:04d}-{command}"))
            continue
        for command in (c for c in JSON_COMMANDS if c in commands):
            if command not in POOLED:
                runs.append(Run(case, command, root / f"{i:04d}-{command}"))
                continue
            for jobs in (1, 2) if case.pooled else (2,):
                runs.append(Run(case, command, root / f"{i:04d}-{command}-j{jobs}", jobs))
    return runs


def summarize(
    rows: list[dict],
    cases: list[Case],
    args: argparse.Namespace,
    commands: list[str],
    groups: tuple[str, ...],
    started: float,
) -> dict:
    """The tally (in all and per class), the figures of the run, the rows not clean."""
    tally = Counter(row["outcome"] for row in rows)
    per_class = {
        group: {
            "inputs": sum(c.group == group for c in cases),
            "broken": sum(c.group == group and not c.valid for c in cases),
            "multi_rank": sum(c.group == group and c.pooled for c in cases),
            "runs": sum(r["group"] == group for r in rows),
            **{
                name: n
                for name in OUTCOMES
                if (n := sum(r["group"] == group and r["outcome"] == name for r in rows))
            },
        }
        for group in groups
    }
    return {
        "seed": args.seed,
        "classes": list(groups),
        "cases": len(cases),
        "broken": sum(not c.valid for c in cases),
        "multi_rank": sum(c.pooled for c in cases),
        "runs": len(rows),
        "commands": commands,
        "mem_cap_gb": args.mem_gb,
        "timeout_s": args.timeout,
        "tally": {name: tally.get(name, 0) for name in OUTCOMES},
        "per_class": per_class,
        "slowest_s": max((row["seconds"] for row in rows), default=0),
        "peak_mib": max((row["peak_mib"] for row in rows), default=0),
        "wall_s": round(time.monotonic() - started, 1),
        "not_clean": [row for row in rows if row["outcome"] != "clean"],
        "valid_refused": [
            row for row in rows if row["valid"] and row["exit"] == 2 and row["outcome"] == "clean"
        ],
    }


def print_summary(summary: dict) -> None:
    print(
        f"corpus seed {summary['seed']}: {summary['cases']} inputs ({summary['broken']} broken, "
        f"{summary['multi_rank']} multi-rank) of {', '.join(summary['classes'])}; "
        f"{summary['runs']} runs of {', '.join(summary['commands'])}; "
        f"cap {summary['mem_cap_gb']:g} GB, {summary['timeout_s']:g} s per run; "
        f"{summary['wall_s']} s in all"
    )
    for name in OUTCOMES:
        print(f"  {name:<15} {summary['tally'][name]:>5}")
    for group, counts in summary["per_class"].items():
        shown = ", ".join(f"{k} {v}" for k, v in counts.items())
        print(f"  class {group}: {shown}")
    print(f"  slowest run {summary['slowest_s']} s, largest peak RSS {summary['peak_mib']} MiB")
    for row in summary["not_clean"]:
        jobs = f" -j {row['jobs']}" if row["jobs"] else ""
        print(f"  {row['outcome']}: {row['case']} [{row['command']}{jobs}] exit {row['exit']}: "
              f"{row['stderr_first']} ... {row['stderr']}")  # fmt: skip
    for row in summary["valid_refused"]:
        jobs = f" -j {row['jobs']}" if row["jobs"] else ""
        print(f"  (valid, refused) {row['case']} [{row['command']}{jobs}]: {row['stderr']}")


if __name__ == "__main__":
    main()
