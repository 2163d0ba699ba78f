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


def test_two_writer_nodes_on_one_cross_node_queue_are_refused(session):
    with TaskGroup() as tg:
        q = Queue(4)
        with Node("a"), Task():
            a = Dataset({"x": np.arange(3)}, name="a")
        with Node("b"), Task():
            b = Dataset({"x": np.arange(3)}, name="b")
        with Node("a"):
            pipe(a.reader(), q)
        with Node("b"):
            pipe(b.reader(), q)
        with Node("c"):
            pipe(q, processor=count_batch)
    expected = re.escape(
        "has tasks on nodes ['a', 'b'] that all write it; a queue between "
        "node processes takes its writers from one node and its readers "
        "from one node -- use one queue per producing node")
    with pytest.raises(PlanError, match=r"^queue '[^']*queue' " + expected):
        session.run(tg, timeout=30)
    assert session.is_open()


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
