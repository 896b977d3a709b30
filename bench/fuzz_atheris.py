"""Coverage-guided fuzzing of each ingester with atheris (opt-in; ``pip install atheris``).

A finding is any exception other than InputError (the one error type for bad input):
a crash the CLI would show as a traceback. Seeds are the real traces (repo traces/ and
../shared/traces); the fuzzer mutates their bytes. One target per run:

    python bench/fuzz_atheris.py TARGET [-atheris_runs=N] [-max_total_time=S] [CORPUS_DIR]

TARGET: planner_json | run_metadata | graphdef | graphdef_text | kineto | sniff.
A crashing input is written by libFuzzer as ``crash-<sha1>`` in the working directory;
replay it with ``python bench/fuzz_atheris.py TARGET crash-<sha1>``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["planner"]):
    from planner.errors import InputError
    from planner.ingest import detect, kineto, planner_json, tf_graphdef, tf_runmetadata

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces" / "generated"
SCRATCH = Path(tempfile.mkdtemp(prefix="planner-fuzz-"))


def _file(data: bytes, name: str) -> Path:
    path = SCRATCH / name
    path.write_bytes(data)
    return path


def _planner_json(data: bytes) -> None:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return
    planner_json.from_document(document, Path("fuzz.json"))


def _run_metadata(data: bytes) -> None:
    tf_runmetadata.load_run_metadata([(Path("run_metadata_step3.pb"), data)])


def _graphdef(data: bytes) -> None:
    tf_graphdef.load_graphdef(Path("graph.pb"), data, text=False)


def _graphdef_text(data: bytes) -> None:
    tf_graphdef.load_graphdef(Path("graph.pbtxt"), data, text=True)


def _kineto(data: bytes) -> None:
    kineto.load_kineto([_file(data, "rank0.pt.trace.json")])


def _sniff(data: bytes) -> None:
    detect.load([_file(data, "input.json.gz")])


TARGETS: dict[str, tuple[Callable[[bytes], None], list[Path]]] = {
    "planner_json": (_planner_json, []),
    "run_metadata": (_run_metadata, sorted((REPO / "traces" / "demo").glob("*.pb"))[:1]),
    "graphdef": (_graphdef, [SHARED / "tf" / "mlp_ps_betweengraph_sync" / "worker0" / "graph.pb"]),
    "graphdef_text": (
        _graphdef_text,
        [SHARED / "tf" / "mlp_ps_betweengraph_sync" / "worker0" / "graph.pbtxt"],
    ),
    "kineto": (_kineto, [REPO / "traces" / "torch" / "hta_trace_compare_base.json.gz"]),
    "sniff": (_sniff, [REPO / "traces" / "torch" / "hta_trace_compare_base.json.gz"]),
}


def _seed_dir(target: str, seeds: list[Path]) -> str:
    """A corpus folder with the seed inputs (decompressed; planner JSON from the demo)."""
    folder = Path(tempfile.mkdtemp(prefix=f"planner-fuzz-{target}-"))
    if target == "planner_json":
        from planner.export.files import dumps

        job = detect.load([REPO / "traces" / "demo" / "run_metadata_step3.pb"])
        (folder / "demo.json").write_text(dumps(planner_json.to_document(job)))
    for i, seed in enumerate(p for p in seeds if p.exists()):
        data = seed.read_bytes()
        if data[:2] == b"\x1f\x8b" and target != "sniff":
            data = gzip.decompress(data)
        (folder / f"seed{i}").write_bytes(data)
    return str(folder)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        raise SystemExit(f"usage: {sys.argv[0]} {{{'|'.join(TARGETS)}}} [libFuzzer flags]")
    target = sys.argv.pop(1)
    function, seeds = TARGETS[target]

    def one_input(data: bytes) -> None:
        with contextlib.suppress(InputError):
            function(data)

    argv = sys.argv
    if not any(not a.startswith("-") for a in argv[1:]):
        argv = [*argv, _seed_dir(target, seeds)]
    os.environ.setdefault("PLANNER_MAX_DECOMPRESSED", str(64 << 20))
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
