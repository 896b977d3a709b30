"""A TensorFlow parameter-server job on 127.0.0.1 that runs a (rewritten) GraphDef.

The recipe of the generated TF traces: one ps and two workers, each a
`tf.distribute.Server` in its own process, and a client (tf.compat.v1 graph mode) that
imports a GraphDef, initialises it and runs traced training steps. Each ``--graph
LABEL=PATH`` runs in turn on the same cluster and writes ``OUT/LABEL/`` with
``run_metadata_step<N>.pb`` (RunMetadata with partition graphs, the input of ``planner
verify``) and ``steps.json`` (wall time of each step). Needs the ``tf`` extra.

    planner schedule -a tic graph.pb -o plan.json
    planner export --graphdef graph.pb --plan plan.json -o planned.pb
    python examples/tf_ps_job.py --graph base=graph.pb --graph planned=planned.pb \\
        --steps 5 --out runs/
    planner verify plan.json runs/planned/run_metadata_step*.pb
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from planner.enforce.needs import missing

SCRIPT = Path(__file__).resolve()
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
# the generated cnn job: train op, loss and the global step's value (a training loop reads
# it each step, as MonitoredTrainingSession does; planner's GraphDef plans assume so)
FETCHES = ("Momentum/update", "truediv:0", "global_step/Read/ReadVariableOp:0")


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports on 127.0.0.1 (the sockets closed again)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@contextlib.contextmanager
def cluster(workers: int = 2, inter_op: int = 2) -> Iterator[str]:
    """Start a ps and `workers` workers; yield the client target (worker 0); stop them."""
    with cluster_spec(workers, inter_op) as spec:
        yield f"grpc://{spec['worker'][0]}"


@contextlib.contextmanager
def cluster_spec(workers: int = 2, inter_op: int = 2) -> Iterator[dict[str, list[str]]]:
    """Start a ps and `workers` workers, each server with `inter_op` executor threads;
    yield the cluster ({job: [host:port]}); stop them."""
    with servers(workers, inter_op) as (spec, _):
        yield spec


@contextlib.contextmanager
def servers(
    workers: int = 2, inter_op: int = 2, cores: Sequence[int] | None = None
) -> Iterator[tuple[dict[str, list[str]], list[int]]]:
    """`cluster_spec`, yielding the servers' process ids too (ps first, then the
    workers). With `cores`, server k runs under ``taskset -c cores[k]``: every thread it
    starts (executor, gRPC) on that one core."""
    ports = free_ports(workers + 1)
    spec = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
    tasks = [("ps", 0)] + [("worker", i) for i in range(workers)]
    pin = [["taskset", "-c", str(c)] for c in cores] if cores else [[] for _ in tasks]
    procs = [
        subprocess.Popen(
            [
                *pin[k],
                sys.executable,
                str(SCRIPT),
                "--serve",
                json.dumps(spec),
                job,
                str(task),
                str(inter_op),
            ],  # fmt: skip
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=ENV,
            text=True,
        )
        for k, (job, task) in enumerate(tasks)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if "ready" not in proc.stdout.readline():  # printed once the server listens
                raise RuntimeError(f"a TF server did not start (exit {proc.poll()})")
        yield spec, [proc.pid for proc in procs]  # taskset execs: the server's own pid
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)


def run_steps(
    target: str, graph: Path, out: Path, steps: int, fetches: Sequence[str] = FETCHES
) -> list[float]:
    """Run `steps` traced steps of `graph` on the cluster into `out`; the step times (s)."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(SCRIPT), "--client", target, str(graph), str(out), str(steps)]
    done = subprocess.run([*argv, *fetches], capture_output=True, text=True, env=ENV)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    times = json.loads((out / "steps.json").read_text())["wall_s"]
    return [float(t) for t in times]


def _serve(spec: str, job: str, task: int, inter_op: int = 2) -> None:
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=1, inter_op_parallelism_threads=inter_op
    )
    cluster_spec = tf.train.ClusterSpec(json.loads(spec))
    server = tf.distribute.Server(cluster_spec, job_name=job, task_index=task, config=config)
    print("ready", flush=True)
    server.join()


def _client(target: str, graph: str, out: str, steps: int, fetches: list[str]) -> None:
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(Path(graph).read_bytes())
    wall: list[float] = []
    with tf.Graph().as_default() as g:
        tf.compat.v1.import_graph_def(graph_def, name="")
        options = tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE, output_partition_graphs=True
        )
        with tf.compat.v1.Session(target, graph=g) as session:
            session.run("init")
            session.run(fetches)  # warm-up: the first step partitions and caches the graph
            for step in range(steps):
                metadata = tf.compat.v1.RunMetadata()
                start = time.perf_counter()
                session.run(fetches, options=options, run_metadata=metadata)
                wall.append(time.perf_counter() - start)
                (Path(out) / f"run_metadata_step{step}.pb").write_bytes(
                    metadata.SerializeToString()
                )
    (Path(out) / "steps.json").write_text(json.dumps({"graph": graph, "wall_s": wall}))


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--serve":
        _serve(args[1], args[2], int(args[3]), int(args[4]) if len(args) > 4 else 2)
        return
    if args and args[0] == "--client":
        _client(args[1], args[2], args[3], int(args[4]), args[5:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", action="append", required=True, help="LABEL=GRAPH.pb")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fetch", action="append", help=f"default: {' '.join(FETCHES)}")
    parser.add_argument("--inter-op", type=int, default=2, help="Each server's executor threads.")
    opts = parser.parse_args(args)
    line = missing("tensorflow", "examples/tf_ps_job.py")
    if line is not None:  # one line, not a traceback from the cluster's servers
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    with cluster(inter_op=opts.inter_op) as target:
        for spec in opts.graph:
            label, _, path = spec.partition("=")
            times = run_steps(target, Path(path), opts.out / label, opts.steps,
                              opts.fetch or FETCHES)  # fmt: skip
            print(label, " ".join(f"{t * 1e3:.1f}" for t in times), "ms", flush=True)


if __name__ == "__main__":
    main()
