"""Outputs stay byte-identical: dump what the CLI of a checkout prints and writes for every
trace set, then compare another run (a later commit, another checkout) with the dump.

    python bench/compare_outputs.py dump  DIR [--checkout CO]   # before a change
    python bench/compare_outputs.py check DIR [--checkout CO]   # after it: the diffs, exit 1
    python bench/compare_outputs.py check DIR --only dlrm        # the sets whose name holds it
    python bench/compare_outputs.py check DIR --commands metrics,analyze   # these commands only

The checkout's own `planner/` and `cli/` are run (whole processes, through a folder of two
symlinks on PYTHONPATH, with this interpreter), so two checkouts compare directly: absolute
paths of the checkout, the inputs and the temporary output folder are replaced by
placeholders (`<CHECKOUT>`, `<TRACES>`, `<SHARED>`, `<OUT>`, ...) in every output.

The sets, listed from the files alone (the same for every checkout dumped): every file of
../shared/traces and this repo's traces/ that the CLI could read (.pb .pbtxt .json .gz .et),
every folder that holds such files (a run: TF RunMetadata with its GraphDef, torch ranks
with their Execution Traces, the 8-rank DLRM set, ...), a torch run's profiler files alone
(each `rankN` without its `et_rankN`), each folder of runs (which the CLI refuses, naming
the runs) and the `worker*` folders of a TF between-graph job together. `_history` copies
are skipped, and a file or folder whose content appeared earlier under the same name is
kept once. An input that is refused stays a set: its exit status and line are its output.

Per set: `inspect --json`, `metrics --json`, `schedule --json -a tic|tac|caramel`,
`simulate --json --samples 20` and `analyze -o OUT --json` (report.json in full, every other
written file by its hash); stdout, stderr and exit status of each. Not a CI test: 453 sets,
3171 outputs, about 35 CPU minutes (an hour on two shared cores) with -j 2.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
SHARED = ROOT.parent / "shared"
TRACE_SUFFIXES = (".pb", ".pbtxt", ".json", ".gz")
"""What the CLI reads from a folder (`planner.ingest.detect.TRACE_SUFFIXES`)."""
FILE_SUFFIXES = (*TRACE_SUFFIXES, ".et")
"""Single files given explicitly: those, and Chakra protobuf ETs (to stay refused)."""
LAUNCH = "import sys; sys.argv[0] = 'planner'; from planner_cli.main import main; main()"
OUT = "<OUT>"
"""Stands for analyze's -o folder: `out` inside the command's temporary working folder."""
COMMANDS: dict[str, list[str]] = {
    "inspect": ["inspect", "--json"],
    "metrics": ["metrics", "--json"],
    "schedule-tic": ["schedule", "--json", "--algorithm", "tic"],
    "schedule-tac": ["schedule", "--json", "--algorithm", "tac"],
    "schedule-caramel": ["schedule", "--json", "--algorithm", "caramel"],
    "simulate": ["simulate", "--json", "--samples", "20"],
    "analyze": ["analyze", "-o", OUT, "--json"],
}
TIMEOUT = 900
"""Seconds one command may take before it is killed (its output then says so)."""


# ---------------------------------------------------------------------------------------
# The input sets


def _head(path: Path, size: int = 1 << 16) -> bytes:
    """The first bytes of the (decompressed) content; empty when unreadable."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(size)
            if raw[:2] != b"\x1f\x8b":
                return raw
            handle.seek(0)
            with gzip.GzipFile(fileobj=handle) as stream:
                return stream.read(size)
    except (OSError, EOFError):
        return b""


def _is_execution_trace(head: bytes) -> bool:
    return head.lstrip().startswith(b"{") and b'"nodes"' in head and b'"schema"' in head


def _is_kineto(head: bytes) -> bool:
    """A profiler chrome trace that is not a TF timeline (a rough copy of the CLI's sniffer:
    it only picks which files form a torch run's no-ET set)."""
    return (
        b'"traceEvents"' in head
        and b'"/job:' not in head
        and b'"/host:' not in head
        and not _is_execution_trace(head)
    )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _folders(root: Path) -> Iterator[Path]:
    """`root` and every folder below it, sorted, without `_history` copies."""
    yield root
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "_history"):
        yield from _folders(sub)


def _holds_traces(folder: Path) -> bool:
    return any(p.is_file() and p.name.endswith(TRACE_SUFFIXES) for p in folder.iterdir())


def _has_runs(folder: Path) -> bool:
    return any(_holds_traces(sub) for sub in _folders(folder) if sub != folder)


def label(path: Path) -> str:
    """A path as set names spell it: under `<SHARED>` or `<TRACES>`."""
    return placeholders({}).apply(str(path).encode()).decode()


def input_sets() -> dict[str, list[Path]]:
    """Set name -> the paths given to `planner`, listed from the trace folders alone."""
    sets: dict[str, list[Path]] = {}
    seen: set[object] = set()
    for root in (SHARED / "traces", TRACES):
        if not root.is_dir():
            continue
        for folder in _folders(root):
            files = sorted(p for p in folder.iterdir() if p.is_file())
            content = {p: (p.name, _digest(p)) for p in files if p.name.endswith(FILE_SUFFIXES)}
            for path, ident in content.items():
                if ident not in seen:
                    seen.add(ident)
                    sets[label(path)] = [path]
            if _holds_traces(folder):
                ident = ("folder", folder.name, tuple(content.values()))
                if ident in seen:
                    continue
                seen.add(ident)
                sets[f"{label(folder)}/"] = [folder]
                heads = {p: _head(p) for p in content if p.name.endswith(TRACE_SUFFIXES)}
                kineto = [p for p, head in heads.items() if _is_kineto(head)]
                traced = {p.name for p, head in heads.items() if _is_execution_trace(head)}
                if len(kineto) >= 2 and all(f"et_{p.name}" in traced for p in kineto):
                    sets[f"{label(folder)}/ (ranks without ET)"] = kineto
            elif folder != root and _has_runs(folder):
                sets[f"{label(folder)}/ (folder of runs)"] = [folder]
                workers = sorted(
                    p for p in folder.iterdir() if p.name.startswith("worker") and p.is_dir()
                )
                if len(workers) >= 2 and all(_holds_traces(p) for p in workers):
                    sets[f"{label(folder)}/worker* (ranks of one job)"] = workers
    return sets


def key(name: str) -> str:
    """A set's file name stem in the dump."""
    return hashlib.sha1(name.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------
# Running a checkout's CLI


@dataclass(frozen=True)
class Placeholders:
    """Absolute paths -> fixed names, longest first (a path inside another one wins)."""

    pairs: tuple[tuple[bytes, bytes], ...]

    def apply(self, data: bytes) -> bytes:
        for path, name in self.pairs:
            data = data.replace(path, name)
        return data


def placeholders(extra: dict[Path, str]) -> Placeholders:
    """The inputs' roots (`<TRACES>`, `<SHARED>`), the interpreter's environment (`<VENV>`,
    in a traceback) and `extra` (a run's checkout and temporary folders)."""
    found = {TRACES: "<TRACES>", SHARED: "<SHARED>", Path(sys.prefix): "<VENV>", **extra}
    spelled: dict[str, str] = {}
    for path, name in found.items():
        for text in {str(path), str(path.resolve())}:
            spelled.setdefault(text, name)
    pairs = sorted(spelled.items(), key=lambda kv: -len(kv[0]))
    return Placeholders(tuple((p.encode(), n.encode()) for p, n in pairs))


@dataclass(frozen=True)
class Checkout:
    """How to run one checkout's `planner`: its packages through symlinks on PYTHONPATH."""

    root: Path
    links: Path
    env: dict[str, str]

    def placeholders(self, work: Path) -> Placeholders:
        return placeholders(
            {
                self.root: "<CHECKOUT>",
                self.links / "planner": "<CHECKOUT>/planner",
                self.links / "planner_cli": "<CHECKOUT>/cli",
                self.links: "<LINKS>",
                work / "out": "<OUT>",
                work: "<WORK>",
            }
        )


@contextlib.contextmanager
def checkout(root: Path) -> Iterator[Checkout]:
    """The checkout at `root`, runnable while the context lasts.

    Bytecode is not written and numba caches its compiled loop in a temporary folder, so
    that nothing is written inside the checkout (a pristine baseline stays so). The
    environment is fixed: no PLANNER_* settings of the caller, no colour, a fixed width."""
    root = root.resolve()
    for part in ("planner", "cli"):
        if not (root / part / "__init__.py").is_file():
            sys.exit(f"{root} is not a checkout: no {part}/__init__.py")
    with tempfile.TemporaryDirectory(prefix="compare_outputs.") as tmp:
        links = Path(tmp) / "path"
        links.mkdir()
        (links / "planner").symlink_to(root / "planner")
        (links / "planner_cli").symlink_to(root / "cli")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
        env.update(
            PYTHONPATH=str(links),
            PYTHONDONTWRITEBYTECODE="1",
            NUMBA_CACHE_DIR=str(Path(tmp) / "numba"),
            NO_COLOR="1",
            COLUMNS="200",
            TERM="dumb",
        )
        yield Checkout(root, links, env)


def run(co: Checkout, args: list[str], cwd: Path) -> tuple[int | str, bytes, bytes]:
    """Exit status (or "timeout"), stdout and stderr of one `planner` process. It runs in
    its own session so that a timeout ends its worker processes too."""
    with subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        cwd=cwd,
        env=co.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            return "timeout", out, err
        return process.returncode, out, err


def outputs(co: Checkout, paths: list[Path], commands: list[str]) -> dict[str, bytes]:
    """Command -> its normalised output: the command line, exit status, stdout, stderr
    and, for analyze, the files written (report.json in full, the rest by hash)."""
    found: dict[str, bytes] = {}
    for command in commands:
        options = COMMANDS[command]
        with tempfile.TemporaryDirectory(prefix="compare_outputs.set.") as tmp:
            work = Path(tmp)
            names = co.placeholders(work)
            given = [str(work / "out") if o == OUT else o for o in options]
            args = [given[0], *map(str, paths), *given[1:]]
            status, out, err = run(co, args, work)
            line = names.apply(" ".join(["$ planner", *args]).encode())
            parts = [line + f"\nexit {status}\n".encode()]
            written = sorted(p for p in (work / "out").rglob("*") if p.is_file())
            report = work / "out" / "report.json"
            body = names.apply(report.read_bytes()) if report.is_file() else None
            stdout = names.apply(out)
            if body is not None and stdout == body:
                parts.append(b"--- stdout: the same bytes as report.json\n")
            else:
                parts.append(b"--- stdout\n" + stdout + b"\n")
            parts.append(b"--- stderr\n" + names.apply(err))
            if command == "analyze":
                parts.append(f"--- files in <OUT> ({len(written)})\n".encode())
                for path in written:
                    name = path.relative_to(work / "out").as_posix()
                    digest = hashlib.sha256(names.apply(path.read_bytes())).hexdigest()
                    parts.append(f"{name} sha256:{digest}\n".encode())
                if body is not None:
                    parts.append(b"--- report.json\n" + body + b"\n")
        found[command] = b"".join(parts)
    return found


# ---------------------------------------------------------------------------------------
# Dump and check


def excerpt(before: bytes, after: bytes, lines: int = 20) -> str:
    """The first lines of a unified diff between the dumped and the new output."""
    diff = difflib.unified_diff(
        before.decode(errors="replace").splitlines(),
        after.decode(errors="replace").splitlines(),
        "dumped",
        "now",
        lineterm="",
    )
    return "\n".join(line for _, line in zip(range(lines), diff, strict=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("dump", "check"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="Run this checkout's CLI.")
    parser.add_argument("--only", default="", help="Only the sets whose name holds this.")
    parser.add_argument("--jobs", type=int, default=2, help="Sets run at the same time.")
    parser.add_argument(
        "--commands", default=",".join(COMMANDS), help="Only these (comma-separated) outputs."
    )
    args = parser.parse_args()
    commands = [c for c in args.commands.split(",") if c]
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown:
        sys.exit(f"--commands: unknown {', '.join(unknown)} (choose from {', '.join(COMMANDS)})")
    with contextlib.suppress(OSError):  # others share the machine
        os.nice(max(0, 10 - os.nice(0)))
    sets = {k: v for k, v in input_sets().items() if args.only in k}
    index_path = args.folder / "index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {"sets": {}}
    if args.mode == "check" and not index["sets"]:
        sys.exit(f"{args.folder}: no dump here (no index.json)")
    start = time.monotonic()
    done = [0]

    def one(item: tuple[str, list[Path]]) -> tuple[dict[str, bytes], float]:
        began = time.monotonic()
        found = outputs(co, item[1], commands)
        done[0] += 1
        took = time.monotonic() - began
        print(f"[{done[0]}/{len(sets)}] {took:6.1f} s  {item[0]}", file=sys.stderr, flush=True)
        return found, took

    with checkout(args.checkout) as co, ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(sets, pool.map(one, sets.items()), strict=True))
    differ = 0
    if args.mode == "dump":
        args.folder.mkdir(parents=True, exist_ok=True)
    for name, (found, took) in results.items():
        stem = key(name)
        if args.mode == "dump":
            for command, data in found.items():
                (args.folder / f"{stem}.{command}").write_bytes(data)
            index["sets"][stem] = {
                "name": name,
                "paths": [label(p) for p in sets[name]],
                "seconds": round(took, 1),
            }
            continue
        if stem not in index["sets"]:
            differ += len(found)
            print(f"NEW SET (not in the dump): {name}")
            continue
        for command, data in found.items():
            path = args.folder / f"{stem}.{command}"
            before = path.read_bytes() if path.is_file() else b""
            if before != data:
                differ += 1
                print(f"DIFFERS: {command} {name}\n{excerpt(before, data)}\n")
    if args.mode == "dump":
        dumped = set(index.get("commands", [])) | set(commands)
        index.update(
            commands=[c for c in COMMANDS if c in dumped], checkout=str(args.checkout.resolve())
        )
        index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    else:
        gone = [v["name"] for v in index["sets"].values() if args.only in v["name"]]
        for name in sorted(set(gone) - set(sets)):
            differ += len(commands)
            print(f"GONE (dumped, not listed now): {name}")
    total = sum(len(found) for found, _ in results.values())
    print(f"({time.monotonic() - start:.0f} s, checkout {args.checkout})", file=sys.stderr)
    print(f"{len(sets)} sets, {total} outputs, {differ} differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
