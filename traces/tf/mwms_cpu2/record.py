"""Record a TF2 multi-worker job under the TF profiler, converted as TensorBoard does.

`tf.distribute.MultiWorkerMirroredStrategy` with 2 CPU workers, each its own process on
127.0.0.1 (``TF_CONFIG`` per worker), a small Keras MLP trained by a custom loop
(`strategy.run` in a `tf.function`; the gradients all-reduced by ``CollectiveReduceV2``),
each step in a `tf.profiler.experimental.Trace("train", step_num=k, _r=1)` (the
profiler's steps). Each worker starts a profiler server
(`tf.profiler.experimental.server.start`) and runs WARMUP steps; the parent then profiles
both together as TensorFlow's guide does for several workers,
`tf.profiler.experimental.client.trace("grpc://127.0.0.1:P0,grpc://127.0.0.1:P1", OUT,
DURATION_MS)`, during which the workers run STEPS more steps; it writes one XSpace per
worker named after its address (``OUT/plugins/profile/<run>/127.0.0.1_<port>.xplane.pb``).
Each XSpace is then converted with TensorFlow's own profiler tools (the ``xprof``
package's trace-viewer conversion, what TensorBoard's trace viewer serves) into
``OUT/127.0.0.1_<port>.trace.json.gz`` (TensorBoard's name for it), and ``OUT/meta.json``
says which port is which task and every step's wall time as each worker timed it.

    python traces/tf/mwms_cpu2/record.py OUT

Needs TensorFlow (``pip install tensorflow-cpu``) and ``xprof``; planner needs neither.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from tf_ps_job import free_ports  # noqa: E402

WORKERS = 2
WARMUP = 5  # steps before the profile (the first builds the function)
STEPS = 10  # steps run while the profiler traces
DURATION_MS = 2000  # long enough for STEPS steps on a loaded 2-core host
BATCH = 16  # per replica
WIDTHS = (784, 512, 256, 10)


def _model(tf):  # noqa: ANN001, ANN202
    layers = [tf.keras.layers.Dense(w, activation="relu") for w in WIDTHS[1:-1]]
    return tf.keras.Sequential(
        [tf.keras.Input((WIDTHS[0],)), *layers, tf.keras.layers.Dense(WIDTHS[-1])]
    )


def worker(out: Path, spec: list[str], task: int, profiler_port: int) -> None:
    """One worker: join the cluster, serve the profiler, train until told to stop."""
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": spec}, "task": {"type": "worker", "index": task}}
    )
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = _model(tf)
        optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )
    x = tf.random.stateless_uniform([BATCH, WIDTHS[0]], seed=[task, 1])
    y = tf.random.stateless_uniform([BATCH], seed=[task, 2], maxval=WIDTHS[-1], dtype=tf.int32)

    def replica_step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH * WORKERS)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step() -> tf.Tensor:
        losses = strategy.run(replica_step)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    tf.profiler.experimental.server.start(profiler_port)
    times = []
    for step in range(WARMUP + STEPS):
        if step == WARMUP:  # wait, out of any collective, until the profile has started
            (out / f"ready{task}").touch()
            _wait([out / "go"], [], 300)
        start = time.perf_counter()
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
            loss = train_step().numpy()
        times.append({"step": step, "wall_s": time.perf_counter() - start, "loss": float(loss)})
    _wait([out / "collected"], [], 300)  # serve the profiler until it has its trace
    meta = {"task": task, "profiler_port": profiler_port, "steps": times}
    meta["variables"] = [{"name": v.name, "shape": v.shape.as_list()} for v in model.weights]
    (out / f"worker{task}.json").write_text(json.dumps(meta, indent=1) + "\n")


def convert(xplane: Path, target: Path) -> None:
    """An XSpace to a trace-viewer JSON with xprof's converter (what TensorBoard serves)."""
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([str(xplane)], "trace_viewer", {})
    if not data:
        raise SystemExit(f"xprof converted nothing from {xplane}")
    text = data if isinstance(data, str) else data.decode()
    target.write_bytes(gzip.compress(text.encode(), mtime=0))


def _wait(paths: list[Path], procs: list[subprocess.Popen], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise SystemExit(f"workers did not reach {paths}")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--worker", nargs=3, metavar=("SPEC", "TASK", "PORT"), help="(internal)")
    args = parser.parse_args()
    if args.worker:
        worker(args.out, args.worker[0].split(","), int(args.worker[1]), int(args.worker[2]))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    ports = free_ports(2 * WORKERS)
    spec = [f"127.0.0.1:{p}" for p in ports[:WORKERS]]
    profilers = ports[WORKERS:]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(args.out), "--worker", ",".join(spec), str(k)]
            + [str(profilers[k])]
        )
        for k in range(WORKERS)
    ]
    import tensorflow as tf

    _wait([args.out / f"ready{k}" for k in range(WORKERS)], procs, 300)
    service = ",".join(f"grpc://127.0.0.1:{p}" for p in profilers)
    tracing = threading.Thread(
        target=tf.profiler.experimental.client.trace, args=(service, str(args.out), DURATION_MS)
    )
    tracing.start()
    time.sleep(0.5)  # the profile starts when the request arrives
    (args.out / "go").touch()
    tracing.join()
    (args.out / "collected").touch()
    if any(p.wait(timeout=300) for p in procs):
        raise SystemExit("a worker failed")
    for name in ("go", "collected", *(f"ready{k}" for k in range(WORKERS))):
        (args.out / name).unlink()
    xplanes = sorted((args.out / "plugins" / "profile").rglob("*.xplane.pb"))
    if len(xplanes) != WORKERS:
        raise SystemExit(f"the profiler wrote {len(xplanes)} XSpace(s) for {WORKERS} workers")
    for xplane in xplanes:
        convert(xplane, args.out / xplane.name.replace(".xplane.pb", ".trace.json.gz"))
    workers = [json.loads((args.out / f"worker{k}.json").read_text()) for k in range(WORKERS)]
    meta = {
        "strategy": "MultiWorkerMirroredStrategy",
        "cluster": {"worker": spec},
        "profiler": {f"127.0.0.1_{p}": f"/job:worker/task:{k}" for k, p in enumerate(profilers)},
        "model": {"dense_widths": list(WIDTHS), "batch_per_replica": BATCH},
        "duration_ms": DURATION_MS,
        "xplanes": [str(p.relative_to(args.out)) for p in xplanes],
        "workers": workers,
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    for k in range(WORKERS):
        (args.out / f"worker{k}.json").unlink()


if __name__ == "__main__":
    main()
