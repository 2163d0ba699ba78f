"""Cluster conditions inside a node's runtime: slow ops and thin links.

What `localcluster.plan.conditions.resolve` decided for a node's run (a
`NodeConditions`) is carried out here, the same way whatever hosts the
node, and on whatever clock the run has -- real time, or a deterministic
schedule's virtual clock:

- a slow node (``slowdown`` s > 1): `run_net_slowed` runs a net and then
  owes ``(s - 1)`` times the time its ops took -- their waits (for a
  record, a timer) not counted -- and pays what it owes
  by waiting once the debt reaches `PAY_AT` (a wait per op of a few
  microseconds would cost more than it emulates, and every pause leaves
  the ops after it a colder cache); what waiting took beyond the
  debt is credited.  Under a schedule the scheduler charges
  the slowdown to the branch's virtual clock instead, and nothing waits.
- a link: the writing node's end of the queue (`LinkedWriter`) appends
  to each record the time it was sent; the reading node's end
  (`LinkedReader`) takes it off and holds the record until it arrives:
  the link moves one record at a time (``bytes / bandwidth`` each, in
  order, starting no earlier than the record was sent), then it takes
  ``latency`` plus a seeded draw of ``[0, jitter)``; a record never
  arrives before the one sent ahead of it.  A reader holds a record
  it has taken while it is in flight, so a queue of capacity c has up to
  c + 1 records in flight.  A partition in force holds a
  record that would arrive while it lasts until it heals.

Records travel with their sending time -- and the index of their writing
node, for a queue several nodes write, each over its own link -- as one
more field, so every channel (in-process, shared memory, an engine's)
carries them unchanged.
Times are the run's clock: virtual ns under a schedule, else the host's
``now_ns`` (CLOCK_MONOTONIC, which every process of this machine shares;
a host spanning machines passes wall-clock ns).
"""

import math
import random
import threading
import time

import numpy as np

from ..errors import Cancelled
from .clock import wait_meter

__all__ = ["run_net_slowed", "RunLinks", "LinkedWriter", "LinkedReader",
           "LinkState", "PAY_AT"]

#: seconds of owed slowdown a thread gathers before it waits them off
PAY_AT = 0.005

_DEBT = threading.local()


def run_net_slowed(run_net, net, code, get, put, ws, rc, task, step):
    """`run_net` (the executor's loop over a net's ops), then the wait a
    slow node owes for them (see the module docstring).  Owed per net,
    not per op: the debt is paid in installments either way, and a call
    per op would add its own cost to every op."""
    meter = wait_meter()
    perf = time.perf_counter
    try:
        waited, start = meter.seconds, perf()
        run_net(net, code, get, put, ws, rc, task, step)
        now = perf()
        spent = now - start - (meter.seconds - waited)
    finally:
        meter.stop()
    debt = getattr(_DEBT, "seconds", 0.0)
    if spent > 0:
        debt += spent * (rc.slowdown - 1.0)
    if debt >= PAY_AT:
        try:
            if rc.clock.wait(rc.cancelled, debt,
                             what=f"node {rc.node!r}'s slowdown"):
                raise Cancelled(f"run on node {rc.node!r} was cancelled")
        finally:
            debt -= perf() - now
    _DEBT.seconds = debt


def _real_ns(clock, now_ns):
    return clock.now_ns if clock.switches else now_ns


class LinkedWriter:
    """The writing node's end of a queue over a link: each record goes
    with the time it was sent (one more field)."""

    def __init__(self, channel, now_ns, index=0, reads_linked=False):
        self._channel = channel
        self._now_ns = now_ns
        self._index = index   # of this node among the queue's writers
        #: ``channel`` is this node's LinkedReader of the same queue,
        #: which takes the stamps off what it reads
        self._strip = not reads_linked

    def put(self, record, cancelled=None, clock=None):
        stamp = np.array([_real_ns(clock, self._now_ns)(), self._index],
                         np.int64)
        return self._channel.put(tuple(record) + (stamp,), cancelled, clock)

    def get(self, n, cancelled=None, clock=None):
        records, finished, done = self._channel.get(n, cancelled, clock)
        if not self._strip:
            return records, finished, done
        return [r[:-1] for r in records], finished, done

    @property
    def counts_writers(self):
        return getattr(self._channel, "counts_writers", False)

    def writer_ended(self):
        self._channel.writer_ended()

    def close(self):
        self._channel.close()

    def abort(self):
        self._channel.abort()


class LinkState:
    """One link's state in one run, on its reading node: when it is free
    again, when its last record arrived, its jitter's draws."""

    def __init__(self, inlink, start_ns):
        self.inlink = inlink
        self.busy_ns = 0
        self.last_ns = 0
        self.rng = random.Random(inlink.seed) if inlink.jitter else None
        self.ns_per_byte = 1e9 / inlink.bandwidth if inlink.bandwidth \
            else 0.0
        self.latency_ns = int(inlink.latency * 1e9)
        self.windows = [(start_ns + int(a * 1e9) if a else -math.inf,
                         math.inf if b is None else start_ns + int(b * 1e9),
                         text) for a, b, text in inlink.windows]
        self.lock = threading.Lock()

    def arrival(self, sent_ns, nbytes):
        """When a record of ``nbytes`` sent at ``sent_ns`` is readable;
        and the partition holding it, if one does."""
        with self.lock:
            moved = max(sent_ns, self.busy_ns) + int(nbytes *
                                                     self.ns_per_byte)
            self.busy_ns = moved
            due = moved + self.latency_ns
            if self.rng is not None:
                due += int(self.rng.random() * self.inlink.jitter * 1e9)
            due = max(due, self.last_ns)
            holder = None
            for start, end, text in self.windows:
                if start <= due < end:
                    due, holder = end, text
            self.last_ns = due
            return due, holder


class LinkedReader:
    """The reading node's end of a queue over a link: a record is handed
    over once it has arrived (see the module docstring)."""

    def __init__(self, channel, states, now_ns, queue):
        self._channel = channel
        self._states = states   # a LinkState per writing node, by index
        self._now_ns = now_ns
        self._queue = queue

    def put(self, record, cancelled=None, clock=None):
        return self._channel.put(record, cancelled, clock)

    def get(self, n, cancelled=None, clock=None):
        records, finished, done = self._channel.get(n, cancelled, clock)
        if not records:
            return records, finished, done
        due, holder, state = 0, None, None
        for record in records:
            nbytes = sum(f.nbytes for f in record[:-1])
            sent, index = record[-1]
            here = self._states[int(index)]
            arrives, held = here.arrival(int(sent), nbytes)
            if arrives >= due:
                due, holder, state = arrives, held, here
        try:
            self._hold(due, holder, state, cancelled, clock)
        except BaseException:
            if done is not None:
                done()
            raise
        return [r[:-1] for r in records], finished, done

    def _hold(self, due, holder, state, cancelled, clock):
        now_ns = _real_ns(clock, self._now_ns)
        link = f"{state.inlink.src}->{state.inlink.dst}"
        what = (f"a record of queue {self._queue!r} held by {holder}"
                if holder else f"a record of queue {self._queue!r} in "
                f"flight on link {link}")
        while True:
            left = due - now_ns()
            if left <= 0:
                return
            seconds = math.inf if due == math.inf else left / 1e9
            if clock.wait(cancelled, seconds, what=what):
                raise Cancelled(f"queue wait ended: the run was cancelled "
                                f"while {what}")

    @property
    def counts_writers(self):
        return getattr(self._channel, "counts_writers", False)

    def writer_ended(self):
        self._channel.writer_ended()

    def close(self):
        self._channel.close()

    def abort(self):
        self._channel.abort()


class RunLinks:
    """A node's queues over links in one run: `wrap` gives a queue's
    channel the end the node needs (a channel hub calls it)."""

    def __init__(self, conditions, start_ns, now_ns):
        self._outgoing = dict(conditions.outgoing)
        self._incoming = dict(conditions.incoming)
        self._start_ns = start_ns
        self._now_ns = now_ns
        self._states = {}   # by sending node: the queues of a link share it

    def wrap(self, queue, channel):
        """The end of ``queue`` this node needs: a writer's stamps its
        records, a reader's holds them; a node that does both (a queue
        several nodes write and read) stamps what it writes and holds
        what it reads."""
        index = self._outgoing.get(queue)
        inlinks = self._incoming.get(queue)
        if inlinks is not None:
            states = tuple(self._state(inlink) for inlink in inlinks)
            channel = LinkedReader(channel, states, self._now_ns, queue)
        if index is not None:
            channel = LinkedWriter(channel, self._now_ns, index,
                                   inlinks is not None)
        return channel

    def _state(self, inlink):
        state = self._states.get(inlink.src)
        if state is None:
            state = self._states[inlink.src] = LinkState(inlink,
                                                         self._start_ns)
        return state
