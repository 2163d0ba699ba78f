"""A queue shared by any number of writer and reader nodes: fan-in (many
trainers to one ps), fan-out (one reader to many trainers) and both at
once.  Every record is read once, by one reader, under every session; the
queue closes when the last writer ends, on whichever node."""

import numpy as np
import pytest

from localcluster import (Dataset, Link, LocalSession, Node, Queue,
                          ReaderWithLimit, Task, TaskGroup, WorkspaceType, pipe)


def _datasets(session, writers, readers, n, width=1):
    """A source dataset on each writer node (uids ``k*n .. k*n+n-1`` for
    the k-th) and an empty destination on each reader node."""
    sources, dests = {}, {}
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        for k, node in enumerate(writers):
            with Node(node), Task():
                uid = np.arange(k * n, (k + 1) * n)
                sources[node] = Dataset(
                    {"uid": uid,
                     "value": np.repeat(uid[:, None], width, axis=1)
                     .astype(np.float64)}, name=f"src_{node}")
        for node in readers:
            with Node(node), Task():
                dests[node] = Dataset(
                    {"uid": np.zeros(0, np.int64),
                     "value": np.zeros((0, width))}, name=f"dst_{node}")
    session.run(init)
    return sources, dests


def _shared_run(session, writers, readers, n=300, capacity=4, runs=2,
                width=1, batch=1):
    """Every writer node pipes its dataset into one queue, every reader
    node pipes the queue into its own dataset; after each run, each uid
    was read exactly once, over all readers -- and each value is the one
    written with it (a record is never torn between writers)."""
    sources, dests = _datasets(session, writers, readers, n, width)
    with TaskGroup() as tg:
        q = Queue(capacity=capacity, name="shared")
        for node in writers:
            with Node(node):
                pipe(sources[node].reader(batch_size=batch), q)
        for node in readers:
            with Node(node):
                pipe(q, dests[node].writer())
    everything = np.arange(len(writers) * n)
    for run in range(1, runs + 1):
        session.run(tg, timeout=120)
        got = [dests[node].fetch(session) for node in readers]
        uids = np.concatenate([g["uid"] for g in got])
        values = np.concatenate([g["value"] for g in got])
        order = np.argsort(uids, kind="stable")
        np.testing.assert_array_equal(uids[order],
                                      np.sort(np.tile(everything, run)))
        np.testing.assert_array_equal(
            values[order], np.repeat(uids[order][:, None], width, axis=1))
    return got


def test_fan_in_many_writer_nodes_to_one_reader(session):
    _shared_run(session, ["w0", "w1", "w2"], ["ps"])


def test_fan_out_one_writer_node_to_many_readers(session):
    got = _shared_run(session, ["reader"], ["t0", "t1", "t2"], n=600)
    # the records are shared out, not all taken by the first reader
    assert sum(len(g["uid"]) > 0 for g in got) >= 2


def test_many_writer_and_reader_nodes_on_one_queue(session):
    _shared_run(session, ["w0", "w1"], ["r0", "r1", "r2"], capacity=3)


def test_a_node_that_writes_and_reads_a_shared_queue(session):
    """A node on both sides of a queue with another writer: the records it
    wrote may come back to it or go to the other reader, once each."""
    _shared_run(session, ["a", "b"], ["a", "c"], n=200)


def test_big_records_pass_between_writer_nodes(session):
    """Records of 128 KiB (past the size where a slot's memory is reused
    as is) written by two nodes through the same slots."""
    _shared_run(session, ["w0", "w1"], ["r0", "r1"], n=12, width=16384,
                runs=2)


def test_records_of_other_layouts_from_each_writer(session):
    """Batches of 1 from one writer, of 3 from another: a slot written by
    one takes the other's layout, and each reader reads it right."""
    sources, dests = _datasets(session, ["w0", "w1"], ["r0", "r1"], 90)
    with TaskGroup() as tg:
        q = Queue(capacity=2, name="shared")
        with Node("w0"):
            pipe(sources["w0"].reader(batch_size=1), q)
        with Node("w1"):
            pipe(sources["w1"].reader(batch_size=3), q)
        for node in ("r0", "r1"):
            with Node(node):
                pipe(q, dests[node].writer())
    session.run(tg, timeout=120)
    got = [dests[node].fetch(session) for node in ("r0", "r1")]
    uids = np.concatenate([g["uid"] for g in got])
    np.testing.assert_array_equal(np.sort(uids), np.arange(180))
    values = np.concatenate([g["value"][:, 0] for g in got])
    np.testing.assert_array_equal(values, uids.astype(np.float64))


def test_a_reader_that_stops_early_keeps_no_record_from_the_others(session):
    """One reader node takes 5 records and closes the queue (a reader may:
    the writer then stops quietly); the other reads what was queued: every
    record written before the close is read once -- none is taken and
    dropped by the reader that stopped."""
    sources, dests = _datasets(session, ["w"], ["r0", "r1"], 200)
    with TaskGroup() as tg:
        q = Queue(capacity=4, name="shared")
        with Node("w"):
            pipe(sources["w"].reader(), q)
        with Node("r0"):
            pipe(ReaderWithLimit(q.reader(), num_iter=5), dests["r0"].writer())
        with Node("r1"):
            pipe(q, dests["r1"].writer())
    session.run(tg, timeout=120)
    first = dests["r0"].fetch(session)["uid"]
    rest = dests["r1"].fetch(session)["uid"]
    assert len(first) == 5
    both = np.sort(np.concatenate([first, rest]))
    np.testing.assert_array_equal(both, np.arange(len(both)))


@pytest.mark.parametrize("seed", range(4))
def test_shared_queues_under_schedules(seed):
    """The same under deterministic schedules, which try the interleavings
    where one writer ends while others still put, and readers race."""
    with LocalSession(schedule=seed) as session:
        _shared_run(session, ["w0", "w1"], ["r0", "r1"], n=20, capacity=2,
                    runs=1)


def test_a_shared_queue_over_links_from_some_of_its_writers(session_factory):
    """Fan-in and fan-out where only some pairs of nodes are over a link:
    every writer stamps its records, every reader takes the stamp off, and
    the records arrive whole, each once."""
    session = session_factory(conditions=[
        Link("w1", "r*", latency=0.002), Link("w0", "r1", latency=0.001)])
    _shared_run(session, ["w0", "w1"], ["r0", "r1"], n=60, runs=1)


@pytest.mark.parametrize("seed", range(2))
def test_a_shared_queue_over_a_link_under_schedules(seed):
    with LocalSession(schedule=seed, conditions=[
            Link("w1", "r0", latency=0.01)]) as session:
        _shared_run(session, ["w0", "w1"], ["r0", "w1"], n=15, capacity=2,
                    runs=1)


def test_readers_of_several_records_never_take_every_slot(session):
    """Two reader nodes each read 3 records at a time from a queue of 4: a
    read takes its records all at once, never some while it waits for the
    rest -- two half-done reads would hold every slot, and the writer
    could put nothing more (a hang)."""
    sources, dests = _datasets(session, ["w"], ["r0", "r1"], 200)
    with TaskGroup() as tg:
        q = Queue(capacity=4, name="shared", num_dequeue_records=3)
        with Node("w"):
            pipe(sources["w"].reader(), q)
        for node in ("r0", "r1"):
            with Node(node):
                pipe(q, dests[node].writer())
    for _ in range(3):
        session.run(tg, timeout=60)
    uids = np.concatenate([dests[n].fetch(session)["uid"]
                           for n in ("r0", "r1")])
    np.testing.assert_array_equal(np.sort(uids),
                                  np.sort(np.tile(np.arange(200), 3)))
