"""Outputs stay byte-identical: dump `inspect --json`, `metrics --json` and `analyze -o`
(report.json) of every Kineto trace set, then compare a later dump with it.

    python bench/compare_outputs.py dump  DIR     # before a change
    python bench/compare_outputs.py check DIR     # after it: exit 1 and the diffs if any
    python bench/compare_outputs.py check DIR --only dlrm   # the sets whose name holds it

The sets: every single-rank Kineto file under ../shared/traces and the repo's traces/
(its own run), the multi-rank runs as folders (with their Execution Traces) and as their
profiler files alone (without ET), and the 8-rank DLRM set. Each command's stdout, exit
status and written report.json are kept; an input that is refused must stay refused with
the same line. Not a CI test: about two minutes of whole `planner` processes.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
PLANNER = str(Path(sys.executable).parent / "planner")
RUNS = ("generated/torch/resnet_ddp", "generated/torch/resnet_ddp_bucket1mb",
        "generated/torch/transformer_ddp")  # fmt: skip
DLRM = "public/param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"


def kineto_files() -> list[Path]:
    """Single Kineto trace files (sniffed from content), outside `_history` copies."""
    from planner.ingest.files import read_head
    from planner.ingest.sniffers import is_kineto

    found = []
    for root in (SHARED, ROOT / "traces"):
        for path in sorted(root.rglob("*.json*")):
            if "_history" in path.parts or not path.name.endswith((".json", ".json.gz")):
                continue
            if is_kineto(read_head(path)):
                found.append(path)
    return found


def input_sets() -> dict[str, list[str]]:
    """Name -> the `planner` arguments that name the set."""
    sets = {str(p.relative_to(ROOT.parent)): [str(p)] for p in kineto_files()}
    for run in RUNS:
        for base in (SHARED, ROOT / "traces" / "torch"):
            folder = base / run if base == SHARED else base / Path(run).name
            if base != SHARED and run != RUNS[0]:
                continue
            if folder.is_dir():
                label = str(folder.relative_to(ROOT.parent))
                sets[f"{label} (with ET)"] = [str(folder)]
                sets[f"{label} (no ET)"] = [str(p) for p in sorted(folder.glob("rank*.json.gz"))]
    if (SHARED / DLRM).is_dir():
        sets["DLRM 8 ranks"] = [str(SHARED / DLRM)]
    return sets


def outputs(name: str, args: list[str]) -> dict[str, bytes]:
    """Each command's stdout + exit status, and analyze's report.json."""
    found: dict[str, bytes] = {}
    for command in (["inspect", "--json"], ["metrics", "--json"]):
        done = subprocess.run([PLANNER, command[0], *args, *command[1:]], capture_output=True)
        found[command[0]] = done.stdout + f"\nexit {done.returncode}\n".encode() + done.stderr
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([PLANNER, "analyze", *args, "-o", tmp, "--json"], capture_output=True)
        report = Path(tmp) / "report.json"
        found["analyze"] = (report.read_bytes() if report.exists() else b"") + (
            f"\nexit {done.returncode}\n".encode() + done.stderr
        )
    return found


def key(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:12]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("dump", "check"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--only", default="", help="Only the sets whose name holds this.")
    args = parser.parse_args()
    sets = {k: v for k, v in input_sets().items() if args.only in k}
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(sets, pool.map(lambda kv: outputs(*kv), sets.items()), strict=True))
    differ = 0
    for name, found in results.items():
        for command, data in found.items():
            path = args.folder / f"{key(name)}.{command}"
            if args.mode == "dump":
                args.folder.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                (args.folder / f"{key(name)}.name").write_text(name)
            elif not path.exists() or path.read_bytes() != data:
                differ += 1
                print(f"DIFFERS: {command} {name}")
    print(f"{len(sets)} sets x 3 outputs: {differ} differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
