"""Queues between nodes under RaySession: a channel actor per queue,
records moved in batches.

::

    writer node (actor)                ChannelActor (async)      reader node
      RayChannel.put(record)           deque (capacity), closed
        copy -> pending (<= capacity)
        flusher thread: all pending
          -- put_many(batch) ------->  appends as room frees
                                            <-- get_many(need, most) --
                                       >= need records (or closed):   |
                                       up to `most` of them ---------> inbox
                                                     RayChannel.get(n): from
                                                     the inbox, n at a time
      a cancelled run: the node's ChannelHub aborts its channels -> abort()
      wakes every waiter, which answers "aborted": the node raises Cancelled

One remote call per record each way cost about a millisecond a record.
Now a writer's `put` copies the record into a local buffer and returns
(a small record pickled into bytes, `_raywire`: Ray moves those as they
are, where it would serialize each field of each record on its own path);
a flusher thread (one per writer, kept while records come) sends
everything buffered in one call while the next records gather, so a
batch is as large as what came during the last call (latency: one round
trip) and the writer is never more than about two capacities ahead of
the readers (its buffer, and the channel).  A reader
asks for the records it needs and takes up to BATCH that are there, kept
for its next `get`s.  `close()` (the writer's commit) first waits until
what the writer buffered is in the channel, so readers see every record
before the end.

What a reader took and did not read by the end of its run is dropped with
the run, as every channel's records are (channels start empty every
run).  A queue read by several nodes is read without that batching: each
reader takes only the records it asked for, so none is kept from the
others (a reader that stops early -- a limit -- leaves them the rest).

A queue closes when the last of the run's writers ends, on any node: the
session tells the channel actor how many end in the run, and each
writer's end (`RayChannel.writer_ended`, after its buffered records are
in) counts itself there.

The session makes one channel actor per cross-node queue (and capacity),
resets it -- empty, open, not aborted -- before every run that uses it,
and hands the run ``{queue id: actor handle}``; a node wraps the handle in
a `RayChannel`, which has `LocalChannel`'s interface.  A reader whose
writer died is never left waiting: the driver cancels the run's other
nodes, their hubs abort the channel, and the reader's wait ends.
"""

import asyncio
import collections
import os
import threading

import numpy as np
import ray

from ..errors import Cancelled
from ..runtime.clock import REAL_TIME, metered
from ..runtime.host import local_channels
from ._raywire import SMALL, array_bytes, pack, unpack

__all__ = ["ChannelActor", "RayChannel", "actor_channels", "BATCH"]

#: records a reader takes at most in one call
BATCH = 256
#: seconds a writer's flusher waits for more records before it ends
IDLE = 0.05


class ChannelActor:
    """A bounded, closable queue of records, shared by the nodes of a run
    (made a Ray actor by the session)."""

    def __init__(self, capacity, name):
        self.capacity = max(1, int(capacity))
        self.name = name
        self._items = collections.deque()
        self._closed = False
        self._aborted = False
        self._cond = None
        self._run = None      # the run it serves: a late batch of an
                              # earlier run is refused, not queued
        self._writers = 1     # writers that end in the run
        self._ended = 0

    def _condition(self):
        if self._cond is None:   # made on the actor's event loop
            self._cond = asyncio.Condition()
        return self._cond

    async def reset(self, run, capacity=None, name=None, writers=1):
        """Empty and open, for run ``run`` (of queue ``name`` holding
        ``capacity`` records: an actor from a pool serves any queue) in
        which ``writers`` writers end."""
        async with self._condition():
            if capacity is not None:
                self.capacity, self.name = max(1, int(capacity)), name
            self._items.clear()
            self._closed = self._aborted = False
            self._run = run
            self._writers, self._ended = writers, 0
            self._cond.notify_all()
        return os.getpid()

    def pid(self):
        return os.getpid()

    async def put_many(self, records, run):
        """Append ``records`` of run ``run`` as room frees: "ok", "closed"
        or "aborted"."""
        cond = self._condition()
        records = collections.deque(records)
        async with cond:
            while records:
                await cond.wait_for(lambda: self._closed or self._aborted or
                                    run != self._run or
                                    len(self._items) < self.capacity)
                if self._aborted or run != self._run:
                    return "aborted"
                if self._closed:
                    return "closed"
                while records and len(self._items) < self.capacity:
                    self._items.append(records.popleft())
                cond.notify_all()
            return "ok"

    async def get_many(self, need, most):
        """Once ``need`` records are here (or the queue is closed): up to
        ``most`` of them, as ``(status, records)``."""
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self._closed or self._aborted or
                                len(self._items) >= need)
            if self._aborted:
                return "aborted", []
            take = min(max(need, most), len(self._items))
            records = [self._items.popleft() for _ in range(take)]
            cond.notify_all()
            return "ok", records

    async def close(self):
        async with self._condition():
            self._closed = True
            self._cond.notify_all()

    async def writer_ended(self, run):
        """A writer of run ``run`` ended; the last of the run's closes."""
        async with self._condition():
            if run == self._run:
                self._ended += 1
                if self._ended >= self._writers:
                    self._closed = True
                    self._cond.notify_all()

    async def abort(self):
        async with self._condition():
            self._aborted = True
            self._cond.notify_all()


class RayChannel:
    """A node's end of a `ChannelActor`: `LocalChannel`'s interface."""

    #: the channel actor counts the run's writers on all nodes
    counts_writers = True

    def __init__(self, handle, run, name, capacity, readers=1):
        self._handle = handle
        self._run = run
        #: records a read takes at most: only what it asked for when
        #: several nodes read the queue
        self._most = BATCH if readers < 2 else 0
        self.name = name
        self._capacity = max(1, int(capacity))
        self._cond = threading.Condition()
        self._pending = collections.deque()   # put, not yet sent
        self._sending = False                 # the flusher runs
        self._ended = False                   # the writer is done
        self._state = None                    # None, "closed", "aborted"
        self._inbox = collections.deque()     # taken, not yet handed out

    def __repr__(self):
        return f"RayChannel({self.name!r})"

    def _cancelled(self):
        raise Cancelled(f"queue {self.name!r}: the run was cancelled")

    # -- writing --------------------------------------------------------------

    def put(self, record, cancelled=None, clock=REAL_TIME):
        # the writer's blobs change after this: the channel keeps a copy
        # -- a small record's pickled (one raw buffer for Ray to move, not
        # an out-of-band buffer per field), a big one's its arrays
        record = tuple(np.asarray(f) for f in record)
        if array_bytes(record) <= SMALL:
            copy = pack(record)
        else:
            copy = tuple(np.array(f, copy=True) for f in record)
        with self._cond:
            clock.wait(self._cond, until=lambda: (
                self._state is not None or
                len(self._pending) < self._capacity or
                (cancelled is not None and cancelled.is_set())),
                what=f"room in queue {self.name!r}")
            if self._state == "aborted" or \
                    (cancelled is not None and cancelled.is_set()):
                self._cancelled()
            if self._state == "closed":
                return False
            self._pending.append(copy)
            if not self._sending:
                self._sending = True
                threading.Thread(target=self._flush, daemon=True,
                                 name=f"queue {self.name} flusher").start()
            else:
                self._cond.notify_all()     # a flusher waiting for more
            return True

    def _flush(self):
        """Send what is pending, a batch a call, until nothing is for
        IDLE seconds (or the writer is done): a writer that puts again
        meanwhile wakes this thread instead of starting another."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._ended or
                                    self._state is not None, timeout=IDLE)
                if not self._pending or self._state is not None:
                    self._sending = False
                    self._cond.notify_all()
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._cond.notify_all()     # room for the writer
            try:
                status = ray.get(self._handle.put_many.remote(
                    batch, self._run))
            except ray.exceptions.RayError:
                status = "aborted"          # the channel actor is gone
            if status != "ok":
                with self._cond:
                    self._state = self._state or status
                    self._pending.clear()

    def close(self):
        """Close the queue once what this writer put is in it."""
        self._sent()
        ray.get(self._handle.close.remote())

    def writer_ended(self):
        """This writer ended: counted once what it put is in the queue
        (the last writer of the run, on any node, closes it)."""
        self._sent()
        ray.get(self._handle.writer_ended.remote(self._run))

    def _sent(self):
        """Wait until what this writer put is in the channel actor (the
        writer is done: its flusher ends)."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._sending or
                                self._state is not None)
            if self._state == "aborted":
                self._cancelled()

    def abort(self):
        with self._cond:
            self._state = "aborted"
            self._pending.clear()
            self._cond.notify_all()
        self._handle.abort.remote()   # wakes every waiter; not waited for

    # -- reading --------------------------------------------------------------

    def get(self, n, cancelled=None, clock=REAL_TIME):
        if cancelled is not None and cancelled.is_set():
            self._cancelled()
        n = max(1, int(n))
        if len(self._inbox) < n:
            status, records = _metered_get(self._handle.get_many.remote(
                n - len(self._inbox), self._most))
            if status == "aborted":
                self._cancelled()
            # a small record unpickles into arrays of its own; Ray hands
            # a big one's over as read-only views of its object store:
            # the workspace gets copies
            self._inbox.extend(
                unpack(r) if isinstance(r, bytes) else
                tuple(np.array(f, copy=True) for f in r) for r in records)
        records = [self._inbox.popleft()
                   for _ in range(min(n, len(self._inbox)))]
        return records, not records, None

    def drop_available(self, n, cancelled=None, clock=REAL_TIME):
        """Drop up to ``n`` of the records there are -- those taken
        already, or else up to ``n`` of those the channel holds once it
        holds one (or the close): one call for them all, none unpickled
        or copied.  ``(how many, finished)``, as a shared-memory
        channel's (a drain's read: see `localcluster.kernels.io_ops`)."""
        if cancelled is not None and cancelled.is_set():
            self._cancelled()
        n = max(1, int(n))
        if self._inbox:
            take = min(n, len(self._inbox))
            for _ in range(take):
                self._inbox.popleft()
            return take, False
        status, records = _metered_get(self._handle.get_many.remote(
            1, min(n, BATCH)))
        if status == "aborted":
            self._cancelled()
        return len(records), not records


#: a blocking ray.get, its time noted as a wait (not an op's work: see
#: `localcluster.runtime.links`)
_metered_get = metered(ray.get)


def actor_channels(queue_id, capacity, context):
    """A node actor's channel factory: the run's channel actor for a queue
    between nodes, an in-process channel for one within the node."""
    remote, local = context if context is not None else ({}, {})
    found = remote.get(queue_id)     # (channel actor, run id, readers)
    if found is not None:
        return RayChannel(found[0], found[1], str(queue_id), capacity,
                          found[2])
    return local_channels(queue_id, capacity, local)
