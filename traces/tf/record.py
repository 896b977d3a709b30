"""Record a TensorFlow parameter-server job on this host, as `../shared/traces/generated/tf`
was recorded: 1 ps and 2 workers, each a `tf.distribute.Server` in its own process on
127.0.0.1 (started by `examples/tf_ps_job.py`'s `cluster`), tf.compat.v1 graph mode,
every variable on the ps, Momentum, 8 steps, steps 3..7 traced with
`RunOptions(trace_level=FULL_TRACE, output_partition_graphs=True)`.

    python traces/tf/record.py --model mlp OUT
    python traces/tf/record.py --mode betweengraph --model mlp OUT

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
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from tf_ps_job import cluster_spec  # noqa: E402

WORKERS = 2
STEPS = 8
TRACED = range(3, STEPS)  # the first steps warm up
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


def run_steps(tf, session, train, out: Path, meta: dict, before=None) -> None:  # noqa: ANN001
    """Run `STEPS` steps of `train` (the loss, or the loss and the global step read),
    tracing `TRACED`; write the RunMetadata and `meta.json` into `out`. `before(step)`,
    when given, runs before each step, outside the timed `session.run`."""
    v1 = tf.compat.v1
    steps = []
    for step in range(STEPS):
        if before is not None:
            before(step)
        traced = step in TRACED
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
    meta.update(steps=steps, traced_steps=list(TRACED))
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def ingraph(target: str, name: str, out: Path) -> None:
    """One client, a tower per worker, gradients averaged on the ps."""
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    with tf.device("/job:ps/task:0"):
        global_step = v1.train.get_or_create_global_step()
    grads, losses = [], []
    opt = v1.train.MomentumOptimizer(0.01, 0.9)
    for i in range(WORKERS):
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
            "model": name, "workers": WORKERS, "client_target": target,
            "variables": variables_meta(tf),
            "optimizer": "MomentumOptimizer(0.01, 0.9), grads averaged on ps",
            "server_config": {"intra_op": 1, "inter_op": 2}, "resource_variables": True,
        }  # fmt: skip
        run_steps(tf, session, total, out, meta)
    write_graph(tf, out)


def betweengraph(spec: dict, task: int, name: str, out: Path) -> None:
    """Worker `task`'s client: its own graph, SyncReplicasOptimizer over both workers'
    gradients; before each step it waits until the other worker's client is there too,
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
            replicas_to_aggregate=WORKERS,
            total_num_replicas=WORKERS,
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
        while not all((meeting / f".{label}.{i}").exists() for i in range(WORKERS)):
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
            "server_config": {"intra_op": 1, "inter_op": 2}, "resource_variables": True,
        }  # fmt: skip
        run_steps(tf, session, fetch, out, meta, before=lambda step: meet(f"step{step}"))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", choices=("cnn", "mlp"), default="mlp")
    parser.add_argument("--mode", choices=("ingraph", "betweengraph"), default="ingraph")
    parser.add_argument("--client", nargs=2, metavar=("SPEC", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:  # one worker's client of a between-graph job
        betweengraph(json.loads(args.client[0]), int(args.client[1]), args.model, args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    with cluster_spec(WORKERS) as spec:  # the servers of examples/tf_ps_job.py
        if args.mode == "ingraph":
            ingraph(f"grpc://{spec['worker'][0]}", args.model, args.out)
            return
        clients = [
            subprocess.Popen(
                [sys.executable, __file__, str(args.out / f"worker{i}"), "--model", args.model,
                 "--client", json.dumps(spec), str(i)]
            )
            for i in range(WORKERS)
        ]  # fmt: skip
        failed = [i for i, c in enumerate(clients) if c.wait() != 0]
        for mark in args.out.glob(".*.*"):
            mark.unlink()
        if failed:
            raise SystemExit(f"the client of worker {failed[0]} failed")


if __name__ == "__main__":
    main()
