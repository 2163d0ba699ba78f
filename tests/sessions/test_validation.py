"""A run every session refuses the same way: validation lives in one place
(the plan layer) and runs under every session."""

import re

import numpy as np
import pytest

from localcluster import (Dataset, Node, PlanError, Queue, Task, TaskGroup,
                          ops, pipe)


def count_batch(batch):
    ops.Add([batch["x"], batch["x"]])
    return None


def test_an_object_array_cannot_be_fed_on_any_session(session):
    with pytest.raises(TypeError, match=r"feed_blob\('x'\): value must be "
                                        "numeric array-like, got list"):
        session.feed_blob("x", [1, "two", None])
    assert not session.has_blob("x")


@pytest.mark.parametrize("value", ["hello", b"bytes", np.array(["a", "b"])])
def test_text_cannot_be_fed_on_any_session(session, value):
    """feed_blob("w", "hello") was accepted: text is no blob an op
    computes with, and a checkpoint would carry it as if it were."""
    with pytest.raises(TypeError, match=r"feed_blob\('w'\): value must be "
                                        "numeric array-like"):
        session.feed_blob("w", value)
    assert not session.has_blob("w")


def test_a_queue_no_task_of_the_group_writes_is_refused_before_the_run(
        session):
    """A queue starts empty at every run: one that a group reads and no
    task of it writes -- here written by another group -- would wait
    forever (the run ended only by its timeout)."""
    q = Queue(4, name="q")
    with TaskGroup() as writes:
        with Node("a"), Task():
            pipe(Dataset({"x": np.arange(3)}, name="d").reader(), q)
    with TaskGroup() as reads:
        with Node("b"), Task():
            pipe(q, processor=count_batch)
    session.run(writes, timeout=30)   # a queue nobody reads: as pipe's
    with pytest.raises(PlanError, match=re.escape(
            "queue 'queue/q' is read on node(s) ['b'] but no task of ")
            + ".* writes it: a queue starts empty at every run, so its "
              "reader would wait forever"):
        session.run(reads, timeout=10)
    assert session.is_open()
    with pytest.raises(PlanError, match="is read on node"):
        session.validate(reads)
