"""Queues between nodes under RaySession: a channel actor per queue.

::

    writer node (actor)                 ChannelActor (async)        reader node
      RayChannel.put(record) -- put --> deque (capacity), closed
                                        waits: asyncio.Condition
                                                  <-- get(n) --  RayChannel.get
      a cancelled run: the node's ChannelHub aborts its channels -> abort()
      wakes every waiter, which answers "aborted": the node raises Cancelled

The session makes one channel actor per cross-node queue (and capacity),
resets it -- empty, open, not aborted -- before every run that uses it,
and hands the run ``{queue id: actor handle}``; a node wraps the handle in
a `RayChannel`, which has `LocalChannel`'s interface.  A reader whose
writer died is never left waiting: the driver cancels the run's other
nodes, their hubs abort the channel, and the reader's wait ends.

Each record is one call each way (not batched yet); records are copied
out of Ray's object store on the reader's side, so the workspace owns
what it stores.
"""

import asyncio
import collections

import numpy as np
import ray

from ..errors import Cancelled
from ..runtime.clock import REAL_TIME
from ..runtime.host import local_channels

__all__ = ["ChannelActor", "RayChannel", "actor_channels"]


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

    def _condition(self):
        if self._cond is None:   # made on the actor's event loop
            self._cond = asyncio.Condition()
        return self._cond

    async def reset(self):
        async with self._condition():
            self._items.clear()
            self._closed = self._aborted = False
            self._cond.notify_all()

    async def put(self, record):
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self._closed or self._aborted or
                                len(self._items) < self.capacity)
            if self._aborted:
                return "aborted"
            if self._closed:
                return "closed"
            self._items.append(record)
            cond.notify_all()
            return "ok"

    async def get(self, n):
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self._closed or self._aborted or
                                len(self._items) >= n)
            if self._aborted:
                return "aborted", []
            take = min(n, len(self._items))
            records = [self._items.popleft() for _ in range(take)]
            cond.notify_all()
            return "ok", records

    async def close(self):
        async with self._condition():
            self._closed = True
            self._cond.notify_all()

    async def abort(self):
        async with self._condition():
            self._aborted = True
            self._cond.notify_all()


class RayChannel:
    """A node's end of a `ChannelActor`: `LocalChannel`'s interface."""

    def __init__(self, handle, name):
        self._handle = handle
        self.name = name

    def __repr__(self):
        return f"RayChannel({self.name!r})"

    def _cancelled(self):
        raise Cancelled(f"queue {self.name!r}: the run was cancelled")

    def put(self, record, cancelled=None, clock=REAL_TIME):
        if cancelled is not None and cancelled.is_set():
            self._cancelled()
        # the call serializes the record at once: the writer's blobs may
        # change after it
        status = ray.get(self._handle.put.remote(tuple(record)))
        if status == "aborted":
            self._cancelled()
        return status == "ok"

    def get(self, n, cancelled=None, clock=REAL_TIME):
        if cancelled is not None and cancelled.is_set():
            self._cancelled()
        status, records = ray.get(self._handle.get.remote(max(1, int(n))))
        if status == "aborted":
            self._cancelled()
        records = [tuple(np.array(f, copy=True) for f in r) for r in records]
        return records, not records, None

    def close(self):
        ray.get(self._handle.close.remote())

    def abort(self):
        self._handle.abort.remote()   # wakes every waiter; not waited for


def actor_channels(queue_id, capacity, context):
    """A node actor's channel factory: the run's channel actor for a queue
    between nodes, an in-process channel for one within the node."""
    remote, local = context if context is not None else ({}, {})
    handle = remote.get(queue_id)
    if handle is not None:
        return RayChannel(handle, str(queue_id))
    return local_channels(queue_id, capacity, local)
