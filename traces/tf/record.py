"""Record a TensorFlow parameter-server job on this host, as `../shared/traces/generated/tf`
was recorded: 1 ps and 2 workers, each a `tf.distribute.Server` in its own process on
127.0.0.1 (started by `examples/tf_ps_job.py`'s `servers`; intra-op 1, inter-op 2
threads each), tf.compat.v1 graph mode, every variable on the ps, Momentum, 8 steps,
steps 3..7 traced with `RunOptions(trace_level=FULL_TRACE, output_partition_graphs=True)`.

    python traces/tf/record.py --model mlp OUT
    python traces/tf/record.py --mode betweengraph --model mlp OUT
    python traces/tf/record.py --workers 1 --inter-op 1 --pin --steps 12 --model mlp OUT

`--workers N` (default 2), `--inter-op K` (each server's executor threads, default 2),
`--steps S` (default 8; steps 3..S-1 traced, the first three warm up). `--pin` runs each
server under `taskset -c`, the ps on core 0 and worker i on core i+1 (so N + 1 cores
are needed), and every client on core 0 beside the ps: a client only waits in
`session.run` while a step runs (the in-graph client's target, the master, is worker 0's
server, which partitions the step and gathers its RunMetadata) and works between steps,
when the servers are idle; the ps's work comes at the step's end, when the worker's core
is still busy with the backward pass of the last layers, so the worker's core is the one
the step needs to itself. Each pinned process's threads' CPUs, read back after the
steps (`os.sched_getaffinity` of each thread), are in `meta.json` (`affinity`), so that
the pinning is checked, not assumed: a process whose threads are not all on its core
fails the recording.

`ingraph` (the default): one client drives a tower on each worker, the gradients
averaged on the ps (one RunMetadata per step with the three partitions, in `OUT/`).
`betweengraph`: a client per worker with SyncReplicasOptimizer (`OUT/worker{0,1}/`, each
RunMetadata holding that worker's partition and the ps's); the clients meet before each
step, outside the timed `session.run`, so that step k of each is the same global step.
Each client writes `meta.json` beside its files: the variables and every step's wall
time as it timed `session.run`. The RunMetadata and the GraphDef are written gzipped
(`.pb.gz`), which planner reads.

Needs TensorFlow (`pip install tensorflow-cpu`), which planner itself does not.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from tf_ps_job import servers  # noqa: E402

WARMUP = 3  # the first steps are not traced
BATCH = 16  # per worker


def model(tf, name: str, x, labels):  # noqa: ANN001, ANN201
    """The loss of a small CNN or MLP on `x` (variables made with `tf.compat.v1`)."""
    v1 = tf.compat.v1
    if name == "cnn":
        h = x
        for i, ch in enumerate((16, 16, 32, 32)):
            with v1.variable_scope(f"conv{i + 1}", reuse=v1.AUTO_REUSE):
                k = v1.get_variable("kernel", [3, 3, h.shape[-1], ch])
                b = v1.get_variable("bias", [ch], initializer=v1.zeros_initializer())
            h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, k, 1, "SAME"), b))
            if i % 2:
                h = tf.nn.max_pool2d(h, 2, 2, "SAME")
        h = tf.reshape(h, [BATCH, -1])
        widths = (128, 10)
    else:
        h = x  # as the generated mlp: 6 layers, 12 variables of 2 to 4,194,304 floats
        widths = (2048, 2048, 1024, 512, 256, 2)
    for i, w in enumerate(widths):
        with v1.variable_scope(f"dense{i + 1}", reuse=v1.AUTO_REUSE):
            k = v1.get_variable("kernel", [h.shape[-1], w])
            b = v1.get_variable("bias", [w], initializer=v1.zeros_initializer())
        h = tf.matmul(h, k) + b
        if i < len(widths) - 1:
            h = tf.nn.relu(h)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=h))


def inputs(tf, name: str, seed: int):  # noqa: ANN001, ANN201
    shape = [BATCH, 16, 16, 3] if name == "cnn" else [BATCH, 784]
    x = tf.random.stateless_uniform(shape, seed=[seed, 1])
    classes = 10 if name == "cnn" else 2
    labels = tf.random.stateless_uniform([BATCH], seed=[seed, 2], maxval=classes, dtype=tf.int32)
    return x, labels


def variables_meta(tf) -> list[dict]:  # noqa: ANN001
    return [
        {
            "name": v.name,
            "shape": v.shape.as_list(),
            "numel": int(v.shape.num_elements()),
            "dtype": v.dtype.base_dtype.name,
            "device": v.device,
            "trainable": v.trainable,
        }
        for v in tf.compat.v1.global_variables()
    ]


def run_steps(tf, session, train, out: Path, meta: dict, count: int, before=None) -> None:  # noqa: ANN001
    """Run `count` steps of `train` (the loss, or the loss and the global step read),
    tracing those from `WARMUP` on; write the RunMetadata and `meta.json` into `out`.
    `before(step)`, when given, runs before each step, outside the timed `session.run`."""
    v1 = tf.compat.v1
    steps = []
    for step in range(count):
        if before is not None:
            before(step)
        traced = step >= WARMUP
        options = (
            v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE, output_partition_graphs=True)
            if traced
            else None
        )
        run_metadata = v1.RunMetadata() if traced else None
        began = time.perf_counter()
        fetched = session.run(train, options=options, run_metadata=run_metadata)
        wall = time.perf_counter() - began
        if traced:
            data = gzip.compress(run_metadata.SerializeToString(), mtime=0)
            (out / f"run_metadata_step{step}.pb.gz").write_bytes(data)
        record = {"step": step, "wall_s": wall, "traced": traced}
        if isinstance(fetched, tuple):  # (loss, the global step it read)
            record.update(loss=float(fetched[0]), global_step_read=int(fetched[1]))
        else:
            record.update(loss=float(fetched))
        steps.append(record)
    meta.update(steps=steps, traced_steps=list(range(WARMUP, count)))
    meta["affinity"] = {"client": affinity(os.getpid())}  # its threads, after the steps
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def ingraph(target: str, name: str, out: Path, setup: dict) -> None:
    """One client, a tower per worker, gradients averaged on the ps. `setup`: the
    cluster's `workers`, `inter_op` and the `steps` to run."""
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    with tf.device("/job:ps/task:0"):
        global_step = v1.train.get_or_create_global_step()
    grads, losses = [], []
    opt = v1.train.MomentumOptimizer(0.01, 0.9)
    for i in range(setup["workers"]):
        with tf.device(f"/job:worker/task:{i}"), v1.name_scope(f"tower{i}"):
            x, labels = inputs(tf, name, i)
            with v1.variable_scope("model", reuse=v1.AUTO_REUSE, custom_getter=_on_ps(tf)):
                loss = model(tf, name, x, labels)
            grads.append(opt.compute_gradients(loss))
            losses.append(loss)
    with tf.device("/job:ps/task:0"):
        averaged = [
            (tf.add_n([g[k][0] for g in grads]) / len(grads), grads[0][k][1])
            for k in range(len(grads[0]))
        ]
        train = opt.apply_gradients(averaged, global_step=global_step)
        with tf.control_dependencies([train]):
            total = tf.add_n(losses) / len(losses)
    with v1.Session(target) as session:
        session.run(v1.global_variables_initializer())
        meta = {
            "framework": "tensorflow", "tf_version": tf.__version__, "mode": "ingraph",
            "model": name, "workers": setup["workers"], "client_target": target,
            "variables": variables_meta(tf),
            "optimizer": "MomentumOptimizer(0.01, 0.9), grads averaged on ps",
            "server_config": {"intra_op": 1, "inter_op": setup["inter_op"]},
            "resource_variables": True,
        }  # fmt: skip
        run_steps(tf, session, total, out, meta, setup["steps"])
    write_graph(tf, out)


def betweengraph(spec: dict, task: int, name: str, out: Path, setup: dict) -> None:
    """Worker `task`'s client: its own graph, SyncReplicasOptimizer over every worker's
    gradients; before each step it waits until the other workers' clients are there too,
    so that step k of each worker is the same global step."""
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    setter = v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{task}", cluster=tf.train.ClusterSpec(spec)
    )
    with v1.device(setter):
        global_step = v1.train.get_or_create_global_step()
        x, labels = inputs(tf, name, task)
        with v1.variable_scope("model"):
            loss = model(tf, name, x, labels)
        opt = v1.train.SyncReplicasOptimizer(
            v1.train.MomentumOptimizer(0.01, 0.9),
            replicas_to_aggregate=setup["workers"],
            total_num_replicas=setup["workers"],
        )
        train = opt.minimize(loss, global_step=global_step)
        with tf.control_dependencies([train]):
            fetch = (tf.identity(loss), global_step.read_value())
    chief = task == 0
    target = f"grpc://{spec['worker'][task]}"
    out.mkdir(parents=True, exist_ok=True)
    meeting = out.parent

    def meet(label: str) -> None:
        (meeting / f".{label}.{task}").touch()
        while not all((meeting / f".{label}.{i}").exists() for i in range(setup["workers"])):
            time.sleep(0.01)

    with v1.train.MonitoredTrainingSession(
        master=target, is_chief=chief, hooks=[opt.make_session_run_hook(chief)],
        save_checkpoint_secs=None, save_summaries_steps=None, log_step_count_steps=None,
    ) as session:  # fmt: skip
        meta = {
            "framework": "tensorflow", "tf_version": tf.__version__, "mode": "betweengraph",
            "model": name, "task": task, "is_chief": chief, "client_target": target,
            "variables": variables_meta(tf),
            "optimizer": "SyncReplicasOptimizer(Momentum(0.01, 0.9)), all workers' gradients",
            "server_config": {"intra_op": 1, "inter_op": setup["inter_op"]},
            "resource_variables": True,
        }  # fmt: skip
        meet_step = lambda step: meet(f"step{step}")  # noqa: E731
        run_steps(tf, session, fetch, out, meta, setup["steps"], before=meet_step)
        meet("done")  # neither client leaves while the other still needs its tokens
    write_graph(tf, out)


def write_graph(tf, out: Path) -> None:  # noqa: ANN001
    """The client's GraphDef, `out/graph.pb.gz`."""
    graph = tf.compat.v1.get_default_graph().as_graph_def().SerializeToString()
    (out / "graph.pb.gz").write_bytes(gzip.compress(graph, mtime=0))


def _on_ps(tf):  # noqa: ANN001, ANN202
    def getter(getter, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        with tf.device("/job:ps/task:0"):
            return getter(*args, **kwargs)

    return getter


def affinity(pid: int) -> list[int]:
    """The CPUs any thread of process `pid` may run on (`os.sched_getaffinity` of each
    thread in /proc/PID/task), sorted."""
    cpus: set[int] = set()
    for thread in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            cpus |= os.sched_getaffinity(int(thread.name))
    return sorted(cpus)


def check_pinning(pids: dict[str, int], cores: dict[str, int], out: Path) -> None:
    """Each server's threads' CPUs (`pids`: process name -> pid) beside the client's in
    every `meta.json` under `out` (`affinity`); fail unless each server and client is
    on its core (`cores`; the clients on core 0) alone."""
    servers_seen = {name: affinity(pid) for name, pid in pids.items()}
    wrong = [f"{n} on CPUs {cpus}" for n, cpus in servers_seen.items() if cpus != [cores[n]]]
    for meta in sorted(out.glob("**/meta.json")):
        doc = json.loads(meta.read_text())
        doc["affinity"] = {**servers_seen, **doc["affinity"]}
        meta.write_text(json.dumps(doc, indent=1))
        if doc["affinity"]["client"] != [0]:
            wrong.append(f"the client of {meta.parent} on CPUs {doc['affinity']['client']}")
    if wrong:
        raise SystemExit(f"pinning did not take: {', '.join(wrong)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", choices=("cnn", "mlp"), default="mlp")
    parser.add_argument("--mode", choices=("ingraph", "betweengraph"), default="ingraph")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--inter-op", type=int, default=2, help="each server's executor threads")
    parser.add_argument("--steps", type=int, default=8, help=f"steps {WARMUP}.. traced")
    parser.add_argument("--pin", action="store_true", help="each server on its own core")
    parser.add_argument("--client", nargs=2, metavar=("SPEC", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    setup = {"workers": args.workers, "inter_op": args.inter_op, "steps": args.steps}
    if args.client:  # one worker's client of a between-graph job
        betweengraph(json.loads(args.client[0]), int(args.client[1]), args.model, args.out, setup)
        return
    if args.steps <= WARMUP or args.workers < 1:
        parser.error(f"--steps must exceed {WARMUP} and --workers be at least 1")
    cores = {"ps0": 0, **{f"worker{i}": i + 1 for i in range(args.workers)}}
    if args.pin and not set(cores.values()) <= os.sched_getaffinity(0):
        parser.error(f"--pin needs cores 0..{args.workers}, this process may not use them all")
    args.out.mkdir(parents=True, exist_ok=True)
    pinned = list(cores.values()) if args.pin else None
    with servers(args.workers, args.inter_op, pinned) as (spec, pids):  # tf_ps_job.py's
        if args.pin:  # the clients beside the ps (module docstring); theirs inherit it
            os.sched_setaffinity(0, {0})
        if args.mode == "ingraph":
            ingraph(f"grpc://{spec['worker'][0]}", args.model, args.out, setup)
        else:
            between_clients(args, spec)
        if args.pin:
            check_pinning(dict(zip(cores, pids, strict=True)), cores, args.out)


def between_clients(args: argparse.Namespace, spec: dict) -> None:
    """Run a client per worker (`betweengraph`), each in its own process."""
    extra = ["--workers", str(args.workers), "--inter-op", str(args.inter_op),
             "--steps", str(args.steps)]  # fmt: skip
    clients = [
        subprocess.Popen(
            [sys.executable, __file__, str(args.out / f"worker{i}"), "--model", args.model,
             *extra, "--client", json.dumps(spec), str(i)]
        )
        for i in range(args.workers)
    ]  # fmt: skip
    failed = [i for i, c in enumerate(clients) if c.wait() != 0]
    for mark in args.out.glob(".*.*"):
        mark.unlink()
    if failed:
        raise SystemExit(f"the client of worker {failed[0]} failed")


if __name__ == "__main__":
    main()
