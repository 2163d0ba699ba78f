"""A queue channel between two node processes, in shared memory.

::

    producer node               control segment                consumer node
    put(record):                [closed, tail, head, freed,    get(n):
      slot = a free slot id      reused, waiting producers,     head < tail?
      copy the record into it    waiting consumers, capacity,     slot = ring[head]
      ring[tail] = slot          slot generations, record ring,   head += 1
      tail += 1 ---------------> layout stamps, free ring]      views on the slot
      consumers waiting?                                         ... copied:
        ring "full"  ---------------------------------------->   free[freed] = slot
      free slots: free[reused..freed) <---------------------    freed += 1
                                                               producers waiting?
                          <------------------------------------  ring "free"

The shared words are the truth: a record is queued when ``tail`` says so,
a slot is free when ``freed`` says so, and neither side makes a system
call while the other keeps up.  The two named FIFOs are only doorbells,
rung when the other side said it sleeps (its "waiting" word): a waiter
counts itself into the word, then looks at the words again, and only then
sleeps, so a record (or slot) published between its look and its sleep
rings the bell (see *Ordering* below).  A waiter wakes on one ``poll`` of
its doorbell *and* the run's cancellation fd (`CancelEvent.fileno`): a
record, a free slot, a close (which rings both bells) or a cancelled run
-- also a dead peer, as the master then cancels the run -- wakes it at
once; nothing polls repeatedly.  (``poll``, not ``select``: a node with
hundreds of queues holds descriptors numbered past select's limit of
1024.)  These waits are real time whatever the run's clock (``put``/``get``
take it and leave it): a deterministic schedule runs its nodes in one
process, with in-process channels.

The master creates the control segment and the two FIFOs per queue
(`ChannelParts`), resets them before every run (every slot in the free
ring) and hands their names to both nodes, which keep their end
(`ShmChannel`) across runs.  A record goes into a slot segment (made by
the producer, kept while records fit, replaced -- new generation -- when
one does not); the consumer maps it by name.  Slots are not tied to ring
positions: the producer takes the slot freed last, so a queue its
consumer keeps up with cycles through a few slots that stay in the CPU's
caches instead of through all ``capacity`` of them.

`get` lends the consumer views on the slots (no copy); the caller copies
them where they go and then calls the ``done`` callback it got, which
hands the slots back to the producer.

All of a queue's writers are on one node and all its readers on another
(the scheduler checks), so each side's words are only written by its own
process (``closed`` by either, only ever to 1), under the end's thread
lock.  Several threads of one side may wait at once: one that wakes and
leaves something for the others rings their bell again.

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
end holds (glibc semaphores: a release then an acquire atomic).  On
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

import os
import platform
import select
import threading

from . import shm
from .cancel import CancelEvent
from .shm_slots import SlotSegments
from ..errors import Cancelled, PlanError

__all__ = ["ChannelParts", "ShmChannel", "MAX_CAPACITY"]

# The control segment is int64 words: the ones below, then one generation
# per slot, the record ring (slot id per position), one layout stamp per
# slot (bumped when the producer writes a new layout) and the free ring
# (slot ids handed back, in the order they were).
(_CLOSED, _TAIL, _HEAD, _FREED, _REUSED, _WAIT_PRODUCERS, _WAIT_CONSUMERS,
 _CAPACITY, _GENERATIONS) = range(9)
#: seconds between looks at a cancellation that has no fd (a plain
#: `threading.Event` given by a caller outside the runtime)
WAIT_SLICE = 0.05
#: seconds after which a wait looks again even unwoken: a safety net only
SAFETY_WAKE = 5.0
#: seconds a producer waits for a batch of free slots once one is free
#: (see `ShmChannel._producer_patience`)
BATCH_WAIT = 0.001
#: the most records a queue between two nodes holds (its control words
#: grow with it)
MAX_CAPACITY = 16384
#: plain loads and stores keep their order here (all but store-load), so
#: only the store-load fences are needed (see Ordering)
_ORDERED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_BELL = b"x"


def _fifo(path):
    # O_RDWR: never blocks to wait for the other end, and keeps the FIFO's
    # bytes while this end is open
    return shm.open_fd(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)


def _drain(fd):
    """Empty doorbell FIFO ``fd``."""
    try:
        while len(os.read(fd, 4096)) == 4096:
            pass
    except BlockingIOError:
        pass


def _ring(fd):
    try:
        os.write(fd, _BELL)
    except BlockingIOError:
        pass  # the FIFO is full of rings: every waiter wakes anyway


def _words(buffer, capacity):
    return memoryview(buffer).cast("B")[:_control_size(capacity)].cast("q")


def _control_size(capacity):
    return 8 * (_GENERATIONS + 4 * capacity)


class ChannelParts:
    """Master side: a channel's control segment and FIFOs.

    The master keeps them (the FIFOs open: a FIFO drops its bytes when
    nobody holds it) for as long as the queue is used, and `reset` them
    before every run -- empty and open -- while the slot segments the nodes
    made stay, already mapped, so records do not fault in fresh pages every
    run.  `close` and a sweep of ``prefix`` remove everything.
    """

    def __init__(self, prefix, capacity, queue=None):
        if capacity > MAX_CAPACITY:
            raise PlanError(
                f"a queue between two nodes holds at most {MAX_CAPACITY} "
                f"records, this one asks for capacity={capacity}; lower it "
                "(larger records, fewer of them) or keep both ends on one "
                "node")
        self.prefix = prefix
        self.capacity = capacity
        self.desc = {"prefix": prefix, "control": prefix + "ctl",
                     "capacity": capacity, "queue": queue}
        self._fds = []
        self._words = None
        self._made = []       # the parts' names, once this made them
        try:
            self._control = shm.create_segment(
                prefix + "ctl", _control_size(capacity),
                what=f"the control words of queue {queue!r}")
            self._made.append(prefix + "ctl")
            self._words = _words(self._control, capacity)
            for kind in ("free", "full"):
                path = os.path.join(shm.SHM_DIR, prefix + kind)
                os.mkfifo(path, 0o600)
                self._made.append(prefix + kind)
                self._fds.append(_fifo(path))
        except BaseException:
            # what failed may be the descriptors running out: remove the
            # parts by name, listing nothing, so the error stays the first
            self._close_parts()
            raise
        self.reset()

    def reset(self):
        """Empty and open, every slot free (nodes idle)."""
        # (slot generations and layout stamps stay: the nodes keep their
        # slot segments and views across runs)
        words, capacity = self._words, self.capacity
        free = _GENERATIONS + 3 * capacity
        for slot in range(capacity):
            words[free + slot] = slot
        for index, value in ((_CLOSED, 0), (_TAIL, 0), (_HEAD, 0),
                             (_FREED, capacity), (_REUSED, 0),
                             (_WAIT_PRODUCERS, 0), (_WAIT_CONSUMERS, 0),
                             (_CAPACITY, capacity)):
            words[index] = value
        for fd in self._fds:
            _drain(fd)

    def close(self):
        self._close_parts()
        shm.sweep(self.prefix)    # and the slot segments the nodes made

    def _close_parts(self):
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self._words is not None:
            self._words.release()
            self._words = None
        for name in self._made:
            shm.unlink(name)
        self._made = []


class ShmChannel:
    """One node's end of a cross-node queue (see the module docstring)."""

    def __init__(self, desc):
        self.prefix = desc["prefix"]
        self.capacity = capacity = desc["capacity"]
        self.queue = desc.get("queue")
        self._control = shm.map_segment(desc["control"], writable=True)
        self._words = _words(self._control, capacity)
        self._ring = _GENERATIONS + capacity
        self._free_ring = _GENERATIONS + 3 * capacity
        self._segments = SlotSegments(
            self.prefix, self.queue, self._words, _GENERATIONS,
            _GENERATIONS + 2 * capacity)
        self._free = _fifo(os.path.join(shm.SHM_DIR, self.prefix + "free"))
        self._full = _fifo(os.path.join(shm.SHM_DIR, self.prefix + "full"))
        self._lock = threading.Lock()
        # held for good, released and re-acquired only by `_fence`
        self._barrier = threading.Lock()
        self._barrier.acquire()
        self._big = False     # the last record was big: reuse hot slots
        #: free slots a waiting producer waits for (see _producer_patience)
        self._batch = max(1, min(capacity // 4, 32))
        self.begin()

    def begin(self):
        """A new run (the master reset the shared parts): this end is
        usable again, after an aborted run too."""
        self._aborted = False
        self._pool = []       # producer: free slot ids taken from the ring

    def _fence(self):
        """A full memory fence (see Ordering in the module docstring);
        called under ``self._lock``, so by one thread at a time."""
        barrier = self._barrier
        barrier.release()
        barrier.acquire()

    # -- waiting ------------------------------------------------------------

    def _sleep(self, waiting, bell, patience, cancelled):
        """Sleep until doorbell ``bell`` rings or the run is cancelled, or
        for ``patience()`` seconds at most: a look at the words once this
        thread counted itself into word ``waiting`` (0: no need to)."""
        if self._aborted or (cancelled is not None and cancelled.is_set()):
            raise Cancelled("queue wait ended: the run was cancelled")
        words, lock = self._words, self._lock
        with lock:
            words[waiting] += 1
            self._fence()     # our "waiting" before their words
            seconds = patience()
            if not seconds:
                words[waiting] -= 1
                return
        try:
            # a poll object per wait (~1 us, less than a select): threads
            # of a node may wait on one channel at once, and one poll
            # object cannot be polled by two threads
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
                _drain(bell)

    # -- producer -----------------------------------------------------------

    def put(self, record, cancelled=None, clock=None):
        """Enqueue ``record``; False (nothing queued) if the queue is closed."""
        words, lock = self._words, self._lock
        with lock:
            pool = self._pool
            if pool and not self._big and not words[_CLOSED]:
                # the common case: a slot at hand, a small record -- copied
                # under the lock, one lock for all
                slot = pool.pop()
                try:
                    self._write(slot, record)
                except BaseException:
                    pool.append(slot)
                    raise
                self._publish(slot)
                return True
        # a big record is copied outside the lock: other threads of the
        # node may put theirs meanwhile
        slot = self._take_slot(cancelled)
        if slot is None:
            return False
        try:
            self._write(slot, record)
        except BaseException:
            with lock:
                self._pool.append(slot)
            raise
        with lock:
            if words[_CLOSED]:
                self._pool.append(slot)
                return False
            self._publish(slot)
        return True

    def _write(self, slot, record):
        views, self._big = self._segments.writer_views(slot, record)
        for view, a in zip(views, record):
            view[...] = a

    def _publish(self, slot):
        """Queue the record written into ``slot`` (under the lock)."""
        words = self._words
        tail = words[_TAIL]
        words[self._ring + tail % self.capacity] = slot
        barrier = self._barrier   # `_fence`, inline: once per record
        if not _ORDERED:          # the record and its ring entry, then tail
            barrier.release()
            barrier.acquire()
        words[_TAIL] = tail + 1
        barrier.release()         # tail, then "waiting consumers"
        barrier.acquire()
        if words[_WAIT_CONSUMERS]:
            _ring(self._full)

    def _take_slot(self, cancelled):
        """A free slot id -- for big records the one freed last, which is
        still in the CPU's caches -- or None once the queue closed."""
        words, lock, pool = self._words, self._lock, self._pool
        while True:
            with lock:
                if words[_CLOSED]:
                    if words[_WAIT_PRODUCERS]:
                        _ring(self._free)   # the others see it too
                    return None
                if not pool or self._big:
                    self._collect_free()
                if pool:
                    slot = pool.pop()
                    if pool and words[_WAIT_PRODUCERS]:
                        _ring(self._free)   # some left for the others
                    return slot
            self._sleep(_WAIT_PRODUCERS, self._free, self._producer_patience,
                        cancelled)

    def _collect_free(self):
        """Move the slots the consumer handed back into the pool, the
        newest last (under the lock)."""
        words = self._words
        freed, reused = words[_FREED], words[_REUSED]
        if freed > reused:
            if not _ORDERED:
                self._fence()  # freed, then the ring (and the slots)
            base, capacity = self._free_ring, self.capacity
            self._pool.extend([words[base + i % capacity]
                               for i in range(reused, freed)])
            words[_REUSED] = freed

    def _producer_patience(self):
        """How long a producer waits (0: not at all): for a batch of free
        slots, so that a consumer that keeps the queue full rings once per
        batch, not once per record -- but only while that consumer is
        busy (not waiting itself), and `BATCH_WAIT` at most."""
        words = self._words
        if self._pool or words[_CLOSED]:
            return 0
        free = words[_FREED] - words[_REUSED]
        if free >= self._batch or (free and words[_WAIT_CONSUMERS]):
            return 0
        return BATCH_WAIT if free else SAFETY_WAKE

    # -- consumer -----------------------------------------------------------

    def get(self, n, cancelled=None, clock=None):
        """Up to ``n`` records: ``(records, finished, done)``.

        The records are views on the queue's slots, lent until ``done()``
        is called (copy them first); ``finished`` is true when the queue is
        closed and nothing was left to take."""
        want = max(1, int(n))
        slots = []
        try:
            while not self._take_records(want, slots) and len(slots) < want:
                self._sleep(_WAIT_CONSUMERS, self._full,
                            self._consumer_patience, cancelled)
            views = self._segments.reader_views
            records = [views(slot) for slot in slots]
        except BaseException:
            self._release(slots)
            raise
        if records:
            return records, False, lambda: self._release(slots)
        return [], True, None

    def _take_records(self, want, slots):
        """Add the slots of the records queued to ``slots``, up to ``want``
        in all; True once the queue is closed and none is left."""
        words = self._words
        with self._lock:
            head, tail = words[_HEAD], words[_TAIL]
            if head >= tail:
                if not words[_CLOSED]:
                    return False
                self._fence()   # closed, then tail: records put before it
                tail = words[_TAIL]
                if head >= tail:
                    if words[_WAIT_CONSUMERS]:
                        _ring(self._full)   # the others see it too
                    return True
            elif not _ORDERED:
                self._fence()   # tail, then the ring (and the slots)
            end = min(tail, head + want - len(slots))
            ring, capacity = self._ring, self.capacity
            slots.extend([words[ring + i % capacity]
                          for i in range(head, end)])
            words[_HEAD] = end
            if end < tail and words[_WAIT_CONSUMERS]:
                _ring(self._full)   # some left for the others
            return False

    def _consumer_patience(self):
        """How long a consumer waits (0: not at all); a producer waiting
        for a batch of free slots is rung first: it gets what is free."""
        words = self._words
        if words[_TAIL] > words[_HEAD] or words[_CLOSED]:
            return 0
        if words[_WAIT_PRODUCERS]:
            _ring(self._free)
        return SAFETY_WAKE

    def _release(self, slots):
        """Hand ``slots`` back to the producer (their records copied)."""
        if not slots:
            return
        words = self._words
        with self._lock:
            freed = words[_FREED]
            base, capacity = self._free_ring, self.capacity
            for slot in slots:
                words[base + freed % capacity] = slot
                freed += 1
            if not _ORDERED:
                self._fence()  # the reads of the slots, the ring, then freed
            words[_FREED] = freed
            self._fence()      # freed, then "waiting producers"
            if words[_WAIT_PRODUCERS]:
                # they wait for a batch: ring once, as it fills up
                free, batch = freed - words[_REUSED], self._batch
                if free - len(slots) < batch <= free:
                    _ring(self._free)

    # -- both ---------------------------------------------------------------

    def close(self):
        with self._lock:
            self._words[_CLOSED] = 1
            self._fence()     # closed, then the waiters' words (in _sleep)
        # wake whoever waits on either side; they see the flag
        _ring(self._free)
        _ring(self._full)

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
