"""What a LocalHostScheduler run sends: plans packed once, queues made once.

A `NodePlan` is packed (`plan.packing.pack_plan`) and its queues listed
the first time it runs, then kept for as long as the plan lives
(`Prepared`); a node that already holds a plan is sent only its id (each
`NodeHandle` mirrors its node's plan cache: same size, same eviction).
A queue used on more than one node gets a shared-memory channel
(`ChannelParts`), made on first use and reset -- empty and open -- for
every run (`QueueChannels`).
"""

import itertools
import weakref

from ..plan.packing import pack_plan
from ..plan.validate import check_cross_node_queues, queues_of
from ..runtime import shm
from ..runtime.host import PLAN_CACHE
from ..runtime.shm_channel import ChannelParts
from . import _protocol as P

__all__ = ["Prepared", "QueueChannels"]


class Prepared:
    """Packed plans and their queues, by NodePlan (weakly)."""

    def __init__(self):
        self._prepared = weakref.WeakKeyDictionary()  # plan -> (id, bytes, q)
        self._ids = itertools.count(1)

    def __call__(self, plans):
        """``{node: (plan id, bytes, queues)}`` and the cross-node queues
        of a run; a plan that cannot be sent fails here, before anything
        starts."""
        prepared = {p.node: self._one(p) for p in plans}
        shared = check_cross_node_queues(
            plans, {node: p[2] for node, p in prepared.items()})
        return prepared, shared

    def _one(self, plan):
        found = self._prepared.get(plan)
        if found is None:
            found = (next(self._ids), pack_plan(plan), queues_of(plan))
            self._prepared[plan] = found
        return found


def run_message(handle, rid, prepared, channels, options):
    """The RUN request for ``handle``: the plan's bytes only if the node
    does not keep it already."""
    plan_id, payload, _ = prepared
    if plan_id in handle.plans:
        payload = None
    else:
        handle.plans[plan_id] = True
        if len(handle.plans) > PLAN_CACHE:
            handle.plans.popitem(last=False)
    return (P.RUN, rid, plan_id, payload, channels, options)


class QueueChannels:
    """The shared-memory channels of a scheduler's cross-node queues."""

    def __init__(self, prefix):
        self._prefix = prefix
        self._parts = {}   # (queue id, capacity) -> ChannelParts
        self._seq = itertools.count()

    def for_run(self, shared):
        """``{queue id: descriptor}`` of the run's cross-node queues, each
        reset for the run."""
        channels = {}
        for queue, capacity in sorted(shared.items()):
            parts = self._parts.get((queue, capacity))
            if parts is None:
                parts = self._make(queue, capacity)
                self._parts[(queue, capacity)] = parts
            else:
                parts.reset()
            channels[queue] = parts.desc
        return channels

    def _make(self, queue, capacity):
        """A new channel under a prefix nobody can guess (a name someone
        created first is skipped for another)."""
        for _ in range(shm.CREATE_TRIES):
            prefix = shm.unique_name(f"{self._prefix}q{next(self._seq)}_")
            try:
                return ChannelParts(prefix + "_", capacity, queue)
            except FileExistsError:
                continue
        raise FileExistsError(
            f"{shm.CREATE_TRIES} random names for the channel of queue "
            f"{queue!r} were all taken in {shm.SHM_DIR}")

    def close(self):
        for parts in self._parts.values():
            parts.close()
        self._parts.clear()
