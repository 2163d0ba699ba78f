"""The Ray actors of a RaySession: a node, and a fault plan's book.

::

    NodeActor (max_concurrency=2: a cancel arrives during a run)
      runtime: NodeRuntime(name, channel_factory=actor_channels, faults)
      run((rid, plan id, plan bytes | None, trace, epoch, channels,
           conditions))
          -> ("ok", outputs, trace) | ("error", error_info)
      cancel(rid) / fetch / feed / blobs / has
      reset(name, faults, book) -> pid: a pooled actor becomes another
          node, with an empty workspace and no plans
    BookActor: when each fault of the plan fired (a Kill fires once per
      session, whichever actor runs the node)

Methods answer with plain data; errors travel as `error_info`, as a node
process's do.  Nothing here knows the driver.
"""

import os
import sys
import time

import numpy as np
import ray

from ..plan.packing import unpack_plan
from ..runtime.faults import NodeFaults, die_in_process
from ..runtime.host import NodeRuntime
from ..runtime.procstats import process_stats
from . import _protocol as P
from ._raychannel import actor_channels

__all__ = ["NodeActor", "BookActor", "announce_name"]


class NodeActor:
    """One node: a NodeRuntime in a Ray actor (see the module docstring).
    Its methods answer with plain data; errors travel as `error_info`."""

    def __init__(self, name, faults=None, book=None):
        self.runtime = None
        self.reset(name, faults, book)

    def __repr__(self):
        return self.name   # Ray prefixes the actor's output with it

    def reset(self, name, faults=None, book=None):
        """Become node ``name`` with an empty workspace and no plans (an
        actor taken from a pool); the process's pid."""
        if self.runtime is not None:
            self.runtime.close()
        self.name = name
        node_faults = None
        if faults:   # a Kill ends this actor's process for real
            node_faults = NodeFaults(name, faults, RemoteBook(book),
                                     die_in_process)
        # records over a link carry wall-clock times: an actor's peer may
        # be on another machine, whose monotonic clock is its own
        self.runtime = NodeRuntime(name, channel_factory=actor_channels,
                                   faults=node_faults, now_ns=time.time_ns)
        announce_name(name)
        return os.getpid()

    def pid(self):
        return os.getpid()

    def stats(self):
        """This process's CPU and memory, read here: the driver may be
        on another machine."""
        return process_stats()

    def run(self, request):
        """``request``: ``(rid, plan id, plan bytes or None, trace, epoch,
        channels, conditions)`` -- one argument, as Ray serializes each separately."""
        rid, plan_id, plan_bytes, trace, epoch, channels, conditions = \
            request
        try:
            if plan_bytes is not None:
                try:
                    plan = unpack_plan(plan_bytes)
                except BaseException as exc:  # noqa: BLE001 - a plan error
                    return ("error", P.error_info(exc, P.PLAN))
                self.runtime.load(plan_id, plan)
            # queues between nodes: the run's channel actors; within the
            # node: in-process channels, new every run
            result = self.runtime.run(rid, plan_id, (channels, {}), trace,
                                      epoch=epoch, conditions=conditions)
        except BaseException as exc:  # noqa: BLE001 - sent to the driver
            return ("error", P.error_info(exc))
        return ("ok", result.outputs, result.trace)

    def cancel(self, rid):
        self.runtime.cancel(rid)

    def fetch(self, name):
        return self.runtime.fetch(name)

    def feed(self, name, value):
        # Ray hands numpy arguments over as read-only views of its object
        # store: the workspace keeps its own, writable copy
        self.runtime.feed(name, np.array(value, copy=True))

    def blobs(self):
        return self.runtime.blobs()

    def has(self, name):
        return self.runtime.has(name)


class BookActor:
    """The fault plan's book, shared by a session's actors: when each
    fault fired (0: not yet)."""

    def __init__(self, size):
        self.reset(size)

    def reset(self, size):
        self.times = [0.0] * size
        return os.getpid()

    def take(self, index):
        if self.times[index]:
            return False
        self.times[index] = time.time()
        return True

    def read(self):
        return list(self.times)


class RemoteBook:
    """A node's view of the `BookActor`: `FaultBook`'s ``take``."""

    def __init__(self, handle):
        self._handle = handle

    def take(self, index):
        return ray.get(self._handle.take.remote(index))



def announce_name(name):
    """Tell Ray's log monitor this actor's output is now ``name``'s (the
    line Ray itself writes when an actor starts; it prefixes the
    actor's later lines with the name)."""
    marker = getattr(getattr(ray, "_private", None), "ray_constants", None)
    marker = getattr(marker, "LOG_PREFIX_ACTOR_NAME", None)
    if marker:
        for stream in (sys.stdout, sys.stderr):
            print(marker + name, file=stream, flush=True)
