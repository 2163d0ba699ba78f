"""A parameter-server linear regression on synthetic data -- the job
``python -m localcluster.run`` runs by default.

Nodes::

    reader ──data queue i──> trainer_i ──w──> ps
              (batches)      (hogwild SGD      (averages every trainer's
                              on its own w)      w, sends the mean back,
    trainer_i <────────────── mean w ─────────   scores it on held-out data)

- **init group**: the ``reader`` node holds one data shard per trainer
  (``x`` rows and ``y = x @ w_true + noise``, made from ``seed``); each
  trainer starts with ``w = 0``; the ``ps`` holds a held-out evaluation set.
- **epoch group**: the reader pipes each shard, in batches, through a
  cross-node Queue to its trainer; each trainer runs ``threads`` hogwild
  task instances doing SGD steps on its own ``w`` (no locks: instances race
  on it, as hogwild does), then sends ``w`` to the ps; the ps averages the
  trainers' weights, sends the mean back to every trainer and reports the
  mean squared error of the mean weights on the held-out set (``loss``).
- Every node's global workspace (data, cursors, weights, the epoch counter)
  is checkpointed after every epoch by the runner.

`build(...)` follows the contract of ``python -m localcluster.run --job``:
it takes the command line's options it names (``nodes``, ``epochs``,
``seed``, ...) and returns ``(job, options)`` where ``options["metrics"]``
maps a metric name to the TaskOutput that holds it after each epoch and
``options["records"]`` is how many records an epoch processes.  Its
hogwild trainers race on ``w`` by design, and say so:
``options["allow_races"]`` names ``w``, so
``localcluster.testing.races((job, options))`` is empty -- a race on any
other blob would be a bug.
"""

import numpy as np

from .. import (Job, Node, Queue, Task, epoch_limiter, ops, pipe,
                pipe_and_output)
from ..dataio import Dataset


def make_data(seed, nodes, samples, dim, noise, eval_samples):
    """``(shards, (x_eval, y_eval), w_true)`` drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=dim)

    def draw(n):
        x = rng.normal(size=(n, dim))
        return x, x @ w_true + noise * rng.normal(size=n)

    per_node = max(1, samples // nodes)
    return [draw(per_node) for _ in range(nodes)], draw(eval_samples), w_true


def build(nodes=2, epochs=5, seed=0, threads=2, samples=65536, dim=32,
          batch=64, lr=0.0015, noise=0.1, eval_samples=1024):
    """The job and its options (see the module docstring)."""
    shards, (x_eval, y_eval), _ = make_data(seed, nodes, samples, dim, noise,
                                            eval_samples)
    trainers = [f"trainer_{i}" for i in range(nodes)]
    data_queues = [Queue(8, name=f"data_{i}") for i in range(nodes)]
    to_ps = [Queue(1, name=f"to_ps_{i}") for i in range(nodes)]
    from_ps = [Queue(1, name=f"from_ps_{i}") for i in range(nodes)]
    metrics = {}

    with Job() as job:
        # -- reader: one shard per trainer, piped in batches -----------------
        with Node("reader"):
            datasets = []
            with job.init_group, Task(name="data"):
                for i, (x, y) in enumerate(shards):
                    datasets.append(Dataset({"x": x, "y": y},
                                            name=f"shard_{i}"))
            for i, dataset in enumerate(datasets):
                # made outside a builder: the cursor restarts every epoch
                pipe(dataset.reader(batch_size=batch), output=data_queues[i],
                     name=f"feed_{i}")

        # -- trainers: hogwild SGD, then w to the ps ---------------------------
        for i, node in enumerate(trainers):
            with Node(node):
                with job.init_group, Task(name="weights"):
                    ops.ConstantFill([], ["w"], shape=[dim], value=0.0)
                    ops.ConstantFill([], ["loss_sum"], value=0.0)
                    ops.ConstantFill([], ["loss_count"], value=0.0)

                def sgd_step(record):
                    x, y = record["x"], record["y"]
                    err = ops.Sub([ops.MatMul([x, "w"]), y])
                    grad = ops.MatMul([x, err], trans_a=True)
                    # hogwild: read w, step, write w -- no lock
                    ops.Sub(["w", ops.Scale([grad], scale=lr / batch)],
                            ["w"])
                    ops.AtomicAdd(["loss_sum",
                                   ops.ReduceSum([ops.Sqr([err])])])
                    ops.AtomicAdd(["loss_count",
                                   ops.Cast([ops.Size([err])],
                                            to="float64")])

                def send_weights(queue=to_ps[i]):
                    # runs once, after every instance has finished
                    writer = queue.writer()
                    writer.write_record(ops.net(), {"w": "w"})
                    writer.commit(ops.net())
                    loss = ops.Div(["loss_sum", "loss_count"])
                    ops.ConstantFill([], ["loss_sum"], value=0.0)
                    ops.ConstantFill([], ["loss_count"], value=0.0)
                    return [loss]

                _, train_loss = pipe_and_output(
                    data_queues[i], processor=sgd_step,
                    num_runtime_threads=threads, name="sgd",
                    final_outputs=send_weights)
                metrics[f"train_loss_{i}"] = train_loss

        # -- ps: average, send back, evaluate ---------------------------------
        with Node("ps"):
            with job.init_group, Task(name="eval_data"):
                ops.Const(x_eval, name="x_eval")
                ops.Const(y_eval, name="y_eval")
                ops.ConstantFill([], ["w"], shape=[dim], value=0.0)
            with Task(name="average"):
                received = []
                for queue in to_ps:
                    _, record = queue.reader().read_record(ops.net())
                    received.append(record["w"])
                ops.Scale([ops.Sum(received)], ["w"], scale=1.0 / nodes)
                for queue in from_ps:
                    writer = queue.writer()
                    writer.write_record(ops.net(), {"w": "w"})
                    writer.commit(ops.net())
                err = ops.Sub([ops.MatMul(["x_eval", "w"]), "y_eval"])
                loss = ops.Scale([ops.ReduceSum([ops.Sqr([err])])],
                                 scale=1.0 / len(y_eval))
                metrics["loss"] = Task.current().add_output(loss)
            epoch_limiter(job, epochs)

        # -- trainers take the mean back --------------------------------------
        for i, node in enumerate(trainers):
            with Node(node), Task(name="receive"):
                _, record = from_ps[i].reader().read_record(ops.net())
                ops.Copy([record["w"]], ["w"])

    records = sum(len(y) for _, y in shards)
    # hogwild: a trainer's instances update its w without a lock, and
    # that is the algorithm (with threads=1 there is no race at all)
    return job, {"metrics": metrics, "records": records,
                 "allow_races": ("w",)}
