"""Small jobs the kit's tests share (the planted bugs are `_corpus`)."""

import numpy as np

from localcluster import Job, Node, Task, epoch_limiter, ops

NODES = ("a", "b")


def scaled_job(epochs=3):
    """Each node: w <- 1.5 w + 1 per epoch; "a" counts the epochs."""
    with Job() as job:
        for i, node in enumerate(NODES):
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.full(3, float(i + 1)), name="w")
                with Task():
                    ops.Scale(["w"], ["w"], scale=1.5)
                    ops.Add(["w", ops.Const(np.ones(3))], ["w"])
        with Node("a"):
            epoch_limiter(job, epochs)
    return job


#: epochs counted by `count`: Python state, outside every checkpoint
COUNTED = [0]


def count(seen):
    COUNTED[0] += 1
    return np.array([COUNTED[0]], dtype=np.int64)


def python_counter_job():
    """Node "a" writes how many epochs the Python process it runs in has
    counted since the job was built: state outside the checkpointed blobs,
    so a resumed (or restarted) run counts from the wrong place."""
    COUNTED[0] = 0
    with Job() as job, Node("a"):
        with job.init_group, Task():
            ops.Const(np.array([0]), name="seen")
        with Task():
            ops.Python(count)(["seen"], ["seen"])
        epoch_limiter(job, 3)
    return job


#: elements of `table_job`'s table: 256 KiB of float64, past the size
#: from which a fresh process's run answers with a known array's number
TABLE_SIZE = 32768


def table_job():
    """Node "a": a big ``table`` set once (every run ends with the same)
    and a small ``w`` stepped from it each epoch."""
    with Job() as job, Node("a"):
        with job.init_group, Task():
            ops.Const(np.arange(TABLE_SIZE, dtype=np.float64) / 7.0,
                      name="table")
            ops.Const(np.zeros(1), name="w")
        with Task():
            ops.Add(["w", ops.ReduceSum(["table"])], ["w"])
        epoch_limiter(job, 2)
    return job


def draw(x):
    return np.random.rand(*x.shape)


def global_draw_job():
    """Node "a": ``x`` drawn from numpy's global random state each epoch
    (unseeded: every fresh process draws other values)."""
    with Job() as job, Node("a"):
        with job.init_group, Task():
            ops.Const(np.zeros(4), name="x")
        with Task():
            ops.Python(draw)(["x"], ["x"])
        epoch_limiter(job, 1)
    return job
