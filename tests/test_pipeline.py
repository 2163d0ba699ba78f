"""Data pipelines: datasets, readers, queues and pipe() (API.md section 6)."""

import math

import numpy as np
import pytest

from localcluster import (Dataset, LocalHostScheduler, Node, Output,
                          PlanError, Queue, ReaderWithLimit, Task, TaskGroup,
                          WorkspaceType, final_output, ops, pipe,
                          pipe_and_output)
from localcluster.dataio import CompositeReader, CounterReader


def make_datasets(session, src, dst_fields, node="local"):
    """Source and (empty) destination datasets in ``node``'s workspace."""
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node(node), Task():
            source = Dataset(src, name="src")
            dest = Dataset({f: np.zeros(0, dtype=np.asarray(src[f]).dtype)
                            for f in dst_fields}, name="dst")
            ops.CreateCounter([], ["calls"])
    session.run(init)
    return source, dest


def double_uid(rec):
    return {"uid": ops.Add([rec["uid"], rec["uid"]]), "value": rec["value"]}


def zero_value(rec):
    ops.CountUp(["calls"])
    return {"uid": rec["uid"], "value": ops.Sub([rec["value"], rec["value"]])}


def test_chain_through_two_queues_into_a_dataset(session):
    src, dst = make_datasets(
        session, {"uid": np.array([1, 2, 6]),
                  "value": np.array([1.4, 1.6, 1.7])}, ["uid", "value"])
    with TaskGroup() as tg:
        q1 = pipe(src.reader(), processor=double_uid)
        q2 = pipe(q1, processor=zero_value)
        pipe(q2, dst.writer())
    session.run(tg, timeout=30)
    out = dst.fetch(session)
    np.testing.assert_array_equal(out["uid"], [2, 4, 12])
    np.testing.assert_array_equal(out["value"], [0.0, 0.0, 0.0])


def test_dequeuing_several_records_concatenates_them(session):
    n, take = 17, 3
    src, dst = make_datasets(
        session, {"uid": np.arange(n), "value": 0.1 * np.arange(n)},
        ["uid", "value"])
    with TaskGroup() as tg:
        q1 = pipe(src.reader(), output=Queue(11, num_dequeue_records=take),
                  processor=double_uid)
        q2 = pipe(q1, processor=zero_value)
        pipe(q2, dst.writer())
    session.run(tg, timeout=30)
    out = dst.fetch(session)
    np.testing.assert_array_equal(out["uid"], 2 * np.arange(n))
    np.testing.assert_array_equal(out["value"], np.zeros(n))
    assert session.fetch_blob("calls") == math.ceil(n / take)


def mark_instance(rec):
    with ops.task_instance_init():
        ops.CountUp(["instances"])
    ops.AtomicAdd(["seen", rec["x"]])
    ops.CountUp(["records"])
    return None


def test_runtime_threads_process_every_record_exactly_once(session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"x": 2 ** np.arange(100, dtype=np.float64)
                           % 1000003}, name="src")
            ops.CreateCounter([], ["instances"])
            ops.CreateCounter([], ["records"])
            ops.ConstantFill([], ["seen"], shape=[1], value=0.0)
    session.run(init)
    with TaskGroup() as tg:
        pipe(src.reader(), processor=mark_instance, num_runtime_threads=8)
    session.run(tg, timeout=30)
    assert session.fetch_blob("instances") == 8
    assert session.fetch_blob("records") == 100
    expected = (2 ** np.arange(100, dtype=np.float64) % 1000003).sum()
    assert session.fetch_blob("seen")[0] == expected


def count_records(rec):
    ops.CountUp(["read"])
    return None


@pytest.mark.parametrize("num_iter,read,finished", [
    (None, 100, True), (0, 0, False), (10, 10, False), (110, 100, True)])
def test_reader_with_limit(session, num_iter, read, finished):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"x": np.arange(100)}, name="src")
            ops.CreateCounter([], ["read"])
    session.run(init)
    with TaskGroup() as tg:
        limited = ReaderWithLimit(src.reader(), num_iter=num_iter)
        _, done = pipe_and_output(limited, processor=count_records,
                                  final_outputs=limited.data_finished)
    session.run(tg, timeout=30)
    assert session.fetch_blob("read") == read
    assert bool(done.fetch()) is finished


def test_a_reader_made_in_a_builder_continues_across_runs(session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"x": np.arange(10)}, name="src")
            reader = src.reader(batch_size=1)  # cursor made here: global
            ops.CreateCounter([], ["read"])
    session.run(init)
    with TaskGroup() as epoch:
        pipe(ReaderWithLimit(reader, num_iter=3), processor=count_records)
    for expected in (3, 6, 9, 10):
        session.run(epoch, timeout=30)
        assert session.fetch_blob("read") == expected


def test_a_reader_made_by_its_task_restarts_every_run(session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"x": np.arange(10)}, name="src")
            ops.CreateCounter([], ["read"])
    session.run(init)
    with TaskGroup() as epoch:
        pipe(ReaderWithLimit(src.reader(), num_iter=3),
             processor=count_records)
    for expected in (3, 6, 9):
        session.run(epoch, timeout=30)
        assert session.fetch_blob("read") == expected
    with TaskGroup() as everything:
        pipe(src.reader(), processor=count_records)
    session.run(everything, timeout=30)
    assert session.fetch_blob("read") == 19


def stop_early(rec):
    return Output(record=rec, should_stop=ops.GE([rec["x"], ops.Const(4)]))


def test_a_consumer_that_stops_early_stops_its_producer(session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"x": np.arange(1000)}, name="src")
            dst = Dataset({"x": np.zeros(0, dtype=np.int64)}, name="dst")
    session.run(init)
    with TaskGroup() as tg:
        q = pipe(src.reader(), capacity=2)
        pipe(ReaderWithLimit(q.reader(), num_iter=5), dst.writer())
    session.run(tg, timeout=30)
    np.testing.assert_array_equal(dst.fetch(session)["x"], np.arange(5))


def test_composite_and_counter_readers(session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"x": np.arange(10, 15)}, name="src")
            dst = Dataset({"a:x": np.zeros(0, np.int64),
                           "b:iter": np.zeros(0, np.int64)}, name="dst")
    session.run(init)
    with TaskGroup() as tg:
        both = CompositeReader(["a", "b"], [src.reader(), CounterReader()])
        pipe(both, dst.writer())
    session.run(tg, timeout=30)
    out = dst.fetch(session)
    np.testing.assert_array_equal(out["a:x"], np.arange(10, 15))
    np.testing.assert_array_equal(out["b:iter"], np.arange(5))


def test_num_threads_zero_returns_a_processing_reader(session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"uid": np.array([1, 2, 3]),
                           "value": np.zeros(3)}, name="src")
            dst = Dataset({"uid": np.zeros(0, np.int64),
                           "value": np.zeros(0)}, name="dst")
    session.run(init)
    with TaskGroup() as tg:
        reader = pipe(src.reader(), num_threads=0, processor=double_uid)
        pipe(reader, dst.writer())
    session.run(tg, timeout=30)
    np.testing.assert_array_equal(dst.fetch(session)["uid"], [2, 4, 6])


def test_pipe_argument_errors():
    with TaskGroup():
        with Node("local"), Task():
            src = Dataset({"x": np.arange(3)})
        with pytest.raises(PlanError, match="not both"):
            pipe(src.reader(), num_threads=2, num_runtime_threads=2)
        with pytest.raises(PlanError, match="no record"):
            pipe(src.reader(), output=Queue(1), processor=count_records)
        with pytest.raises(PlanError, match="Reader, a Queue or a Dataset"):
            pipe(42)


def test_a_dataset_needs_a_builder_and_equal_lengths():
    with pytest.raises(PlanError, match="Task"):
        Dataset({"x": np.arange(3)})
    with TaskGroup(), Task():
        with pytest.raises(PlanError, match="one length"):
            Dataset({"x": np.arange(3), "y": np.arange(4)})


def test_cross_node_queues_are_refused_clearly_by_the_scheduler():
    session = LocalHostScheduler()
    try:
        with TaskGroup(WorkspaceType.GLOBAL) as init:
            with Node("reader"), Task():
                src = Dataset({"x": np.arange(3)}, name="src")
        session.run(init)
        with TaskGroup() as tg:
            with Node("reader"):
                q = pipe(src.reader())
            with Node("trainer"):
                pipe(q, processor=count_records)
        with pytest.raises(PlanError, match="'reader' and 'trainer'"):
            session.run(tg)
    finally:
        session.close()
