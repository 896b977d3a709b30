"""Inputs read within limits (issue 17, points 2 and 3), through the real CLI.

Each refusal is exit status 2 and one stderr line naming the file and the problem (and,
for a limit, the variable that raises it); nothing is written. Bases are the repo's
real traces (the demo RunMetadata, the HTA Kineto sample) and, when present, the shared
DDP traces.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from conftest import DEMO, SHARED, need, run_cli
from mutations import HTA, _planner_doc

from planner.ingest import files

RESNET = SHARED / "generated" / "torch" / "resnet_ddp"
TRANSFORMER = SHARED / "generated" / "torch" / "transformer_ddp"
HTA_DATA = SHARED / "public" / "HolisticTraceAnalysis" / "tests" / "data"
CLI = [sys.executable, "-c", "from planner_cli.main import main; main()"]


def _refused(args: list, capsys: pytest.CaptureFixture[str], culprit: object, *words: str) -> str:
    """Run the CLI; assert exit 2 with one line naming `culprit`; the line."""
    code, out, err = run_cli(args, capsys)
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("planner: error: "), err
    assert str(culprit) in lines[0], (culprit, lines[0])
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert "Traceback" not in err and out == ""
    return lines[0]


def _hta() -> dict:
    return json.loads(gzip.decompress(HTA.read_bytes()))


# ------------------------------------------------------------- what a path may be


def test_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    done = subprocess.run(  # an open() would block forever: a subprocess with a timeout
        [*CLI, "analyze", str(fifo), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"planner: error: {fifo}: is a FIFO, not a regular file; refused " + (
        "without reading it\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_fifo_in_a_directory_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run_metadata_step3.pb").write_bytes((DEMO / "run_metadata_step3.pb").read_bytes())
    os.mkfifo(tmp_path / "run_metadata_step4.pb")
    _refused(["inspect", tmp_path], capsys, tmp_path / "run_metadata_step4.pb", "a FIFO")


def test_a_socket_and_devices_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = tmp_path / "trace.json"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(sock))
        _refused(["inspect", sock], capsys, sock, "is a socket")
    finally:
        server.close()
    for device in ("/dev/zero", "/dev/null", "/dev/urandom"):
        if Path(device).exists():
            _refused(["inspect", device], capsys, device, "a character device", "without reading")


def test_an_oversized_plain_file_is_refused_from_its_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLANNER_MAX_DECOMPRESSED", raising=False)
    sparse = tmp_path / "run_metadata_step3.pb"  # 12 GiB, no blocks: reading it would fill RAM
    with sparse.open("wb") as handle:
        handle.write((DEMO / "run_metadata_step3.pb").read_bytes())
        handle.truncate(12 << 30)
    line = _refused(["inspect", sparse], capsys, sparse, "PLANNER_MAX_DECOMPRESSED")
    assert "is 12 GiB, over the 8 GiB input limit" in line


def test_the_limit_for_inputs_read_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = (DEMO / "run_metadata_step3.pb").read_bytes()
    source = tmp_path / "run_metadata_step3.pb.gz"
    source.write_bytes(gzip.compress(data))
    monkeypatch.setenv("PLANNER_MAX_DOCUMENT", str(len(data) - 1))
    line = _refused(["inspect", source], capsys, source, "raise PLANNER_MAX_DOCUMENT")
    assert "the limit for inputs read whole" in line
    monkeypatch.setenv("PLANNER_MAX_DOCUMENT", str(len(data)))
    assert run_cli(["inspect", source], capsys)[0] == 0


def test_a_file_name_that_is_not_utf8_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = os.fsencode(tmp_path) + b"/run_metadata_step3\xff.pb"
    with open(raw, "wb") as handle:
        handle.write((DEMO / "run_metadata_step3.pb").read_bytes())
    line = _refused(["inspect", os.fsdecode(raw)], capsys, "\\xff", "file name is not UTF-8")
    assert line.isprintable()


def test_a_path_component_over_255_bytes_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = tmp_path / ("é" * 130 + ".pb")  # 263 bytes
    _refused(["inspect", long], capsys, tmp_path, "263 bytes, over the 255-byte limit")


# ------------------------------------------------------------- streaming and bombs


def _gzip_of(prefix: bytes, filler: bytes, mib: int) -> bytes:
    """A gzip stream of `prefix` then `mib` MiB of `filler` (a bomb: ~1000:1)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [packer.compress(prefix)]
    parts += [packer.compress(filler * (1 << 20)) for _ in range(mib)]
    return b"".join([*parts, packer.flush()])


def _peak_rss_mib(args: list[str], env: dict[str, str]) -> tuple[int, float, str]:
    """Run the CLI in a fresh interpreter: (exit status, its peak RSS in MiB, stderr)."""
    script = (  # VmHWM: this process's own high-water mark (ru_maxrss would count the
        # parent's memory, inherited through the fork/vfork before exec)
        "import re, sys\n"
        "from pathlib import Path\n"
        "from planner_cli.main import main\n"
        "code = 0\n"
        "try:\n    main(sys.argv[1:])\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        "status = Path('/proc/self/status').read_text()\n"
        "peak = int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))\n"
        "print(f'PEAK {peak}', file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    peak = int(re.search(r"PEAK (\d+)", done.stderr).group(1)) / 1024
    return done.returncode, peak, re.sub(r"PEAK \d+\n", "", done.stderr)


def test_a_kineto_shaped_bomb_streams_in_bounded_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "rank0.pt.trace.json.gz"
    bomb.write_bytes(_gzip_of(b'{"schemaVersion": 1, "traceEvents": [', b" ", 384))
    plain = tmp_path / "plain" / "rank0.pt.trace.json.gz"
    plain.parent.mkdir()
    plain.write_bytes(HTA.read_bytes())
    env = {
        "PLANNER_MAX_DECOMPRESSED": str(256 << 20),
        "PLANNER_MAX_DOCUMENT": str(128 << 20),
        "PLANNER_MAX_GZIP_RATIO": "100000",  # the size limit, not the ratio, stops it here
    }
    base_code, baseline, _ = _peak_rss_mib(["inspect", str(plain)], env)
    assert base_code == 0
    code, peak, err = _peak_rss_mib(["inspect", str(bomb)], env)
    assert code == 2
    assert err == f"planner: error: {bomb}: decompresses to more than 256 MiB (a gzip bomb? " + (
        "raise PLANNER_MAX_DECOMPRESSED to allow it)\n"
    )
    assert peak < baseline + 48, (peak, baseline)  # 256 MiB inflated, a few pieces held


def test_a_kineto_file_with_no_event_boundary_is_refused_without_a_whole_read(
    tmp_path: Path,
) -> None:
    source = tmp_path / "rank0.pt.trace.json.gz"  # 96 MiB of NULs after the event bracket
    source.write_bytes(_gzip_of(b'{"schemaVersion": 1, "traceEvents": [{"a": "', b"\0", 96))
    code, peak, err = _peak_rss_mib(["inspect", str(source)], {"PLANNER_MAX_GZIP_RATIO": "99999"})
    assert code == 2 and err.startswith(f"planner: error: {source}: invalid JSON"), err
    assert peak < 600, peak  # the 64 MiB stretch once, never the whole 96 MiB document twice


def test_a_kineto_file_of_padding_is_refused_without_a_whole_read(tmp_path: Path) -> None:
    source = tmp_path / "rank0.pt.trace.json.gz"  # 200 MiB of spaces, then nothing
    source.write_bytes(_gzip_of(b'{"schemaVersion": 1, "traceEvents": [', b" ", 200))
    env = {"PLANNER_MAX_DOCUMENT": str(100 << 20), "PLANNER_MAX_GZIP_RATIO": "100000"}
    code, _, err = _peak_rss_mib(["inspect", str(source)], env)
    assert code == 2
    assert "the limit for inputs read whole (raise PLANNER_MAX_DOCUMENT" in err, err


def test_a_bomb_at_the_default_limits_is_refused_from_its_ratio_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("PLANNER_MAX_DECOMPRESSED", "PLANNER_MAX_DOCUMENT", "PLANNER_MAX_GZIP_RATIO"):
        monkeypatch.delenv(name, raising=False)
    bomb = tmp_path / "rank0.pt.trace.json.gz"  # 160 MiB from 160 KB: about 1000x
    bomb.write_bytes(_gzip_of(b'{"schemaVersion": 1, "traceEvents": [', b" ", 160))
    line = _refused(["inspect", bomb], capsys, bomb, "raise PLANNER_MAX_GZIP_RATIO to allow it")
    assert "inflates more than 200 times (64" in line  # stopped at 64 MiB, not at 8 GiB
    real = need(RESNET / "et_rank0.json.gz")  # 32x: the most compressible shared trace here
    monkeypatch.setenv("PLANNER_MAX_GZIP_RATIO", "33")
    monkeypatch.setattr(files, "RATIO_FLOOR", 1 << 20)
    assert sum(len(c) for c in files.iter_content(real)) > 2 << 20
    monkeypatch.setenv("PLANNER_MAX_GZIP_RATIO", "20")
    with pytest.raises(files.InputError, match="inflates more than 20 times"):
        list(files.iter_content(real))


# ------------------------------------------------------------- nesting and numbers


def test_deeply_nested_json_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "trace.json"
    plain.write_text("[" * 100_000 + "]" * 100_000)
    _refused(["inspect", plain], capsys, plain, "nested too deeply")
    kineto = tmp_path / "rank0.pt.trace.json"
    kineto.write_text('{"schemaVersion": 1, "traceEvents": [' + "[" * 100_000 + "]" * 100_000)
    _refused(["inspect", kineto], capsys, kineto, "invalid JSON")
    deep = tmp_path / "deep.json"
    nested = '"notes": [' + "[" * 5000 + "]" * 5000 + ","
    deep.write_text(_planner_doc().replace('"notes": [', nested, 1))
    _refused(["inspect", deep], capsys, deep, "nested too deeply")


def test_a_pbtxt_attr_value_nested_20000_deep_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    depth = 20_000
    text = (
        'node { name: "a" op: "NoOp" attr { key: "f" value { '
        + 'func { name: "x" attr { key: "k" value { ' * depth
        + "i: 1"
        + " } } }" * depth
        + " } } }\n"
    )
    source = tmp_path / "graph.pbtxt"
    source.write_text(text)
    _refused(["inspect", source], capsys, source, "nested too deeply")


def _resnet_with_input_dims(value: str) -> str:
    text = gzip.decompress((need(RESNET) / "rank0.json.gz").read_bytes()).decode()
    found = re.search(r'"name": "aten::conv2d".{0,600}?"Input Dims": (\[\[.*?\]\])', text, re.S)
    assert found
    return text[: found.start(1)] + value + text[found.end(1) :]


@pytest.mark.parametrize(
    "dims, problem",
    [
        ("[" * 600 + "1" + "]" * 600, "nested more than 3 levels deep"),
        ("[[1e30]]", "holds a float (1e+30) where a size belongs"),
        ("[[null]]", "holds null"),
        ("[[-7, 3]]", "holds the size -7, out of range"),
        ("[[4294967296, 4294967296, 4294967296]]", "elements, over 1 PiB"),
        ("[[1, [2]]]", "mixes sizes and lists"),
        ('"3x3"', "is not a list"),
    ],
)
def test_input_dims_that_are_no_shapes_are_refused(
    dims: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "rank0.json"
    source.write_text(_resnet_with_input_dims(dims))
    line = _refused(["inspect", source], capsys, source, problem)
    assert "'Input Dims' of a aten::conv2d event" in line


def test_an_iteration_number_of_10_to_the_40_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _hta()
    step = next(e for e in doc["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#"))
    step["name"] = f"ProfilerStep#{10**40}"
    source = tmp_path / "rank0.json"
    source.write_text(json.dumps(doc))
    _refused(["inspect", source], capsys, source, "is no step marker")


def test_lone_surrogates_in_names_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planner_doc = json.loads(_planner_doc())
    name = planner_doc["ranks"][0]["ops"][0]["name"]
    text = _planner_doc().replace(json.dumps(name), json.dumps(name)[:-1] + '\\udc80"')
    source = tmp_path / "trace.json"
    source.write_text(text)
    line = _refused(["analyze", source, "-o", tmp_path / "out"], capsys, source, "lone surrogate")
    assert line.isascii()
    assert not (tmp_path / "out").exists()
    doc = _hta()
    op = next(e for e in doc["traceEvents"] if e.get("ph") == "X")
    kineto = tmp_path / "rank0.json"
    kineto.write_text(json.dumps(doc).replace(json.dumps(op["name"]), '"bad\\udc80name"', 1))
    _refused(["inspect", kineto], capsys, kineto, "invalid JSON", "surrogate")
    raw = tmp_path / "raw.json"  # the surrogate as (invalid) UTF-8 bytes, not an escape
    raw.write_bytes(text.replace("\\udc80", "").encode().replace(b"}", b"\xed\xb2\x80}", 1))
    _refused(["inspect", raw], capsys, raw, "invalid JSON")


# ------------------------------------------------------------- inputs wrong together


def test_a_truncated_rank_file_in_a_directory_is_an_error_not_a_dropped_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need(RESNET)
    (tmp_path / "rank0.json.gz").write_bytes((RESNET / "rank0.json.gz").read_bytes())
    whole = (RESNET / "rank1.json.gz").read_bytes()
    (tmp_path / "rank1.json.gz").write_bytes(whole[: len(whole) // 2])
    args = ["metrics", tmp_path, "--min-efficiency", "0.01"]
    _refused(args, capsys, tmp_path / "rank1.json.gz", "broken gzip data")
    (tmp_path / "rank1.json.gz").write_bytes(b"")
    _refused(args, capsys, tmp_path / "rank1.json.gz", "file is empty")
    (tmp_path / "rank1.json.gz").write_bytes(whole)
    assert run_cli(args, capsys)[0] == 0  # both ranks whole: the gate runs


def test_ranks_of_two_different_jobs_are_refused_naming_the_difference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    first, second = need(RESNET) / "rank0.json.gz", need(TRANSFORMER) / "rank1.json.gz"
    line = _refused(["inspect", first, second], capsys, second, f"not from the same job as {first}")
    assert "collectives differ (rank1: 2 all_reduce; rank0: 2 all_reduce, 2 broadcast)" in line
    ok, _, err = run_cli(["inspect", RESNET / "rank0.json.gz", RESNET / "rank1.json.gz"], capsys)
    assert ok == 0, err


def test_two_ranks_of_one_job_whose_all_reduce_sizes_differ_are_one_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """HTA's ``trace_filter``: ranks 0 and 1 of one 128-rank NCCL job, their
    ``ProfilerStep#551`` starting 0.2 ms apart. In the same two steps rank 0
    all-reduces 105 and 108 MB and rank 1 78 and 105 MB: the sizes are no job's
    signature, and comparing them refused this job. Both ranks call the same
    collectives (2 all_reduce, 2 all_to_all, 1 all_gather), and load as one job."""
    folder = need(HTA_DATA / "trace_filter")
    starts = []
    for rank in (0, 1):
        raw = json.loads(gzip.decompress((folder / f"sampled_rank-{rank}.json.gz").read_bytes()))
        assert raw["distributedInfo"]["world_size"] == 128
        starts.append(min(e["ts"] for e in raw["traceEvents"]
                          if e.get("name") == "ProfilerStep#551"))  # fmt: skip
    assert abs(starts[0] - starts[1]) < 1000  # us
    from planner.ingest import detect

    job = detect.load([folder])
    assert job.ranks == ["rank0", "rank1"]
    sizes = {
        rank: sorted(op.nbytes for name, op in job.graphs[rank].ops.items()
                     if name.startswith("net/all_reduce"))
        for rank in job.ranks
    }  # fmt: skip
    assert sizes["rank0"] != sizes["rank1"]
    code, _, err = run_cli(["metrics", folder, "--json"], capsys)
    assert code == 0, err


@pytest.mark.parametrize("world_size, words", [(0, "must be >= 1"), (-2, "must be >= 1"),
                                               (1, "is not below world_size 1")])  # fmt: skip
def test_a_world_size_that_cannot_hold_the_rank_is_refused(
    world_size: int, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _hta()  # rank 1
    doc["distributedInfo"] = {**doc["distributedInfo"], "world_size": world_size}
    source = tmp_path / "rank1.json"
    source.write_text(json.dumps(doc))
    _refused(["inspect", source], capsys, source, words)


def test_a_run_metadata_copied_under_another_name_is_one_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for step in (3, 4):
        data = (DEMO / f"run_metadata_step{step}.pb").read_bytes()
        (tmp_path / f"run_metadata_step{step}.pb").write_bytes(data)
    (tmp_path / "run_metadata_step9.pb").write_bytes((DEMO / "run_metadata_step3.pb").read_bytes())
    code, out, err = run_cli(["metrics", tmp_path, "--json"], capsys)
    assert code == 0, err
    assert [(s["rank"], s["iteration"]) for s in json.loads(out)["steps"]] == [
        ("worker0", 3),
        ("worker0", 4),
    ]
    code, out, err = run_cli(["inspect", tmp_path], capsys)
    assert code == 0, err
    copy, original = tmp_path / "run_metadata_step9.pb", tmp_path / "run_metadata_step3.pb"
    note = f"ignored {copy}: the same RunMetadata as {original}"
    assert "".join(note.split()) in "".join((out + err).split())  # rich wraps long lines


def test_a_command_that_cannot_run_on_an_input_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = need(SHARED / "generated" / "tf" / "cnn_ps_ingraph" / "graph.pb")
    _refused(["simulate", graph], capsys, graph, "simulation needs timings")
    _refused(["metrics", graph], capsys, graph, "metrics need timings")


def test_limits_are_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_MAX_DOCUMENT", "0")
    with pytest.raises(files.InputError, match="must be positive"):
        files.max_document()
    monkeypatch.setenv("PLANNER_MAX_DOCUMENT", "4096")
    assert files.max_document() == 4096
    assert files.MAX_DOCUMENT == 1 << 30
