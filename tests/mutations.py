"""Seeded mutation corpus: broken inputs derived from the real traces.

`build_corpus(seed)` returns the cases (in memory); `Case.write(dir)` puts one on disk.
Each is broken in a way a reader can detect (truncation inside a record,
a cycle, a negative size, ...); inputs that a mutation would leave valid are built as
`valid=True` cases, so nothing still valid is counted as broken. Bases: the repo's
traces/ (always there) and ../shared/traces (used when present).

Rerun with another seed: ``PLANNER_CORPUS_SEED=7 pytest tests/test_corpus.py``.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
DEMO = REPO / "traces" / "demo"
HTA = REPO / "traces" / "torch" / "hta_trace_compare_base.json.gz"
TF_CNN = SHARED / "generated" / "tf" / "cnn_ps_ingraph"
TORCH_RESNET = REPO / "traces" / "torch" / "resnet_ddp"


@dataclass(frozen=True)
class Case:
    """One corpus input, held in memory: files (relative path -> bytes), what to pass.

    `inputs` and `blame` are relative paths ("." = the case's folder); one of `blame`
    must be named on stderr. `valid` cases must succeed instead.
    """

    name: str
    family: str
    files: dict[str, bytes]
    inputs: tuple[str, ...]
    blame: tuple[str, ...] = ()
    valid: bool = False
    xfail: str | None = None
    special: tuple[tuple[str, str], ...] = ()
    """(relative path, what): ``fifo``, ``socket``, ``sparse:<bytes>`` or ``link:<target>``."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment for the run (lower limits, so a bomb stays small)."""
    output: str = ""
    """What `-o` names: "" a fresh path; ``file`` an existing file; ``below-file`` a path
    under an existing file (then `-o` itself is the culprit)."""
    heavy: bool = False
    """Only for bench/fuzz_ingest.py (default limits, GiBs to inflate), not the tests."""
    group: str = "base"
    """The corpus class (`GROUPS`): ``base``, ``numbers``, ``encoding`` or ``multirank``."""
    pooled: bool = False
    """Several rank files: the bench runs each command with `-j 1` and `-j 2` and compares."""
    algorithm: str = "caramel"
    """`schedule -a` for the bench (``tac`` for parameter-server inputs)."""

    def write(self, root: Path) -> tuple[list[Path], list[Path]]:
        """Write the files under `root` (created); the input and culprit paths."""
        root.mkdir(parents=True, exist_ok=True)
        for relative, content in self.files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        for relative, what in self.special:
            _make_special(root / relative, what)
        place = [root if p == "." else root / p for p in self.inputs]
        return place, [root if p == "." else root / p for p in self.blame]

    def output_path(self, work: Path) -> tuple[Path, bytes | None]:
        """The `-o` path for a run in `work`, and the bytes that must stay there (or None)."""
        if not self.output:
            return work / "out", None
        taken = work / "taken.txt"
        taken.parent.mkdir(parents=True, exist_ok=True)
        taken.write_bytes(b"an earlier file the planner must not touch\n")
        return (taken if self.output == "file" else taken / "out"), taken.read_bytes()


def _make_special(path: Path, what: str) -> None:
    """Create a FIFO, a listening-free socket file, a sparse file or a symlink at `path`."""
    import os
    import socket

    path.parent.mkdir(parents=True, exist_ok=True)
    if what == "fifo":
        os.mkfifo(path)
    elif what == "socket":
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.bind(str(path))
        finally:
            sock.close()
    elif what.startswith("sparse:"):
        with path.open("r+b" if path.exists() else "wb") as handle:
            handle.truncate(int(what.split(":", 1)[1]))
    elif what.startswith("link:"):
        path.symlink_to(what.split(":", 1)[1])
    else:
        raise ValueError(what)


@dataclass
class Corpus:
    """Collects cases; names are unique (a numbered prefix keeps the order)."""

    rng: random.Random
    cases: list[Case] = field(default_factory=list)
    heavy: bool = False  # also build the cases only bench/fuzz_ingest.py runs
    group: str = "base"  # the class of the family being built (set by build_corpus)
    start: int = 0  # the first number of the group's cases (names stay stable per group)

    def _add(self, case: Case) -> Case:
        xfail = case.xfail or known_gap(case.name, self.group)
        number = self.start + len(self.cases)
        named = replace(case, name=f"{number:03d}-{case.name}", xfail=xfail, group=self.group)
        self.cases.append(named)
        return named

    def case(self, case: Case) -> Case:
        """Any case, with the fields the helpers below do not set."""
        return self._add(case)

    def file(
        self,
        family: str,
        name: str,
        filename: str,
        content: bytes,
        valid: bool = False,
        xfail: str | None = None,
    ) -> Case:
        """A case of one file."""
        blame = () if valid else (filename,)
        return self._add(Case(name, family, {filename: content}, (filename,), blame, valid, xfail))

    def files(
        self,
        family: str,
        name: str,
        contents: dict[str, bytes],
        blame: tuple[str, ...],
        give_dir: bool = False,
        xfail: str | None = None,
        valid: bool = False,
    ) -> Case:
        """A case of several files (or their folder); `blame` names the acceptable culprits."""
        inputs = (".",) if give_dir else tuple(contents)
        return self._add(Case(name, family, dict(contents), inputs, blame, valid, xfail))


#: Case name -> why it fails today (a strict xfail); empty: every known Kineto gap is fixed.
KNOWN_KINETO_BUGS: dict[str, str] = {}

_NUMBER_GAPS: dict[str, str] = {}
"""The numbers class's gaps (`planner inspect`), strict xfails in
tests/test_corpus_classes.py; empty: every id, size and rank past int64 is refused in one
line and an integer of 5000 digits in a field that is a name or unused is read
(`planner.ingest.exact_json`). The encoding class has none left either: every name that
is not UTF-8 is read escaped."""


def known_gap(name: str, group: str) -> str | None:
    """Why case `name` (unnumbered) of class `group` fails today, or None."""
    if group == "numbers":
        return _NUMBER_GAPS.get(name)
    return KNOWN_KINETO_BUGS.get(name)


# ---------------------------------------------------------------- bases (real traces)


@cache
def _demo_bytes() -> bytes:
    return (DEMO / "run_metadata_step3.pb").read_bytes()


@cache
def _planner_doc() -> str:
    """The demo's steps 3 and 4 as a planner JSON trace (written by the planner itself)."""
    from planner.export.files import dumps
    from planner.ingest import detect, planner_json

    job = detect.load([DEMO / "run_metadata_step3.pb", DEMO / "run_metadata_step4.pb"])
    return dumps(planner_json.to_document(job))


@cache
def _hta_text() -> str:
    return gzip.decompress(HTA.read_bytes()).decode()


@cache
def _resnet_text() -> str:
    return gzip.decompress((TORCH_RESNET / "rank0.json.gz").read_bytes()).decode()


def _gz(data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return gzip.compress(raw, mtime=0)


def _js(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def field_boundaries(data: bytes) -> set[int]:
    """Offsets between the top-level fields of a protobuf message (a cut there parses)."""
    pos, out = 0, {0}
    while pos < len(data):
        key, pos = _varint(data, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            pos += size
        elif wire == 5:
            pos += 4
        else:
            break
        out.add(pos)
    return out


def _cuts(rng: random.Random, data: bytes, count: int, avoid: set[int]) -> list[int]:
    """`count` distinct cut points strictly inside `data`, none in `avoid`."""
    cuts: set[int] = {1, len(data) // 2, len(data) - 1} - avoid
    while len(cuts) < count:
        cut = rng.randrange(1, len(data))
        if cut not in avoid:
            cuts.add(cut)
    return sorted(cuts)[:count]


def _json_cuts(rng: random.Random, text: str, count: int) -> list[int]:
    """Cut points that leave JSON unparsable (checked, so never a valid prefix)."""
    cuts: list[int] = []
    while len(cuts) < count:
        cut = rng.randrange(1, len(text) - 1)
        try:
            json.loads(text[:cut])
        except ValueError:
            cuts.append(cut)
    return cuts


# ---------------------------------------------------------------- families


def empty_and_garbage(c: Corpus) -> None:
    """Empty files and folders, whitespace, binary garbage and text with a trace suffix."""
    for suffix in (".pb", ".pbtxt", ".json", ".json.gz", ".pt.trace.json", ".gz"):
        c.file("empty", f"empty{suffix}", f"trace{suffix}", b"")
    c.file("empty", "blank.json", "trace.json", b"  \n\t \n")
    c.file("empty", "empty-gzip-stream", "rank0.json.gz", _gz(b""))
    c.file("empty", "gzip-of-blank", "rank0.json.gz", _gz(b"   \n"))
    c.file("empty", "empty-object", "trace.json", b"{}")
    c.file("empty", "empty-list", "trace.json", b"[]")
    c.file("empty", "json-null", "trace.json", b"null")
    c.files("empty", "empty-dir", {}, blame=(".",), give_dir=True)
    c.files("empty", "dir-no-traces", {"notes.txt": b"hello"}, blame=(".",), give_dir=True)
    c.files("empty", "dir-only-meta", {"meta.json": b'{"a": 1}'}, blame=(".",), give_dir=True)
    c.files(
        "empty",
        "dir-empty-pb",
        {"run_metadata_step3.pb": b""},
        blame=(".", "run_metadata_step3.pb"),
        give_dir=True,
    )
    for i in range(8):
        size = c.rng.choice((3, 17, 512, 4096, 65537))
        junk = c.rng.randbytes(size)
        suffix = (".pb", ".json", ".json.gz", ".pbtxt")[i % 4]
        if suffix == ".json":
            junk = b"{" + junk
        elif suffix == ".json.gz":
            junk = b"\x1f\x8b" + junk
        c.file("garbage", f"random-{i}{suffix}", f"trace{suffix}", junk)
    c.file("garbage", "gzip-of-garbage", "rank0.json.gz", _gz(c.rng.randbytes(2048)))
    c.file("garbage", "gzip-of-gzip-garbage", "trace.pb.gz", _gz(_gz(c.rng.randbytes(64))))
    c.file("garbage", "text-as-pb", "graph.pb", b"this is a README, not a graph\n")
    c.file("garbage", "html-as-json", "trace.json", b"<html><body>404</body></html>")
    c.file("garbage", "png-as-pb", "graph.pb", b"\x89PNG\r\n\x1a\n" + c.rng.randbytes(200))
    c.file("garbage", "zip-as-gz", "rank0.json.gz", b"PK\x03\x04" + c.rng.randbytes(200))
    c.file("garbage", "nul-bytes.pbtxt", "graph.pbtxt", b"\x00" * 300)


def tf_run_metadata(c: Corpus) -> None:
    """Truncated and semantically broken RunMetadata (the repo's demo, and shared runs)."""
    from planner.ingest.proto import tf_subset_pb2 as tfpb

    data = _demo_bytes()
    for cut in _cuts(c.rng, data, 10, field_boundaries(data)):
        c.file("truncated-protobuf", f"rm-cut-{cut}", "run_metadata_step3.pb", data[:cut])
    cut = _cuts(c.rng, data, 1, field_boundaries(data))[0]
    c.file("truncated-gzip", "rm-gz-cut", "run_metadata_step3.pb.gz", _gz(data)[: cut // 3])
    for i in range(3):  # flipped bytes inside the first top-level field's length prefix region
        damaged = bytearray(data)
        damaged[1 + i] = 0xFF
        c.file("garbage", f"rm-bad-length-{i}", "run_metadata_step3.pb", bytes(damaged))

    def variant(name: str, family: str, edit: Callable[[Any], None]) -> None:
        run = tfpb.RunMetadata()
        run.ParseFromString(data)
        edit(run)
        c.file(family, name, "run_metadata_step3.pb", run.SerializeToString())

    def worker_stats(run: Any) -> list[Any]:
        return [
            ns
            for dev in run.step_stats.dev_stats
            if "worker" in dev.device
            for ns in dev.node_stats
            if ns.node_name != "RecvTensor"
        ]

    def recv_records(run: Any) -> list[Any]:
        stats = [ns for dev in run.step_stats.dev_stats for ns in dev.node_stats]
        return [ns for ns in stats if ns.node_name == "RecvTensor"]

    def worker_partition(run: Any) -> Any:
        return next(g for g in run.partition_graphs if "worker" in g.node[0].device)

    variant("rm-no-step-stats", "missing-field", lambda r: r.ClearField("step_stats"))
    variant("rm-no-partitions", "missing-field", lambda r: r.ClearField("partition_graphs"))
    variant(
        "rm-no-worker-partition",
        "mismatched-ranks",
        lambda r: r.partition_graphs.remove(worker_partition(r)),
    )

    def no_worker_stats(run: Any) -> None:
        for dev in run.step_stats.dev_stats:
            if "worker" in dev.device:
                del dev.node_stats[:]

    variant("rm-no-worker-node-stats", "missing-field", no_worker_stats)

    def negative_duration(run: Any) -> None:
        stats = c.rng.choice(worker_stats(run))
        stats.all_end_rel_micros, stats.all_end_rel_nanos = -5000, -5_000_000

    for i in range(2):
        variant(f"rm-negative-duration-{i}", "negative-huge", negative_duration)

    def negative_start(run: Any) -> None:
        stats = c.rng.choice(worker_stats(run))
        stats.all_start_micros, stats.all_start_nanos = -(10**12), -(10**15)

    variant("rm-negative-start", "negative-huge", negative_start)

    def huge_duration(run: Any) -> None:
        stats = c.rng.choice(worker_stats(run))  # 31 years
        stats.all_end_rel_micros, stats.all_end_rel_nanos = 10**15, 10**18

    variant("rm-huge-duration", "negative-huge", huge_duration)

    def huge_start(run: Any) -> None:
        stats = c.rng.choice(worker_stats(run))
        stats.all_start_micros, stats.all_start_nanos = 2**52, 2**62

    variant("rm-huge-start", "negative-huge", huge_start)

    def bytes_to(value: int) -> Callable[[Any], None]:
        def edit(run: Any) -> None:
            for ns in recv_records(run):
                for out in ns.output:
                    out.tensor_description.allocation_description.requested_bytes = value

        return edit

    variant("rm-negative-bytes", "negative-huge", bytes_to(-4096))
    variant("rm-huge-bytes", "negative-huge", bytes_to(2**62))

    def cycle(run: Any) -> None:
        graph = worker_partition(run)
        names = {n.name for n in graph.node}
        while True:
            node = c.rng.choice(list(graph.node))
            inputs = [i.lstrip("^").split(":")[0] for i in node.input]
            inputs = [i for i in inputs if i in names]
            if inputs:
                break
        source = next(n for n in graph.node if n.name == inputs[0])
        source.input.append(f"^{node.name}")

    for i in range(3):
        variant(f"rm-cycle-{i}", "cycle", cycle)

    def self_loop(run: Any) -> None:
        node = c.rng.choice(list(worker_partition(run).node))
        node.input.append(f"^{node.name}")

    variant("rm-self-loop", "cycle", self_loop)

    def dangling(run: Any) -> None:
        c.rng.choice(list(worker_partition(run).node)).input.append("no/such/node:0")

    variant("rm-unknown-input", "missing-field", dangling)

    def unnamed(run: Any) -> None:
        c.rng.choice(list(worker_partition(run).node)).name = ""

    variant("rm-unnamed-node", "missing-field", unnamed)

    run = tfpb.RunMetadata()
    run.ParseFromString(data)
    for node in worker_partition(run).node:  # bytes that are not UTF-8 (found by fuzzing)
        if node.op == "_Recv":
            node.attr["tensor_name"].s = b"\xa6\xff" + node.attr["tensor_name"].s
            node.attr["send_device"].s = b"\xa6" + node.attr["send_device"].s
    c.file(
        "valid", "rm-non-utf8-attrs", "run_metadata_step3.pb", run.SerializeToString(), valid=True
    )

    step4 = (DEMO / "run_metadata_step4.pb").read_bytes()
    c.files(
        "duplicate-steps",
        "rm-same-step-twice",
        {"a/run_metadata_step3.pb": data, "b/run_metadata_step3.pb": step4},
        blame=("a/run_metadata_step3.pb", "b/run_metadata_step3.pb"),
    )
    c.files(
        "duplicate-steps",
        "rm-same-number-in-dir",
        {"run_metadata_step3.pb": data, "run_metadata_step03.pb": step4},
        blame=("run_metadata_step3.pb", "run_metadata_step03.pb"),
        give_dir=True,
    )
    if TF_CNN.exists():
        other = (TF_CNN / "run_metadata_step4.pb").read_bytes()
        c.files(
            "mismatched-ranks",
            "rm-two-jobs",
            {"run_metadata_step3.pb": data, "run_metadata_step4.pb": other},
            blame=("run_metadata_step4.pb", "run_metadata_step3.pb"),
        )
        c.files(
            "mismatched-ranks",
            "rm-with-planner-json",
            {"run_metadata_step3.pb": data, "trace.json": _planner_doc().encode()},
            blame=("run_metadata_step3.pb", "trace.json"),
        )


def tf_graphdef(c: Corpus) -> None:
    """Truncated, cyclic and dangling client GraphDefs (binary and text)."""
    if not TF_CNN.exists():
        return
    from planner.ingest.proto import tf_subset_pb2 as tfpb

    data = (TF_CNN / "graph.pb").read_bytes()
    for cut in _cuts(c.rng, data, 6, field_boundaries(data)):
        c.file("truncated-protobuf", f"graph-cut-{cut}", "graph.pb", data[:cut])
    text = (TF_CNN / "graph.pbtxt").read_text()
    cuts = 0
    while cuts < 6:
        cut = c.rng.randrange(10, len(text) - 10)
        if text[:cut].count("{") != text[:cut].count("}"):  # inside a node: never parses
            c.file("truncated-text", f"pbtxt-cut-{cut}", "graph.pbtxt", text[:cut].encode())
            cuts += 1
    c.file(
        "invalid-text",
        "pbtxt-bad-token",
        "graph.pbtxt",
        text.replace("node {", "node [", 1).encode(),
    )
    c.file("invalid-text", "pbtxt-unknown-field", "graph.pbtxt", ("colour: 3\n" + text).encode())

    def variant(name: str, family: str, edit: Callable[[Any], None], text_form: bool) -> None:
        from google.protobuf import text_format

        graph = tfpb.GraphDef()
        graph.ParseFromString(data)
        edit(graph)
        if text_form:
            c.file(
                family, name + "-txt", "graph.pbtxt", text_format.MessageToString(graph).encode()
            )
        else:
            c.file(family, name, "graph.pb", graph.SerializeToString())

    def cycle(graph: Any) -> None:
        names = {n.name: n for n in graph.node}
        while True:
            node = c.rng.choice(list(graph.node))
            inputs = [i.lstrip("^").split(":")[0] for i in node.input]
            same = [
                i
                for i in inputs
                if i in names and names[i].device == node.device and "/job:ps" not in node.device
            ]
            if same:
                break
        names[same[0]].input.append(f"^{node.name}")

    def dangling(graph: Any) -> None:
        c.rng.choice(list(graph.node)).input.append("missing_node:0")

    def no_op(graph: Any) -> None:
        c.rng.choice(list(graph.node)).op = ""

    for text_form in (False, True):
        variant("graph-cycle", "cycle", cycle, text_form)
        variant("graph-unknown-input", "missing-field", dangling, text_form)
        variant("graph-node-without-op", "missing-field", no_op, text_form)
    variant("graph-no-nodes", "missing-field", lambda g: g.ClearField("node"), False)


def planner_json(c: Corpus) -> None:
    """The planner JSON trace: invalid JSON, missing and mistyped fields, bad values."""
    text = _planner_doc()
    base = json.loads(text)
    for cut in _json_cuts(c.rng, text, 6):
        c.file("invalid-json", f"pj-cut-{cut}", "trace.json", text[:cut].encode())
    c.file("invalid-json", "pj-trailing-garbage", "trace.json", (text + "}{").encode())
    c.file("invalid-json", "pj-single-quotes", "trace.json", text.replace('"', "'").encode())
    c.file("invalid-json", "pj-comment", "trace.json", ("// planner\n" + text).encode())
    c.file(
        "invalid-json", "pj-latin1", "trace.json", text.replace("}", "\xe9}", 1).encode("latin-1")
    )
    c.file("truncated-gzip", "pj-gz-cut", "trace.json.gz", _gz(text)[:-9])
    c.file("truncated-gzip", "pj-gz-no-trailer", "trace.json.gz", _gz(text)[:-4])

    def variant(name: str, family: str, edit: Callable[[dict[str, Any]], None]) -> None:
        doc = copy.deepcopy(base)
        edit(doc)
        c.file(family, name, "trace.json", _js(doc))

    rank = base["ranks"][0]
    ops = [op["name"] for op in rank["ops"]]
    timed = [name for name in ops if name in rank["iterations"][0]["ops"]]

    def pick_op(doc: dict[str, Any]) -> dict[str, Any]:
        return c.rng.choice(doc["ranks"][0]["ops"])

    def pick_timing(doc: dict[str, Any]) -> list[float]:
        return doc["ranks"][0]["iterations"][0]["ops"][c.rng.choice(timed)]

    def first_it(doc: dict[str, Any]) -> dict[str, Any]:
        return doc["ranks"][0]["iterations"][0]

    def transfer(doc: dict[str, Any]) -> dict[str, Any]:
        return c.rng.choice([op for op in doc["ranks"][0]["ops"] if op["kind"] == "recv"])

    def setter(target: Callable[[dict[str, Any]], Any], key: Any, value: Any) -> Callable:
        def edit(doc: dict[str, Any]) -> None:
            target(doc)[key] = value

        return edit

    def deleter(target: Callable[[dict[str, Any]], Any], key: Any) -> Callable:
        def edit(doc: dict[str, Any]) -> None:
            del target(doc)[key]

        return edit

    def rank0(doc: dict[str, Any]) -> dict[str, Any]:
        return doc["ranks"][0]

    # missing fields
    variant("pj-no-schema", "missing-field", deleter(lambda d: d, "schema"))
    variant("pj-no-ranks", "missing-field", deleter(lambda d: d, "ranks"))
    variant("pj-no-rank-name", "missing-field", deleter(rank0, "rank"))
    variant("pj-no-ops", "missing-field", deleter(rank0, "ops"))
    for i in range(3):
        variant(f"pj-op-no-name-{i}", "missing-field", deleter(pick_op, "name"))
    for key in ("iteration", "start", "duration"):
        variant(f"pj-iteration-no-{key}", "missing-field", deleter(first_it, key))
    variant("pj-timing-one-value", "missing-field", lambda d: pick_timing(d).pop())
    variant("pj-ranks-empty", "missing-field", setter(lambda d: d, "ranks", []))
    variant("pj-rank-name-empty", "missing-field", setter(rank0, "rank", ""))
    variant("pj-op-name-empty", "missing-field", setter(pick_op, "name", ""))

    def drop_op_keep_edges(doc: dict[str, Any]) -> None:
        edge = c.rng.choice(doc["ranks"][0]["edges"])
        doc["ranks"][0]["ops"] = [o for o in doc["ranks"][0]["ops"] if o["name"] != edge[0]]
        for it in doc["ranks"][0]["iterations"]:
            it["ops"].pop(edge[0], None)

    variant("pj-edge-to-unknown-op", "missing-field", drop_op_keep_edges)

    def time_unknown_op(doc: dict[str, Any]) -> None:
        first_it(doc)["ops"]["no/such/op"] = [0.0, 0.001]

    variant("pj-times-unknown-op", "missing-field", time_unknown_op)
    # mistyped fields
    mistyped: list[tuple[str, Callable[[dict[str, Any]], Any], Any, Any]] = [
        ("ranks-dict", lambda d: d, "ranks", {}),
        ("ranks-string", lambda d: d, "ranks", "worker0"),
        ("schema-number", lambda d: d, "schema", 1),
        ("schema-version-2", lambda d: d, "schema", "planner.trace/2"),
        ("origin-float", lambda d: d, "origin_ns", 1.5e18),
        ("origin-string", lambda d: d, "origin_ns", "1795303818272004225"),
        ("rank-number", rank0, "rank", 0),
        ("ops-dict", rank0, "ops", {}),
        ("edges-string", rank0, "edges", "a->b"),
        ("iterations-dict", rank0, "iterations", {}),
        ("op-name-number", pick_op, "name", 7),
        ("op-kind-unknown", pick_op, "kind", "teleport"),
        ("op-phase-unknown", pick_op, "phase", "sideways"),
        ("op-nbytes-string", pick_op, "nbytes", "1024"),
        ("op-nbytes-float", pick_op, "nbytes", 1024.5),
        ("op-nbytes-bool", pick_op, "nbytes", True),
        ("op-resource-list", pick_op, "resource", ["cpu"]),
        ("op-param-number", transfer, "param", 3),
        ("op-type-null-dict", pick_op, "type", {"op": "MatMul"}),
        ("iteration-string", first_it, "iteration", "3"),
        ("iteration-float", first_it, "iteration", 3.0),
        ("start-string", first_it, "start", "0.0"),
        ("duration-null", first_it, "duration", None),
        ("duration-bool", first_it, "duration", True),
        ("iteration-ops-list", first_it, "ops", []),
    ]
    for name, target, key, value in mistyped:
        variant(f"pj-{name}", "mistyped-field", setter(target, key, value))

    def timing_to(value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(doc: dict[str, Any]) -> None:
            first_it(doc)["ops"][c.rng.choice(timed)] = value

        return edit

    for name, value in (
        ("string", "0.1"),
        ("number", 0.1),
        ("dict", {"start": 0}),
        ("three", [0, 1, 2]),
    ):
        variant(f"pj-timing-{name}", "mistyped-field", timing_to(value))

    def edge_to(value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(doc: dict[str, Any]) -> None:
            doc["ranks"][0]["edges"][0] = value

        return edit

    for name, value in (
        ("number", 5),
        ("one", ["a"]),
        ("kind", [ops[0], ops[1], "weak"]),
        ("nonstr", [ops[0], 1]),
    ):
        variant(f"pj-edge-{name}", "mistyped-field", edge_to(value))
    # negative / huge values
    for name, value in (
        ("neg", -0.001),
        ("huge", 1e300),
        ("nan", float("nan")),
        ("inf", float("inf")),
    ):

        def op_duration(doc: dict[str, Any], value: Any = value) -> None:
            pick_timing(doc)[1] = value

        variant(f"pj-op-duration-{name}", "negative-huge", op_duration)

        def op_start(doc: dict[str, Any], value: Any = value) -> None:
            pick_timing(doc)[0] = value

        variant(f"pj-op-start-{name}", "negative-huge", op_start)
        variant(
            f"pj-iteration-duration-{name}", "negative-huge", setter(first_it, "duration", value)
        )
        variant(f"pj-iteration-start-{name}", "negative-huge", setter(first_it, "start", value))
    for i, value in enumerate((-1, -(2**40), 2**70, 10**30)):
        variant(f"pj-nbytes-bad-{i}", "negative-huge", setter(transfer, "nbytes", value))
    variant("pj-origin-negative", "negative-huge", setter(lambda d: d, "origin_ns", -(2**80)))
    variant("pj-origin-huge", "negative-huge", setter(lambda d: d, "origin_ns", 2**80))
    variant("pj-op-duration-years", "negative-huge", lambda d: pick_timing(d).__setitem__(1, 3e8))

    # wrong time units: op times in ns or µs where seconds are wanted
    for unit, factor in (("ns", 1e9), ("us", 1e6)):

        def op_units(doc: dict[str, Any], factor: float = factor) -> None:
            for it in doc["ranks"][0]["iterations"]:
                for timing in it["ops"].values():
                    timing[0] *= factor
                    timing[1] *= factor

        variant(f"pj-op-times-in-{unit}", "wrong-units", op_units)

        def all_units(doc: dict[str, Any], factor: float = factor) -> None:
            op_units(doc, factor)
            for it in doc["ranks"][0]["iterations"]:
                it["duration"] *= factor
                it["start"] *= factor

        variant(f"pj-all-times-in-{unit}", "wrong-units", all_units)

    def iteration_ms(doc: dict[str, Any]) -> None:
        for it in doc["ranks"][0]["iterations"]:
            it["duration"] /= 1e3

    variant("pj-iteration-duration-in-ks", "wrong-units", iteration_ms)
    # duplicate / missing step markers
    variant(
        "pj-duplicate-iteration",
        "duplicate-steps",
        lambda d: rank0(d)["iterations"].append(copy.deepcopy(first_it(d))),
    )

    def renumber(doc: dict[str, Any]) -> None:
        its = rank0(doc)["iterations"]
        its[1]["iteration"] = its[0]["iteration"]

    variant("pj-two-iterations-same-number", "duplicate-steps", renumber)
    # cycles
    for i in range(3):

        def back_edge(doc: dict[str, Any]) -> None:
            src, dst, _ = c.rng.choice(doc["ranks"][0]["edges"])
            doc["ranks"][0]["edges"].append([dst, src, "control"])

        variant(f"pj-cycle-{i}", "cycle", back_edge)

    def self_loop(doc: dict[str, Any]) -> None:
        name = c.rng.choice(ops)
        doc["ranks"][0]["edges"].append([name, name, "control"])

    variant("pj-self-loop", "cycle", self_loop)

    def long_cycle(doc: dict[str, Any]) -> None:
        edges = doc["ranks"][0]["edges"]
        succ: dict[str, list[str]] = {}
        for src, dst, _ in edges:
            succ.setdefault(src, []).append(dst)
        node = next(s for s in succ if s in ops)
        path = [node]
        while path[-1] in succ and len(path) < 6:
            path.append(succ[path[-1]][0])
        edges.append([path[-1], path[0], "data"])

    variant("pj-long-cycle", "cycle", long_cycle)
    # mismatched ranks
    variant(
        "pj-duplicate-rank",
        "mismatched-ranks",
        lambda d: d["ranks"].append(copy.deepcopy(rank0(d))),
    )
    c.files(
        "mismatched-ranks",
        "pj-two-documents",
        {"a.json": text.encode(), "b.json": text.encode()},
        blame=("a.json", "b.json"),
    )
    # valid documents that look odd: must be accepted (exit 0), not counted as broken
    c.file("valid", "pj-as-is", "trace.json", text.encode(), valid=True)
    c.file("valid", "pj-gzip", "trace.json.gz", _gz(text), valid=True)

    def scaled(doc: dict[str, Any]) -> None:
        timing = pick_timing(doc)
        timing[1] *= 0.5

    doc = copy.deepcopy(base)
    scaled(doc)
    c.file("valid", "pj-shorter-op", "trace.json", _js(doc), valid=True)
    doc = copy.deepcopy(base)
    doc["notes"].append("../../etc/passwd")
    c.file("valid", "pj-extra-note", "trace.json", _js(doc), valid=True)


def kineto(c: Corpus) -> None:
    """PyTorch profiler traces: the repo's HTA sample, and a shared DDP rank when present."""
    bases = [("hta", _hta_text())]
    if TORCH_RESNET.exists():
        bases.append(("resnet", _resnet_text()))
    for label, text in bases:
        packed = _gz(text)
        for cut in _cuts(c.rng, packed, 4, {0}):
            c.file(
                "truncated-gzip", f"k-{label}-gz-cut-{cut}", "rank0.pt.trace.json.gz", packed[:cut]
            )
        for cut in _json_cuts(c.rng, text, 3):
            c.file(
                "invalid-json", f"k-{label}-cut-{cut}", "rank0.pt.trace.json", text[:cut].encode()
            )
    text = _hta_text()
    base = json.loads(text)

    def variant(
        name: str, family: str, edit: Callable[[dict[str, Any]], None], xfail: str | None = None
    ) -> None:
        doc = copy.deepcopy(base)
        edit(doc)
        c.file(family, name, "rank0.pt.trace.json", _js(doc), xfail=xfail)

    events = base["traceEvents"]
    complete = [i for i, e in enumerate(events) if e.get("ph") == "X"]
    steps = [i for i, e in enumerate(events) if str(e.get("name", "")).startswith("ProfilerStep#")]

    def on_event(index_pool: list[int], key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(doc: dict[str, Any]) -> None:
            doc["traceEvents"][c.rng.choice(index_pool)][key] = value

        return edit

    def drop_key(index_pool: list[int], key: str) -> Callable[[dict[str, Any]], None]:
        def edit(doc: dict[str, Any]) -> None:
            doc["traceEvents"][c.rng.choice(index_pool)].pop(key, None)

        return edit

    variant("k-no-trace-events", "missing-field", lambda d: d.pop("traceEvents"))
    variant("k-trace-events-dict", "mistyped-field", lambda d: d.__setitem__("traceEvents", {}))
    variant("k-trace-events-string", "mistyped-field", lambda d: d.__setitem__("traceEvents", "x"))
    variant(
        "k-event-number", "mistyped-field", lambda d: d["traceEvents"].__setitem__(complete[0], 5)
    )

    def no_complete(doc: dict[str, Any]) -> None:
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "X"]

    variant("k-no-complete-events", "missing-field", no_complete)
    for key in ("ts", "dur", "name"):
        variant(f"k-step-no-{key}", "missing-field", drop_key(steps, key))
    variant("k-event-no-ts", "missing-field", drop_key(complete, "ts"))
    variant("k-event-no-dur", "missing-field", drop_key(complete, "dur"))
    for key, value in (
        ("ts", "soon"),
        ("dur", "long"),
        ("ts", None),
        ("dur", [1]),
        ("name", 5),
        ("args", "x"),
    ):
        variant(
            f"k-event-{key}-{type(value).__name__}",
            "mistyped-field",
            on_event(complete, key, value),
        )
    for key, value in (("ts", "soon"), ("dur", None), ("name", 3)):
        variant(
            f"k-step-{key}-{type(value).__name__}", "mistyped-field", on_event(steps, key, value)
        )
    for name, value in (
        ("neg", -1500),
        ("nan", float("nan")),
        ("inf", float("inf")),
        ("huge", 1e18),
    ):
        variant(f"k-event-dur-{name}", "negative-huge", on_event(complete, "dur", value))
        variant(f"k-step-dur-{name}", "negative-huge", on_event(steps, "dur", value))
    variant("k-event-ts-neg", "negative-huge", on_event(complete, "ts", -1e18))
    variant("k-event-ts-huge", "negative-huge", on_event(complete, "ts", 1e300))

    # A trace without ProfilerStep#N is valid: its steps come from a fallback (with a
    # note), see tests/test_gpu_traces.py. Step ranges that hold no op are not.
    def empty_steps(doc: dict[str, Any]) -> None:
        last = max(float(e.get("ts", 0)) + float(e.get("dur", 0)) for e in doc["traceEvents"]
                   if isinstance(e.get("ts"), (int, float)))  # fmt: skip
        for k, i in enumerate(steps):
            doc["traceEvents"][i]["ts"] = last + 1e6 + 10 * k
            doc["traceEvents"][i]["dur"] = 1

    variant("k-empty-steps", "missing-steps", empty_steps)

    def duplicate_step(doc: dict[str, Any]) -> None:
        doc["traceEvents"].append(copy.deepcopy(doc["traceEvents"][steps[0]]))

    variant("k-duplicate-step-marker", "duplicate-steps", duplicate_step)

    def renumber_step(doc: dict[str, Any]) -> None:
        doc["traceEvents"][steps[1]]["name"] = doc["traceEvents"][steps[0]]["name"]

    variant("k-two-steps-same-number", "duplicate-steps", renumber_step)

    def bad_step_number(doc: dict[str, Any]) -> None:
        doc["traceEvents"][steps[0]]["name"] = "ProfilerStep#x"

    variant("k-step-number-not-int", "mistyped-field", bad_step_number)
    if TORCH_RESNET.exists():
        rank0 = (TORCH_RESNET / "rank0.json.gz").read_bytes()
        rank1 = (TORCH_RESNET / "rank1.json.gz").read_bytes()
        et1 = (TORCH_RESNET / "et_rank1.json.gz").read_bytes()
        c.files(
            "mismatched-ranks",
            "k-same-rank-twice",
            {"rank0.json.gz": rank0, "rank0-copy.json.gz": rank0},
            blame=("rank0.json.gz", "rank0-copy.json.gz"),
        )
        c.files(
            "mismatched-ranks",
            "k-with-wrong-et",
            {"rank0.json.gz": rank0, "et_rank1.json.gz": et1},
            blame=("rank0.json.gz", "et_rank1.json.gz"),
        )
        c.files(
            "mismatched-ranks",
            "k-with-run-metadata",
            {"rank0.json.gz": rank0, "run_metadata_step3.pb": _demo_bytes()},
            blame=("rank0.json.gz", "run_metadata_step3.pb"),
        )
        c.files(
            "mismatched-ranks",
            "k-et-alone",
            {"et_rank1.json.gz": et1},
            blame=("et_rank1.json.gz",),
        )
        et_text = gzip.decompress(et1)
        for cut in _cuts(c.rng, _gz(et_text), 2, {0}):
            c.files(
                "truncated-gzip",
                f"k-et-gz-cut-{cut}",
                {"rank1.json.gz": rank1, "et_rank1.json.gz": _gz(et_text)[:cut]},
                blame=("et_rank1.json.gz",),
            )
        c.files(
            "valid",
            "k-ddp-ranks",
            {"rank0.json.gz": rank0, "rank1.json.gz": rank1},
            blame=(),
            valid=True,
        )
    c.file("valid", "k-hta-as-is", "rank0.pt.trace.json", text.encode(), valid=True)


def _gzip_of(prefix: bytes, filler: bytes, mib: int) -> bytes:
    """`prefix` then `mib` MiB of `filler`, gzipped (about 1000:1: a bomb)."""
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = filler * (1 << 20)
    parts = [packer.compress(prefix), *(packer.compress(block) for _ in range(mib))]
    return b"".join([*parts, packer.flush()])


@cache
def _gib_of_zeros_gz() -> bytes:
    """One gzip member inflating to 1 GiB of NULs (about 1 MB); members concatenate."""
    return _gzip_of(b"", b"\0", 1024)


_SMALL_LIMITS = (
    ("PLANNER_MAX_DECOMPRESSED", str(32 << 20)),
    ("PLANNER_MAX_DOCUMENT", str(16 << 20)),
)


def special_files(c: Corpus) -> None:
    """FIFOs, sockets and devices (refused from `stat`, never opened), and sparse giants."""
    for name in ("rank0.json", "trace.pb", "graph.pbtxt"):
        c.case(
            Case(f"fifo-{name}", "special-file", {}, (name,), (name,), special=((name, "fifo"),))
        )
    c.case(
        Case(
            "socket",
            "special-file",
            {},
            ("trace.json",),
            ("trace.json",),
            special=(("trace.json", "socket"),),
        )
    )
    for device in ("/dev/zero", "/dev/urandom", "/dev/null"):
        name = f"rank0{device.replace('/', '-')}.json.gz"
        c.case(
            Case(
                f"link-to{device.replace('/', '-')}",
                "special-file",
                {},
                (name,),
                (name,),
                special=((name, f"link:{device}"),),
            )
        )
    demo = _demo_bytes()
    c.case(
        Case(
            "fifo-in-a-dir",
            "special-file",
            {"run_metadata_step3.pb": demo},
            (".",),
            ("run_metadata_step4.pb",),
            special=(("run_metadata_step4.pb", "fifo"),),
        )
    )
    c.case(
        Case(
            "sparse-12GiB-pb",
            "limits",
            {"run_metadata_step3.pb": demo},
            ("run_metadata_step3.pb",),
            ("run_metadata_step3.pb",),
            special=(("run_metadata_step3.pb", f"sparse:{12 << 30}"),),
        )
    )


def limits(c: Corpus) -> None:
    """Gzip bombs of every format (under lowered limits) and the whole-read limit."""
    kineto_head = b'{"schemaVersion": 1, "traceEvents": ['
    bombs = {
        "kineto-spaces": ("rank0.pt.trace.json.gz", kineto_head, b" "),
        "kineto-nuls": ("rank0.pt.trace.json.gz", kineto_head + b'{"name": "', b"\0"),
        "kineto-brackets": ("rank0.pt.trace.json.gz", kineto_head, b"["),
        "planner-json": ("trace.json.gz", b'{"schema": "planner.trace/1", "notes": ["', b" "),
        "protobuf": ("run_metadata_step3.pb.gz", b"", b"\0"),
        "pbtxt": ("graph.pbtxt.gz", b'node { name: "', b"a"),
    }
    for label, (name, prefix, filler) in bombs.items():
        c.case(
            Case(
                f"bomb-{label}",
                "limits",
                {name: _gzip_of(prefix, filler, 48)},
                (name,),
                (name,),
                env=_SMALL_LIMITS,
            )
        )
    big_pb = _gz(_demo_bytes() * 1)
    env = (("PLANNER_MAX_DOCUMENT", str(len(_demo_bytes()) - 1)),)
    c.case(
        Case(
            "whole-read-limit-pb",
            "limits",
            {"run_metadata_step3.pb.gz": big_pb},
            ("run_metadata_step3.pb.gz",),
            ("run_metadata_step3.pb.gz",),
            env=env,
        )
    )
    c.case(
        Case(
            "bomb-default-limits-ratio",
            "limits",
            {"rank0.pt.trace.json.gz": _gzip_of(kineto_head, b" ", 96)},
            ("rank0.pt.trace.json.gz",),
            ("rank0.pt.trace.json.gz",),
        )
    )
    if not c.heavy:
        return
    # the case at the default limits: 21 MB of gzip inflating to 21 GiB (bench only)
    c.case(
        Case(
            "bomb-21GiB-default-limits",
            "limits",
            {"rank0.pt.trace.json.gz": _gzip_of(kineto_head, b" ", 1) + _gib_of_zeros_gz() * 21},
            ("rank0.pt.trace.json.gz",),
            ("rank0.pt.trace.json.gz",),
            heavy=True,
        )
    )


def nesting_numbers_names(c: Corpus) -> None:
    """Deep nesting, numbers that overflow, lone surrogates and unusable file names."""
    deep = "[" * 100_000 + "]" * 100_000
    c.file("deep-nesting", "json-100k-brackets", "trace.json", deep.encode())
    c.file(
        "deep-nesting",
        "kineto-100k-brackets",
        "rank0.pt.trace.json",
        b'{"schemaVersion": 1, "traceEvents": [' + deep.encode() + b"]}",
    )
    text = _planner_doc()
    nested = '"notes": [' + "[" * 5000 + "]" * 5000 + ","
    c.file(
        "deep-nesting",
        "pj-notes-5000-deep",
        "trace.json",
        text.replace('"notes": [', nested, 1).encode(),
    )
    depth = 20_000
    pbtxt = (
        'node { name: "a" op: "NoOp" attr { key: "f" value { '
        + 'func { name: "x" attr { key: "k" value { ' * depth
        + "i: 1"
        + " } } }" * depth
        + " } } }\n"
    )
    c.file("deep-nesting", "pbtxt-attr-20000-deep", "graph.pbtxt", pbtxt.encode())
    hta = json.loads(_hta_text())
    steps = [
        i
        for i, e in enumerate(hta["traceEvents"])
        if str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    doc = copy.deepcopy(hta)
    doc["traceEvents"][steps[0]]["name"] = f"ProfilerStep#{10**40}"
    c.file("overflow-number", "k-step-10e40", "rank0.pt.trace.json", _js(doc))
    doc = copy.deepcopy(hta)
    doc["traceEvents"][steps[0]]["ts"] = 10**40
    c.file("overflow-number", "k-step-ts-10e40", "rank0.pt.trace.json", _js(doc))
    for label, size in (("zero", 0), ("negative", -3), ("below-rank", 1)):
        doc = copy.deepcopy(hta)
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "world_size": size}
        c.file("mismatched-ranks", f"k-world-size-{label}", "rank1.pt.trace.json", _js(doc))
    if TORCH_RESNET.exists():
        import re

        resnet = _resnet_text()
        found = re.search(
            r'"name": "aten::conv2d".{0,600}?"Input Dims": (\[\[.*?\]\])', resnet, re.S
        )
        assert found
        for label, dims in (
            ("600-deep", "[" * 600 + "1" + "]" * 600),
            ("1e30", "[[1e30]]"),
            ("null", "[[null]]"),
            ("negative", "[[-7]]"),
            ("int64-overflow", "[[4294967296, 4294967296, 4294967296]]"),
        ):
            family = "deep-nesting" if label == "600-deep" else "overflow-number"
            edited = resnet[: found.start(1)] + dims + resnet[found.end(1) :]
            c.file(family, f"k-input-dims-{label}", "rank0.json", edited.encode())
    # lone surrogates: escaped (valid JSON syntax, no Unicode text) and as raw bytes
    planner = json.loads(text)
    op = planner["ranks"][0]["ops"][0]["name"]
    c.file(
        "bad-name",
        "pj-op-name-lone-surrogate",
        "trace.json",
        text.replace(json.dumps(op), json.dumps(op)[:-1] + '\\udc80"').encode(),
    )
    c.file(
        "bad-name",
        "pj-rank-lone-surrogate",
        "trace.json",
        text.replace('"rank": "worker0"', '"rank": "\\ud800worker0"').encode(),
    )
    kineto_op = next(e["name"] for e in hta["traceEvents"] if e.get("ph") == "X")
    c.file(
        "bad-name",
        "k-name-lone-surrogate",
        "rank0.pt.trace.json",
        _hta_text().replace(json.dumps(kineto_op), '"bad\\udc80name"', 1).encode(),
    )
    c.file(
        "bad-name",
        "pj-raw-surrogate-bytes",
        "trace.json",
        text.encode().replace(b"}", b"\xed\xb2\x80}", 1),
    )
    odd = os.fsdecode(b"run_metadata_step3\xff.pb")
    c.file("bad-name", "file-name-not-utf8", odd, _demo_bytes())
    long_name = "é" * 130 + ".pb"
    c.case(Case("path-component-over-255-bytes", "bad-name", {}, (long_name,), ("",)))


def wrong_together(c: Corpus) -> None:
    """Ranks of two jobs, a truncated rank in a directory, a duplicated RunMetadata."""
    if TORCH_RESNET.exists():
        transformer = TORCH_RESNET.parent / "transformer_ddp" / "rank1.json.gz"
        rank0 = (TORCH_RESNET / "rank0.json.gz").read_bytes()
        rank1 = (TORCH_RESNET / "rank1.json.gz").read_bytes()
        if transformer.exists():
            c.files(
                "mismatched-ranks",
                "k-two-jobs",
                {"rank0.json.gz": rank0, "rank1.json.gz": transformer.read_bytes()},
                blame=("rank1.json.gz",),
            )
        for label, data in (
            ("half", rank1[: len(rank1) // 2]),
            ("empty", b""),
            ("tail-cut", _gz(gzip.decompress(rank1)[:-100])),
        ):
            c.files(
                "mismatched-ranks",
                f"k-dir-rank1-truncated-{label}",
                {"rank0.json.gz": rank0, "rank1.json.gz": data},
                blame=("rank1.json.gz",),
                give_dir=True,
            )
    c.files(
        "valid",
        "rm-copied-under-another-name",
        {"run_metadata_step3.pb": _demo_bytes(), "run_metadata_step9.pb": _demo_bytes()},
        blame=(),
        valid=True,
    )


def outputs(c: Corpus) -> None:
    """`-o` that names an existing file or a path below one (valid input, unusable -o)."""
    for output in ("file", "below-file"):
        c.case(
            Case(
                f"output-{output}",
                "output",
                {"run_metadata_step3.pb": _demo_bytes()},
                ("run_metadata_step3.pb",),
                (),
                output=output,
            )
        )


# ---------------------------------------------------------------- numbers, encodings, ranks
# (issue 47) Bench classes, built on request: `build_corpus(groups=...)`. Values are put into
# the JSON text through markers, so an integer of any length and bytes that are not UTF-8
# reach the reader as they would from a damaged or foreign exporter.

HTA_MULTI = SHARED / "public" / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter"
"""Two ranks (0, 1) of a 128-rank NCCL job on GPUs: all_reduce, all_to_all, all_gather."""

HUGE: tuple[tuple[str, str], ...] = (
    ("2p63", str(2**63)),  # one past int64
    ("1e30", str(10**30)),
    ("neg-2p63", str(-(2**63) - 1)),
    ("5000-digits", "9" * 5000),  # past Python's 4300-digit limit for int("...")
)
"""Integer literals beyond int64, as JSON text."""

BAD_BYTES: tuple[tuple[str, bytes], ...] = (
    ("latin1", b"caf\xe9"),
    ("lone-continuation", b"x\x80\xbfy"),
    ("truncated-3", b"euro\xe2\x82"),
    ("truncated-4", b"smile\xf0\x9f\x98"),
    ("overlong", b"slash\xc0\xaf"),
    ("ff-fe", b"\xff\xfe"),
)
"""Byte strings that are not UTF-8: Latin-1, lone continuation bytes, cut multibyte
sequences, an overlong encoding, bytes UTF-8 never uses."""


def _marked(doc: Any, raw: dict[str, bytes]) -> bytes:
    """`doc` as JSON with each marker string replaced by raw bytes: ``"@@N0@@"`` (quotes
    included) for a number literal, ``@@B0@@`` inside a string for bytes."""
    data = json.dumps(doc).encode()
    for marker, value in raw.items():
        data = data.replace(marker.encode(), value)
    return data


def _num(i: int = 0) -> str:
    return f"@@N{i}@@"


def _numbers(doc: Any, value: str) -> bytes:
    return _marked(doc, {json.dumps(_num()): value.encode()})


def _bytes_marker(i: int = 0) -> str:
    return f"@@B{i}@@"


def _with_bytes(doc: Any, value: bytes) -> bytes:
    return _marked(doc, {_bytes_marker(): value})


def _first(events: list[dict[str, Any]], test: Callable[[dict[str, Any]], bool]) -> int:
    return next(i for i, e in enumerate(events) if test(e))


def _hta_targets(events: list[dict[str, Any]]) -> dict[str, int]:
    """Indexes of one event of each kind in the HTA sample (1 rank, NCCL, kernels)."""

    def named(prefix: str) -> Callable[[dict[str, Any]], bool]:
        return lambda e: str(e.get("name", "")).startswith(prefix)

    def cat(name: str) -> Callable[[dict[str, Any]], bool]:
        return lambda e: e.get("cat") == name

    return {
        "step": _first(events, named("ProfilerStep#")),
        "cpu-op": _first(events, lambda e: e.get("name") == "aten::zero_"),
        "nccl": _first(events, named("nccl:all_reduce")),
        "kernel": _first(events, cat("kernel")),
        "memcpy": _first(events, cat("gpu_memcpy")),
        "launch": _first(events, lambda e: e.get("name") == "cudaLaunchKernel"),
    }


def huge_numbers(c: Corpus) -> None:
    """Integers beyond int64 in every numeric field the Kineto, planner JSON and TF
    timeline readers read: step numbers, times, ids, sizes, ranks, process and thread ids.

    Times, step numbers, ids that join events, sizes and ranks must be refused with one
    line; fields the readers treat as names (pid, tid, device, stream) or do not use
    (cbid, sequence numbers, event indexes) must be read."""
    base = json.loads(_hta_text())
    where = _hta_targets(base["traceEvents"])
    # (label, event kind or "" for the document, path of keys, the input is valid)
    fields: list[tuple[str, str, tuple[str, ...], bool]] = [
        ("step-ts", "step", ("ts",), False),
        ("step-dur", "step", ("dur",), False),
        ("step-external-id", "step", ("args", "External id"), True),
        ("op-ts", "cpu-op", ("ts",), False),
        ("op-dur", "cpu-op", ("dur",), False),
        ("op-pid", "cpu-op", ("pid",), True),
        ("op-tid", "cpu-op", ("tid",), True),
        ("op-external-id", "cpu-op", ("args", "External id"), True),
        ("op-record-function-id", "cpu-op", ("args", "Record function id"), False),
        ("op-sequence-number", "cpu-op", ("args", "Sequence number"), True),
        ("op-event-index", "cpu-op", ("args", "Profiler Event Index"), True),
        ("nccl-ts", "nccl", ("ts",), False),
        ("nccl-external-id", "nccl", ("args", "External id"), False),
        ("nccl-in-msg-nelems", "nccl", ("args", "In msg nelems"), False),
        ("nccl-group-size", "nccl", ("args", "Group size"), True),
        ("kernel-ts", "kernel", ("ts",), False),
        ("kernel-dur", "kernel", ("dur",), False),
        ("kernel-pid", "kernel", ("pid",), True),
        ("kernel-tid", "kernel", ("tid",), True),
        ("kernel-correlation", "kernel", ("args", "correlation"), False),
        ("kernel-external-id", "kernel", ("args", "External id"), True),  # joined by correlation
        ("kernel-device", "kernel", ("args", "device"), True),
        ("kernel-stream", "kernel", ("args", "stream"), True),
        ("memcpy-bytes", "memcpy", ("args", "bytes"), True),
        ("memcpy-correlation", "memcpy", ("args", "correlation"), False),
        ("launch-correlation", "launch", ("args", "correlation"), False),
        ("launch-cbid", "launch", ("args", "cbid"), True),
        ("rank", "", ("distributedInfo", "rank"), False),
        ("world-size", "", ("distributedInfo", "world_size"), False),
    ]
    for label, kind, keys, valid in fields:
        for name, value in HUGE:
            doc = copy.deepcopy(base)
            target = doc["traceEvents"][where[kind]] if kind else doc
            for key in keys[:-1]:
                target = target.setdefault(key, {})
            target[keys[-1]] = _num()
            if label == "world-size":
                doc["distributedInfo"].setdefault("rank", 1)
            # no JSON reader holds 5000 digits as a number: refusing it is right, even for a
            # name (pid, tid); a field no reader parses (cbid, indexes) is skipped unread
            named = label.endswith(("-pid", "-tid"))
            ok = valid and not (named and name == "5000-digits")
            family = "valid" if ok else "overflow-number"
            c.file(family, f"k-{label}-{name}", "rank0.pt.trace.json", _numbers(doc, value), ok)
    for name, value in HUGE:  # sizes inside lists: an all-reduce's shape
        doc = copy.deepcopy(base)
        doc["traceEvents"][where["nccl"]]["args"]["Input Dims"] = [[_num()]]
        c.file("overflow-number", f"k-nccl-input-dims-{name}", "rank0.pt.trace.json",
               _numbers(doc, value))  # fmt: skip
        doc = copy.deepcopy(base)
        event = doc["traceEvents"][where["step"]]
        event["name"] = "ProfilerStep#@@S@@"
        step = _marked(doc, {"@@S@@": value.encode()})
        c.file("overflow-number", f"k-step-number-{name}", "rank0.pt.trace.json", step)
    doc = copy.deepcopy(base)
    doc["traceEvents"][where["nccl"]]["args"]["Input Dims"] = [[_num()]]
    c.file("overflow-number", "k-nccl-input-dims-1e400", "rank0.pt.trace.json",
           _numbers(doc, "1e400"))  # fmt: skip
    _planner_numbers(c)
    _timeline_numbers(c)
    if TORCH_RESNET.exists():
        _resnet_numbers(c)


def _planner_numbers(c: Corpus) -> None:
    base = json.loads(_planner_doc())
    recv = next(i for i, op in enumerate(base["ranks"][0]["ops"]) if op["kind"] == "recv")
    timed = next(iter(base["ranks"][0]["iterations"][0]["ops"]))

    def first_it(doc: dict[str, Any]) -> dict[str, Any]:
        return doc["ranks"][0]["iterations"][0]

    def put(where: Callable[[dict[str, Any]], Any], key: Any) -> Callable[[dict[str, Any]], None]:
        def edit(doc: dict[str, Any]) -> None:
            where(doc)[key] = _num()

        return edit

    edits = {
        "origin-ns": put(lambda d: d, "origin_ns"),
        "iteration-number": put(first_it, "iteration"),
        "iteration-start": put(first_it, "start"),
        "iteration-duration": put(first_it, "duration"),
        "op-start": put(lambda d: first_it(d)["ops"][timed], 0),
        "op-duration": put(lambda d: first_it(d)["ops"][timed], 1),
        "nbytes": put(lambda d: d["ranks"][0]["ops"][recv], "nbytes"),
    }
    for label, edit in edits.items():
        for name, value in HUGE:
            doc = copy.deepcopy(base)
            edit(doc)
            case = c.file("overflow-number", f"pj-{label}-{name}", "trace.json",
                          _numbers(doc, value))  # fmt: skip
            c.cases[-1] = replace(case, algorithm="tac")


def _timeline_numbers(c: Corpus) -> None:
    path = REPO / "traces" / "tf_timeline" / "GPU" / "timeline_02_step_0.json"
    base = json.loads(path.read_text())
    events = base["traceEvents"]
    op = _first(events, lambda e: e.get("ph") == "X" and e.get("args", {}).get("op") == "MatMul")
    flow = _first(events, lambda e: e.get("ph") == "s")
    fields = [
        ("op-ts", op, "ts", False),
        ("op-dur", op, "dur", False),
        ("op-pid", op, "pid", True),
        ("op-tid", op, "tid", True),
        ("flow-id", flow, "id", True),
        ("flow-ts", flow, "ts", True),  # flows join by id; their times are not read
    ]
    for label, index, key, valid in fields:
        for name, value in HUGE[:2]:
            doc = copy.deepcopy(base)
            doc["traceEvents"][index][key] = _num()
            family = "valid" if valid else "overflow-number"
            c.file(family, f"tl-{label}-{name}", "timeline_step0.json", _numbers(doc, value), valid)


def _resnet_numbers(c: Corpus) -> None:
    """The CPU gloo ranks: a bucket's size, a record-function id of the ET step."""
    docs = _resnet_docs()
    for name, value in HUGE[:2]:
        doc = copy.deepcopy(docs[0])
        event = next(e for e in doc["traceEvents"] if e.get("name") == "gloo:all_reduce")
        event["args"]["Input Dims"] = [[_num()]]
        c.file("overflow-number", f"k-gloo-input-dims-{name}", "rank0.json", _numbers(doc, value))


# ---------------------------------------------------------------- encodings


def bad_encoding(c: Corpus) -> None:
    """Names that are not UTF-8 (Latin-1, lone continuation bytes, cut multibyte
    sequences, overlong forms) in op, kernel, collective, thread and process names, in
    args and keys, in Kineto JSON (plain and gzip), planner JSON and TF timelines.

    A name is data: it must be read with the bytes escaped and a note (exit 0); only a
    name the reader must parse (a `ProfilerStep#N` number) may be refused, in one line."""
    base = json.loads(_hta_text())
    where = _hta_targets(base["traceEvents"])
    pid = base["traceEvents"][where["cpu-op"]]["pid"]
    tid = base["traceEvents"][where["cpu-op"]]["tid"]
    mark = _bytes_marker()

    def on(kind: str, keys: tuple[str, ...], suffix: bool = True) -> Callable[[Any], None]:
        def edit(doc: dict[str, Any]) -> None:
            target = doc["traceEvents"][where[kind]] if kind else doc
            for key in keys[:-1]:
                target = target.setdefault(key, {})
            old = target.get(keys[-1], "")
            target[keys[-1]] = f"{old}{mark}" if suffix and isinstance(old, str) else mark

        return edit

    def metadata(what: str) -> Callable[[Any], None]:
        def edit(doc: dict[str, Any]) -> None:
            doc["traceEvents"].insert(0, {"ph": "M", "name": what, "pid": pid, "tid": tid,
                                          "ts": 0, "args": {"name": f"main{mark}"}})  # fmt: skip

        return edit

    def arg_key(doc: dict[str, Any]) -> None:
        doc["traceEvents"][where["cpu-op"]]["args"][f"Call{mark}stack"] = "x"

    def input_type(doc: dict[str, Any]) -> None:
        doc["traceEvents"][where["nccl"]]["args"]["Input type"] = [f"float{mark}"]

    places: dict[str, tuple[Callable[[Any], None], bool]] = {
        "op-name": (on("cpu-op", ("name",)), True),
        "kernel-name": (on("kernel", ("name",)), True),
        "nccl-name": (on("nccl", ("name",)), True),
        "launch-name": (on("launch", ("name",)), True),
        "op-category": (on("cpu-op", ("cat",)), True),
        "op-arg-value": (on("cpu-op", ("args", "Module Hierarchy")), True),
        "op-arg-key": (arg_key, True),
        "nccl-input-type": (input_type, True),
        "nccl-process-group": (on("nccl", ("args", "Process Group Name"), False), True),
        "thread-name": (metadata("thread_name"), True),
        "process-name": (metadata("process_name"), True),
        "backend": (on("", ("distributedInfo", "backend"), False), True),
        "step-name": (on("step", ("name",)), False),
    }
    for label, (edit, valid) in places.items():
        for kind, raw in BAD_BYTES:
            doc = copy.deepcopy(base)
            edit(doc)
            data = _with_bytes(doc, raw)
            family = "valid" if valid else "bad-name"
            c.file(family, f"k-{label}-{kind}", "rank0.pt.trace.json", data, valid)
            if kind in ("latin1", "truncated-3"):
                c.file(family, f"k-{label}-{kind}-gz", "rank0.pt.trace.json.gz", _gz(data), valid)
    _planner_encoding(c)
    _timeline_encoding(c)


def _planner_encoding(c: Corpus) -> None:
    base = json.loads(_planner_doc())
    mark = _bytes_marker()
    recv = next(i for i, op in enumerate(base["ranks"][0]["ops"]) if op["kind"] == "recv")

    def op_name(doc: dict[str, Any]) -> None:
        rank = doc["ranks"][0]
        old = rank["ops"][recv]["name"]
        new = f"{old}{mark}"
        rank["ops"][recv]["name"] = new
        rank["edges"] = [[new if x == old else x for x in e[:2]] + e[2:] for e in rank["edges"]]
        for it in rank["iterations"]:
            if old in it["ops"]:
                it["ops"][new] = it["ops"].pop(old)

    def field(key: str) -> Callable[[dict[str, Any]], None]:
        def edit(doc: dict[str, Any]) -> None:
            op = doc["ranks"][0]["ops"][recv]
            op[key] = f"{op[key]}{mark}"

        return edit

    def rank_name(doc: dict[str, Any]) -> None:
        doc["ranks"][0]["rank"] += mark

    def note(doc: dict[str, Any]) -> None:
        doc["notes"].append(f"note {mark}")

    places = {
        "op-name": op_name,
        "op-type": field("type"),
        "op-resource": field("resource"),
        "op-param": field("param"),
        "rank-name": rank_name,
        "note": note,
    }
    for label, edit in places.items():
        for kind, raw in BAD_BYTES:
            doc = copy.deepcopy(base)
            edit(doc)
            data = _with_bytes(doc, raw)
            case = c.file("valid", f"pj-{label}-{kind}", "trace.json", data, valid=True)
            c.cases[-1] = replace(case, algorithm="tac")
        data = _with_bytes(doc, BAD_BYTES[0][1])
        case = c.file("valid", f"pj-{label}-latin1-gz", "trace.json.gz", _gz(data), valid=True)
        c.cases[-1] = replace(case, algorithm="tac")


def _timeline_encoding(c: Corpus) -> None:
    path = REPO / "traces" / "tf_timeline" / "GPU" / "timeline_02_step_0.json"
    base = json.loads(path.read_text())
    events = base["traceEvents"]
    op = _first(events, lambda e: e.get("ph") == "X" and e.get("args", {}).get("op") == "MatMul")
    proc = _first(events, lambda e: e.get("ph") == "M")
    mark = _bytes_marker()
    for label, index, keys in (
        ("op-name", op, ("args", "name")),
        ("op-type", op, ("name",)),
        ("process-name", proc, ("args", "name")),
    ):
        for kind, raw in BAD_BYTES[:3]:
            doc = copy.deepcopy(base)
            target = doc["traceEvents"][index]
            for key in keys[:-1]:
                target = target[key]
            target[keys[-1]] += mark
            c.file("valid", f"tl-{label}-{kind}", "timeline_step0.json", _with_bytes(doc, raw),
                   valid=True)  # fmt: skip


# ---------------------------------------------------------------- multi-rank


@cache
def _resnet_docs() -> tuple[dict[str, Any], ...]:
    """The 2 gloo ranks of resnet_ddp cut to their first 2 profiled steps (fast to run)."""
    docs = []
    for rank in (0, 1):
        doc = json.loads(gzip.decompress((TORCH_RESNET / f"rank{rank}.json.gz").read_bytes()))
        docs.append(_first_steps(doc, 2))
    return tuple(docs)


def _first_steps(doc: dict[str, Any], count: int) -> dict[str, Any]:
    """`doc` without the events that start after its first `count` ProfilerSteps."""
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in doc["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    end = steps[count - 1][1]
    events = [e for e in doc["traceEvents"] if e.get("ph") != "X" or e.get("ts", 0) < end]
    return {**doc, "traceEvents": events}


@cache
def _nccl_docs() -> tuple[dict[str, Any], ...]:
    return tuple(
        json.loads(gzip.decompress((HTA_MULTI / f"sampled_rank-{r}.json.gz").read_bytes()))
        for r in (0, 1)
    )


def _is_collective(event: dict[str, Any]) -> bool:
    name = str(event.get("name", "")).lower()
    return any(t in name for t in ("nccl", "gloo", "c10d::", "record_param_comms"))


def multi_rank(c: Corpus) -> None:
    """Mutations of two real multi-rank sets, run with the pool on: the NCCL job on GPUs
    of HTA's `trace_filter` (../shared) and the gloo CPU DDP run `resnet_ddp` (repo)."""
    bases: list[tuple[str, tuple[dict[str, Any], ...], str]] = []
    if HTA_MULTI.exists():
        bases.append(("nccl", _nccl_docs(), "sampled_rank-{}.json.gz"))
    if TORCH_RESNET.exists():
        bases.append(("gloo", _resnet_docs(), "rank{}.json.gz"))
    for label, docs, pattern in bases:
        _multi_rank_set(c, label, docs, pattern)


def _multi_rank_set(c: Corpus, label: str, docs: tuple[dict[str, Any], ...], pattern: str) -> None:
    names = [pattern.format(r) for r in range(len(docs))]
    packed = [_gz(_js(d)) for d in docs]

    def add(
        name: str,
        family: str,
        files: dict[str, bytes],
        valid: bool,
        blame: tuple[str, ...] = (),
        give_dir: bool = True,
    ) -> None:
        inputs = (".",) if give_dir else tuple(files)
        blame = blame or ((".", *files) if not valid else ())
        pooled = sum(not f.startswith("meta") for f in files) > 1
        c.case(Case(f"mr-{label}-{name}", family, files, inputs, blame, valid, pooled=pooled))

    def with_rank1(doc: dict[str, Any] | bytes, name: str | None = None) -> dict[str, bytes]:
        data = doc if isinstance(doc, bytes) else _gz(_js(doc))
        return {names[0]: packed[0], (name or names[1]): data}

    def edited(edit: Callable[[dict[str, Any]], None], rank: int = 1) -> dict[str, Any]:
        doc = copy.deepcopy(docs[rank])
        edit(doc)
        return doc

    add("as-is-dir", "valid", dict(zip(names, packed, strict=True)), True)
    add("as-is-files", "valid", dict(zip(names, packed, strict=True)), True, give_dir=False)
    add("one-rank", "valid", {names[1]: packed[1]}, True)
    add("with-meta-json", "valid", {**with_rank1(packed[1]), "meta.json": b'{"a": 1}'}, True)

    # sizes: the ranks of one job may disagree (HTA's ranks do); beyond int64 they may not
    def scale_sizes(factor: int, only_first: bool = False) -> Callable[[dict[str, Any]], None]:
        def edit(doc: dict[str, Any]) -> None:
            for event in doc["traceEvents"]:
                dims = event.get("args", {}).get("Input Dims")
                if _is_collective(event) and dims and dims[0] and isinstance(dims[0][0], int):
                    dims[0][0] *= factor
                    if only_first:
                        return

        return edit

    add("sizes-doubled", "valid", with_rank1(edited(scale_sizes(2))), True)
    add("one-size-tripled", "valid", with_rank1(edited(scale_sizes(3, True))), True)

    def huge_size(doc: dict[str, Any]) -> None:
        for event in doc["traceEvents"]:
            if _is_collective(event) and event.get("args", {}).get("Input Dims"):
                event["args"]["Input Dims"] = [[_num()]]
                return

    for name, value in HUGE[:2]:
        data = _gz(_numbers(edited(huge_size), value))
        add(f"size-{name}", "overflow-number", with_rank1(data), False, (names[1],))

    # ids: rank numbers and world sizes
    def dist(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(doc: dict[str, Any]) -> None:
            info = doc.setdefault("distributedInfo", {})
            if value is None:
                info.pop(key, None)
            else:
                info[key] = value

        return edit

    world = docs[1].get("distributedInfo", {}).get("world_size", 2)
    add("world-size-differs", "mismatched-ranks",
        with_rank1(edited(dist("world_size", world * 2))), False)  # fmt: skip
    add("world-size-missing-one", "mismatched-ranks",
        with_rank1(edited(dist("world_size", None))), False)  # fmt: skip
    add("rank-repeated", "mismatched-ranks", with_rank1(edited(dist("rank", 0))), False)
    # without its number a rank reads as rank 0: given twice, from another process
    add("rank-missing-one", "mismatched-ranks", with_rank1(edited(dist("rank", None))), False)
    for key in ("rank", "world_size"):
        for name, value in HUGE[:2]:
            data = _gz(_numbers(edited(dist(key, _num())), value))
            add(f"{key.replace('_', '-')}-{name}", "overflow-number", with_rank1(data), False,
                (names[1],))  # fmt: skip
    twin = edited(dist("rank", 1), rank=0)  # rank 0 again, under rank 1's number
    add("rank0-copied-as-rank1", "valid", with_rank1(twin), True)
    third = edited(dist("rank", 2), rank=1)
    if label == "gloo":
        third["distributedInfo"]["world_size"] = max(world, 3)
    files = {**with_rank1(packed[1]), pattern.format(2): _gz(_js(third))}
    add("rank1-copied-as-rank2", "valid" if label == "nccl" else "mismatched-ranks", files,
        label == "nccl")  # fmt: skip

    # launch ids: one rank's GPU work pointing at the other rank's launches
    def foreign_ids(doc: dict[str, Any]) -> None:
        theirs = [
            e["args"]["correlation"]
            for e in docs[0]["traceEvents"]
            if e.get("cat") == "kernel" and "correlation" in e.get("args", {})
        ]
        mine = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        for event, other in zip(mine, theirs, strict=False):
            event["args"]["correlation"] = other
            event["args"]["External id"] = other

    if label == "nccl":
        add("launch-ids-of-rank0", "valid", with_rank1(edited(foreign_ids)), True)

        def no_nccl_kernels(doc: dict[str, Any]) -> None:
            doc["traceEvents"] = [
                e for e in doc["traceEvents"]
                if not (e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower())
            ]  # fmt: skip

        add("no-nccl-kernels-one", "valid", with_rank1(edited(no_nccl_kernels)), True)

    def no_collectives(doc: dict[str, Any]) -> None:
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not _is_collective(e)]

    add("no-collectives-one", "mismatched-ranks", with_rank1(edited(no_collectives)), False)

    # order and time: shuffled events, a clock offset, renumbered steps
    def shuffle(doc: dict[str, Any]) -> None:
        c.rng.shuffle(doc["traceEvents"])

    add("rank1-shuffled", "valid", with_rank1(edited(shuffle)), True)
    both = {names[0]: _gz(_js(edited(shuffle, rank=0))), names[1]: _gz(_js(edited(shuffle)))}
    add("both-shuffled", "valid", both, True)

    def offset(doc: dict[str, Any]) -> None:
        for event in doc["traceEvents"]:
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] += 5_000_000

    add("rank1-clock-5s-later", "valid", with_rank1(edited(offset)), True)

    def renumber(doc: dict[str, Any]) -> None:
        for event in doc["traceEvents"]:
            name = str(event.get("name", ""))
            if name.startswith("ProfilerStep#"):
                event["name"] = f"ProfilerStep#{int(name.split('#')[1]) + 1000}"

    add("rank1-steps-renumbered", "valid", with_rank1(edited(renumber)), True)

    # one rank cut, empty or doubled
    text = _js(docs[1])
    cut = _json_cuts(c.rng, text.decode(), 1)[0]
    add("rank1-gz-cut", "truncated-gzip", with_rank1(packed[1][: len(packed[1]) // 2]), False,
        (names[1],))  # fmt: skip
    add("rank1-json-cut", "invalid-json", with_rank1(_gz(text[:cut])), False, (names[1],))
    add("rank1-empty", "empty", with_rank1(b""), False, (names[1],))
    add("rank0-twice", "mismatched-ranks", {names[0]: packed[0], "copy.json.gz": packed[0]},
        False, (names[0], "copy.json.gz"))  # fmt: skip

    # names that are not UTF-8 in one rank
    def bad_kernel_name(doc: dict[str, Any]) -> None:
        for event in doc["traceEvents"]:
            if event.get("cat") in ("kernel", "cpu_op"):
                event["name"] += _bytes_marker()
                return

    for kind, raw in BAD_BYTES[:2]:
        data = _gz(_with_bytes(edited(bad_kernel_name), raw))
        add(f"rank1-op-name-{kind}", "valid", with_rank1(data), True)


GROUPS: dict[str, tuple[Callable[[Corpus], None], ...]] = {}
"""Corpus classes (`build_corpus(groups=...)`, `bench/fuzz_ingest.py --only`)."""
GROUP_START = {"base": 0, "numbers": 1000, "encoding": 2000, "multirank": 3000}
"""The number of each class's first case: names do not depend on the classes built."""


FAMILIES = (
    empty_and_garbage,
    tf_run_metadata,
    tf_graphdef,
    planner_json,
    kineto,
    special_files,
    limits,
    nesting_numbers_names,
    wrong_together,
    outputs,
)


GROUPS.update(
    base=FAMILIES, numbers=(huge_numbers,), encoding=(bad_encoding,), multirank=(multi_rank,)
)


def build_corpus(
    seed: int = 0, heavy: bool = False, groups: tuple[str, ...] = ("base",)
) -> list[Case]:
    """The corpus for a seed (deterministic), in memory; `Case.write` puts one on disk.

    `heavy` adds the cases that take GiBs to inflate at the default limits (the bench).
    `groups`: the classes of `GROUPS` to build (the tests' corpus is ``base``); each has
    its own random stream, so a class's cases do not depend on the others built.
    """
    cases: list[Case] = []
    for group in groups:
        rng = random.Random(seed if group == "base" else f"{seed}/{group}")
        corpus = Corpus(rng, heavy=heavy, group=group, start=GROUP_START[group])
        for family in GROUPS[group]:
            family(corpus)
        cases += corpus.cases
    return cases
