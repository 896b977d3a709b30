"""The lab's TensorFlow client: runs (rewritten) GraphDefs on a PS cluster, interleaved.

    ip netns exec NS python bench/lab/tf_client.py SPEC.json

SPEC names the client ``target`` (grpc://worker0), ``graphs`` ({label: GraphDef path}),
the ``fetches`` (the generated cnn job's: train op, loss, global step; see
examples/tf_ps_job.py), ``warmup`` steps per graph, and a ``mode``:

- ``trace``: the one graph's steps traced (FULL_TRACE with partition graphs, as
  examples/tf_ps_job.py records them): ``run_metadata_step<N>.pb`` and a copy of the
  GraphDef (``graph.pb``) in ``trace_dir``, the input of `planner analyze`; ``untraced``
  steps timed before and after;
- ``measure``: one session per graph on the same cluster, each warmed up, then the
  blocks of ``order`` (labels) run in turn, ``block`` untraced steps each.

Writes ``out`` (JSON): per label the step times (s) and their block numbers, and each
block's monotonic start and end.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path


def _session(tf, target: str, path: str):
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(Path(path).read_bytes())
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    return tf.compat.v1.Session(target, graph=graph)


def _timed(session, fetches: list[str], n: int, **kwargs) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        session.run(fetches, **kwargs)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    spec = json.loads(Path(sys.argv[1]).read_text())
    fetches = spec["fetches"]
    sessions = {label: _session(tf, spec["target"], p) for label, p in spec["graphs"].items()}
    for session in sessions.values():
        session.run("init")
    for session in sessions.values():
        _timed(session, fetches, spec["warmup"])  # the first step partitions the graph
    result: dict = {"start": time.monotonic()}
    if spec["mode"] == "trace":
        ((label, session),) = sessions.items()
        where = Path(spec["trace_dir"])
        where.mkdir(parents=True, exist_ok=True)
        shutil.copy(spec["graphs"][label], where / "graph.pb")
        options = tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE, output_partition_graphs=True
        )
        before = _timed(session, fetches, spec["untraced"])
        traced = []
        for step in range(spec["traced"]):
            metadata = tf.compat.v1.RunMetadata()
            start = time.perf_counter()
            session.run(fetches, options=options, run_metadata=metadata)
            traced.append(time.perf_counter() - start)
            (where / f"run_metadata_step{step}.pb").write_bytes(metadata.SerializeToString())
        after = _timed(session, fetches, spec["untraced"])
        result |= {"untraced": before + after, "traced": traced}
    else:
        times: dict[str, list[float]] = {label: [] for label in sessions}
        blocks: dict[str, list[int]] = {label: [] for label in sessions}
        spans = []
        for number, label in enumerate(spec["order"]):
            start = time.monotonic()
            got = _timed(sessions[label], fetches, spec["block"])
            spans.append({"label": label, "start": start, "end": time.monotonic()})
            times[label] += got
            blocks[label] += [number] * len(got)
        result |= {"times": times, "blocks": blocks, "spans": spans}
    for session in sessions.values():
        session.close()
    result["end"] = time.monotonic()
    Path(spec["out"]).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
