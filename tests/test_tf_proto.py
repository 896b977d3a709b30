"""planner.tf protos (tf_subset.proto) against TensorBoard's copy of TensorFlow's.

The planner parses TensorFlow's GraphDef and RunMetadata with its own generated
module, planner/ingest/proto/tf_subset_pb2.py. These tests check that

* every field it declares has TensorFlow's number, name, type and label, and its
  enums have TensorFlow's values (names matter: .pbtxt files are matched by name);
* on the real TensorFlow 2.21 traces in ../shared/traces/generated/tf/ and the
  public TensorBoard demo graph, both parse to identical values for everything
  the planner reads, and re-serializing ours gives TensorBoard's bytes.

tensorboard is only in the test extra, so these skip without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

tb_config_pb2 = pytest.importorskip("tensorboard.compat.proto.config_pb2")
from tensorboard.compat.proto import (  # noqa: E402
    attr_value_pb2,
    full_type_pb2,
    graph_pb2,
    step_stats_pb2,
    types_pb2,
)

from planner.ingest.proto import tf_subset_pb2 as ours  # noqa: E402

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
TF_DIR = TRACES / "generated" / "tf"
PUBLIC_TB_DIR = TRACES / "public" / "tensorboard"

# Attributes the planner reads from partition graphs and client graphs.
ATTR_KEYS = ("send_device", "recv_device", "tensor_name", "_class", "dtype", "T")


def _params(paths: list[Path], what: str) -> list:
    if not paths:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"needs {what} under {TRACES}"))]
    return [pytest.param(p, id=str(p.relative_to(TRACES))) for p in paths]


def _files(root: Path, pattern: str) -> list[Path]:
    return sorted(root.rglob(pattern)) if root.is_dir() else []


RUN_METADATA_FILES = _files(TF_DIR, "run_metadata_step*.pb")
GRAPH_PB_FILES = _files(TF_DIR, "graph.pb")
GRAPH_PBTXT_FILES = _files(TF_DIR, "graph.pbtxt") + _files(PUBLIC_TB_DIR, "*.pbtxt")


# --------------------------------------------------------------- descriptors


def _tb_descriptors():
    """TensorBoard's message descriptors, by short name, reachable from ours."""
    found = {}
    todo = [
        tb_config_pb2.RunMetadata.DESCRIPTOR,
        graph_pb2.GraphDef.DESCRIPTOR,
        step_stats_pb2.StepStats.DESCRIPTOR,
    ]
    while todo:
        d = todo.pop()
        key = d.full_name.removeprefix("tensorboard.")
        if key in found:
            continue
        found[key] = d
        todo.extend(d.nested_types)
        todo.extend(f.message_type for f in d.fields if f.message_type is not None)
    return found


def _our_descriptors():
    found = {}
    todo = list(ours.DESCRIPTOR.message_types_by_name.values())
    while todo:
        d = todo.pop()
        found[d.full_name.removeprefix("planner.tf.")] = d
        todo.extend(d.nested_types)
    return found


def _short(d) -> str | None:
    if d is None:
        return None
    return d.full_name.removeprefix("tensorboard.").removeprefix("planner.tf.")


def _repeated(f) -> bool:
    if hasattr(f, "is_repeated"):  # protobuf >= 5.29; `label` is deprecated
        return f.is_repeated
    return f.label == f.LABEL_REPEATED


def _packed(f) -> bool | None:
    return getattr(f, "is_packed", None)  # None on runtimes without it


def test_package_does_not_collide_with_tensorflow_or_tensorboard():
    assert ours.DESCRIPTOR.package == "planner.tf"
    assert ours.DESCRIPTOR.name == "planner/ingest/proto/tf_subset.proto"


def test_fields_match_tensorflow():
    tb = _tb_descriptors()
    mine = _our_descriptors()
    # FunctionDefLibrary is declared empty on purpose (see tf_subset.proto).
    assert not mine["FunctionDefLibrary"].fields
    checked = 0
    for name, d in mine.items():
        assert name in tb, f"{name} is not a TensorFlow message reachable from RunMetadata"
        ref = tb[name]
        for f in d.fields:
            r = ref.fields_by_number.get(f.number)
            assert r is not None, f"{name}.{f.name} = {f.number} not in TensorFlow"
            where = f"{name}.{f.name}"
            assert f.name == r.name, where
            assert f.type == r.type, where
            assert _repeated(f) == _repeated(r), where
            assert _packed(f) == _packed(r), where
            assert _short(f.message_type) == _short(r.message_type), where
            assert _short(f.enum_type) == _short(r.enum_type), where
            assert (f.containing_oneof and f.containing_oneof.name) == (
                r.containing_oneof and r.containing_oneof.name
            ), where
            checked += 1
    assert checked > 100


def test_omitted_fields_are_the_documented_ones():
    tb = _tb_descriptors()
    omitted = set()
    for name, d in _our_descriptors().items():
        for r in tb[name].fields:
            if r.number not in d.fields_by_number:
                omitted.add(f"{name}.{r.name}")
    assert omitted == {
        "GraphDef.debug_info",
        "RunMetadata.cost_graph",
        "FunctionDefLibrary.function",
        "FunctionDefLibrary.gradient",
        "FunctionDefLibrary.registered_gradients",
    }


@pytest.mark.parametrize(
    ("mine", "ref"),
    [
        (ours.DataType, types_pb2.DataType),
        (ours.FullTypeId, full_type_pb2.FullTypeId),
    ],
    ids=["DataType", "FullTypeId"],
)
def test_enums_match_tensorflow(mine, ref):
    values = lambda e: {(v.name, v.number) for v in e.DESCRIPTOR.values}  # noqa: E731
    assert values(mine) == values(ref)


# ---------------------------------------------------------- values on traces


def _attr(v) -> tuple:
    """An AttrValue as (oneof member, value); messages by their text format."""
    which = v.WhichOneof("value")
    if which is None:
        return (None, None)
    val = getattr(v, which)
    if which in ("list", "shape", "tensor", "func"):
        val = text_format.MessageToString(val, as_one_line=True)
    return (which, val)


def _nodes(graph) -> list[tuple]:
    return [
        (
            n.name,
            n.op,
            list(n.input),
            n.device,
            {k: _attr(n.attr[k]) for k in ATTR_KEYS if k in n.attr},
        )
        for n in graph.node
    ]


def _node_stats(ns) -> tuple:
    return (
        ns.node_name,
        ns.all_start_micros,
        ns.all_end_rel_micros,
        ns.all_start_nanos,
        ns.all_end_rel_nanos,
        ns.op_start_rel_micros,
        ns.op_end_rel_micros,
        ns.op_start_rel_nanos,
        ns.op_end_rel_nanos,
        ns.scheduled_micros,
        ns.scheduled_nanos,
        ns.timeline_label,
        ns.thread_id,
        [o.tensor_description.allocation_description.requested_bytes for o in ns.output],
    )


def _run_metadata_values(rm) -> tuple:
    devs = [(d.device, [_node_stats(ns) for ns in d.node_stats]) for d in rm.step_stats.dev_stats]
    parts = [_nodes(g) for g in rm.partition_graphs]
    return devs, parts


@pytest.mark.parametrize("path", _params(RUN_METADATA_FILES, "run_metadata_step*.pb"))
def test_run_metadata_parses_like_tensorboard(path):
    data = path.read_bytes()
    mine = ours.RunMetadata.FromString(data)
    ref = tb_config_pb2.RunMetadata.FromString(data)

    devs, parts = _run_metadata_values(mine)
    assert (devs, parts) == _run_metadata_values(ref)
    # Not vacuous: there are timings, and _Send/_Recv attrs to compare.
    assert any(stats for _, stats in devs)
    assert any("tensor_name" in attrs for nodes in parts for *_, attrs in nodes)

    # Nothing is lost: TensorBoard reads back exactly what it read.
    again = tb_config_pb2.RunMetadata.FromString(mine.SerializeToString())
    assert again == ref
    # These files set no field that tf_subset.proto omits (cost_graph, library
    # contents, debug_info), so ours has no unknown fields and serializes
    # field for field like TensorBoard.
    mine_bytes = mine.SerializeToString(deterministic=True)
    assert mine_bytes == ref.SerializeToString(deterministic=True)


@pytest.mark.parametrize("path", _params(GRAPH_PB_FILES, "graph.pb"))
def test_graph_pb_parses_like_tensorboard(path):
    data = path.read_bytes()
    mine = ours.GraphDef.FromString(data)
    ref = graph_pb2.GraphDef.FromString(data)
    assert mine.node
    assert _nodes(mine) == _nodes(ref)
    assert mine.versions.producer == ref.versions.producer
    assert graph_pb2.GraphDef.FromString(mine.SerializeToString()) == ref
    mine_bytes = mine.SerializeToString(deterministic=True)
    assert mine_bytes == ref.SerializeToString(deterministic=True)


@pytest.mark.parametrize("path", _params(GRAPH_PBTXT_FILES, "graph .pbtxt"))
def test_graph_pbtxt_parses_like_tensorboard(path):
    text = path.read_text()
    mine = text_format.Parse(text, ours.GraphDef())
    ref = text_format.Parse(text, graph_pb2.GraphDef())
    assert mine.node
    assert _nodes(mine) == _nodes(ref)
    assert mine.versions.producer == ref.versions.producer
    # Same field names everywhere: the text renderings agree in full.
    assert text_format.MessageToString(mine) == text_format.MessageToString(ref)


def test_attr_value_oneof_covers_every_member():
    """Each AttrValue member reads back the same through both descriptors."""
    a = ours.AttrValue
    samples = [
        a(s=b"/job:ps/replica:0/task:0/device:CPU:0"),
        a(i=-3),
        a(f=0.5),
        a(b=True),
        a(type=ours.DT_FLOAT),
        a(shape=ours.TensorShapeProto(dim=[ours.TensorShapeProto.Dim(size=4)])),
        a(tensor=ours.TensorProto(dtype=ours.DT_INT32, int_val=[1, 2])),
        a(list=a.ListValue(s=[b"loc:@v"], type=[ours.DT_HALF])),
        a(func=ours.NameAttrList(name="f", attr={"T": a(type=ours.DT_INT64)})),
        a(placeholder="T"),
    ]
    members = {f.name for f in a.DESCRIPTOR.oneofs_by_name["value"].fields}
    assert {v.WhichOneof("value") for v in samples} == members
    for v in samples:
        ref = attr_value_pb2.AttrValue.FromString(v.SerializeToString())
        assert _attr(ref) == _attr(v)
