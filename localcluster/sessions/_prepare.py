"""What a LocalHostScheduler run sends: plans packed once, queues made once.

A `NodePlan` is packed (`plan.packing.pack_plan`) and its queues listed
the first time it runs, then kept for as long as the plan lives
(`Prepared`); a node that already holds a plan is sent only its id (each
`NodeHandle` mirrors its node's plan cache: same size, same eviction).
A queue used on more than one node gets a shared-memory channel
(`ChannelParts`), made on first use -- with a lock for all its ends when
several nodes write or read it -- reset for every run -- empty, open, and
told how many writers end in the run -- and released once no plan the
session keeps names its queue (`QueueChannels`).
"""

import itertools
import weakref

from ..plan.packing import pack_plan
from ..plan.validate import queue_writers, queues_of, shared_queues
from ..runtime import shm
from ..runtime.host import PLAN_CACHE
from ..runtime.shm_channel import ChannelParts
from . import _protocol as P

__all__ = ["Prepared", "QueueChannels", "must_send", "run_message"]


class Prepared:
    """Packed plans and their queues, by NodePlan (weakly)."""

    def __init__(self, dumps=None):
        self._prepared = weakref.WeakKeyDictionary()  # plan -> (id, bytes, q)
        self._ids = itertools.count(1)
        self._dumps = dumps   # the pickler of plans (`pack_plan`)

    def __call__(self, plans):
        """``{node: (plan id, bytes, queues, writers)}`` and the cross-node
        queues of a run (`shared_queues`); a plan that cannot be sent fails
        here, before anything starts."""
        prepared = {p.node: self._one(p) for p in plans}
        if not any(p[2] for p in prepared.values()):
            return prepared, {}   # no queue at all: none across nodes
        shared = shared_queues(
            plans, {node: p[2] for node, p in prepared.items()},
            {node: p[3] for node, p in prepared.items()})
        return prepared, shared

    def _one(self, plan):
        # a prototype's instances share its plan: packed once, one id
        plan = plan.origin or plan
        found = self._prepared.get(plan)
        if found is None:
            found = (next(self._ids), pack_plan(plan, self._dumps),
                     queues_of(plan), queue_writers(plan))
            self._prepared[plan] = found
        return found


def run_message(handle, rid, prepared, channels, options):
    """The RUN request for ``handle``: the plan's bytes only if the node
    does not keep it already."""
    plan_id, payload = prepared[:2]
    if not must_send(handle.plans, plan_id):
        payload = None
    return (P.RUN, rid, plan_id, payload, channels, options)


def must_send(kept, plan_id):
    """Whether a node must be sent plan ``plan_id``, noting in ``kept``
    (an OrderedDict mirroring the node's plan cache: first in, first out,
    PLAN_CACHE of them) that it will keep it."""
    if plan_id in kept:
        return False
    kept[plan_id] = True
    if len(kept) > PLAN_CACHE:
        kept.popitem(last=False)
    return True


class QueueChannels:
    """The shared-memory channels of a scheduler's cross-node queues.

    A channel is made the first time a run uses its queue across nodes and
    kept -- reset for every run -- while some plan the session keeps names
    the queue: each plan of a run with cross-node queues is counted once
    for every queue it names, and uncounted when it is collected (a
    finalizer only notes it; the next run does the work).  A queue that no
    live plan names again has its channel released: closed here, and
    dropped by the nodes that used it at their next run (`options_for`
    puts the channel prefixes in their RUN message's options, as
    ``"release"``).  A run without cross-node queues pays one look at an
    empty list.
    """

    def __init__(self, prefix):
        self._prefix = prefix
        self._parts = {}   # queue id -> {(capacity, lock): ChannelParts}
        self._seq = itertools.count()
        self._counted = weakref.WeakSet()   # plans counted in _named
        self._named = {}   # queue id -> how many counted plans name it
        self._users = {}   # queue id -> nodes of counted plans naming it
        self._dead = []    # queue ids of each counted plan collected since
        self._drops = {}   # node -> channel prefixes it is to release

    def for_run(self, shared, plans=(), prepared=None):
        """``{queue id: descriptor}`` of the run's cross-node queues
        (``shared``: ``{queue id: SharedQueue}``), each reset for the run;
        ``prepared`` gives ``(id, bytes, queues, writers)`` of each plan by
        node."""
        if shared:
            for plan in plans:
                if plan not in self._counted:
                    self._count(plan, prepared[plan.node][2])
        if self._dead:
            self._collect()
        channels = {}
        for queue, use in sorted(shared.items()):
            key = _kind(use)
            by_kind = self._parts.setdefault(queue, {})
            parts = by_kind.get(key)
            if parts is None:
                parts = by_kind[key] = self._make(queue, *key)
            parts.reset(use.writers)
            channels[queue] = parts.desc
        return channels

    def missing(self, shared):
        """How many of the cross-node queues ``shared`` (``{queue id:
        SharedQueue}``) have no channel yet (each one a run would make)."""
        return sum(1 for queue, use in shared.items()
                   if _kind(use) not in self._parts.get(queue, ()))

    def options_for(self, node, options):
        """The RUN options of ``node``: ``options``, with the prefixes of
        the channels it is to release, if any."""
        drops = self._drops.pop(node, None) if self._drops else None
        return options if drops is None else dict(options, release=drops)

    def _count(self, plan, queues):
        self._counted.add(plan)
        ids = tuple(queues)
        for queue in ids:
            self._named[queue] = self._named.get(queue, 0) + 1
            self._users.setdefault(queue, set()).add(plan.node)
        # list.append is atomic: safe whenever the collector runs this
        weakref.finalize(plan, self._dead.append, ids).atexit = False

    def _collect(self):
        """Uncount the plans collected since the last run; release the
        channels of the queues no counted plan names any more."""
        while self._dead:
            for queue in self._dead.pop():
                left = self._named.get(queue, 0) - 1
                if left > 0:
                    self._named[queue] = left
                    continue
                self._named.pop(queue, None)
                users = self._users.pop(queue, ())
                for parts in self._parts.pop(queue, {}).values():
                    parts.close()
                    for node in users:
                        self._drops.setdefault(node, []).append(parts.prefix)

    def _make(self, queue, capacity, shared_lock):
        """A new channel under a prefix nobody can guess (a name someone
        created first is skipped for another)."""
        for _ in range(shm.CREATE_TRIES):
            prefix = shm.unique_name(f"{self._prefix}q{next(self._seq)}_")
            try:
                return ChannelParts(prefix + "_", capacity, queue,
                                    shared_lock)
            except FileExistsError:
                continue
        raise FileExistsError(
            f"{shm.CREATE_TRIES} random names for the channel of queue "
            f"{queue!r} were all taken in {shm.SHM_DIR}")

    def close(self):
        for by_kind in self._parts.values():
            for parts in by_kind.values():
                parts.close()
        self._parts.clear()
        self._named.clear()
        self._users.clear()
        self._drops.clear()


def _kind(use):
    """What a queue's channel is made for: ``(capacity, shared lock)`` --
    one lock for all its ends when several nodes write or read it."""
    return use.capacity, len(use.writer_nodes) > 1 or \
        len(use.reader_nodes) > 1
