"""Where a cross-node queue's records live: one slot segment per slot.

The producer end of a channel (`shm_channel.ShmChannel`) makes a slot's
segment, named ``<channel prefix>s<slot>_g<generation>``, big enough for
the record it writes there, and keeps it while records fit; one that does
not fit gets a new segment under a new generation (a random number, not a
count, so that nobody can create the name first in the world-writable
/dev/shm).  A segment starts with its record's layout -- the pickled
``(dtype, shape)`` of each field -- followed by the fields, each aligned to
64 bytes.  The consumer end maps a slot by the generation in the control
words and keeps its views while the slot's generation and layout stamp
(bumped by the producer whenever it writes a new layout) stay the same:
most queues carry records of one layout, so a record costs no pickling
and no mapping once each slot has been used.

When several node processes write one queue (``shared``), a slot passes
from one producer to another: a producer maps the segment another made
(if the record fits), writes a layout only if the slot holds another,
and trusts its views on a slot only while the layout stamp is the one it
saw -- another producer may have written the slot since.
"""

import pickle
import secrets
import struct

import numpy as np

from . import shm

__all__ = ["SlotSegments", "BIG"]

_ALIGN = 64
#: a record at least this big makes the producer reuse the slot freed last
BIG = 64 << 10


class SlotSegments:
    """One channel end's slot segments and its views on them.

    ``words`` are the channel's control words: word ``generations + slot``
    is the slot's generation, ``stamps + slot`` its layout stamp."""

    def __init__(self, prefix, queue, words, generations, stamps,
                 shared=False):
        self.prefix = prefix
        self._shared = shared
        self.queue = queue
        self._words = words
        self._generations = generations
        self._stamps = stamps
        self._mapped = {}     # slot -> (generation, mmap)
        self._views = {}      # slot -> (generation, views, big, stamp)
        self._rviews = {}     # slot -> (generation, stamp, views): reading

    def write(self, slot, record):
        """Copy ``record`` into ``slot`` (producer side); whether it is
        `BIG`.  The slot's views are kept while records keep their layout
        (most queues carry one); a new layout is written first, the
        slot's segment replaced if too small."""
        cached = self._views.get(slot)
        if cached is not None and \
                cached[0] == self._words[self._generations + slot] and \
                len(cached[1]) == len(record) and \
                (not self._shared or
                 cached[3] == self._words[self._stamps + slot]):
            # the common case: checked and copied field by field (a field
            # that does not match is copied again below)
            for view, a in zip(cached[1], record):
                if view.shape != a.shape or view.dtype != a.dtype:
                    break
                view[...] = a
            else:
                return cached[2]
        views, big = self._new_layout(slot, record)
        for view, a in zip(views, record):
            view[...] = a
        return big

    def _new_layout(self, slot, record):
        """``(views, big)`` on ``slot`` for records like ``record``, the
        layout written into the slot."""
        generation = self._words[self._generations + slot]
        key = tuple((a.dtype.str, a.shape) for a in record)
        meta = pickle.dumps(key)
        offsets, size = [], 8 + len(meta)
        for dtype, shape in key:
            size = -(-size // _ALIGN) * _ALIGN
            offsets.append(size)
            size += np.dtype(dtype).itemsize * int(np.prod(shape,
                                                           dtype=np.int64))
        mapped = self._mapped.get(slot)
        if self._shared and generation and \
                (mapped is None or mapped[0] != generation):
            # another producer made this slot's segment
            mapped = (generation, self._map(slot, generation))
        if mapped is None or mapped[0] != generation or \
                len(mapped[1]) < size:
            # the new segment first: if /dev/shm is full, the slot keeps
            # the one the consumer may still have to map
            old = generation
            generation, mm = self._new_segment(slot, max(size, 4096), old)
            if old:
                shm.unlink(self._name(slot, old))
            self._words[self._generations + slot] = generation
        else:
            mm = mapped[1]
        if struct.unpack_from("q", mm, 0)[0] != len(meta) or \
                mm[8:8 + len(meta)] != meta:
            struct.pack_into("q", mm, 0, len(meta))
            mm[8:8 + len(meta)] = meta
            # a new layout: the consumer's views on this slot are stale
            self._words[self._stamps + slot] += 1
        views = [np.ndarray(shape, np.dtype(dtype), buffer=mm, offset=offset)
                 for (dtype, shape), offset in zip(key, offsets)]
        big = size >= BIG
        self._views[slot] = (generation, views, big,
                             self._words[self._stamps + slot])
        return views, big

    def reader_views(self, slot):
        """Views on ``slot`` for the record in it (consumer side), kept
        while the producer keeps writing that slot with the same layout
        (its generation and layout stamp unchanged)."""
        words = self._words
        generation = words[self._generations + slot]
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

    def clear(self):
        """Drop every mapping and view (the segments stay: the master
        sweeps them)."""
        self._mapped.clear()
        self._views.clear()
        self._rviews.clear()

    def _name(self, slot, generation):
        return f"{self.prefix}s{slot}_g{generation:x}"

    def _new_segment(self, slot, size, old):
        """A new segment for ``slot`` (producer side): ``(generation,
        mmap)``, the generation random -- nonzero, not ``old`` -- so that
        the segment's name cannot be guessed (and taken) first."""
        for _ in range(shm.CREATE_TRIES):
            generation = secrets.randbits(62)
            if generation in (0, old):
                continue
            try:
                mm = shm.create_segment(
                    self._name(slot, generation), size,
                    what=f"a record of queue {self.queue!r}")
            except FileExistsError:
                continue
            self._mapped[slot] = (generation, mm)
            return generation, mm
        raise FileExistsError(
            f"{shm.CREATE_TRIES} random names for a slot of queue "
            f"{self.queue!r} were all taken in {shm.SHM_DIR}")

    def _map(self, slot, generation):
        """The mapping of the segment another end made for ``slot``."""
        cached = self._mapped.get(slot)
        if cached is not None and cached[0] == generation:
            return cached[1]
        # writable when shared: an end may write the slots it reads
        mm = shm.map_segment(self._name(slot, generation),
                             writable=self._shared)
        self._mapped[slot] = (generation, mm)
        return mm
