"""Queue channels: what a Queue is while a run executes.

A `Queue` in a plan is only an id, a capacity and a dequeue size; the ops
that use it find its channel in the node's runtime resources
(``resources["queues"]``, a `ChannelHub`), created empty and open for every
run by the session: LocalSession's nodes share their channels; a node
process has its own (cross-node queues attach a shared-memory channel
there).  A queue closes when a reader closes it, or when the last of its
writers in the run has ended (`ChannelHub.writer_ended`): the hub counts
a queue's writers when they are all on its node; a channel shared by
several nodes counts them itself, over all its nodes (``counts_writers``:
it was told how many end in the run).

A channel holds records -- tuples of arrays whose first axis is the batch.
``put`` blocks while the channel is full, ``get(n)`` until ``n`` records
are queued or the channel is closed (then it takes what is left);
``get_available(n)``, where a channel has it, waits for one record only and
takes up to ``n`` of those queued, and ``drop_available(n)`` drops what
it would take (a pipe that looks at no record alone drains its queue so:
see `localcluster.kernels.io_ops`).  A
waiter waits on the channel's condition through the run's clock
(``clock.wait(cond, until=...)``, see `localcluster.runtime.clock`) and is
woken by whatever changes what it waits for: a put, a get, a close -- or
the hub being *aborted*, which a cancelled run does (the hub subscribes to
the run's `CancelEvent`), so the waiter raises `Cancelled` at once.  No
wait polls.  Under a deterministic schedule the same waits are the
schedule's switch points, and what they wait for is what a
`DeadlockError` reports.
"""

import collections
import threading

import numpy as np

from ..errors import Cancelled
from .clock import REAL_TIME

__all__ = ["LocalChannel", "ChannelHub"]


class LocalChannel:
    """A bounded, closable queue of records between threads; ``name``
    says which queue it is in what its waits report."""

    def __init__(self, capacity, name=None, writers=None):
        self.capacity = max(1, int(capacity))
        self._items = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._aborted = False
        self.name = name
        #: writers of the run on all the nodes sharing this channel (None:
        #: the node's hub counts them)
        self.counts_writers = writers is not None
        self._writers_left = writers

    def __repr__(self):
        return (f"LocalChannel({self.name!r}, {len(self._items)}/"
                f"{self.capacity}{', closed' if self._closed else ''})")

    def _check(self, cancelled):
        if self._aborted or (cancelled is not None and cancelled.is_set()):
            raise Cancelled("queue wait ended: the run was cancelled")

    def put(self, record, cancelled=None, clock=REAL_TIME):
        """Enqueue ``record``; False (nothing queued) if the queue is closed."""
        with self._cond:
            while not self._closed and len(self._items) >= self.capacity:
                self._check(cancelled)
                # (a schedule asks at each of its decisions: no call
                # beyond the condition's own)
                clock.wait(self._cond, until=lambda: (
                    self._closed or len(self._items) < self.capacity or
                    self._aborted or (cancelled is not None and
                                      cancelled.is_set())),
                    what=f"room in queue {self.name!r} (it holds "
                         f"{self.capacity} records)")
            self._check(cancelled)
            if self._closed:
                return False
            # the queue keeps its own copy: the writer's blobs change later
            self._items.append(tuple(np.array(f, copy=True) for f in record))
            self._cond.notify_all()
            return True

    def get(self, n, cancelled=None, clock=REAL_TIME):
        """Up to ``n`` records: ``n`` of them, or what is left once closed.

        Returns ``(records, finished, done)``; ``finished`` is true when
        the queue is closed and nothing was left to take; ``done`` is None
        here (the records are the caller's), a callable for channels that
        only lend their records (`ShmChannel`).
        """
        n = max(1, int(n))
        return self._read(n, n, cancelled, clock)

    def get_available(self, n, cancelled=None, clock=REAL_TIME):
        """Up to ``n`` of the records queued now, waiting for one only
        (or the close); ``(records, finished, done)`` as `get`."""
        return self._read(max(1, int(n)), 1, cancelled, clock)

    def drop_available(self, n, cancelled=None, clock=REAL_TIME):
        """`get_available`, the records dropped: ``(how many,
        finished)``."""
        records, finished, _ = self._read(max(1, int(n)), 1, cancelled,
                                          clock)
        return len(records), finished

    def _read(self, n, least, cancelled, clock):
        """Wait for ``least`` records (or the close), then take up to
        ``n``: `get` and `get_available`."""
        with self._cond:
            while not self._closed and len(self._items) < least:
                self._check(cancelled)
                clock.wait(self._cond, until=lambda: (
                    self._closed or len(self._items) >= least or
                    self._aborted or (cancelled is not None and
                                      cancelled.is_set())),
                    what=f"{least} record(s) from queue {self.name!r} (it "
                         f"holds {len(self._items)}, open)")
            self._check(cancelled)
            take = min(n, len(self._items))
            records = [self._items.popleft() for _ in range(take)]
            self._cond.notify_all()
            return records, not records, None

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def writer_ended(self):
        """One of the run's writers ended; the last closes the queue."""
        with self._cond:
            self._writers_left -= 1
            if self._writers_left <= 0:
                self._closed = True
                self._cond.notify_all()

    def abort(self):
        with self._cond:
            self._aborted = True
            self._cond.notify_all()


class ChannelHub:
    """The queue channels of a node's runs, by queue id.

    One hub serves a node's runs one after another: `begin` starts a run
    with no channels, and each is made on first use by ``factory(queue_id,
    capacity, context)`` (``context``: what the host gave the run).  The
    hub subscribes to the run's ``cancelled`` event when it makes the
    run's first channel -- a run that uses no queue pays nothing -- and a
    cancel aborts every channel it made.
    """

    def __init__(self, factory, cancelled):
        self._factory = factory
        self._cancelled = cancelled
        self._channels = {}
        self._context = None
        self._links = None
        self._writers = {}
        self._ended = {}
        self._lock = threading.Lock()
        self._aborted = False

    def begin(self, context=None, links=None, writers=None):
        """A new run: no channels yet, not aborted; ``links``: the run's
        `RunLinks` (its queues over links), or None; ``writers``: ``{queue
        id: writers}`` of the run (`plan.validate.queue_writers`)."""
        self._channels = {}
        self._context = context
        self._links = links
        self._writers = writers or {}
        self._ended = {}
        self._aborted = False

    def writer_ended(self, queue_id, capacity):
        """One writer of ``queue_id`` ended; the last of the run's writers
        closes the queue (the others' records are all in it by then)."""
        channel = self.channel(queue_id, capacity)
        if getattr(channel, "counts_writers", False):
            channel.writer_ended()   # shared by nodes: it counts them all
            return
        with self._lock:
            ended = self._ended[queue_id] = self._ended.get(queue_id, 0) + 1
        if ended >= self._writers.get(queue_id, 1):
            channel.close()

    def channel(self, queue_id, capacity):
        found = self._channels.get(queue_id)  # made already: no lock needed
        if found is not None:
            return found
        with self._lock:
            found = self._channels.get(queue_id)
            if found is None:
                if not self._channels:
                    self._cancelled.subscribe(self.abort)
                found = self._factory(queue_id, capacity, self._context)
                if self._links is not None:
                    found = self._links.wrap(queue_id, found)
                self._channels[queue_id] = found
                if self._aborted:
                    found.abort()
            return found

    def abort(self):
        """Wake every waiter of this run's channels; they raise Cancelled."""
        with self._lock:
            self._aborted = True
            channels = list(self._channels.values())
        for channel in channels:
            channel.abort()
