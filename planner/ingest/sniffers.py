"""What a file is, from its first bytes or its parsed JSON: the format sniffers.

Kept apart from the readers (numpy, pandas, networkx, protobuf) so that deciding a
file's format imports none of them; `planner.ingest.detect` uses these and loads only
the reader of the format it finds.
"""

from __future__ import annotations

from typing import Any

XPLANE_ANSWER = (
    "a TensorFlow profiler XPlane (XSpace protobuf), which planner does not read: give the "
    "*.trace.json.gz written beside it (op timings, no dependencies), or RunMetadata .pb "
    "files traced with RunOptions(trace_level=FULL_TRACE, output_partition_graphs=True)"
)


def is_kineto(head: bytes) -> bool:
    """True when the first bytes of (decompressed) content look like a Kineto trace."""
    text = head.lstrip()
    if b'"/job:' in head:  # a TensorFlow timeline
        return False
    if text.startswith(b"["):  # the old (2020) format: a bare event array
        return b'"ph"' in head and (b'"Operator"' in head or b"ProfilerStep#" in head)
    if not text.startswith(b"{") or b'"traceEvents"' not in head and b'"schemaVersion"' not in head:
        return False
    markers = (
        b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"', b'"cpu_op"',
        b"ProfilerStep#", b'"displayTimeUnit"', b'"cuda_runtime"', b'"Operator"',
    )  # fmt: skip
    return any(m in head for m in markers)


HOROVOD_ACTIVITIES = (
    b'"NEGOTIATE_ALLREDUCE"', b'"NEGOTIATE_BROADCAST"', b'"NEGOTIATE_ALLGATHER"',
    b'"MPI_ALLREDUCE"', b'"NCCL_ALLREDUCE"', b'"MEMCPY_IN_FUSION_BUFFER"',
)  # fmt: skip
"""Activity names only a Horovod timeline writes."""


def is_horovod(head: bytes) -> bool:
    """True when the first bytes look like a Horovod timeline: a JSON array (Horovod
    never closes it) of ``CYCLE_START`` marks or per-tensor negotiation activities."""
    if not head.lstrip().startswith(b"["):
        return False
    return any(m in head for m in HOROVOD_ACTIVITIES) or (
        b'"CYCLE_START"' in head and b'"ph"' in head
    )


def is_horovod_events(document: Any) -> bool:
    """True when a parsed JSON array holds a Horovod timeline's activities."""
    if not isinstance(document, list):
        return False
    names = {m.strip(b'"').decode() for m in HOROVOD_ACTIVITIES} | {"CYCLE_START"}
    return any(isinstance(e, dict) and e.get("name") in names for e in document[:2000])


def is_execution_trace(head: bytes) -> bool:
    """True when the first bytes look like an ExecutionTraceObserver JSON document."""
    text = head.lstrip()
    return (
        text.startswith(b"{")
        and b'"schema"' in head
        and b'"nodes"' in head
        and (b'"rf_id"' in head or b"execution_trace" in head or b"execution_graph" in head)
    )


def is_tf_profiler(head: bytes) -> bool:
    """True when the first bytes look like a TF2 profiler trace-viewer JSON document
    (processes ``/host:CPU`` and ``/device:GPU:0``; ``highres-ticks`` metadata, which
    TF timelines, whose processes are ``/job:...``, lack)."""
    text = head.lstrip()
    if not text.startswith(b"{"):
        return False
    if b'"highres-ticks"' in head and (b'"/device:' in head or b'"/host:' in head):
        return True  # a multi-worker job's events may name devices by /job:...
    return b'"/host:CPU"' in head and b'"/job:' not in head


def looks_like_xplane(data: bytes) -> bool:
    """True when bytes are an XSpace protobuf: field 1 (planes) whose first plane has an
    optional id (field 1) and a name (field 2) such as ``/host:CPU`` or ``/device:GPU:0``."""
    if len(data) < 4 or data[0] != 0x0A:
        return False
    pos = 1
    for _ in range(10):  # skip the plane's length varint
        if pos >= len(data) or data[pos] < 0x80:
            break
        pos += 1
    pos += 1
    if pos < len(data) and data[pos] == 0x08:  # plane id
        pos += 1
        while pos < len(data) and data[pos] >= 0x80:
            pos += 1
        pos += 1
    if pos + 2 >= len(data) or data[pos] != 0x12:
        return False
    size = data[pos + 1]
    name = data[pos + 2 : pos + 2 + size]
    return name.startswith((b"/host:", b"/device:"))


def is_timeline(document: Any) -> bool:
    """True when a parsed JSON document is a TF timeline (a process named ``/job:...``)."""
    if not isinstance(document, dict):
        return False
    events = document.get("traceEvents")
    if not isinstance(events, list):
        return False
    return any(
        isinstance(e, dict)
        and e.get("ph") == "M"
        and isinstance(e.get("args"), dict)
        and str(e["args"].get("name", "")).startswith("/job:")
        for e in events[:400]
    )
