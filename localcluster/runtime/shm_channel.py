"""A queue channel between two node processes, in shared memory.

::

  producer node          control segment (shm_control)      consumer node
  put(record):           [closed, tail, head, freed,        get(n):
    take a free slot      reused, waiting producers and       take the slots
    copy the record       consumers, consumer sleeps,         ring[head:tail]
    ring[tail] = slot     slot generations, record ring,      head = tail
    tail += 1 ---------> layout stamps, free ring]           views on a slot
    consumers asleep?                                        ... copied:
      ring "full" ---------------------------------------->  free[freed] = slot
    free slots are                                           freed += 1
    free[reused:freed] <-----------------------------------  producers asleep?
                       <-----------------------------------   ring "free"

The shared words are the truth: a record is queued when ``tail`` says so,
a slot is free when ``freed`` says so, and neither side makes a system
call while the other keeps up.  The two named FIFOs are only doorbells,
rung when the other side said it sleeps (its "waiting" word): a waiter
counts itself into the word, then looks at the words again, and only then
sleeps, so a record (or slot) published between its look and its sleep
rings the bell (see *Ordering* below).  Rings are batched: a producer
rings a consumer once per sleep (the consumer counts its sleeps), not once
per record put while it wakes, and only once the queue holds what the
consumer sleeps for (word ``RING_AT``, the tail it asked to be rung at:
the records a read of several needs; a batch -- half the capacity, or
`BATCH_BYTES` of records -- for a consumer whose last take found several
records, its producer being ahead, which then sleeps `BATCH_WAIT` at most
and takes what came).  A ring wakes a process, which costs the producer
tens of microseconds; so before it sleeps a consumer looks at the words
for up to `SPIN` (where such a look lately found its records: not when
the two sides share a CPU), and a producer that keeps up a stream wakes
nobody.  A producer that finds the queue full waits
for a batch of free slots -- a quarter of the capacity, `BATCH_WAIT` at
most once one is free, at once if the consumer waits too -- so a consumer
that keeps the queue full rings twice per batch, not once per record.
Consumers of several nodes (``shared_lock``) are rung at every record
and do not look before they sleep.
A consumer takes every queued record off the ring at once; its next reads
of one record find theirs at hand, without the lock or the shared words.
A waiter wakes on one ``poll`` of its doorbell *and* the run's
cancellation fd (`CancelEvent.fileno`): a record, a free slot, a close
(which rings both bells) or a cancelled run -- also a dead peer, as the
master then cancels the run -- wakes it at once; nothing polls
repeatedly.  (``poll``, not ``select``: a node with hundreds of queues
holds descriptors numbered past select's limit of 1024.)  These waits are
real time whatever the run's clock (``put``/``get`` take it and leave
it): a deterministic schedule runs its nodes in one process, with
in-process channels.

The master creates the control segment and the two FIFOs per queue
(`ChannelParts`), resets them before every run (every slot in the free
ring) and hands their names to both nodes, which keep their end
(`ShmChannel`) across runs.  A record goes into a slot segment (made by
the producer, kept while records fit, replaced -- new generation -- when
one does not; see `shm_slots`); the consumer maps it by name.  Slots are
not tied to ring positions: the producer takes the slot freed last, so a
queue its consumer keeps up with cycles through a few slots that stay in
the CPU's caches instead of through all ``capacity`` of them.

`get` lends the consumer views on the slots (no copy); the caller copies
them where they go and then calls the ``done`` callback it got, which
hands the slots back to the producer.

When all of a queue's writers are on one node and all its readers on
another -- the common case, and the fast one -- each side's words are only
written by its own process (``closed`` by either, only ever to 1), under
the end's thread lock.  Several threads of one side may wait at once: one
that wakes and leaves something for the others rings their bell again.

Several writer nodes, or several reader nodes (fan-in, fan-out): the
master made the queue a semaphore (``shared_lock``), and every end takes
it with its thread lock (`shm_control.ProcessLock`), so all the words are
written under one lock -- by whichever process.  No end then keeps what
others may need: a producer takes one free slot per record (not every
free slot into its pool), a consumer only the records it asked for (not
every record queued), and a slot written by one producer may next be
written by another (`shm_slots`).  Records are read once each, in the
order they were queued; a waiter of one process wakes those of others
the same way as its own threads.

The queue closes when the last writer of the run ends, on any node: the
master says how many end in the run (word ``writers``), and each counts
itself in word ``ended`` under the lock (`ShmChannel.writer_ended`).

Ordering.  Words are int64, 8-byte aligned, each read or written whole
(one aligned access through a memoryview of format "q"; never
struct.pack_into, which zeroes a field before writing it).  Between words
the channel needs: the slot's bytes and its ring entry visible before the
``tail`` that publishes them (and the consumer's reads of a slot done
before ``freed`` hands it back), read in that order on the other side;
and, for the doorbells, a store of one's own word ordered before the load
of the other side's (tail then "waiting consumers" in the producer,
"waiting consumers" then tail in the consumer: the classic store-load
pattern, which x86-64 does *not* keep in order by itself).  CPython has no
fence, but a lock has one: `_fence` releases and re-acquires a lock this
end holds (a release then an acquire atomic: glibc's semaphores under
CPython 3.11's locks, compare-and-swaps under newer ones).  On
x86-64 each atomic is a locked instruction, a full barrier; on arm64 a
store-release followed by a load-acquire is never reordered (ARMv8's
acquire/release are sequentially consistent), so everything before the
release is ordered before everything after the acquire -- a full fence
either way.  The store-load fences are taken on every machine; the
others only where plain loads and stores may be reordered (not x86-64,
whose plain loads and stores keep their order except store-load).

Every name a channel makes ends in a random part -- the master's prefix,
and a slot segment's generation, a random number (not a count) -- so that
nobody can create it first in the world-writable /dev/shm; a name that is
taken is retried with another.  Each end keeps two descriptors (its FIFOs)
and no more: mappings keep none (`shm`).  A channel lives until the
master releases it (`ChannelParts.close`, then `ShmChannel.release` on
each node); slot segments then go with the master's sweep of its prefix.
"""

import collections
import functools
import os
import platform
import select
import threading
import time

from . import shm
from .cancel import CancelEvent
from .clock import metered
from .shm_control import (CLOSED, CONSUMER_SLEEPS, ENDED, FREED, HEAD,
                          MAX_CAPACITY, REUSED, RING_AT, TAIL, WAIT_CONSUMERS,
                          WAIT_PRODUCERS, WRITERS, ChannelParts, ProcessLock,
                          control_words, drain, fifo, layout, ring_bell)
from .shm_slots import SlotSegments
from ..errors import Cancelled

__all__ = ["ChannelParts", "ShmChannel", "MAX_CAPACITY"]

#: seconds between looks at a cancellation that has no fd (a plain
#: `threading.Event` given by a caller outside the runtime)
WAIT_SLICE = 0.05
#: seconds after which a wait looks again even unwoken: a safety net only
SAFETY_WAKE = 5.0
#: seconds a producer waits for a batch of free slots once one is free
#: (see `ShmChannel._producer_patience`)
BATCH_WAIT = 0.001
#: seconds a consumer looks at the words before it sleeps (see
#: `ShmChannel._spin`): about what a sleep and its ring cost
SPIN = 50e-6
#: a consumer whose look found nothing looks again only every this many
#: waits, until a look finds its records (see `ShmChannel._spin`)
SPIN_PROBE = 8
#: the bytes of records a consumer that does not keep up with its producer
#: waits for (see `ShmChannel._read`): a few big records, up to half the
#: queue of small ones
BATCH_BYTES = 8 << 20
#: plain loads and stores keep their order here (all but store-load), so
#: only the store-load fences are needed (see Ordering)
_ORDERED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _wait_exclusive(bell, cancelled, seconds):
    """Wait for doorbell ``bell`` or the run's cancellation, ``seconds``
    at most, as one of the doorbell's *exclusive* waiters: a ring wakes
    one of them, not all.  A shared queue may have a thousand waiters (the
    instances of a prototype writing to one ps): woken all at once for
    every ring, each to find the one slot or record taken already, they
    would spend the queue's time on the lock.  One wakes, and what it
    leaves for the others it rings for again (the chain every waiter
    follows, see the module docstring) -- a close too."""
    waiter = select.epoll(2)
    try:
        waiter.register(bell, select.EPOLLIN | select.EPOLLEXCLUSIVE)
        waiter.register(cancelled.fileno(), select.EPOLLIN)
        waiter.poll(seconds)
    finally:
        waiter.close()


class ShmChannel:
    """One node's end of a cross-node queue (see the module docstring)."""

    #: the channel counts the run's writers on all its nodes (the master
    #: tells it how many end): a node's hub leaves the counting to it
    counts_writers = True

    def __init__(self, desc):
        self.prefix = desc["prefix"]
        self.capacity = capacity = desc["capacity"]
        self.queue = desc.get("queue")
        #: several writer or reader nodes: one lock for all (see above)
        self._shared = shared = bool(desc.get("shared_lock"))
        self._aborted = False
        self._control = shm.map_segment(desc["control"], writable=True)
        self._words = control_words(self._control, capacity)
        generations, self._ring, stamps, self._free_ring, _ = \
            layout(capacity)
        self._segments = SlotSegments(self.prefix, self.queue, self._words,
                                      generations, stamps, shared)
        self._free = fifo(os.path.join(shm.SHM_DIR, self.prefix + "free"))
        self._full = fifo(os.path.join(shm.SHM_DIR, self.prefix + "full"))
        self._lock = ProcessLock(self.prefix, lambda: self._aborted) \
            if shared else threading.Lock()
        # held for good, released and re-acquired only by `_fence`
        self._barrier = threading.Lock()
        self._barrier.acquire()
        self._big = False     # the last record was big: reuse hot slots
        #: a consumer looks before it sleeps (see `_spin`): not when
        #: consumers of several nodes share the queue, nor on one CPU
        self._spins = not shared and len(os.sched_getaffinity(0)) > 1
        #: free slots a waiting producer waits for (see _producer_patience):
        #: one when producers of several nodes share them
        self._batch = 1 if shared else max(1, min(capacity // 4, 32))
        self.begin()

    def begin(self):
        """A new run (the master reset the shared parts): this end is
        usable again, after an aborted run too."""
        self._aborted = False
        self._pool = []       # producer: free slot ids taken from the ring
        self._rung = -1       # producer: the consumers' sleep rung for last
        # consumer: slots of records taken from the ring, not yet read
        self._taken = collections.deque()
        # consumer: the last take from the ring found more records than
        # one (the producer is ahead), and how many a batch is
        self._streaming = False
        self._stream_batch = 1
        # consumer: waits since a look before sleeping last found records
        self._misses = 0

    def _fence(self):
        """A full memory fence (see Ordering in the module docstring);
        called under ``self._lock``, so by one thread at a time."""
        barrier = self._barrier
        barrier.release()
        barrier.acquire()

    # -- waiting ------------------------------------------------------------

    @metered
    def _sleep(self, waiting, bell, patience, cancelled, sleeps=None,
               ring_at=None):
        """Sleep until doorbell ``bell`` rings or the run is cancelled, or
        for ``patience()`` seconds at most: a look at the words once this
        thread counted itself into word ``waiting`` (0: no need to) --
        and, if given, counted this sleep in word ``sleeps`` and asked
        for its ring once ``tail`` reaches ``ring_at()`` (word
        `RING_AT`: the lowest any sleeper asked for)."""
        if self._aborted or (cancelled is not None and cancelled.is_set()):
            raise Cancelled("queue wait ended: the run was cancelled")
        words, lock = self._words, self._lock
        with lock:
            if ring_at is not None:
                at = ring_at()
                if words[waiting]:
                    at = min(at, words[RING_AT])   # others sleep too
                words[RING_AT] = at
                if not _ORDERED:
                    self._fence()   # the ring's tail, then "waiting"
            words[waiting] += 1
            if sleeps is not None:
                words[sleeps] += 1
            self._fence()     # our "waiting" before their words
            seconds = patience()
            if not seconds:
                words[waiting] -= 1
                return
        try:
            if self._shared and isinstance(cancelled, CancelEvent):
                _wait_exclusive(bell, cancelled, min(seconds, SAFETY_WAKE))
            else:
                # a poll object per wait (~1 us, less than a select):
                # threads of a node may wait on one channel at once, and
                # one poll object cannot be polled by two threads
                poller = select.poll()
                poller.register(bell, select.POLLIN)
                if isinstance(cancelled, CancelEvent):
                    poller.register(cancelled.fileno(), select.POLLIN)
                    poller.poll(min(seconds, SAFETY_WAKE) * 1000)
                else:
                    poller.poll(min(seconds, WAIT_SLICE) * 1000)
        finally:
            with lock:
                words[waiting] -= 1
                # the rings up to now are answered: whoever takes what
                # they announced and leaves some rings again for the rest
                drain(bell)
                if sleeps is not None and words[waiting]:
                    # and a ring drained here may have been rung for
                    # another sleeper too: a new count, a new ring
                    words[sleeps] += 1

    # -- producer -----------------------------------------------------------

    def put(self, record, cancelled=None, clock=None):
        """Enqueue ``record``; False (nothing queued) if the queue is closed."""
        words, lock = self._words, self._lock
        with lock:
            pool = self._pool
            if pool and not self._big and not words[CLOSED]:
                # the common case: a slot at hand, a small record -- copied
                # under the lock, one lock for all
                slot = pool[-1]
                self._big = self._segments.write(slot, record)
                self._publish(pool.pop())
                return True
        # a big record is copied outside the lock: other threads of the
        # node may put theirs meanwhile
        slot = self._take_slot(cancelled)
        if slot is None:
            return False
        try:
            self._big = self._segments.write(slot, record)
        except BaseException:
            with lock:
                self._unused(slot)
            raise
        with lock:
            if words[CLOSED]:
                self._unused(slot)
                return False
            self._publish(slot)
        return True

    def _unused(self, slot):
        """Keep ``slot``, taken and not queued, for the next record (under
        the lock); with producers on several nodes, back in the free ring,
        where they all find it."""
        if not self._shared:
            self._pool.append(slot)
            return
        words, capacity = self._words, self.capacity
        freed = words[FREED]
        words[self._free_ring + freed % capacity] = slot
        words[FREED] = freed + 1

    def _publish(self, slot):
        """Queue the record written into ``slot`` (under the lock)."""
        words = self._words
        tail = words[TAIL]
        words[self._ring + tail % self.capacity] = slot
        barrier = self._barrier   # `_fence`, inline: once per record
        if not _ORDERED:          # the record and its ring entry, then tail
            barrier.release()
            barrier.acquire()
        tail += 1
        words[TAIL] = tail
        barrier.release()         # tail, then "waiting consumers"
        barrier.acquire()
        if words[WAIT_CONSUMERS]:
            # once per sleep: a sleeper takes a while to wake, and every
            # record put meanwhile would ring again -- and once the queue
            # holds what the sleepers wait for (`RING_AT`), not before
            sleeps = words[CONSUMER_SLEEPS]
            if sleeps != self._rung:
                if not _ORDERED:
                    barrier.release()   # "waiting", then the ring's tail
                    barrier.acquire()
                if tail >= words[RING_AT]:
                    self._rung = sleeps
                    ring_bell(self._full)

    def _take_slot(self, cancelled):
        """A free slot id -- for big records the one freed last, which is
        still in the CPU's caches -- or None once the queue closed."""
        words, lock, pool = self._words, self._lock, self._pool
        while True:
            with lock:
                if words[CLOSED]:
                    if words[WAIT_PRODUCERS]:
                        ring_bell(self._free)   # the others see it too
                    return None
                if self._shared:
                    slot = self._take_free()
                    if slot is not None:
                        return slot
                else:
                    if not pool or self._big:
                        self._collect_free()
                    if pool:
                        slot = pool.pop()
                        if pool and words[WAIT_PRODUCERS]:
                            ring_bell(self._free)   # some left for others
                        return slot
            self._sleep(WAIT_PRODUCERS, self._free, self._producer_patience,
                        cancelled)

    def _take_free(self):
        """One slot of the free ring, the oldest, or None (under the lock):
        what a producer takes when producers of several nodes share the
        slots (none keeps slots others wait for)."""
        words = self._words
        freed, reused = words[FREED], words[REUSED]
        if freed == reused:
            return None
        if not _ORDERED:
            self._fence()  # freed, then the ring (and the slot)
        slot = words[self._free_ring + reused % self.capacity]
        words[REUSED] = reused + 1
        if freed > reused + 1 and words[WAIT_PRODUCERS]:
            ring_bell(self._free)   # some left for the others
        return slot

    def _collect_free(self):
        """Move the slots the consumer handed back into the pool, the
        newest last (under the lock)."""
        words = self._words
        freed, reused = words[FREED], words[REUSED]
        if freed > reused:
            if not _ORDERED:
                self._fence()  # freed, then the ring (and the slots)
            base, capacity = self._free_ring, self.capacity
            self._pool.extend([words[base + i % capacity]
                               for i in range(reused, freed)])
            words[REUSED] = freed

    def _producer_patience(self):
        """How long a producer waits (0: not at all): for a batch of free
        slots, so that a consumer that keeps the queue full rings once per
        batch, not once per record -- but only while that consumer is
        busy (not waiting itself), and `BATCH_WAIT` at most."""
        words = self._words
        if self._pool or words[CLOSED]:
            return 0
        free = words[FREED] - words[REUSED]
        if free >= self._batch or (free and words[WAIT_CONSUMERS]):
            return 0
        return BATCH_WAIT if free else SAFETY_WAKE

    # -- consumer -----------------------------------------------------------

    def get(self, n, cancelled=None, clock=None):
        """Up to ``n`` records: ``(records, finished, done)``.

        The records are views on the queue's slots, lent until ``done()``
        is called (copy them first); ``finished`` is true when the queue is
        closed and nothing was left to take."""
        if n == 1:
            # the common case: one record, at hand if an earlier read took
            # it from the ring (`_take_records`); a deque's popleft is
            # atomic, so no lock
            try:
                slot = self._taken.popleft()
            except IndexError:
                pass
            else:
                slots = (slot,)
                try:
                    record = self._segments.reader_views(slot)
                except BaseException:
                    self._release(slots)
                    raise
                return [record], False, functools.partial(self._release,
                                                          slots)
        want = max(1, int(n))
        return self._lend(self._read(want, want, cancelled))

    def get_available(self, n, cancelled=None, clock=None):
        """Up to ``n`` of the records queued now, waiting for one only:
        ``(records, finished, done)`` as `get`.  One call takes every
        record the ring holds (a lock and the shared words once), so a
        reader that looks at no record alone moves them in bulk."""
        return self._lend(self._read(max(1, int(n)), 1, cancelled))

    def drop_available(self, n, cancelled=None, clock=None):
        """`get_available`, the records dropped at once: ``(how many,
        finished)``.  No view is made on them, and their slots go back
        to the producer in the same call."""
        slots = self._read(max(1, int(n)), 1, cancelled)
        self._release(slots)
        return len(slots), not slots

    def _lend(self, slots):
        """``(records, finished, done)`` of the records in ``slots``: views
        on them, lent until ``done()``."""
        if not slots:
            return [], True, None
        try:
            views = self._segments.reader_views
            records = [views(slot) for slot in slots]
        except BaseException:
            self._release(slots)
            raise
        return records, False, functools.partial(self._release, slots)

    def _read(self, want, least, cancelled):
        """Wait for ``least`` records (or the close), then take up to
        ``want`` of those queued: their slots (none: the queue is closed
        and empty)."""
        slots, batched, spun = [], False, not self._spins or \
            self._misses % SPIN_PROBE != 0
        try:
            while not self._take_records(least, slots) and \
                    len(slots) < least:
                if not spun:
                    spun = True
                    if self._spin(least):
                        self._misses = 0
                        continue
                    self._misses += 1
                elif self._misses:
                    self._misses += 1
                # a producer ahead of this consumer: one sleep waits for a
                # batch (BATCH_WAIT at most), not for the first record --
                # a ring per batch, not one per record or two
                batch = 0
                if self._streaming and not batched and \
                        self._stream_batch > least:
                    batch, batched = self._stream_batch, True
                self._sleep(WAIT_CONSUMERS, self._full,
                            functools.partial(self._consumer_patience, least,
                                              batch),
                            cancelled, CONSUMER_SLEEPS,
                            functools.partial(self._ring_at, least, batch))
            self._pop_taken(want, slots)
            if slots and self._streaming:
                # a batch: half the queue, or BATCH_BYTES of these records
                size = sum(view.nbytes for view in
                           self._segments.reader_views(slots[-1]))
                self._stream_batch = max(1, min(self.capacity // 2,
                                                BATCH_BYTES // max(1, size)))
        except BaseException:
            self._release(slots)
            raise
        return slots

    @metered
    def _spin(self, want):
        """Whether ``want`` records are queued (or the queue is closed)
        within `SPIN` seconds: a consumer looks at the words before it
        sleeps, so that a producer that puts
        a record every few microseconds wakes nobody -- a ring costs it
        tens of them."""
        words, taken = self._words, self._taken
        clock = time.perf_counter
        end = clock() + SPIN
        while not (words[CLOSED] or
                   len(taken) + words[TAIL] - words[HEAD] >= want):
            if self._aborted or clock() > end:
                return False
        return True

    def _pop_taken(self, want, slots):
        """Add to ``slots`` the records already taken from the ring, until
        it holds ``want``."""
        taken = self._taken
        while taken and len(slots) < want:
            slots.append(taken.popleft())

    def _take_records(self, want, slots):
        """Add records' slots to ``slots``, ``want`` in all -- or what is
        left once the queue is closed; True once it is closed and none is
        left.  Every record queued is taken from the ring at once -- the
        next reads find theirs at hand (`get`), a lock and the shared words
        fewer per record.

        A read takes its records all at once or none: one that held some
        while it waited for the rest could, with other such reads, hold
        every slot, and the writers could put nothing more."""
        words, taken = self._words, self._taken
        with self._lock:
            closed = words[CLOSED]
            if closed and not _ORDERED:
                self._fence()   # closed, then tail: records put before it
            head, tail = words[HEAD], words[TAIL]
            if not closed and len(taken) + tail - head < want - len(slots):
                return False
            if self._shared:
                # readers on several nodes: take what was asked, no more
                tail = min(tail, head + want - len(slots))
            if head < tail:
                if not _ORDERED:
                    self._fence()   # tail, then the ring (and the slots)
                ring, capacity = self._ring, self.capacity
                taken.extend([words[ring + i % capacity]
                              for i in range(head, tail)])
                words[HEAD] = tail
                self._streaming = tail - head > 1
            self._pop_taken(want, slots)
            left = taken or words[TAIL] > tail
            if left or closed:
                if words[WAIT_CONSUMERS]:
                    ring_bell(self._full)   # some left, or closed: the others
            return not left and bool(closed)

    def _consumer_patience(self, want, batch=0):
        """How long a consumer of ``want`` records waits (0: not at all):
        for them, or -- ``batch`` -- for that many, `BATCH_WAIT` at most;
        a producer waiting for a batch of free slots is rung first: it
        gets what is free."""
        words = self._words
        if len(self._taken) + words[TAIL] - words[HEAD] >= want or \
                words[CLOSED]:
            return 0
        if words[WAIT_PRODUCERS]:
            ring_bell(self._free)
        return BATCH_WAIT if batch else SAFETY_WAKE

    def _ring_at(self, want, batch=0):
        """The ``tail`` at which a consumer of ``want`` records -- or of a
        ``batch`` -- wants its ring (under the lock): once the queue holds
        them.  Consumers of several nodes take records from one another:
        they are rung at every record, as the first of them might be
        theirs."""
        if self._shared:
            return 0
        return self._words[HEAD] - len(self._taken) + max(want, batch)

    def _release(self, slots):
        """Hand ``slots`` back to the producer (their records copied)."""
        if not slots:
            return
        words = self._words
        with self._lock:
            freed = words[FREED]
            base, capacity = self._free_ring, self.capacity
            for slot in slots:
                words[base + freed % capacity] = slot
                freed += 1
            barrier = self._barrier   # `_fence`, inline: once per record
            if not _ORDERED:          # the reads of the slots, the ring,
                barrier.release()     # then freed
                barrier.acquire()
            words[FREED] = freed
            barrier.release()         # freed, then "waiting producers"
            barrier.acquire()
            if words[WAIT_PRODUCERS]:
                # they wait for a batch (`_producer_patience`): ring as the
                # first slot is free -- they then wait `BATCH_WAIT` at
                # most -- and as the batch is
                free = freed - words[REUSED]
                before = free - len(slots)
                if before < 1 <= free or before < self._batch <= free:
                    ring_bell(self._free)

    # -- both ---------------------------------------------------------------

    def close(self):
        with self._lock:
            self._words[CLOSED] = 1
            self._fence()     # closed, then the waiters' words (in _sleep)
        # wake whoever waits on either side; they see the flag
        ring_bell(self._free)
        ring_bell(self._full)

    def writer_ended(self):
        """One of the run's writers ended, on this node; the last of them
        on all the queue's nodes closes it."""
        words = self._words
        with self._lock:
            ended = words[ENDED] = words[ENDED] + 1
            last = ended >= words[WRITERS]
        if last:
            self.close()

    def abort(self):
        self._aborted = True

    def release(self):
        """Drop this node's mappings and FIFO descriptors."""
        for fd in (self._free, self._full):
            try:
                os.close(fd)
            except OSError:
                pass
        self._segments.clear()
        self._words.release()
        self._words = self._control = None
