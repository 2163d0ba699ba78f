"""Queues between RaySession's nodes: records in batches, with every
promise of a queue kept -- order, a bounded writer, a close seen after
the records, each record taken once, a cancel that wakes both sides, a
late batch of an earlier run refused."""

import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

#: the module starts a Ray in this process (`ray_instance`)
pytestmark = pytest.mark.own_ray

from localcluster.errors import Cancelled  # noqa: E402
from localcluster.sessions._raychannel import (ChannelActor,  # noqa: E402
                                               RayChannel)
from localcluster.sessions._raywire import SMALL  # noqa: E402


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    warm = ray.remote(ChannelActor).options(num_cpus=0).remote(1, "warm")
    ray.get(warm.reset.remote(0))
    yield
    ray.kill(warm)
    ray.shutdown()


@pytest.fixture
def channel(ray_instance):
    """``make(capacity) -> (writer end, reader end)`` of one channel."""
    made = []

    def make(capacity, run=1):
        actor = ray.remote(ChannelActor).options(num_cpus=0).remote(
            capacity, "q")
        ray.get(actor.reset.remote(run))
        made.append(actor)
        return (RayChannel(actor, run, "q", capacity),
                RayChannel(actor, run, "q", capacity))

    yield make
    for actor in made:
        ray.kill(actor)


def values(records):
    return [int(r[0]) for r in records]


def read_all(reader, n=1):
    out = []
    while True:
        records, finished, _ = reader.get(n)
        if finished:
            return out
        out += values(records)


def test_many_small_records_arrive_in_order_and_then_the_end(channel):
    writer, reader = channel(4)
    got = []
    thread = threading.Thread(target=lambda: got.extend(read_all(reader)))
    thread.start()
    for i in range(1000):
        assert writer.put((np.array(i),))
    writer.close()
    thread.join(30)
    assert got == list(range(1000))


def test_a_get_of_n_gives_n_or_what_is_left_once_closed(channel):
    writer, reader = channel(16)
    for i in range(7):
        writer.put((np.array(i),))
    writer.close()
    assert values(reader.get(3)[0]) == [0, 1, 2]
    assert values(reader.get(3)[0]) == [3, 4, 5]
    records, finished, _ = reader.get(3)
    assert values(records) == [6] and not finished
    assert reader.get(3)[:2] == ([], True)


def test_a_drain_drops_what_is_there_in_one_call_and_then_the_end(
        channel, monkeypatch):
    """A pipe that looks at no record drains its queue: `drop_available`
    drops what the reader took already, else up to ``n`` of what the
    channel holds in one remote call (a call per record was the
    per-record cost a drain avoids), and reports the end once closed and
    empty; what is left is read in order."""
    from localcluster.sessions import _raychannel
    calls = []
    plain_get = _raychannel._metered_get
    monkeypatch.setattr(_raychannel, "_metered_get",
                        lambda ref: calls.append(ref) or plain_get(ref))
    writer, reader = channel(64)
    for i in range(40):
        writer.put((np.array(i),))
    writer._sent()                     # all 40 are in the channel
    assert reader.drop_available(30) == (30, False)
    assert len(calls) == 1
    assert values(reader.get(1)[0]) == [30]     # takes the rest: 31..39
    assert reader.drop_available(4) == (4, False)   # of those, no call
    assert len(calls) == 2
    writer.close()
    assert values(reader.get(9)[0]) == [35, 36, 37, 38, 39]
    assert reader.drop_available(8) == (0, True)


def test_a_writer_without_a_reader_stops_about_two_capacities_ahead(
        channel):
    writer, reader = channel(2)
    done = []
    thread = threading.Thread(target=lambda: [
        done.append(writer.put((np.array(i),))) for i in range(40)])
    thread.start()
    time.sleep(1.0)
    ahead = len(done)
    assert 2 <= ahead <= 6            # its buffer, a batch, the channel
    got = []
    reader_thread = threading.Thread(
        target=lambda: got.extend(read_all(reader)))
    reader_thread.start()
    thread.join(30)
    writer.close()
    reader_thread.join(30)
    assert got == list(range(40))


def test_records_are_copies_taken_at_put(channel):
    writer, reader = channel(4)
    blob = np.zeros(3)
    writer.put((blob,))
    blob[:] = 7.0                     # the writer's blob changes at once
    writer.close()
    [record], _, _ = reader.get(1)
    assert record[0].tolist() == [0.0, 0.0, 0.0]
    record[0][0] = 1.0                # the reader's copy is its own


def test_a_small_record_crosses_as_one_buffer_a_big_one_as_arrays(channel):
    """A small record reaches the channel actor pickled, one raw buffer
    Ray moves as it is (not an out-of-band buffer per field, each on
    Ray's own serialization path); a big one as its arrays, which Ray
    passes without the copies pickling would add."""
    writer, _ = channel(4)
    writer.put((np.zeros(3), np.ones(2)))
    writer.put((np.zeros(SMALL // 8 + 1),))
    writer.close()
    status, held = ray.get(writer._handle.get_many.remote(2, 2))
    assert status == "ok"
    assert [type(r) for r in held] == [bytes, tuple]


def test_several_writers_and_readers_see_each_record_once(channel):
    first, reader = channel(8)
    actor = first._handle
    writers = [first] + [RayChannel(actor, 1, "q", 8) for _ in range(2)]
    readers = [reader] + [RayChannel(actor, 1, "q", 8) for _ in range(2)]
    got = [[] for _ in readers]
    reading = [threading.Thread(target=lambda r=r, g=g: g.extend(
        read_all(r, n=2))) for r, g in zip(readers, got)]
    writing = [threading.Thread(target=lambda w=w, k=k: [
        w.put((np.array(1000 * k + i),)) for i in range(300)])
        for k, w in enumerate(writers)]
    for thread in reading + writing:
        thread.start()
    for thread in writing:
        thread.join(30)
    for writer in writers:            # each flushed before the queue ends
        with writer._cond:
            writer._cond.wait_for(lambda w=writer: not w._sending, 30)
    first.close()
    for thread in reading:
        thread.join(30)
    everything = sorted(v for g in got for v in g)
    assert everything == sorted(1000 * k + i for k in range(3)
                                for i in range(300))
    for g in got:                     # each reader saw a writer's in order
        for k in range(3):
            mine = [v for v in g if v // 1000 == k]
            assert mine == sorted(mine)


def test_an_abort_wakes_a_blocked_reader_and_a_blocked_writer(channel):
    writer, reader = channel(1)
    errors = []

    def expect_cancel(fn):
        try:
            fn()
        except Cancelled:
            errors.append(True)

    blocked = [threading.Thread(target=expect_cancel,
                                args=(lambda: reader.get(5),)),
               threading.Thread(target=expect_cancel, args=(lambda: [
                   writer.put((np.array(i),)) for i in range(50)],))]
    for thread in blocked:
        thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    reader.abort()
    writer.abort()
    for thread in blocked:
        thread.join(10)
    assert errors == [True, True]
    assert time.monotonic() - start < 5


def test_a_late_batch_of_an_earlier_run_is_refused(channel):
    writer, reader = channel(1, run=1)
    # 0 fills the channel, 1 waits for room in the channel actor, 2 waits
    # in the writer's buffer; the writer's run ends without a reader
    thread = threading.Thread(target=lambda: [
        writer.put((np.array(i),)) for i in range(3)], daemon=True)
    thread.start()
    time.sleep(0.5)
    actor = writer._handle
    ray.get(actor.reset.remote(2))    # the next run starts
    fresh = RayChannel(actor, 2, "q", 1)
    fresh.put((np.array(99),))
    fresh.close()
    assert read_all(RayChannel(actor, 2, "q", 1)) == [99]
    thread.join(10)
    assert not thread.is_alive() and writer._state == "aborted"
