"""The shared-memory queue channel on its own, between two processes."""

import array
import contextlib
import os
import fcntl
import multiprocessing
import termios
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster import Net, register_op
from localcluster.runtime import shm
from localcluster.errors import Cancelled
from localcluster.runtime import shm_channel
from localcluster.runtime.cancel import CancelEvent
from localcluster.runtime.shm_channel import ChannelParts, ShmChannel

FORK = multiprocessing.get_context("fork")


def _produce(desc, n, size):
    channel = ShmChannel(desc)
    values, index = np.zeros(size), np.zeros(1, dtype=np.int64)
    for i in range(n):
        values[0] = values[-1] = index[0] = i
        channel.put((values, index))
    channel.close()


@pytest.fixture
def parts():
    made = ChannelParts(shm.session_prefix() + "qtest_", 8)
    yield made
    made.close()
    assert not shm.segments(made.prefix)


# Many small records keep both sides busy on the shared words at once.
@pytest.mark.parametrize("n,size", [(20000, 1), (40, 1 << 17)])
def test_records_arrive_complete_and_in_order(parts, n, size):
    producer = FORK.Process(target=_produce, args=(parts.desc, n, size))
    producer.start()
    channel = ShmChannel(parts.desc)
    # bounded: a broken channel ends in Cancelled, not a hang
    watchdog = threading.Timer(20, channel.abort)
    watchdog.start()
    try:
        got = 0
        while True:
            records, finished, done = channel.get(3)
            if finished:
                break
            assert records, "an empty read of a queue that is not finished"
            for values, index in records:
                assert index[0] == got and values.shape == (size,)
                assert values[0] == got and values[-1] == got
                got += 1
            done()
        assert got == n
    finally:
        watchdog.cancel()
        producer.kill()
        producer.join(10)
        channel.release()


def test_a_reset_channel_is_empty_and_open_again(parts):
    channel = ShmChannel(parts.desc)
    try:
        assert channel.put((np.arange(3),))
        channel.close()
        assert not channel.put((np.arange(3),))
        parts.reset()
        channel.begin()
        assert channel.put((np.arange(4),))
        (record,), finished, done = channel.get(1)
        assert not finished and list(record[0]) == [0, 1, 2, 3]
        done()
    finally:
        channel.release()


def test_a_queue_kept_up_with_reuses_the_slot_freed_last(parts):
    """Big records cycle through the slots that are in use, not through
    all ``capacity`` of them: the memory stays in the CPU's caches."""
    channel = ShmChannel(parts.desc)
    try:
        for i in range(3 * parts.capacity):
            assert channel.put((np.full(1 << 14, i),))  # 128 KiB
            (record,), _, done = channel.get(1)
            assert record[0][0] == i
            done()
        assert len(shm.segments(parts.prefix + "s")) == 1
    finally:
        channel.release()


def test_a_lent_slot_is_not_reused_before_it_is_handed_back(parts):
    channel = ShmChannel(parts.desc)
    try:
        for i in range(parts.capacity):
            assert channel.put((np.full(4, i),))
        records, _, done = channel.get(parts.capacity)
        # every slot is lent: a writer waits, and the records stay intact
        cancelled = threading.Event()
        threading.Timer(0.2, cancelled.set).start()
        with pytest.raises(Cancelled):
            channel.put((np.full(4, -1),), cancelled)
        assert [int(r[0][0]) for r in records] == list(range(parts.capacity))
        done()
        assert channel.put((np.full(4, 99),))
    finally:
        channel.release()


def test_writers_and_readers_on_several_threads_lose_nothing(parts,
                                                            monkeypatch):
    # a lost wake-up would wait for the safety net: make that a hang
    monkeypatch.setattr(shm_channel, "SAFETY_WAKE", 600.0)
    channel = ShmChannel(parts.desc)
    got, lock = [], threading.Lock()

    def write(start):
        for i in range(start, start + 500):
            assert channel.put((np.array([i]),))

    def read():
        while True:
            records, finished, done = channel.get(2)
            if finished:
                return
            with lock:
                got.extend(int(r[0][0]) for r in records)
            done()

    writers = [threading.Thread(target=write, args=(k * 500,))
               for k in range(3)]
    readers = [threading.Thread(target=read) for _ in range(3)]
    try:
        for t in writers + readers:
            t.start()
        for t in writers:
            t.join(20)
        channel.close()
        for t in readers:
            t.join(20)
        assert not any(t.is_alive() for t in writers + readers)
        assert sorted(got) == list(range(1500))
    finally:
        channel.abort()
        channel.release()


def _bytes_waiting(fd):
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count, True)
    return count[0]


def test_records_flow_without_a_doorbell_while_nobody_waits(parts):
    """The shared words carry the records; the FIFOs are rung only for a
    side that sleeps, so a queue kept up with makes no system call."""
    channel = ShmChannel(parts.desc)
    try:
        for i in range(3 * parts.capacity):
            assert channel.put((np.array([i]),))
            (record,), finished, done = channel.get(1)
            assert int(record[0][0]) == i and not finished
            done()
        assert _bytes_waiting(channel._full) == 0
        assert _bytes_waiting(channel._free) == 0
    finally:
        channel.release()


def test_a_read_of_one_record_at_a_time_stops_only_once_closed_and_empty(
        parts):
    channel = ShmChannel(parts.desc)
    try:
        for i in range(3):
            assert channel.put((np.array([i]),))
        (first,), _, done = channel.get(1)   # takes all three off the ring
        done()
        channel.close()
        got = [int(first[0][0])]
        while True:
            records, finished, done = channel.get(1)
            if finished:
                break
            got.append(int(records[0][0][0]))
            done()
        assert got == [0, 1, 2]
        assert channel.get(1)[1], "a closed, empty queue stays finished"
    finally:
        channel.release()


def test_a_full_queue_writer_goes_on_once_a_slot_is_free(parts, monkeypatch):
    """A writer waiting on a full queue waits for a batch of free slots
    (one ring per batch), but not for long: a reader that frees one slot
    and then does something else does not leave it blocked."""
    monkeypatch.setattr(shm_channel, "SAFETY_WAKE", 600.0)
    channel = ShmChannel(parts.desc)
    cancel = CancelEvent()
    try:
        for i in range(parts.capacity):
            assert channel.put((np.array([i]),))
        writer = threading.Thread(target=channel.put,
                                  args=((np.array([99]),), cancel))
        writer.start()
        (record,), _, done = channel.get(1)
        done()   # one slot free, fewer than the writer's batch
        writer.join(60)
        assert not writer.is_alive(), "the writer waited for a full batch"
    finally:
        cancel.set()
        channel.release()
        cancel.close()


def _produce_in_bursts(desc, n):
    """Records 0..n-1, pausing now and then so that readers sleep often."""
    channel, cancel = ShmChannel(desc), CancelEvent()
    for i in range(n):
        channel.put((np.array([i]),), cancel)
        if i % 3 == 0:
            time.sleep(0.0001)
    channel.close()


def _readers_see_every_record_once(parts, reads):
    """Reader threads of one end -- ``reads`` of ``(size, available)``: a
    get of ``size`` records, or (``available``) of what is there, up to
    ``size`` -- against a producer process putting 3000 records in
    bursts: every record is read once, and none sleeps through its
    records (the safety wake is 10 minutes: a watchdog cancels after 60
    s)."""
    n = 3000
    producer = FORK.Process(target=_produce_in_bursts, args=(parts.desc, n))
    channel, cancel = ShmChannel(parts.desc), CancelEvent()
    got, lock = [], threading.Lock()

    def read(size, available):
        take = channel.get_available if available else channel.get
        while True:
            records, finished, done = take(size, cancel)
            if finished:
                return
            with lock:
                got.extend(int(r[0][0]) for r in records)
            done()

    readers = [threading.Thread(target=read, args=args) for args in reads]
    watchdog = threading.Timer(60, cancel.set)
    try:
        watchdog.start()
        producer.start()
        for t in readers:
            t.start()
        for t in readers:
            t.join(90)
        assert not any(t.is_alive() for t in readers)
        assert not cancel.is_set(), "a reader slept through its records"
        assert sorted(got) == list(range(n))
    finally:
        watchdog.cancel()
        cancel.set()
        producer.kill()
        producer.join(10)
        channel.release()
        cancel.close()


def test_readers_on_several_threads_miss_no_wake_up(parts, monkeypatch):
    """Readers of one end sleep and wake on one doorbell: one that drains
    a ring others were woken by too must not leave them asleep."""
    monkeypatch.setattr(shm_channel, "SAFETY_WAKE", 600.0)
    _readers_see_every_record_once(parts, [(1, False), (1, False),
                                           (2, False)])


@pytest.fixture
def rings(monkeypatch):
    """The doorbells rung, by FIFO descriptor, as they are rung; no look
    before a sleep (a consumer sleeps at once) and no safety wake."""
    rung = []
    plain = shm_channel.ring_bell

    def ring(fd):
        rung.append(fd)
        plain(fd)

    monkeypatch.setattr(shm_channel, "ring_bell", ring)
    monkeypatch.setattr(shm_channel, "SAFETY_WAKE", 600.0)
    monkeypatch.setattr(shm_channel, "SPIN", 0.0)
    return rung


def _asleep(channel, sleepers=1):
    """Wait (bounded) until ``sleepers`` consumers sleep on ``channel``."""
    deadline = time.monotonic() + 20
    while channel._words[shm_channel.WAIT_CONSUMERS] < sleepers:
        assert time.monotonic() < deadline, "the reader never slept"
        time.sleep(0.001)


@contextlib.contextmanager
def _two_ends(parts):
    """``(writer, reader, cancel)``: both ends of one channel and the
    run's cancellation.  At the end the run is cancelled and the reader
    aborted (a reader thread still waiting wakes), the threads started
    meanwhile joined, both ends released."""
    writer, reader = ShmChannel(parts.desc), ShmChannel(parts.desc)
    cancel = CancelEvent()
    before = set(threading.enumerate())
    try:
        yield writer, reader, cancel
    finally:
        cancel.set()
        reader.abort()
        for thread in set(threading.enumerate()) - before:
            thread.join(20)
        writer.release()
        reader.release()
        cancel.close()


def _read_in_thread(channel, n, available=False, cancel=None):
    """A thread reading ``n`` records (`get`, or `get_available`); what it
    read is in the returned list once it ends."""
    out = []

    def read():
        take = channel.get_available if available else channel.get
        records, finished, done = take(n, cancel)
        out.extend(int(r[0][0]) for r in records)
        if done is not None:
            done()

    thread = threading.Thread(target=read)
    thread.start()
    return thread, out


def test_a_reader_of_several_records_is_rung_once_they_are_all_there(
        parts, rings):
    """A read of 4 records sleeps until the queue holds 4: the writer rings
    once, as the fourth is put -- not at the first, to find it short of
    three more (and so on: a ring per record)."""
    with _two_ends(parts) as (writer, reader, cancel):
        thread, got = _read_in_thread(reader, 4, cancel=cancel)
        _asleep(reader)
        for i in range(3):
            assert writer.put((np.array([i]),))
        assert rings.count(writer._full) == 0
        assert writer.put((np.array([3]),))
        thread.join(20)
        assert not thread.is_alive() and got == [0, 1, 2, 3]
        assert rings.count(writer._full) == 1


def test_a_reader_behind_its_writer_sleeps_for_a_batch(parts, rings,
                                                       monkeypatch):
    """A reader whose last take found several records (its writer is ahead)
    sleeps for a batch: rung once half the queue is there, not at the
    first record."""
    monkeypatch.setattr(shm_channel, "BATCH_WAIT", 600.0)
    with _two_ends(parts) as (writer, reader, cancel):
        for i in range(3):
            assert writer.put((np.array([i]),))
        records, _, done = reader.get_available(parts.capacity)
        assert len(records) == 3
        done()
        batch = parts.capacity // 2
        thread, got = _read_in_thread(reader, parts.capacity, True, cancel)
        _asleep(reader)
        for i in range(3, 3 + batch - 1):
            assert writer.put((np.array([i]),))
        assert rings.count(writer._full) == 0
        assert writer.put((np.array([2 + batch]),))
        thread.join(20)
        assert not thread.is_alive() and got == list(range(3, 3 + batch))
        assert rings.count(writer._full) == 1


def test_a_reader_waiting_for_a_batch_takes_what_came_after_a_while(
        parts, rings, monkeypatch):
    """The batch is not waited for long: a writer that puts one record and
    then does something else has it read, without a ring."""
    monkeypatch.setattr(shm_channel, "BATCH_WAIT", 0.01)
    with _two_ends(parts) as (writer, reader, cancel):
        for i in range(3):
            assert writer.put((np.array([i]),))
        _, _, done = reader.get_available(parts.capacity)
        done()

        def read_what_one_put_brings(value):
            """What a bulk read asleep on the queue got once ``value``
            was put; the thread has ended."""
            thread, got = _read_in_thread(reader, parts.capacity, True,
                                          cancel)
            _asleep(reader)
            assert writer.put((np.array([value]),))
            thread.join(20)
            assert not thread.is_alive()
            return got

        assert read_what_one_put_brings(3) == [3]
        assert rings.count(writer._full) == 0
        # and the next read, having found one record, waits for the first
        assert read_what_one_put_brings(4) == [4]
        assert rings.count(writer._full) == 1


def test_a_reader_that_looks_before_it_sleeps_is_not_rung(parts, rings,
                                                          monkeypatch):
    """A record put while the reader looks at the words (before it sleeps)
    is read without a ring."""
    monkeypatch.setattr(shm_channel, "SPIN", 600.0)
    looking = threading.Event()
    with _two_ends(parts) as (writer, reader, cancel):
        reader._spins = True
        plain_spin = reader._spin

        def spin(want):
            looking.set()
            return plain_spin(want)

        reader._spin = spin
        thread, got = _read_in_thread(reader, 1, True, cancel)
        assert looking.wait(20)
        assert writer.put((np.array([7]),))
        thread.join(20)
        assert not thread.is_alive() and got == [7]
        assert rings == []


@pytest.mark.parametrize("spin", [0.0, shm_channel.SPIN])
def test_bulk_readers_on_several_threads_miss_no_wake_up(parts, monkeypatch,
                                                         spin):
    """Readers taking what is there (a drain) and readers of 1 or 2 records,
    on threads of one end, sleeping for batches and for their own counts:
    every record is read once, none sleeps through its records."""
    monkeypatch.setattr(shm_channel, "SAFETY_WAKE", 600.0)
    monkeypatch.setattr(shm_channel, "SPIN", spin)
    _readers_see_every_record_once(parts, [(parts.capacity, True),
                                           (3, True), (1, False),
                                           (2, False)])


def test_a_cross_node_queue_larger_than_a_fifo_holds_is_refused():
    from localcluster.errors import PlanError
    from localcluster.runtime.shm_channel import MAX_CAPACITY
    prefix = shm.session_prefix() + "qbig_"
    with pytest.raises(PlanError, match="capacity"):
        ChannelParts(prefix, MAX_CAPACITY + 1)
    assert not shm.segments(prefix)


def test_an_aborted_wait_raises_cancelled(parts):
    channel = ShmChannel(parts.desc)
    try:
        channel.abort()
        with pytest.raises(Cancelled):
            channel.get(1)
    finally:
        channel.release()


# -- a lent record, stored by the executor --------------------------------------

#: what the lending op below lends next, and where it notes the hand-back
LENDING = {}


@register_op("ChannelsTestLend", lends=True)
def lend_record():
    """Lend ``LENDING["value"]`` as the only output, as a queue lends a
    slot; ``done`` notes that the memory was handed back."""
    returned = LENDING["returned"]
    return (LENDING["value"],), lambda: returned.append(True)


def tail(x):
    return x[1:]


def _lend(session, value):
    """Store ``value`` as a lending op's only output, blob ``x``."""
    returned = []
    LENDING.update(value=value, returned=returned)
    try:
        net = Net("lend")
        net.ChannelsTestLend([], ["x"])
        session.run(net)
    finally:
        LENDING.clear()
    assert returned == [True], "the lent memory was not handed back"


def _held(session, name):
    """The array the node holds as ``name``: a zero-copy fetch is a view on
    it."""
    return session.fetch_blob(name, copy=False).base


def test_a_lent_record_is_copied_into_the_array_it_replaces(local):
    session = local()
    slot = np.arange(4.0)
    _lend(session, slot)
    first = _held(session, "x")
    assert first is not slot and list(first) == [0, 1, 2, 3]
    del first
    array_id = id(_held(session, "x"))
    slot[:] = 7
    _lend(session, slot)
    assert id(_held(session, "x")) == array_id and \
        list(_held(session, "x")) == [7] * 4


def test_a_lent_record_leaves_views_and_fetched_values_alone(local):
    session = local()
    _lend(session, np.zeros(4))
    kept = session.fetch_blob("x", copy=False)
    net = Net("view")
    net.Python(tail)(["x"], ["y"])  # stores a view on x
    session.run(net)
    _lend(session, np.ones(4))
    assert list(kept) == [0] * 4 and list(session.fetch_blob("y")) == [0] * 3
    assert list(session.fetch_blob("x")) == [1] * 4


#: what the lending loop below lends, one value per read, and the ids of
#: the array its stop blob was each time
LOOP = {}


@register_op("ChannelsTestLendFlag", lends=True)
def lend_flag():
    """Lend the next of ``LOOP["flags"]`` as the only output, as a queue's
    read lends its ``finished`` flag."""
    return (LOOP["flags"].pop(0),), lambda: None


def note_array(flag):
    LOOP["ids"].append(id(flag))


def test_a_read_loop_copies_its_stop_flag_in_place(local):
    """The loop's own test of its stop blob keeps no reference to it, so
    every read copies the flag into the array it replaces."""
    from localcluster import execution_step
    session = local()
    LOOP.update(flags=[np.array(False)] * 5 + [np.array(True)], ids=[])
    try:
        read = Net("read")
        read.ChannelsTestLendFlag([], ["stop"])
        read.Python(note_array)(["stop"], [])
        session.run(execution_step("loop", [read], should_stop_blob="stop"))
        assert len(LOOP["ids"]) == 6 and len(set(LOOP["ids"][1:])) == 1
    finally:
        LOOP.clear()


# -- several producer and consumer processes on one channel -------------------

def _produce_shared(desc, first, n, size):
    """Put records ``first .. first+n-1`` and count this writer out."""
    channel = ShmChannel(desc)
    values, index = np.zeros(size), np.zeros(1, dtype=np.int64)
    for i in range(first, first + n):
        values[0] = values[-1] = index[0] = i
        channel.put((values, index))
    channel.writer_ended()


def _consume_shared(desc, conn, want):
    channel = ShmChannel(desc)
    watchdog = threading.Timer(30, channel.abort)
    watchdog.start()
    seen = []
    try:
        while True:
            records, finished, done = channel.get(want)
            if finished:
                break
            for values, index in records:
                assert values[0] == values[-1] == index[0]
                seen.append(int(index[0]))
            done()
    finally:
        watchdog.cancel()
    conn.send(seen)


@pytest.mark.parametrize("size", [1, 1 << 15])
def test_several_producer_and_consumer_processes_read_each_record_once(size):
    """Three producer processes, three consumer processes, one channel:
    each record is read once, whole, and the channel closes when the last
    producer counted itself out -- not the first."""
    parts = ChannelParts(shm.session_prefix() + "qtest_", 4, "q",
                         shared_lock=True)
    n = 3000 if size == 1 else 60
    try:
        parts.reset(writers=3)
        pipes = [FORK.Pipe(duplex=False) for _ in range(3)]
        procs = [FORK.Process(target=_produce_shared,
                              args=(parts.desc, k * n, n + 17 * k, size))
                 for k in range(3)]
        procs += [FORK.Process(target=_consume_shared,
                               args=(parts.desc, send, 1 + k))
                  for k, (_, send) in enumerate(pipes)]
        for p in procs:
            p.start()
        seen = []
        for recv, _ in pipes:
            assert recv.poll(60), "a consumer did not finish"
            seen += recv.recv()
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        expected = sorted(i for k in range(3)
                          for i in range(k * n, k * n + n + 17 * k))
        assert sorted(seen) == expected
    finally:
        parts.close()
    assert not shm.segments(parts.prefix)


def _hold_lock_and_die(desc):
    channel = ShmChannel(desc)
    channel._lock.__enter__()     # and never leave it: as if killed in it
    os._exit(0)


def test_a_node_that_died_holding_the_shared_lock_blocks_no_later_run():
    """A node killed inside a critical section leaves the queue's lock
    taken: the other ends' waits end when the run is cancelled (not
    never), and the master's reset for the next run frees it."""
    parts = ChannelParts(shm.session_prefix() + "qtest_", 4, "q",
                         shared_lock=True)
    try:
        names = shm.segments(parts.prefix)
        assert any(n.startswith(shm.SEMAPHORE) for n in names), names
        dead = FORK.Process(target=_hold_lock_and_die, args=(parts.desc,))
        dead.start()
        dead.join(30)
        end = ShmChannel(parts.desc)
        threading.Timer(0.2, end.abort).start()
        started = time.monotonic()
        with pytest.raises(Cancelled):
            end.put((np.zeros(1),))
        assert time.monotonic() - started < 10
        parts.reset(writers=1)
        end.begin()
        assert end.put((np.ones(1),))
        end.writer_ended()
        records, _, done = end.get(1)
        assert records[0][0][0] == 1.0
        done()
        assert end.get(1)[1]          # closed and empty: finished
        end.release()
    finally:
        parts.close()
    assert not shm.segments(parts.prefix)


def _slow_producer(desc, n):
    channel = ShmChannel(desc)
    for i in range(n):
        channel.put((np.full(1, i),))
        time.sleep(0.001)     # readers find the queue short of their 3
    channel.writer_ended()


def _read_threes(channel, out):
    """Read 3 records at a time until the queue is finished; put how many
    were read (or "hung": the watchdog ended a wait) in ``out``."""
    got = 0
    try:
        while True:
            records, finished, done = channel.get(3)
            if finished:
                break
            got += len(records)
            done()
    except Cancelled:
        got = "hung"
    out.put(got)


def _readers(desc, out, threads):
    """``threads`` reader threads of 3 records on one end of ``desc``."""
    channel = ShmChannel(desc)
    watchdog = threading.Timer(20, channel.abort)
    watchdog.start()
    running = [threading.Thread(target=_read_threes, args=(channel, out))
               for _ in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    watchdog.cancel()


@pytest.mark.parametrize("readers_in", ["processes", "threads"])
def test_reads_of_several_records_never_hold_every_slot(readers_in):
    """Two readers of 3 records each on a queue of 4: a read takes its
    records all at once, or none -- two reads each holding two slots while
    waiting for a third would leave the writer no slot (a hang until the
    watchdog; it was, before reads took all or none)."""
    shared = readers_in == "processes"
    parts = ChannelParts(shm.session_prefix() + "qtest_", 4, "q",
                         shared_lock=shared)
    n = 60
    try:
        parts.reset(writers=1)
        out = FORK.Queue()
        producer = FORK.Process(target=_slow_producer, args=(parts.desc, n))
        if shared:   # two reader processes
            readers = [FORK.Process(target=_readers,
                                    args=(parts.desc, out, 1))
                       for _ in range(2)]
        else:        # two reader threads of one process
            readers = [FORK.Process(target=_readers,
                                    args=(parts.desc, out, 2))]
        for p in [producer] + readers:
            p.start()
        got = [out.get(timeout=60) for _ in range(2)]
        for p in [producer] + readers:
            p.join(30)
        assert "hung" not in got and sum(got) == n, got
    finally:
        parts.close()


def test_a_ring_of_a_shared_queue_wakes_one_of_its_waiters_not_all():
    """A record put into a queue a thousand instances wait on wakes one of
    them: woken all at once, each to find it taken, they spent the queue's
    time on its lock (an epoch of a 1000-instance job took 20 s)."""
    parts = ChannelParts(shm.session_prefix() + "qherd_", 4, "herd", True)
    channel = ShmChannel(parts.desc)
    readers, sleeps, got = 16, [], []
    plain_sleep = channel._sleep

    def counted(*args, **kwargs):
        sleeps.append(1)
        return plain_sleep(*args, **kwargs)

    channel._sleep = counted
    cancelled = CancelEvent()

    def read():
        records, _, done = channel.get(2, cancelled=cancelled)
        got.append(int(records[0][0][0]))
        done()

    threads = [threading.Thread(target=read) for _ in range(readers)]
    try:
        for thread in threads:
            thread.start()
        for i in range(readers):
            # every reader left is asleep before each record is put
            deadline = time.monotonic() + 20
            while channel._words[shm_channel.WAIT_CONSUMERS] < readers - i:
                assert time.monotonic() < deadline, "readers never slept"
                time.sleep(0.001)
            assert channel.put((np.array([i]),))
            assert channel.put((np.array([i]),))
        for thread in threads:
            thread.join(20)
        assert sorted(got) == list(range(readers))
        # one wake per record (each reader sleeps once, and perhaps once
        # more); all of them per record would be 16 + 15 + ... + 1 = 136
        assert len(sleeps) <= 3 * readers, len(sleeps)
    finally:
        cancelled.set()
        for thread in threads:
            thread.join(5)
        channel.release()
        parts.close()
        cancelled.close()


# -- taking what is queued, in bulk (a pipe that looks at no record) ---------

def _local_channel(capacity):
    from localcluster.runtime.channels import LocalChannel
    return LocalChannel(capacity, name="bulk")


def _values(records):
    return [int(r[0][0]) for r in records]


def _read_to_the_end(channel):
    """The values a closed ``channel`` still holds, read one at a time."""
    got = []
    while True:
        records, finished, _ = channel.get(1)
        if finished:
            return got
        got += _values(records)


def test_a_bulk_read_takes_every_queued_record_in_one_call(parts):
    for channel in (ShmChannel(parts.desc), _local_channel(8)):
        try:
            for i in range(5):
                assert channel.put((np.array([i]),))
            records, finished, done = channel.get_available(8)
            assert _values(records) == [0, 1, 2, 3, 4] and not finished
            if done is not None:
                done()
            assert channel.put((np.array([5]),))
            channel.close()
            records, finished, done = channel.get_available(8)
            assert _values(records) == [5] and not finished
            if done is not None:
                done()
            assert channel.get_available(8)[:2] == ([], True)
        finally:
            if isinstance(channel, ShmChannel):
                channel.release()


def test_a_bulk_read_takes_at_most_what_was_asked_in_order(parts):
    for channel in (ShmChannel(parts.desc), _local_channel(8)):
        try:
            for i in range(7):
                assert channel.put((np.array([i]),))
            got = []
            for want in (3, 1, 8):
                records, _, done = channel.get_available(want)
                assert len(records) == min(want, 7 - len(got))
                got += _values(records)
                if done is not None:
                    done()
            assert got == list(range(7))
        finally:
            if isinstance(channel, ShmChannel):
                channel.release()


def test_a_bulk_read_of_an_empty_queue_waits_for_one_record(parts):
    for channel in (ShmChannel(parts.desc), _local_channel(8)):
        timer = threading.Timer(0.05, channel.put, ((np.array([9]),),))
        timer.start()
        try:
            records, finished, done = channel.get_available(8)
            assert _values(records) == [9] and not finished
            if done is not None:
                done()
        finally:
            timer.join()
            if isinstance(channel, ShmChannel):
                channel.release()


def test_a_bulk_read_of_an_aborted_run_ends_in_cancelled(parts):
    for channel in (ShmChannel(parts.desc), _local_channel(8)):
        timer = threading.Timer(0.05, channel.abort)
        timer.start()
        try:
            with pytest.raises(Cancelled):
                channel.get_available(8)
        finally:
            timer.join()
            if isinstance(channel, ShmChannel):
                channel.release()


@given(st.lists(st.one_of(st.tuples(st.just("put"), st.integers(0, 99)),
                          st.tuples(st.just("get"), st.integers(1, 6))),
                max_size=40))
@settings(max_examples=40)
def test_bulk_reads_give_the_records_one_record_reads_give(steps):
    """Whatever is put and however many a bulk read asks for, the records
    come out in the order of single reads, none lost or repeated."""
    channel, queued, got, expected = _local_channel(64), 0, [], []
    for kind, value in steps:
        if kind == "put" and queued < 64:
            channel.put((np.array([value]),))
            expected.append(value)
            queued += 1
        elif kind == "get" and queued:
            records, _, _ = channel.get_available(value)
            assert len(records) == min(value, queued)
            got += _values(records)
            queued -= len(records)
    channel.close()
    assert got + _read_to_the_end(channel) == expected


class _OneAtATime:
    """A channel with no bulk read (a link's reading end, another
    engine's channel): `get` only."""

    def __init__(self, channel):
        self.channel, self.asked = channel, []

    def get(self, n, cancelled=None, clock=None):
        self.asked.append(n)
        return self.channel.get(n, cancelled, clock)


class _Hub:
    def __init__(self, channel):
        self._channel = channel

    def channel(self, queue, capacity):
        return self._channel


def _drain_context(channel):
    from types import SimpleNamespace
    from localcluster.runtime.clock import REAL_TIME
    return SimpleNamespace(resources={"queues": _Hub(channel)}, node="n",
                           cancelled=None, clock=REAL_TIME)


def test_a_drain_takes_what_is_queued_in_one_call_where_the_channel_can():
    from localcluster.kernels.io_ops import drain_records
    channel = _local_channel(8)
    for i in range(5):
        channel.put((np.array([i]),))
    channel.close()
    ctx = _drain_context(channel)
    assert not drain_records(ctx, queue="q", capacity=8)
    assert drain_records(ctx, queue="q", capacity=8), "closed and empty"


def test_a_drain_takes_one_record_a_call_from_a_channel_without_bulk_reads():
    """Over a link each record is held until it has arrived: the drain
    asks for one at a time, so per-record conditions hold."""
    from localcluster.kernels.io_ops import drain_records
    inner = _local_channel(8)
    for i in range(3):
        inner.put((np.array([i]),))
    inner.close()
    channel = _OneAtATime(inner)
    ctx = _drain_context(channel)
    results = [bool(drain_records(ctx, queue="q", capacity=8))
               for _ in range(4)]
    assert results == [False, False, False, True]
    assert channel.asked == [1, 1, 1, 1]


def test_a_drop_takes_what_a_bulk_read_takes_and_hands_the_slots_back(parts):
    """`drop_available` counts what `get_available` would give, in the
    same calls, and the slots of a shared-memory channel are free again
    at once: the writer fills the queue anew without waiting."""
    for channel in (ShmChannel(parts.desc), _local_channel(8)):
        watchdog = threading.Timer(20, channel.abort)
        watchdog.start()
        try:
            for rounds in range(3):
                for i in range(8):
                    assert channel.put((np.array([i]),))
                assert channel.drop_available(3) == (3, False)
                assert channel.drop_available(8) == (5, False)
            assert channel.put((np.array([1]),))
            channel.close()
            assert channel.drop_available(8) == (1, False)
            assert channel.drop_available(8) == (0, True)
        finally:
            watchdog.cancel()
            if isinstance(channel, ShmChannel):
                channel.release()


@given(st.lists(st.one_of(st.tuples(st.just("put"), st.integers(0, 99)),
                          st.tuples(st.sampled_from(["get", "drop"]),
                                    st.integers(1, 6))),
                max_size=40))
@settings(max_examples=40, deadline=None)
def test_drops_and_bulk_reads_leave_the_records_single_reads_would(steps):
    """Records dropped are the ones a bulk read of as many would give: what
    is read next is what single reads would have read after them."""
    channel, model = _local_channel(64), []
    for kind, value in steps:
        if kind == "put" and len(model) < 64:
            channel.put((np.array([value]),))
            model.append(value)
        elif kind == "get" and model:
            records, _, _ = channel.get_available(value)
            assert _values(records) == model[:value]
            del model[:value]
        elif kind == "drop" and model:
            assert channel.drop_available(value) == (min(value, len(model)),
                                                     False)
            del model[:value]
    channel.close()
    assert _read_to_the_end(channel) == model


def _enqueue_net():
    net = Net("put")
    net.ConstantFill([], ["x"], shape=[2], value=3.0)
    net.EnqueueRecord(["x"], ["closed"], queue="q", capacity=2)
    return net


def _run_enqueue(resources):
    from localcluster.runtime.executor import RunContext, execute
    from localcluster.runtime.workspace import Workspace
    from localcluster.plan.step import execution_step
    ws = Workspace("n")
    rc = RunContext("n", ws.lock, resources=resources)
    rc.begin()
    execute(execution_step("s", [_enqueue_net()]), ws, rc)
    return ws.get("closed")


def test_a_bound_enqueue_puts_and_answers_as_the_kernel_does():
    """The executor calls EnqueueRecord through its binder (the lookups
    done once per compiled op): the record queued, False while open, True
    once the queue is closed -- as the kernel answers."""
    from localcluster.kernels.io_ops import enqueue_record
    from localcluster.kernels.registry import OpContext
    channel = _local_channel(2)
    hub = _Hub(channel)
    assert _run_enqueue({"queues": hub}).tolist() is False
    records, _, _ = channel.get(1)
    assert records[0][0].tolist() == [3.0, 3.0]
    ctx = OpContext("n", threading.Lock(), CancelEvent(), _drain_context(
        channel), {"queues": hub})
    assert enqueue_record(ctx, np.zeros(1), queue="q",
                          capacity=2).tolist() is False
    channel.close()
    assert _run_enqueue({"queues": hub}).tolist() is True
    assert enqueue_record(ctx, np.zeros(1), queue="q",
                          capacity=2).tolist() is True


def test_a_bound_enqueue_without_queues_fails_as_the_kernel_does():
    from localcluster.errors import TaskFailedError
    with pytest.raises(TaskFailedError,
                       match="this session does not provide queues"):
        _run_enqueue({})


def _produce_paced(desc, n, pauses):
    """Records 0..n-1, pausing ``pauses[i % len(pauses)]`` seconds after
    record i: bursts and gaps, so the reader sleeps for records, for
    batches and not at all."""
    channel, cancel = ShmChannel(desc), CancelEvent()
    for i in range(n):
        channel.put((np.array([i]),), cancel)
        if pauses[i % len(pauses)]:
            time.sleep(pauses[i % len(pauses)])
    channel.close()


@given(reads=st.lists(st.tuples(st.sampled_from(["get", "available", "drop"]),
                                st.integers(1, 8)), min_size=1, max_size=12),
       pauses=st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.0002, 0.002]),
                       min_size=1, max_size=8),
       spin=st.sampled_from([0.0, 50e-6]))
@settings(max_examples=12, deadline=None)
def test_any_mix_of_reads_sees_the_records_in_order_across_processes(
        reads, pauses, spin):
    """Whatever reads a reader makes -- of n records, of what is there, or
    drops -- against a writer process that pauses or not, the records
    come in order, none lost or repeated, and every read ends: the
    reader's sleeps (for its records, for a batch, after a look) never
    miss their ring."""
    n = 400
    plain = (shm_channel.SAFETY_WAKE, shm_channel.SPIN,
             shm_channel.BATCH_WAIT)
    shm_channel.SAFETY_WAKE, shm_channel.SPIN = 600.0, spin
    shm_channel.BATCH_WAIT = 0.002
    parts = ChannelParts(shm.session_prefix() + "qmix_", 8)
    producer = FORK.Process(target=_produce_paced,
                            args=(parts.desc, n, pauses))
    channel, cancel = ShmChannel(parts.desc), CancelEvent()
    channel._spins = bool(spin)
    watchdog = threading.Timer(60, cancel.set)
    try:
        watchdog.start()
        producer.start()
        seen, step = 0, 0
        while True:
            kind, size = reads[step % len(reads)]
            step += 1
            if kind == "drop":
                count, finished = channel.drop_available(size, cancel)
                assert count <= size
                seen += count
            else:
                take = channel.get if kind == "get" else \
                    channel.get_available
                records, finished, done = take(size, cancel)
                assert _values(records) == list(range(seen,
                                                      seen + len(records)))
                assert len(records) <= size
                if kind == "get" and not finished and seen + size <= n:
                    assert len(records) == size
                seen += len(records)
                if done is not None:
                    done()
            if finished:
                break
        assert seen == n and not cancel.is_set()
    finally:
        watchdog.cancel()
        cancel.set()
        producer.kill()
        producer.join(10)
        channel.release()
        parts.close()
        cancel.close()
        (shm_channel.SAFETY_WAKE, shm_channel.SPIN,
         shm_channel.BATCH_WAIT) = plain
