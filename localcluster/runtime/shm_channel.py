"""A queue channel between two node processes, in shared memory.

::

    producer node                 control segment              consumer node
    put(record):                  [closed, tail, head, capacity,  get(n):
      take a free slot id  <----   slot generations, order ring] ---> wait "full" tokens
      copy the record into it                                    slot = ring[head]
      ring[tail] = slot; tail += 1; post "full" ---------------> views on the slot
                              <----- FIFO "free" (slot ids) ---  post the slot id
                                                                 once they are copied

The master creates a control segment and two named FIFOs per queue
(`ChannelParts`), resets them before every run (``free`` filled with every
slot id) and hands their names to both nodes, which keep their end
(`ShmChannel`) across runs.  A record goes into a slot segment (made by the
producer, kept while records fit, replaced -- new generation -- when one
does not); the consumer maps it by name.

Slots are not tied to ring positions: the producer reuses the slot freed
last, so a queue its consumer keeps up with cycles through a few slots that
stay in the CPU's caches instead of through all ``capacity`` of them.
Tokens are read in bulk (one ``read`` takes every token waiting), so a busy
queue costs about one system call per record on each side.

`get` lends the consumer views on the slots (no copy); the caller copies
them where they go and then calls the ``done`` callback it got, which hands
the slots back to the producer.

All of a queue's writers are on one node and all its readers on another
(the scheduler checks), so each side's words are only written by its own
process, under a thread lock.  Every wait is one ``poll`` on the FIFO
*and* the run's cancellation fd (`CancelEvent.fileno`): a token, a close
(which posts wake-up tokens) or a cancelled run -- also a dead peer, as
the master then cancels the run -- wakes it at once; nothing polls
repeatedly.  (``poll``, not ``select``: a node with hundreds of queues
holds descriptors numbered past select's limit of 1024.)  These waits
are real time whatever the run's clock (``put``/``get`` take it and leave
it): a deterministic schedule runs its nodes in one process, with
in-process channels.

Every name a channel makes ends in a random part -- the master's prefix,
and a slot segment's generation, a random number (not a count) -- so that
nobody can create it first in the world-writable /dev/shm; a name that is
taken is retried with another.  Each end keeps two descriptors (its FIFOs)
and no more: mappings keep none (`shm`).  A channel lives until the
master releases it (`ChannelParts.close`, then `ShmChannel.release` on
each node); slot segments then go with the master's sweep of its prefix.
"""

import array
import fcntl
import os
import pickle
import secrets
import select
import struct
import termios
import threading

import numpy as np

from . import shm
from .cancel import CancelEvent
from ..errors import Cancelled, PlanError

__all__ = ["ChannelParts", "ShmChannel", "MAX_CAPACITY"]

# The control segment is int64 words: closed, tail, head, capacity, then
# one generation per slot, the order ring (slot id per position), and one
# layout stamp per slot (bumped when the producer writes a new layout).
# Words are read and written one aligned 8-byte access each (a memoryview
# of format "q"), never with struct.pack_into, which zeroes the field
# before writing it (a reader could see 0).
_CLOSED, _TAIL, _HEAD, _CAPACITY, _GENERATIONS = 0, 1, 2, 3, 4
#: seconds between looks at a cancellation that has no fd (a plain
#: `threading.Event` given by a caller outside the runtime)
WAIT_SLICE = 0.05
#: seconds after which a wait looks again even unwoken: a safety net only
SAFETY_WAKE = 5.0
_ALIGN = 64
#: free tokens are slot ids, 2 bytes each; the FIFO holds 64 KiB
MAX_CAPACITY = 16384
_WAKE = 0xFFFF                # a free token that is no slot: close()'s
_WAKE_TOKEN = array.array("H", [_WAKE]).tobytes()
#: a record at least this big makes the producer reuse the slot freed last
_BIG = 64 << 10


def _fifo(path):
    # O_RDWR: never blocks to wait for the other end, and keeps the FIFO's
    # bytes while this end is open
    return shm.open_fd(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)


def _read_all(fd, count):
    """Every byte waiting in FIFO ``fd`` (b"" if none) -- asked first
    (into ``count``, an int array), as a read of an empty FIFO costs a
    raised BlockingIOError."""
    fcntl.ioctl(fd, termios.FIONREAD, count, True)
    return os.read(fd, count[0]) if count[0] else b""


def _words(buffer, capacity):
    return memoryview(buffer).cast("B")[:_control_size(capacity)].cast("q")


def _control_size(capacity):
    return 8 * (_GENERATIONS + 3 * capacity)


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
        for index, value in enumerate((0, 0, 0, self.capacity)):
            self._words[index] = value
        for fd in self._fds:
            try:
                while os.read(fd, 65536):
                    pass
            except BlockingIOError:
                pass
        os.write(self._fds[0], array.array("H", range(self.capacity))
                 .tobytes())

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
        self.capacity = desc["capacity"]
        self.queue = desc.get("queue")
        self._control = shm.map_segment(desc["control"], writable=True)
        self._words = _words(self._control, self.capacity)
        self._ring = _GENERATIONS + self.capacity
        self._stamps = _GENERATIONS + 2 * self.capacity
        self._free = _fifo(os.path.join(shm.SHM_DIR, self.prefix + "free"))
        self._full = _fifo(os.path.join(shm.SHM_DIR, self.prefix + "full"))
        self._lock = threading.Lock()
        self._count = array.array("i", [0])   # FIONREAD's, under the lock
        self._slots = {}      # slot -> (generation, mmap)
        self._views = {}      # slot -> (generation, views): writing
        self._rviews = {}     # slot -> (generation, stamp, views): reading
        self._big = False     # the last record was big: reuse hot slots
        self.begin()

    def begin(self):
        """A new run (the master reset the shared parts): this end is
        usable again, after an aborted run too."""
        self._aborted = False
        self._pool = []       # producer: free slot ids taken from the FIFO
        self._tokens = 0      # consumer: "full" tokens taken from the FIFO

    # -- waiting ------------------------------------------------------------

    def _wait(self, fd, cancelled):
        if self._aborted or (cancelled is not None and cancelled.is_set()):
            raise Cancelled("queue wait ended: the run was cancelled")
        # a poll object per wait (~1 us, less than a select): threads of a
        # node may wait on one channel at once, and one poll object cannot
        # be polled by two threads
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if isinstance(cancelled, CancelEvent):
            poller.register(cancelled.fileno(), select.POLLIN)
            poller.poll(SAFETY_WAKE * 1000)
        else:
            poller.poll(WAIT_SLICE * 1000)

    def _post(self, fd, data):
        try:
            os.write(fd, data)
        except BlockingIOError:
            pass  # the FIFO is full of tokens: every waiter can go on

    # -- producer -----------------------------------------------------------

    def _take_slot(self, cancelled):
        """A free slot id -- for big records the one freed last, which is
        still in the CPU's caches -- or None once the queue closed."""
        words, lock, pool = self._words, self._lock, self._pool
        while True:
            if words[_CLOSED]:
                return None
            with lock:
                if not pool or self._big:
                    # the slots freed since the last look, the newest last
                    data = _read_all(self._free, self._count)
                    if data:
                        pool.extend(slot for slot in
                                    array.array("H", data).tolist()
                                    if slot != _WAKE)
                if pool:
                    return pool.pop()
            self._wait(self._free, cancelled)

    def put(self, record, cancelled=None, clock=None):
        """Enqueue ``record``; False (nothing queued) if the queue is closed."""
        slot = self._take_slot(cancelled)
        if slot is None:
            return False
        words = self._words
        try:
            for view, a in zip(self._layout(slot, record), record):
                np.copyto(view, a)
        except BaseException:
            with self._lock:
                self._pool.append(slot)
            raise
        with self._lock:
            if words[_CLOSED]:
                self._pool.append(slot)
                return False
            tail = words[_TAIL]
            words[self._ring + tail % self.capacity] = slot
            words[_TAIL] = tail + 1
        self._post(self._full, b"x")
        return True

    def _layout(self, slot, record):
        """Views on ``slot`` for a record like ``record`` (producer side),
        the layout written; the slot's segment is replaced if too small.
        Kept while records keep their layout: most queues carry one."""
        generation = self._words[_GENERATIONS + slot]
        cached = self._views.get(slot)
        if cached is not None and cached[0] == generation:
            views = cached[1]
            if len(views) == len(record):
                for view, a in zip(views, record):
                    if view.dtype != a.dtype or view.shape != a.shape:
                        break
                else:
                    return views
        key = tuple((a.dtype.str, a.shape) for a in record)
        meta = pickle.dumps(key)
        offsets, size = [], 8 + len(meta)
        for dtype, shape in key:
            size = -(-size // _ALIGN) * _ALIGN
            offsets.append(size)
            size += np.dtype(dtype).itemsize * int(np.prod(shape,
                                                           dtype=np.int64))
        mapped = self._slots.get(slot)
        if mapped is None or mapped[0] != generation or \
                len(mapped[1]) < size:
            # the new segment first: if /dev/shm is full, the slot keeps
            # the one the consumer may still have to map
            old = generation
            generation, mm = self._new_slot(slot, max(size, 4096), old)
            if old:
                shm.unlink(self._slot_name(slot, old))
            self._words[_GENERATIONS + slot] = generation
        else:
            mm = mapped[1]
        struct.pack_into("q", mm, 0, len(meta))
        mm[8:8 + len(meta)] = meta
        # a new layout: the consumer's views on this slot are stale
        self._words[self._stamps + slot] += 1
        views = [np.ndarray(shape, np.dtype(dtype), buffer=mm, offset=offset)
                 for (dtype, shape), offset in zip(key, offsets)]
        self._views[slot] = (generation, views)
        self._big = size >= _BIG
        return views

    # -- consumer -----------------------------------------------------------

    def get(self, n, cancelled=None, clock=None):
        """Up to ``n`` records: ``(records, finished, done)``.

        The records are views on the queue's slots, lent until ``done()``
        is called (copy them first); ``finished`` is true when the queue is
        closed and nothing was left to take."""
        slots = []
        try:
            for _ in range(max(1, int(n))):
                slot = self._take_record(cancelled)
                if slot is None:
                    break
                slots.append(slot)
            records = [self._reader_views(slot) for slot in slots]
        except BaseException:
            self._release(slots)
            raise
        if records:
            return records, False, lambda: self._release(slots)
        return [], self._drained(), None

    def _release(self, slots):
        if slots:
            self._post(self._free, array.array("H", slots).tobytes())

    def _take_record(self, cancelled):
        """The slot of the next record; None once the queue is closed and
        every record has been taken (by this thread or another)."""
        words, lock = self._words, self._lock
        while True:
            with lock:
                if not self._tokens:
                    self._tokens = len(_read_all(self._full, self._count))
                if self._tokens:
                    self._tokens -= 1
                    head = words[_HEAD]
                    if head < words[_TAIL]:
                        words[_HEAD] = head + 1
                        return words[self._ring + head % self.capacity]
                    # a wake-up token of close(): pass it on
                    self._post(self._full, b"x")
                    return None
                if self._drained():
                    return None
            self._wait(self._full, cancelled)

    def _drained(self):
        words = self._words
        return words[_CLOSED] and words[_HEAD] >= words[_TAIL]

    def _reader_views(self, slot):
        """Views on ``slot`` for the record in it (consumer side), kept
        while the producer keeps writing that slot with the same layout
        (its generation and layout stamp unchanged)."""
        words = self._words
        generation = words[_GENERATIONS + slot]
        stamp = words[self._stamps + slot]
        cached = self._rviews.get(slot)
        if cached is not None and cached[0] == generation and \
                cached[1] == stamp:
            return cached[2]
        mm = self._map(slot, generation)
        (meta_len,) = struct.unpack_from("q", mm, 0)
        offset, views = 8 + meta_len, []
        for dtype, shape in pickle.loads(mm[8:8 + meta_len]):
            offset = -(-offset // _ALIGN) * _ALIGN
            view = np.ndarray(shape, np.dtype(dtype), buffer=mm,
                              offset=offset)
            views.append(view)
            offset += view.nbytes
        views = tuple(views)
        self._rviews[slot] = (generation, stamp, views)
        return views

    # -- both ---------------------------------------------------------------

    def _slot_name(self, slot, generation):
        return f"{self.prefix}s{slot}_g{generation:x}"

    def _new_slot(self, slot, size, old):
        """A new segment for ``slot`` (producer side): ``(generation,
        mmap)``, the generation random -- nonzero, not ``old`` -- so that
        the segment's name cannot be guessed (and taken) first."""
        for _ in range(shm.CREATE_TRIES):
            generation = secrets.randbits(62)
            if generation in (0, old):
                continue
            try:
                mm = shm.create_segment(
                    self._slot_name(slot, generation), size,
                    what=f"a record of queue {self.queue!r}")
            except FileExistsError:
                continue
            self._slots[slot] = (generation, mm)
            return generation, mm
        raise FileExistsError(
            f"{shm.CREATE_TRIES} random names for a slot of queue "
            f"{self.queue!r} were all taken in {shm.SHM_DIR}")

    def _map(self, slot, generation):
        """The mapping of the producer's segment for ``slot`` (consumer
        side)."""
        cached = self._slots.get(slot)
        if cached is not None and cached[0] == generation:
            return cached[1]
        mm = shm.map_segment(self._slot_name(slot, generation))
        self._slots[slot] = (generation, mm)
        return mm

    def close(self):
        self._words[_CLOSED] = 1
        # wake whoever waits on either side; they see the flag
        self._post(self._free, _WAKE_TOKEN * 64)
        self._post(self._full, b"x" * 64)

    def abort(self):
        self._aborted = True

    def release(self):
        """Drop this node's mappings and FIFO descriptors."""
        for fd in (self._free, self._full):
            try:
                os.close(fd)
            except OSError:
                pass
        self._slots.clear()
        self._views.clear()
        self._rviews.clear()
        self._words.release()
        self._words = self._control = None
