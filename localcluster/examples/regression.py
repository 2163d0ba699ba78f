"""A parameter-server linear regression on synthetic data -- the job
``python -m localcluster.run`` runs by default.

Nodes (``--nodes N`` trainers; 4 nodes by default: reader, trainer_0,
trainer_1, ps)::

                 trainer_i (one prototype, N instances)
                 hogwild SGD on its own shard and its own w
                   |  {index: i, w}                ^  mean w
                   v  (queue to_ps, shared)        |  (queue from_ps, shared)
    reader ──held-out batches──> ps: puts each w in row i, averages the
            (queue eval_data)        rows in index order, sends the mean
                                     back, scores it on the held-out data

- **init group**: each trainer instance draws its own data shard (``x``
  rows and ``y = x @ w_true + noise``) from ``(seed, its NodeIndex)`` with
  a Python op, and keeps it as a Dataset in its workspace, with ``w = 0``;
  the ``reader`` draws the held-out evaluation set from ``seed`` the same
  way; the ps starts with ``w = 0``.  ``w_true`` comes from ``seed`` alone,
  so every node draws the same one.
- **epoch group**: each trainer runs ``threads`` hogwild task instances
  doing SGD steps over its shard, in batches, on its own ``w`` (no locks:
  instances race on it, as hogwild does), then sends ``{index, w}`` to
  the ps through the one queue ``to_ps`` all trainers share; the ps reads
  N records, puts each ``w`` in row ``index`` of an ``[N, dim]`` matrix
  (`AssignRow`, registered here), averages the rows, and writes the mean
  N times to the one queue ``from_ps``, from which each trainer takes one
  record (all are the same) as its new ``w``.  Meanwhile the reader pipes
  the held-out set, in batches, to the ps through ``eval_data``; the ps
  scores the mean weights on it: the mean squared error (``loss``).
- Every node's global workspace (shard, weights, the epoch counter) is
  checkpointed after every epoch by the runner, each trainer instance to
  its own file.

The trainers are one ``Node("trainer", num_instances=nodes)`` prototype,
so building the job takes the same time at any number of trainers: no
per-trainer queue, data or op is made while it is built -- the shards are
drawn at run time, the ps loops ``ops.loop(nodes)`` times.

Why the data goes where it goes: a shared queue hands its records to
whichever reader asks first, so a trainer's training data cannot come
through one (which trainer got which batch would be timing) -- each
trainer draws its own, deterministically.  The reader's role is the
held-out data: it holds the evaluation set and streams it to the ps every
epoch (one writer, one reader: the batches arrive in order).  And the ps
sums the trainers' weights in the order of their index, never in the
order they arrive, so with ``threads=1`` the results are the same bits
run after run, under any session and schedule, and after a resume.

`build(...)` follows the contract of ``python -m localcluster.run --job``:
it takes the command line's options it names (``nodes``, ``epochs``,
``seed``, ...) and returns ``(job, options)`` where ``options["metrics"]``
maps a metric name to the TaskOutput that holds it after each epoch --
``loss`` (the ps's) and ``train_loss``, a TaskOutput of the trainer
prototype: it fetches as a list of every instance's mean training loss
in the epoch, which the command line shows as ``train_loss_<i>`` -- and
``options["records"]`` is how many records an epoch trains on.  Its
hogwild trainers race on ``w`` by design, and say so:
``options["allow_races"]`` names ``w``, so
``localcluster.testing.races((job, options))`` is empty -- a race on any
other blob would be a bug.
"""

import functools

import numpy as np

from .. import (Job, Node, Queue, Task, epoch_limiter, ops, pipe,
                pipe_and_output, register_op)
from ..dataio import Dataset

#: records the shared queues between the trainers and the ps hold
QUEUE_CAPACITY = 16


@register_op("AssignRow", atomic=True)
def assign_row(matrix, index, row):
    """``matrix`` with row ``index`` set to ``row``, written in place (the
    blob is updated, not copied: the matrix has a row per trainer)."""
    matrix[int(index)] = row
    return matrix


def true_weights(seed, dim):
    """The weights the data is drawn from: ``seed``'s alone."""
    return np.random.default_rng(seed).normal(size=dim)


def draw(seed, key, dim, rows, noise):
    """``(x, y)``: ``rows`` records drawn from ``(seed, key)`` -- ``key`` a
    tuple of ints (the seed sequence's spawn key: independent streams)."""
    w_true = true_weights(seed, dim)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))
    x = rng.normal(size=(rows, dim))
    return x, x @ w_true + noise * rng.normal(size=rows)


def shard(index, *, seed, dim, rows, noise):
    """The shard of trainer ``index`` (a Python op's kernel: ``index`` is
    its NodeIndex)."""
    return draw(seed, (0, int(index)), dim, rows, noise)


def held_out(*, seed, dim, rows, noise):
    """The evaluation set (a Python op's kernel)."""
    return draw(seed, (1,), dim, rows, noise)


def make_data(seed, nodes, samples, dim, noise, eval_samples):
    """``(shards, (x_eval, y_eval), w_true)`` as the job draws them at run
    time (for looking at the data; building the job calls none of this)."""
    rows = max(1, samples // nodes)
    return ([shard(i, seed=seed, dim=dim, rows=rows, noise=noise)
             for i in range(nodes)],
            held_out(seed=seed, dim=dim, rows=eval_samples, noise=noise),
            true_weights(seed, dim))


def _drawn_dataset(name, dim, kernel, inputs=()):
    """A Dataset of ``x``/``y`` columns that ``kernel`` (a Python op's
    function) fills when the current task runs: built empty, so nothing
    of the data is in the plan."""
    dataset = Dataset({"x": np.zeros((0, dim)), "y": np.zeros(0)}, name=name)
    ops.Python(kernel)(list(inputs), dataset.content().field_blobs())
    return dataset


def build(nodes=2, epochs=5, seed=0, threads=2, samples=65536, dim=32,
          batch=64, lr=0.0015, noise=0.1, eval_samples=1024):
    """The job and its options (see the module docstring)."""
    rows = max(1, samples // nodes)
    eval_data = Queue(8, name="eval_data")
    to_ps = Queue(QUEUE_CAPACITY, name="to_ps")
    from_ps = Queue(QUEUE_CAPACITY, name="from_ps")
    metrics = {}

    with Job() as job:
        # -- reader: the held-out set, piped to the ps every epoch -----------
        with Node("reader"):
            with job.init_group, Task(name="eval_data"):
                evaluation = _drawn_dataset(
                    "eval", dim, functools.partial(
                        held_out, seed=seed, dim=dim, rows=eval_samples,
                        noise=noise))
            # made outside a builder: the cursor restarts every epoch
            pipe(evaluation.reader(batch_size=batch), output=eval_data,
                 name="feed_eval")

        # -- trainers: hogwild SGD on their own shard, then w to the ps ------
        trainer = Node("trainer", num_instances=nodes)
        with trainer:
            with job.init_group, Task(name="data"):
                data = _drawn_dataset(
                    "shard", dim, functools.partial(
                        shard, seed=seed, dim=dim, rows=rows, noise=noise),
                    [ops.NodeIndex()])
                ops.ConstantFill([], ["w"], shape=[dim], value=0.0)
                ops.ConstantFill([], ["loss_sum"], value=0.0)
                ops.ConstantFill([], ["loss_count"], value=0.0)

            def sgd_step(record):
                x, y = record["x"], record["y"]
                err = ops.Sub([ops.MatMul([x, "w"]), y])
                grad = ops.MatMul([x, err], trans_a=True)
                # hogwild: read w, step, write w -- no lock
                ops.Sub(["w", ops.Scale([grad], scale=lr / batch)], ["w"])
                ops.AtomicAdd(["loss_sum", ops.ReduceSum([ops.Sqr([err])])])
                ops.AtomicAdd(["loss_count",
                               ops.Cast([ops.Size([err])], to="float64")])

            def send_weights():
                # runs once, after every instance has finished
                writer = to_ps.writer()
                writer.write_record(ops.net(), {"index": ops.NodeIndex(),
                                                "w": "w"})
                writer.commit(ops.net())
                loss = ops.Div(["loss_sum", "loss_count"])
                ops.ConstantFill([], ["loss_sum"], value=0.0)
                ops.ConstantFill([], ["loss_count"], value=0.0)
                return [loss]

            # made outside a builder: the cursor restarts every epoch
            _, metrics["train_loss"] = pipe_and_output(
                data.reader(batch_size=batch), processor=sgd_step,
                num_runtime_threads=threads, name="sgd",
                final_outputs=send_weights)

        # -- ps: gather by index, average, send back, evaluate ----------------
        with Node("ps"):
            with job.init_group, Task(name="weights"):
                ops.ConstantFill([], ["w"], shape=[dim], value=0.0)
            with Task(name="average"):
                # the epoch's own blob (the epoch group is PRIVATE): a row
                # per trainer, each written once an epoch
                rows_of = ops.ConstantFill([], ["trainer_w"],
                                           shape=[nodes, dim], value=0.0)
                with ops.loop(nodes):
                    _, record = to_ps.reader().read_record(ops.net())
                    ops.AssignRow([rows_of, record["index"], record["w"]],
                                  [rows_of])
                ops.ReduceMean([rows_of], ["w"], axes=0)
                back = from_ps.writer()
                with ops.loop(nodes):
                    back.write_record(ops.net(), {"w": "w"})
                back.commit(ops.net())
                sse = ops.ConstantFill([], value=0.0)
                with ops.loop():
                    done, batch_of = eval_data.reader().read_record(
                        ops.net())
                    ops.stop_if(done)
                    err = ops.Sub([ops.MatMul([batch_of["x"], "w"]),
                                   batch_of["y"]])
                    ops.Add([sse, ops.ReduceSum([ops.Sqr([err])])], [sse])
                loss = ops.Scale([sse], scale=1.0 / eval_samples)
                metrics["loss"] = Task.current().add_output(loss)
            epoch_limiter(job, epochs)

        # -- trainers take the mean back ----------------------------------------
        with trainer, Task(name="receive"):
            _, record = from_ps.reader().read_record(ops.net())
            ops.Copy([record["w"]], ["w"])

    # hogwild: a trainer's instances update its w without a lock, and
    # that is the algorithm (with threads=1 there is no race at all)
    return job, {"metrics": metrics, "records": rows * nodes,
                 "allow_races": ("w",)}
