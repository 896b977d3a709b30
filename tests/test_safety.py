"""Inputs are data, never code; decompression is bounded; input names never pick a path."""

from __future__ import annotations

import ast
import copy
import gzip
import json
import pickle
from pathlib import Path

import pytest
from conftest import run_cli
from mutations import _planner_doc

from planner.errors import InputError
from planner.ingest import files

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted((REPO / "planner").rglob("*.py")) + sorted((REPO / "cli").rglob("*.py"))

BANNED_CALLS = {"eval", "exec", "compile", "__import__"}
BANNED_ATTRS = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("marshal", "loads"),
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
    ("torch", "load"),
    ("dill", "loads"),
}
BANNED_MODULES = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "yaml"}


def _violations(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names if a.name in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module in BANNED_MODULES:
            found.append(f"{where} from {node.module} import")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in BANNED_CALLS:
                found.append(f"{where} {func.id}()")
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if (func.value.id, func.attr) in BANNED_ATTRS:
                    found.append(f"{where} {func.value.id}.{func.attr}()")
                if func.attr == "load" and func.value.id in ("np", "numpy"):
                    pickles = [k for k in node.keywords if k.arg == "allow_pickle"]
                    if any(not isinstance(k.value, ast.Constant) or k.value.value for k in pickles):
                        found.append(f"{where} np.load(allow_pickle)")
    return found


def test_the_source_scan_finds_what_it_bans(tmp_path: Path) -> None:
    bad = REPO / "planner" / "_scan_probe_never_committed.py"
    text = "import pickle\nimport numpy as np\neval('1')\nnp.load('x', allow_pickle=True)\n"
    try:
        bad.write_text(text)
        assert len(_violations(bad)) == 3
    finally:
        bad.unlink()


def test_no_code_execution_primitives_in_the_package() -> None:
    assert len(SOURCES) > 20
    found = [v for path in SOURCES for v in _violations(path)]
    assert not found, found


class _Boom:
    """A pickle that would create a file when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("name", ["trace.pb", "rank0.json.gz", "trace.json", "graph.pbtxt"])
def test_a_pickle_with_a_trace_suffix_is_refused_not_run(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "PWNED"
    payload = pickle.dumps(_Boom(marker))
    if name.endswith(".gz"):
        payload = gzip.compress(payload)
    source = tmp_path / name
    source.write_bytes(payload)
    code, _, err = run_cli(["analyze", source, "-o", tmp_path / "out"], capsys)
    assert code == 2 and str(source) in err
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_code_in_names_is_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "PWNED"
    payload = f"__import__('os').system('touch {marker}')"
    doc = _renamed(json.loads(_planner_doc()), lambda n: f"{n}{payload}")
    doc["notes"] = [payload, "{{7*7}}", "${{jndi:x}}"]
    doc["framework"] = payload
    source = tmp_path / "trace.json"
    source.write_text(json.dumps(doc))
    code, _, err = run_cli(["analyze", source, "-o", tmp_path / "out"], capsys)
    assert code == 0, err
    assert not marker.exists()
    assert payload in (tmp_path / "out" / "report.json").read_text()


# ------------------------------------------------------------------ decompression bound


def _bomb(path: Path, prefix: bytes, size: int) -> Path:
    """A small gzip file that inflates to `size` bytes (`prefix`, then zeros/spaces)."""
    filler = b" " if prefix else b"\0"
    with gzip.open(path, "wb", compresslevel=9) as stream:
        stream.write(prefix)
        chunk = filler * (1 << 20)
        for _ in range(size >> 20):
            stream.write(chunk)
    return path


def test_limit_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLANNER_MAX_DECOMPRESSED", raising=False)
    assert files.max_decompressed() == files.MAX_DECOMPRESSED == 8 << 30
    monkeypatch.setenv("PLANNER_MAX_DECOMPRESSED", "12345")
    assert files.max_decompressed() == 12345
    monkeypatch.setenv("PLANNER_MAX_DECOMPRESSED", "lots")
    with pytest.raises(InputError, match="not a byte count"):
        files.max_decompressed()


@pytest.mark.parametrize(
    "name, prefix",
    [
        ("bomb.pb.gz", b""),
        ("trace.json.gz", b'{"schema": "planner.trace/1", "notes": ["'),
    ],
)
def test_gzip_bomb_is_refused(
    name: str,
    prefix: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bomb = _bomb(tmp_path / name, prefix, 64 << 20)
    assert bomb.stat().st_size < 100_000  # 64 MiB from under 100 kB
    monkeypatch.setenv("PLANNER_MAX_DECOMPRESSED", str(16 << 20))
    code, out, err = run_cli(["analyze", bomb, "-o", tmp_path / "out"], capsys)
    assert code == 2
    assert err == f"planner: error: {bomb}: decompresses to more than 16 MiB " + (
        "(a gzip bomb? raise PLANNER_MAX_DECOMPRESSED to allow it)\n"
    )
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("PLANNER_MAX_DECOMPRESSED", str(128 << 20))  # under the limit: other error
    code, _, err = run_cli(["inspect", bomb], capsys)
    assert code == 2 and "decompresses" not in err


def test_kineto_shaped_gzip_bomb_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = b'{"schemaVersion": 1, "traceEvents": ['  # sniffed as Kineto: the streaming reader
    bomb = _bomb(tmp_path / "rank0.pt.trace.json.gz", prefix, 64 << 20)
    monkeypatch.setenv("PLANNER_MAX_DECOMPRESSED", str(16 << 20))
    code, _, err = run_cli(["inspect", bomb], capsys)
    assert code == 2 and "decompresses to more than 16 MiB" in err


# ------------------------------------------------------------------ output paths


def _renamed(doc: dict, rename) -> dict:  # type: ignore[no-untyped-def]
    """The document with every op of every rank renamed consistently."""
    doc = copy.deepcopy(doc)
    for rank in doc["ranks"]:
        for op in rank["ops"]:
            op["name"] = rename(op["name"])
        rank["edges"] = [[rename(s), rename(d), *rest] for s, d, *rest in rank["edges"]]
        for it in rank["iterations"]:
            it["ops"] = {rename(k): v for k, v in it["ops"].items()}
    return doc


def _tree(root: Path) -> set[Path]:
    return set(root.rglob("*"))


@pytest.mark.parametrize("command", ["analyze", "schedule", "convert"])
def test_op_names_with_path_syntax_write_only_inside_the_output(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    doc = _renamed(json.loads(_planner_doc()), lambda n: f"../../{n}/../x/{n}")
    doc["ranks"][0]["ops"][0]["name"] = "/etc/passwd"
    first = json.loads(_planner_doc())["ranks"][0]["ops"][0]["name"]
    doc = _renamed(doc, lambda n: "/etc/passwd" if n == f"../../{first}/../x/{first}" else n)
    source = tmp_path / "trace.json"
    source.write_text(json.dumps(doc))
    before = _tree(tmp_path)
    target = work / "out" if command == "analyze" else work / "out" / "plan.json"
    extra = ["--format", "tictac"] if command == "schedule" else []
    code, _, err = run_cli([command, source, "-o", target, *extra], capsys)
    assert code == 0, err
    created = _tree(tmp_path) - before
    assert created, "nothing written"
    assert all(p.is_relative_to(work / "out") or p == work / "out" for p in created), created


def _trace_with_rank(tmp_path: Path, rank: str) -> Path:
    """A planner trace (in tmp_path/in/) whose first rank is named `rank`."""
    doc = json.loads(_planner_doc())
    doc["ranks"][0]["rank"] = rank
    source = tmp_path / "in" / "trace.json"
    source.parent.mkdir()
    source.write_text(json.dumps(doc))
    return source


@pytest.mark.parametrize(
    "rank", ["../../evil", "a/b", "..", ".hidden", "c:\\x", "x" * 300, "café☃", "Worker0"]
)
def test_rank_names_become_safe_file_names_with_the_mapping_in_the_report(
    rank: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _trace_with_rank(tmp_path, rank)
    out = tmp_path / "work" / "out"
    code, _, err = run_cli(["analyze", source, "-o", out], capsys)
    assert code == 0, err
    assert set((tmp_path / "work").iterdir()) == {out}  # nothing beside -o, no temp left
    mapping = json.loads((out / "report.json").read_text())["file_names"]["ranks"]
    part = mapping[rank]
    assert not part.startswith(".") and len(part) <= 64 and part.isprintable()
    assert all(c.isascii() and (c.isalnum() or c in "._+-") for c in part)
    assert (part == rank) == (rank == "Worker0")
    for plan in ("tic", "tac"):
        assert (out / f"{part}.{plan}.txt").is_file()
    assert all(p.parent == out for p in out.rglob("*"))


@pytest.mark.parametrize("rank", ["", "tab\there", "bell\x07"])
def test_empty_or_control_rank_names_are_refused(
    rank: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _trace_with_rank(tmp_path, rank)
    before = _tree(tmp_path)
    code, _, err = run_cli(["analyze", source, "-o", tmp_path / "out"], capsys)
    assert code == 2
    assert "empty or holds control characters" in err and str(source) in err
    assert _tree(tmp_path) == before
