"""Find the input files, sniff their format from content, and load one Job.

The file name is only a hint: a RunMetadata is recognised by parsing, JSON by its
keys. In a directory, files that are not traces are skipped, with a note (a client
GraphDef or TF timelines beside RunMetadata, a JSON of another kind) or without one
where they are the run's own (`run_metadata`: meta.json, a plan); named explicitly, an
unrecognised file is an error. A TensorFlow XPlane protobuf is refused with what to
give instead (skipped, with a note, in a directory). A file that cannot be read or
parsed is an error in a directory too (a truncated rank file must not become a
dropped rank), and every path passes `files.check_path` before anything opens it.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.ingest import sniffers
from planner.ingest.files import check_path, escaped_note, parse_json_escaped, read_bytes, read_head
from planner.model.trace import Job

TRACE_SUFFIXES = (".pb", ".pbtxt", ".json", ".gz")


@dataclass(frozen=True)
class Sniffed:
    """One input file with its format and (decompressed) content."""

    path: Path
    format: str
    data: bytes
    document: Any = None
    escaped: int = 0  # bytes of a JSON text that were not UTF-8, read escaped


def sniff(path: Path) -> Sniffed:
    """Decide what a file is from its content.

    Kineto traces and Execution Traces are recognised from their first 64 KiB and left
    for their reader to parse (they can be large); everything else is read here.
    """
    head = read_head(path)
    if not head.strip():
        raise InputError(path, "file is empty")
    kind = other_kind(head)
    if kind is not None:
        raise InputError(path, f"{kind}, not a trace this planner reads")
    first = head.lstrip()[:1]
    if first in (b"{", b"["):
        if sniffers.is_horovod(head):
            return _sniff_json(path, "horovod")
        if sniffers.is_tf_profiler(head):
            return _sniff_json(path, "tf_profiler")
        if sniffers.is_execution_trace(head):
            return Sniffed(path, "execution_trace", b"")
        if sniffers.is_kineto(head):
            return Sniffed(path, "kineto", b"")
        return _sniff_json(path, None)
    data = read_bytes(path)
    if sniffers.looks_like_xplane(data):
        raise InputError(path, sniffers.XPLANE_ANSWER)
    if path.suffix == ".pbtxt" or _is_text(data):
        return Sniffed(path, "graphdef_text", data)
    from planner.ingest import tf_runmetadata

    if tf_runmetadata.looks_like_run_metadata(data) and "graph" not in path.stem.lower():
        return Sniffed(path, "run_metadata", data)
    return Sniffed(path, "graphdef", data)


MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"%PDF-", "a PDF document"),
    (b"PK\x03\x04", "a ZIP archive (unpack it and give the trace inside)"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"BZh", "a bzip2 archive"),
    (b"\x7fELF", "an executable (ELF)"),
)
"""Leading bytes of common files that are no trace, and what to call them."""


def other_kind(head: bytes) -> str | None:
    """What a file that is no trace is, from its first bytes (a PNG renamed .json must not
    be reported as a broken GraphDef), or None."""
    for magic, kind in MAGIC:
        if head.startswith(magic):
            return kind
    if head[:5] == b"ustar" or head[257:262] == b"ustar":
        return "a tar archive (unpack it and give the trace inside)"
    text = head.lstrip()[:64].lower()
    if text.startswith((b"<!doctype html", b"<html")):
        return "an HTML page"
    return None


def _sniff_json(path: Path, known: str | None) -> Sniffed:
    """Read and parse a JSON file; its format is `known` or decided from its keys."""
    data = read_bytes(path)
    document, escaped = parse_json_escaped(path, data)
    return Sniffed(path, known or _json_format(document), data, document, escaped)


def _is_text(data: bytes) -> bool:
    sample = data[:4096]
    try:
        text = sample.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return "node" in text and "{" in text and all(c.isprintable() or c.isspace() for c in text)


def _json_format(document: Any) -> str:
    if isinstance(document, dict):
        schema = document.get("schema")
        if isinstance(schema, str) and schema.startswith("planner.trace/"):
            return "planner_json"
        if "traceEvents" in document:
            return "tf_timeline" if sniffers.is_timeline(document) else "kineto"
        if "nodes" in document and "schema" in document:
            return "execution_trace"
    if sniffers.is_horovod_events(document):
        return "horovod"
    return "unknown_json"


def expand(paths: Iterable[Path]) -> list[tuple[Path, bool]]:
    """Input files as (path, named explicitly); directories list their trace files.

    Every path is checked before anything opens it (`check_path`): FIFOs, devices,
    oversized files and bad names are refused, in a directory too.
    """
    result: list[tuple[Path, bool]] = []
    for path in paths:
        if stat.S_ISDIR(check_path(path).st_mode):
            found = sorted(
                p for p in path.iterdir() if p.name.endswith(TRACE_SUFFIXES) and not p.is_dir()
            )
            if not found:
                raise InputError(path, "directory holds no trace files (.pb, .pbtxt, .json, .gz)")
            for p in found:
                check_path(p)
            result.extend((p, False) for p in found)
        else:
            result.append((path, True))
    return result


Progress = Callable[[str], None]


def load(paths: Iterable[str | Path], progress: Progress | None = None) -> Job:
    """Load the inputs into one Job (see module docstring for what is skipped)."""
    files = expand(Path(p) for p in paths)
    if not files:
        raise InputError(None, "no input given")
    sniffed: list[Sniffed] = []
    notes: list[str] = []
    for path, explicit in files:
        if progress:
            progress(str(path))
        try:
            item = sniff(path)  # in a directory too: a truncated rank file is no rank dropped
        except InputError as exc:
            if explicit or exc.problem != sniffers.XPLANE_ANSWER:
                raise
            notes.append(f"skipped {path}: a TF profiler XPlane")
            continue
        if item.format == "unknown_json":
            if explicit:
                raise InputError(path, "JSON is not a trace this planner reads")
            if not run_metadata(item):  # a run's own description: nothing to say
                notes.append(f"skipped {path}: not a trace")
            continue
        if item.escaped:
            notes.append(f"{path}: {escaped_note(item.escaped)}")
        sniffed.append(item)
    by_format: dict[str, list[Sniffed]] = {}
    for item in sniffed:
        by_format.setdefault(item.format, []).append(item)
    job = _load_formats(by_format, notes, files)
    return Job(
        framework=job.framework,
        graphs=job.graphs,
        trace=job.trace,
        sources=job.sources,
        notes=(*job.notes, *notes),
        meta=job.meta,
    )


def _load_formats(by_format: dict[str, list[Sniffed]], notes: list[str], files: list) -> Job:
    # each reader is imported only when its format is present (protobuf only for TF)
    if "run_metadata" in by_format:
        for other in ("graphdef", "graphdef_text", "tf_timeline"):
            for item in by_format.pop(other, []):
                notes.append(f"ignored {item.path}: RunMetadata partition graphs are used")
        _only(by_format, "run_metadata")
        from planner.ingest import tf_runmetadata

        return tf_runmetadata.load_run_metadata(
            [(s.path, s.data) for s in by_format["run_metadata"]]
        )
    if "kineto" in by_format:
        traces = [s.path for s in by_format.pop("execution_trace", [])]
        _only(by_format, "kineto")
        from planner.ingest import kineto

        return kineto.load_kineto([s.path for s in by_format["kineto"]], traces or None)
    if "execution_trace" in by_format:
        raise InputError(
            by_format["execution_trace"][0].path,
            "an Execution Trace needs the Kineto traces of the same run beside it",
        )
    from planner.ingest import tf_timeline

    if "tf_timeline" in by_format:
        for other in ("graphdef", "graphdef_text"):
            for item in by_format.pop(other, []):
                notes.append(f"ignored {item.path}: the TF timelines are used")
        _only(by_format, "tf_timeline")
        return tf_timeline.load_timelines([(s.path, s.document) for s in by_format["tf_timeline"]])
    if "tf_profiler" in by_format:
        _only(by_format, "tf_profiler")
        from planner.ingest import tf_profiler  # one file per task of a multi-worker job

        return tf_profiler.load_profiler_traces(
            [(s.path, s.document) for s in by_format["tf_profiler"]]
        )
    if "horovod" in by_format:
        _only(by_format, "horovod")
        items = by_format["horovod"]
        if len(items) > 1:
            raise InputError(items[1].path, "give one Horovod timeline at a time")
        from planner.ingest import horovod

        return horovod.load_horovod(items[0].path, items[0].document)
    if "planner_json" in by_format:
        _only(by_format, "planner_json")
        items = by_format["planner_json"]
        if len(items) > 1:
            raise InputError(items[1].path, "give one planner trace at a time")
        from planner.ingest import planner_json

        return planner_json.from_document(items[0].document, items[0].path)
    graphdefs = by_format.get("graphdef", []) + by_format.get("graphdef_text", [])
    if graphdefs:
        if len(graphdefs) > 1:
            raise InputError(graphdefs[1].path, "give one GraphDef at a time")
        item = graphdefs[0]
        from planner.ingest import tf_graphdef

        return tf_graphdef.load_graphdef(item.path, item.data, item.format == "graphdef_text")
    where = files[0][0].parent if files else None
    raise InputError(where, "no readable trace among the inputs")


RUN_METADATA = re.compile(r"(meta(_rank\d+)?|(tf_)?summary|steps|spec)\.json")
"""Files a recorded run keeps beside its traces (what was run, how, its step times: the
recordings' meta.json, meta_rank<N>.json, summary.json, tf_summary.json, steps.json and
the lab's spec.json): passed over in a folder without a note."""


def run_metadata(item: Sniffed) -> bool:
    """Whether a JSON file that is no trace is a run's own: its description by name
    (`RUN_METADATA`), or a document planner wrote (``"schema": "planner.…"``: the plan a
    run enforced, kept beside its traces). Any other is named in a note."""
    if RUN_METADATA.fullmatch(item.path.name) is not None:
        return True
    schema = item.document.get("schema") if isinstance(item.document, dict) else None
    return isinstance(schema, str) and schema.startswith("planner.")


FORMAT_NAMES = {
    "run_metadata": "a TensorFlow RunMetadata",
    "kineto": "a PyTorch profiler (Kineto) trace",
    "execution_trace": "a PyTorch Execution Trace",
    "tf_timeline": "a TensorFlow timeline",
    "tf_profiler": "a TensorFlow 2 profiler trace",
    "planner_json": "a planner trace",
    "horovod": "a Horovod timeline",
    "graphdef": "a TensorFlow GraphDef",
    "graphdef_text": "a TensorFlow GraphDef (text)",
}
"""What a user calls each input format, for the line that refuses a mix of them."""


def _only(by_format: dict[str, list[Sniffed]], wanted: str) -> None:
    """InputError naming the first input of another format than `wanted`: what it is,
    what the others are, and how to split them (one job, one format, per command)."""
    # an Execution Trace is named last: its Kineto traces say more of what the input is
    for fmt, items in sorted(by_format.items(), key=lambda kv: kv[0] == "execution_trace"):
        if fmt != wanted and items:
            first = by_format[wanted][0].path
            problem = (
                f"is {FORMAT_NAMES.get(fmt, fmt)}, the other inputs {FORMAT_NAMES[wanted]} "
                f"(e.g. {first}): one job's traces of one format per command; give them to "
                "two planner commands"
            )
            raise InputError(items[0].path, problem)
