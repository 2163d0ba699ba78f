"""Data pipelines: datasets, readers, queues and pipe()."""

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localcluster import (Dataset, LocalHostScheduler, Node, Output,
                          PlanError, Queue, ReaderWithLimit, Task, TaskGroup,
                          WorkspaceType, ops, pipe,
                          pipe_and_output)
from localcluster.dataio import CompositeReader, CounterReader


def make_datasets(session, src, dst_fields, node="local", dst_node=None):
    """Source and (empty) destination datasets; the destination (and the
    ``calls`` counter) on ``dst_node``, by default the source's node."""
    dst_node = dst_node or node
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node(node), Task():
            source = Dataset(src, name="src")
        with Node(dst_node), Task():
            dest = Dataset({f: np.zeros(0, dtype=np.asarray(src[f]).dtype)
                            for f in dst_fields}, name="dst")
            ops.CreateCounter([], ["calls"])
    session.run(init)
    return source, dest


#: (producer node, consumer node): one node, or a queue between two
PLACEMENTS = [("local", "local"), ("reader", "trainer")]


def double_uid(rec):
    return {"uid": ops.Add([rec["uid"], rec["uid"]]), "value": rec["value"]}


def zero_value(rec):
    ops.CountUp(["calls"])
    return {"uid": rec["uid"], "value": ops.Sub([rec["value"], rec["value"]])}


@pytest.mark.parametrize("producer,consumer", PLACEMENTS)
def test_chain_through_two_queues_into_a_dataset(session, producer,
                                                 consumer):
    src, dst = make_datasets(
        session, {"uid": np.array([1, 2, 6]),
                  "value": np.array([1.4, 1.6, 1.7])}, ["uid", "value"],
        node=producer, dst_node=consumer)
    with TaskGroup() as tg:
        with Node(producer):
            q1 = pipe(src.reader(), processor=double_uid)
        with Node(consumer):
            q2 = pipe(q1, processor=zero_value)
            pipe(q2, dst.writer())
    session.run(tg, timeout=30)
    out = dst.fetch(session)
    np.testing.assert_array_equal(out["uid"], [2, 4, 12])
    np.testing.assert_array_equal(out["value"], [0.0, 0.0, 0.0])


@pytest.mark.parametrize("producer,consumer", PLACEMENTS)
def test_dequeuing_several_records_concatenates_them(session, producer,
                                                     consumer):
    n, take = 17, 3
    src, dst = make_datasets(
        session, {"uid": np.arange(n), "value": 0.1 * np.arange(n)},
        ["uid", "value"], node=producer, dst_node=consumer)
    with TaskGroup() as tg:
        q1 = Queue(11, num_dequeue_records=take)
        with Node(producer):
            assert pipe(src.reader(), output=q1, processor=double_uid) is None
        with Node(consumer):
            q2 = pipe(q1, processor=zero_value)
            pipe(q2, dst.writer())
    session.run(tg, timeout=30)
    out = dst.fetch(session)
    np.testing.assert_array_equal(out["uid"], 2 * np.arange(n))
    np.testing.assert_array_equal(out["value"], np.zeros(n))
    assert session.fetch_blob("calls", consumer) == math.ceil(n / take)


def mark_instance(rec):
    with ops.task_instance_init():
        ops.CountUp(["instances"])
    ops.AtomicAdd(["seen", rec["x"]])
    ops.CountUp(["records"])
    return None


@pytest.mark.parametrize("producer,consumer", PLACEMENTS)
def test_runtime_threads_process_every_record_exactly_once(session, producer,
                                                           consumer):
    values = 2 ** np.arange(100, dtype=np.float64) % 1000003
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node(producer), Task():
            src = Dataset({"x": values}, name="src")
        with Node(consumer), Task():
            ops.CreateCounter([], ["instances"])
            ops.CreateCounter([], ["records"])
            ops.ConstantFill([], ["seen"], shape=[1], value=0.0)
    session.run(init)
    with TaskGroup() as tg:
        with Node(producer):
            source = src.reader() if producer == consumer else \
                pipe(src.reader(), capacity=8)
        with Node(consumer):
            pipe(source, processor=mark_instance, num_runtime_threads=8)
    session.run(tg, timeout=30)
    assert session.fetch_blob("instances", consumer) == 8
    assert session.fetch_blob("records", consumer) == 100
    assert session.fetch_blob("seen", consumer)[0] == values.sum()


def count_records(rec):
    ops.CountUp(["read"])
    return None


@pytest.mark.parametrize("num_iter,read,finished", [
    (None, 100, True), (0, 0, False), (10, 10, False), (110, 100, True),
    (100, 100, True)])   # the limit at the data's very end: ran out too
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


def test_a_queue_cannot_dequeue_more_than_it_holds():
    with pytest.raises(PlanError, match="capacity"):
        Queue(3, num_dequeue_records=4)


def test_a_write_after_commit_is_an_error_naming_the_writer():
    """commit ends a queue writer's writing (the queue closes once its
    last writer has committed): a record written after it was dropped
    without a word; now building it is a PlanError naming the writer."""
    q = Queue(4, name="q")
    with TaskGroup(), Node("a"), Task():
        writer = q.writer()
        writer.write_record(ops.net(), {"v": ops.Const(1.0)})
        writer.commit(ops.net())
        refused = re.escape("QueueWriter('queue/q'): a write after its "
                            "commit;") + ".* would be dropped"
        with pytest.raises(PlanError, match=refused):
            writer.write_record(ops.net(), {"v": ops.Const(2.0)})
        with pytest.raises(PlanError, match=refused):
            pipe(Dataset({"v": np.arange(3.0)}).reader(), writer)
        with pytest.raises(PlanError, match=refused):
            writer.commit(ops.net())
        q.writer().write_record(ops.net(), {"v": ops.Const(3.0)})  # another


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


def test_a_queue_between_two_nodes(session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("reader"), Task():
            src = Dataset({"uid": np.arange(50), "value": np.ones(50)},
                          name="src")
        with Node("trainer"), Task():
            dst = Dataset({"uid": np.zeros(0, np.int64),
                           "value": np.zeros(0)}, name="dst")
            ops.CreateCounter([], ["calls"])
    session.run(init)
    with TaskGroup() as tg:
        q = Queue(5, num_dequeue_records=4)
        with Node("reader"):
            pipe(src.reader(batch_size=2), output=q, processor=double_uid)
        with Node("trainer"):
            pipe(q, dst.writer(), processor=zero_value)
    for _ in range(2):  # queues start empty and open at every run
        session.run(tg, timeout=30)
    out = dst.fetch(session)
    np.testing.assert_array_equal(out["uid"], np.tile(2 * np.arange(50), 2))
    np.testing.assert_array_equal(out["value"], np.zeros(100))
    assert session.fetch_blob("calls", "trainer") == 2 * math.ceil(25 / 4)


def test_a_consumer_on_another_node_that_stops_early_stops_the_producer(
        session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("reader"), Task():
            src = Dataset({"x": np.arange(100000)}, name="src")
        with Node("trainer"), Task():
            dst = Dataset({"x": np.zeros(0, dtype=np.int64)}, name="dst")
    session.run(init)
    with TaskGroup() as tg:
        with Node("reader"):
            q = pipe(src.reader(), capacity=2)
        with Node("trainer"):
            pipe(ReaderWithLimit(q.reader(), num_iter=5), dst.writer())
    session.run(tg, timeout=30)
    np.testing.assert_array_equal(dst.fetch(session, "trainer")["x"],
                                  np.arange(5))


def kill_self(_):
    import os
    import signal
    os.kill(os.getpid(), signal.SIGKILL)


def test_killing_the_producer_node_mid_stream_fails_the_run_cleanly():
    from localcluster import NodeFailedError
    from localcluster.runtime import shm
    from conftest import child_processes
    session = LocalHostScheduler()
    prefix = session.shm_prefix
    try:
        with TaskGroup(WorkspaceType.GLOBAL) as init:
            with Node("reader"), Task():
                src = Dataset({"x": np.arange(1000)}, name="src")
        session.run(init)
        with TaskGroup() as tg:
            with Node("reader"):
                q = pipe(src.reader(), capacity=4)
                with Task():
                    ops.Sleep([], [], seconds=0.2)
                    ops.Python(kill_self)([ops.Const(0)], [])
            with Node("trainer"):
                pipe(q, processor=lambda rec: None)
        with pytest.raises(NodeFailedError, match="'reader'"):
            session.run(tg, timeout=30)
    finally:
        session.close()
    assert not child_processes()
    assert not shm.segments(prefix)


def test_reader_with_time_limit_stops_after_its_duration(session):
    from localcluster import ReaderWithDelay, ReaderWithTimeLimit
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"x": np.arange(1000)}, name="src")
            ops.CreateCounter([], ["read"])
    session.run(init)
    with TaskGroup() as tg:
        slow = ReaderWithDelay(src.reader(), 0.01)
        pipe(ReaderWithTimeLimit(slow, duration=0.2), processor=count_records)
    session.run(tg, timeout=30)
    # ~20 reads in 0.2 s at 10 ms each; far fewer than the 1000 records
    assert 1 <= session.fetch_blob("read") <= 100


def test_reader_with_delay_waits_before_every_read(session):
    import time
    from localcluster import ReaderWithDelay
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"x": np.arange(5)}, name="src")
            ops.CreateCounter([], ["read"])
    session.run(init)
    with TaskGroup() as tg:
        pipe(ReaderWithDelay(src.reader(), 0.05), processor=count_records)
    start = time.monotonic()
    session.run(tg, timeout=30)
    assert time.monotonic() - start >= 0.25  # six reads, each after 50 ms
    assert session.fetch_blob("read") == 5


def test_a_pipe_queue_nobody_reads_holds_a_hundred_records(session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("local"), Task():
            src = Dataset({"x": np.arange(50)}, name="src")
    session.run(init)
    with TaskGroup() as tg:
        with Node("local"):
            queue = pipe(src.reader(), processor=lambda rec: {"x": rec["x"]})
    assert queue.capacity == 100
    # 50 records fit: the pipe ends without a reader (capacity 1 blocked
    # on the second record until the timeout)
    session.run(tg, timeout=20)


# -- several writers on one queue (issue: the first to end closed it) ------

@pytest.mark.parametrize("producer,consumer", PLACEMENTS)
@pytest.mark.parametrize("writers", ["pipes", "tasks"])
def test_a_queue_with_several_writers_closes_when_the_last_ends(
        session, producer, consumer, writers):
    """Two pipes (or two tasks) write one queue: every record of both
    arrives, however their ends interleave -- the queue closes when the
    last of them ends, not the first."""
    n = 400
    src, dst = make_datasets(
        session, {"uid": np.arange(n), "value": np.ones(n)},
        ["uid", "value"], node=producer, dst_node=consumer)
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node(producer), Task():
            short = Dataset({"uid": np.arange(n, n + 3),
                             "value": np.ones(3)}, name="short")
    session.run(init)
    with TaskGroup() as tg:
        q = Queue(capacity=4, name="shared")
        with Node(producer):
            if writers == "pipes":
                pipe(short.reader(), q)       # ends long before the other
                pipe(src.reader(), q)
            else:
                for dataset in (short, src):
                    with Task():
                        pipe(dataset.reader(), q)
        with Node(consumer):
            pipe(q, dst.writer())
    session.run(tg, timeout=60)
    got = np.sort(dst.fetch(session)["uid"])
    np.testing.assert_array_equal(got, np.arange(n + 3))


def test_a_reader_closing_a_queue_stops_every_writer_quietly(session):
    """A reader that has what it needs closes the queue early: both
    writers stop without an error, and the run ends."""
    src, dst = make_datasets(
        session, {"uid": np.arange(1000), "value": np.ones(1000)},
        ["uid", "value"])
    with TaskGroup() as tg:
        q = Queue(capacity=2, name="shared")
        with Node("local"):
            pipe(src.reader(), q)
            pipe(src.reader(), q)
            pipe(ReaderWithLimit(q.reader(), num_iter=5), dst.writer())
    session.run(tg, timeout=60)
    assert len(dst.fetch(session)["uid"]) == 5


@pytest.mark.parametrize("seed", range(4))
def test_several_writers_lose_no_record_under_any_schedule(seed):
    """The same under deterministic schedules, which try the interleavings
    where one writer ends while the other still has records to put."""
    from localcluster import LocalSession
    with LocalSession(schedule=seed) as session:
        test_a_queue_with_several_writers_closes_when_the_last_ends(
            session, "local", "local", "pipes")


# -- a reader made inside a task of the reading group (the cursor race) -----

def _reader_in_a_task(session, n=300, runs=2):
    """``with Node(n), Task(): pipe(ds.reader(), q)`` -- the surrounding
    task runs concurrently with the pipe's task, so it must not be the one
    that makes (or rewinds) the cursor the pipe reads with."""
    src, dst = make_datasets(
        session, {"uid": np.arange(n), "value": np.ones(n)},
        ["uid", "value"])
    with TaskGroup() as tg:
        with Node("local"), Task():
            q = pipe(src.reader(), capacity=3)
        with Node("local"):
            pipe(q, dst.writer())
    for run in range(1, runs + 1):
        session.run(tg, timeout=60)
        got = np.sort(dst.fetch(session)["uid"])
        # every record once per run: each run reads from the start
        np.testing.assert_array_equal(got, np.sort(np.tile(np.arange(n),
                                                           run)))


def test_a_reader_made_in_a_task_of_its_group_reads_every_record(session):
    _reader_in_a_task(session)


@pytest.mark.parametrize("seed", range(6))
def test_a_reader_made_in_a_task_of_its_group_reads_every_record_scheduled(
        seed):
    from localcluster import LocalSession
    with LocalSession(schedule=seed) as session:
        _reader_in_a_task(session, n=40)


# -- a pipe that looks at no record drains its queue in bulk -----------------

def _queue_op_types(group):
    """The types of the queue-reading ops of every task in ``group``."""
    return sorted(op.type for task in group.tasks()
                  for net in task.get_step().walk_nets() for op in net.ops
                  if op.type in ("DequeueRecords", "DrainRecords"))


def _write_one_record(queue):
    """A task on node ``w`` that writes one record into ``queue``."""
    with Node("w"), Task():
        queue.writer().write_record(ops.net(), {
            "x": ops.ConstantFill([], shape=[1], value=1.0)})


def test_a_pipe_that_looks_at_no_record_drains_its_queue_in_one_op():
    with TaskGroup() as tg:
        queue = Queue(8)
        _write_one_record(queue)
        with Node("r"):
            pipe(queue, processor=lambda record: None)
    assert _queue_op_types(tg) == ["DrainRecords"]


@pytest.mark.parametrize("processor", [
    None,                                         # writes each record on
    lambda record: (ops.CountUp(["calls"]), None)[1],   # makes ops
    lambda record: Output(record=record),          # a record
])
def test_a_pipe_that_looks_at_its_records_reads_them_one_read_at_a_time(
        processor):
    with TaskGroup() as tg:
        queue = Queue(8)
        _write_one_record(queue)
        with Node("r"):
            pipe(queue, processor=processor)
    assert _queue_op_types(tg) == ["DequeueRecords"]


def test_a_limited_or_final_output_pipe_does_not_drain():
    with TaskGroup() as tg:
        queue = Queue(8)
        _write_one_record(queue)
        with Node("r"):
            pipe(ReaderWithLimit(queue.reader(), 3),
                 processor=lambda record: None)
            pipe_and_output(queue, processor=lambda record: None,
                            final_outputs=lambda: ops.ConstantFill(
                                [], shape=[1], value=0.0))
    assert _queue_op_types(tg) == ["DequeueRecords", "DequeueRecords"]


@pytest.mark.parametrize("producer,consumer", PLACEMENTS)
@pytest.mark.parametrize("n,capacity", [(0, 1), (1, 1), (37, 4), (300, 64)])
def test_a_draining_pipe_takes_every_record_and_ends(session, producer,
                                                     consumer, n, capacity):
    """Every record written reaches the queue (the draining reader closes
    it only once closed and empty), whatever the capacity."""
    src, _ = make_datasets(session, {"uid": np.arange(n)}, ["uid"],
                           node=producer)
    with TaskGroup() as tg:
        queue = Queue(capacity)
        with Node(producer):
            pipe(src.reader(), output=queue,
                 processor=lambda rec: (ops.CountUp(["calls"]), rec)[1])
        with Node(consumer):
            pipe(queue, processor=lambda record: None)
    session.run(tg, timeout=60)
    assert session.fetch_blob("calls", producer) == n
    assert _queue_op_types(tg) == ["DrainRecords"]


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 120), capacity=st.integers(1, 16),
       writers=st.integers(1, 2), cross=st.booleans())
def test_a_draining_pipe_ends_a_run_as_the_one_record_pipe_does(
        session, n, capacity, writers, cross):
    """Batched (a pipe that looks at no record) and one record a read (the
    same pipe counting what it reads): every writer writes all of its
    records, and the one-record pipe reads exactly those, under every
    session, one node or a queue between nodes, one writer or two."""
    producers = [f"w{i}" if cross else "local" for i in range(writers)]
    consumer = "r" if cross else "local"
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        for node in {*producers, consumer}:
            with Node(node), Task():
                ops.CreateCounter([], ["written"])
                ops.CreateCounter([], ["read"])
    counts = {}
    for drains in (True, False):
        session.run(init)
        with TaskGroup() as tg:
            queue = Queue(capacity)
            for i, node in enumerate(producers):
                share = n // writers + (i < n % writers)
                with Node(node), Task(name=f"producer_{i}"):
                    record = {"x": ops.ConstantFill([], shape=[1],
                                                    value=1.0)}
                    writer = queue.writer()
                    with ops.loop(share):
                        net = ops.net()
                        writer.write_record(net, record)
                        net.CountUp(["written"])
                    writer.commit(ops.net())
            with Node(consumer):
                pipe(queue, processor=(lambda r: None) if drains else
                     (lambda r: (ops.CountUp(["read"]), None)[1]))
        assert _queue_op_types(tg) == \
            ["DrainRecords" if drains else "DequeueRecords"]
        session.run(tg, timeout=60)
        counts[drains] = sum(int(session.fetch_blob("written", node))
                             for node in set(producers))
    assert counts == {True: n, False: n}
    assert int(session.fetch_blob("read", consumer)) == n


@pytest.mark.parametrize("seed", range(4))
def test_a_draining_pipe_ends_under_a_deterministic_schedule(seed):
    """The drain's wait for one record is a switch point like any queue
    wait: every schedule ends, with every record written."""
    from localcluster import LocalSession
    with LocalSession(schedule=seed) as session:
        with TaskGroup(WorkspaceType.GLOBAL) as init:
            with Node("w"), Task():
                ops.CreateCounter([], ["written"])
        session.run(init)
        with TaskGroup() as tg:
            queue = Queue(3)
            with Node("w"), Task():
                record = {"x": ops.ConstantFill([], shape=[1], value=1.0)}
                writer = queue.writer()
                with ops.loop(10):
                    net = ops.net()
                    writer.write_record(net, record)
                    net.CountUp(["written"])
                writer.commit(ops.net())
            with Node("r"):
                pipe(queue, processor=lambda record: None)
        session.run(tg, timeout=30)
        assert int(session.fetch_blob("written", "w")) == 10
