"""A queue channel between two node processes, in shared memory.

::

    producer node                 control segment              consumer node
    put(record):                  [closed, tail, head,         get(n):
      wait a "free" token  <----   capacity, slot gens...]  ---> wait "full" tokens
      copy the record into slot                                 copy records out
      tail += 1; post "full"  ------ FIFO "full" ------------>  head += 1;
                              <----- FIFO "free" -------------  post "free"

The master creates a control segment and two named FIFOs per queue
(`ChannelParts`), resets them before every run (``free`` filled with
``capacity`` tokens) and hands their names to both nodes, which keep their
end (`ShmChannel`) across runs.  A record goes into a slot segment (made by
the producer, kept while records fit, replaced -- new generation -- when
one does not); the consumer maps it by name and copies the arrays out.

All of a queue's writers are on one node and all its readers on another
(the scheduler checks), so each side's index is only touched by its own
process, under a thread lock.  Every wait is a ``select`` on a FIFO in
slices, checking the closed flag, the run's cancellation and the
channel's abort, so a closed queue, a cancelled run or a dead peer (the
master cancels the run) never leaves a node blocked.
"""

import os
import pickle
import select
import struct
import threading

import numpy as np

from . import shm
from .executor import Cancelled

__all__ = ["ChannelParts", "ShmChannel"]

# The control segment is int64 words: closed, tail, head, capacity, then
# one generation per slot.  Words are read and written through an int64
# array -- one aligned 8-byte access each -- never with struct.pack_into,
# which zeroes the field before writing it (a reader could see 0).
_CLOSED, _TAIL, _HEAD, _CAPACITY, _GENERATIONS = 0, 1, 2, 3, 4
WAIT_SLICE = 0.05
_ALIGN = 64


def _fifo(path):
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    return fd


class ChannelParts:
    """Master side: a channel's control segment and FIFOs.

    The master keeps them (the FIFOs open: a FIFO drops its bytes when
    nobody holds it) for as long as the queue is used, and `reset` them
    before every run -- empty and open -- while the slot segments the nodes
    made stay, already mapped, so records do not fault in fresh pages every
    run.  `close` and a sweep of ``prefix`` remove everything.
    """

    def __init__(self, prefix, capacity):
        self.prefix = prefix
        self.capacity = capacity
        self.desc = {"prefix": prefix, "control": prefix + "ctl",
                     "capacity": capacity}
        self._fds = []
        try:
            self._control = shm.create_segment(
                prefix + "ctl", 8 * (_GENERATIONS + capacity))
            self._words = np.ndarray(_GENERATIONS + capacity, np.int64,
                                     buffer=self._control)
            for kind in ("free", "full"):
                path = os.path.join(shm.SHM_DIR, prefix + kind)
                os.mkfifo(path, 0o600)
                self._fds.append(_fifo(path))
        except BaseException:
            self.close()
            raise
        self.reset()

    def reset(self):
        """Empty and open, with ``capacity`` free slots (nodes idle)."""
        self._words[:_GENERATIONS] = (0, 0, 0, self.capacity)
        for fd in self._fds:
            try:
                while os.read(fd, 65536):
                    pass
            except BlockingIOError:
                pass
        os.write(self._fds[0], b"x" * self.capacity)

    def close(self):
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        shm.sweep(self.prefix)


class ShmChannel:
    """One node's end of a cross-node queue (see the module docstring)."""

    def __init__(self, desc):
        self.prefix = desc["prefix"]
        self.capacity = desc["capacity"]
        self._control = shm.map_segment(desc["control"], writable=True)
        self._words = np.ndarray(_GENERATIONS + self.capacity, np.int64,
                                 buffer=self._control)
        self._free = _fifo(os.path.join(shm.SHM_DIR, self.prefix + "free"))
        self._full = _fifo(os.path.join(shm.SHM_DIR, self.prefix + "full"))
        self._lock = threading.Lock()
        self._slots = {}      # slot -> (generation, mmap)
        self._views = {}      # slot -> (generation, layout, views): writing
        self._rviews = {}     # slot -> (generation, layout bytes, views)
        self._aborted = False

    def begin(self):
        """A new run: this end is usable again after an aborted one."""
        self._aborted = False

    # -- shared words -------------------------------------------------------

    def _word(self, index):
        return int(self._words[index])

    def _set(self, index, value):
        self._words[index] = value

    def _generation(self, slot):
        return int(self._words[_GENERATIONS + slot])

    def _closed(self):
        return self._words[_CLOSED] != 0

    # -- tokens -------------------------------------------------------------

    def _take(self, fd, cancelled):
        """Take one token from ``fd``; False if the queue closed first --
        for a reader, only once every queued record has been taken (by
        this thread or another of this node)."""
        while True:
            if self._aborted or (cancelled is not None and cancelled.is_set()):
                raise Cancelled("queue wait ended: the run was cancelled")
            try:
                if os.read(fd, 1):
                    return True
            except BlockingIOError:
                pass
            if self._closed() and (fd == self._free or self._drained()):
                return False
            select.select([fd], [], [], WAIT_SLICE)

    def _post(self, fd, n=1):
        try:
            os.write(fd, b"x" * n)
        except BlockingIOError:
            pass  # the FIFO is full of tokens: every waiter can go on

    # -- slots --------------------------------------------------------------

    def _slot_name(self, slot, generation):
        return f"{self.prefix}s{slot}_g{generation}"

    def _map(self, slot, generation, size=None):
        cached = self._slots.get(slot)
        if cached is not None and cached[0] == generation and \
                (size is None or len(cached[1]) >= size):
            return cached[1]
        name = self._slot_name(slot, generation)
        mm = (shm.create_segment(name, size) if size is not None
              else shm.map_segment(name))
        self._slots[slot] = (generation, mm)
        return mm

    def put(self, record, cancelled=None):
        """Enqueue ``record``; False (nothing queued) if the queue is closed."""
        if self._closed() or not self._take(self._free, cancelled):
            return False
        if self._closed():
            self._post(self._free)  # a wake-up token: pass it on
            return False
        arrays = [np.asarray(a, order="C") for a in record]
        key = tuple((a.dtype.str, a.shape) for a in arrays)
        with self._lock:
            tail = self._word(_TAIL)
            slot = tail % self.capacity
            for view, a in zip(self._layout(slot, key), arrays):
                np.copyto(view, a)
            self._set(_TAIL, tail + 1)
        self._post(self._full)
        return True

    def _layout(self, slot, key):
        """Views on ``slot`` for a record of layout ``key`` (producer side),
        the layout written; the slot's segment is replaced if too small.
        Kept while records keep their layout: most queues carry one."""
        generation = self._generation(slot)
        cached = self._views.get(slot)
        if cached is not None and cached[0] == generation and \
                cached[1] == key:
            return cached[2]
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
            if generation:
                shm.unlink(self._slot_name(slot, generation))
            generation += 1
            mm = self._map(slot, generation, max(size, 4096))
            self._set(_GENERATIONS + slot, generation)
        else:
            mm = mapped[1]
        struct.pack_into("q", mm, 0, len(meta))
        mm[8:8 + len(meta)] = meta
        views = [np.ndarray(shape, np.dtype(dtype), buffer=mm, offset=offset)
                 for (dtype, shape), offset in zip(key, offsets)]
        self._views[slot] = (generation, key, views)
        return views

    def get(self, n, cancelled=None):
        """Up to ``n`` records; ``(records, finished)`` as LocalChannel."""
        records = []
        for _ in range(max(1, int(n))):
            if not self._take(self._full, cancelled):
                break
            record = self._read_one()
            if record is None:  # a wake-up token of close(): pass it on
                self._post(self._full)
                break
            records.append(record)
            self._post(self._free)
        if records:
            return records, False
        return [], self._drained()

    def _drained(self):
        return self._closed() and self._word(_HEAD) >= self._word(_TAIL)

    def _read_one(self):
        with self._lock:
            head = self._word(_HEAD)
            if head >= self._word(_TAIL):
                return None
            slot = head % self.capacity
            out = tuple(np.array(view, copy=True)
                        for view in self._reader_views(slot))
            self._set(_HEAD, head + 1)
        return out

    def _reader_views(self, slot):
        """Views on ``slot`` for the record in it (consumer side), kept
        while the producer keeps writing that slot with the same layout."""
        generation = self._generation(slot)
        mm = self._map(slot, generation)
        (meta_len,) = struct.unpack_from("q", mm, 0)
        raw = mm[8:8 + meta_len]
        cached = self._rviews.get(slot)
        if cached is not None and cached[0] == generation and \
                cached[1] == raw:
            return cached[2]
        offset, views = 8 + meta_len, []
        for dtype, shape in pickle.loads(raw):
            offset = -(-offset // _ALIGN) * _ALIGN
            view = np.ndarray(shape, np.dtype(dtype), buffer=mm,
                              offset=offset)
            views.append(view)
            offset += view.nbytes
        self._rviews[slot] = (generation, raw, views)
        return views

    def close(self):
        self._set(_CLOSED, 1)
        # wake whoever waits on either side; they see the flag
        self._post(self._free, 64)
        self._post(self._full, 64)

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
        self._words = self._control = None
