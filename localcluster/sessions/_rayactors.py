"""The Ray actors of a RaySession: a node, and a fault plan's book.

::

    NodeActor (max_concurrency=2: a cancel arrives during a run)
      runtime: NodeRuntime(name, channel_factory=actor_channels, faults)
      run(pickled (rid, plan id, trace, epoch, conditions), plan bytes
          | None (sent as an object-store ref: Ray hands the actor the
          bytes), channels | None) -> ("ok", outputs, trace), pickled
          when its outputs are small (`_raywire`) | ("error", error_info)
      cancel(rid) / fetch / feed / blobs / has / ray_node (where it runs)
      reset(name, faults, book, logs, driver pid) -> pid: a pooled actor
          becomes another node, with an empty workspace and no plans
      its process is titled ``localcluster: <node> (<driver pid>)``
          (`_title`: Ray's per-call title kept out)
      logs = (log_dir, echo): the actor appends its node's output to
          <log_dir>/<node>.log itself (a header per node start: the
          actor's first, or a pooled actor's reset), and writes it to its
          real stdout/stderr -- which Ray forwards to the driver, prefixed
          with the node's name -- only if the node is echoed
    BookActor: when each fault of the plan fired (a Kill fires once per
      session, whichever actor runs the node)

Methods answer with plain data; errors travel as `error_info`, as a node
process's do.  Nothing here knows the driver.  ``log_dir`` is a path on
the actor's machine: on one machine it is the driver's directory; on a
cluster each machine writes its actors' logs under that path on its own
disk (or on a shared filesystem mounted there).
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
from . import _outroute as route
from . import _protocol as P
from . import _raywire as wire
from ._nodelogs import LogOptions
from ._raychannel import actor_channels
from ._title import set_ray_title

__all__ = ["NodeActor", "BookActor", "announce_name"]


class NodeActor:
    """One node: a NodeRuntime in a Ray actor (see the module docstring).
    Its methods answer with plain data; errors travel as `error_info`."""

    def __init__(self, name, faults=None, book=None, logs=None,
                 driver_pid=None):
        self.runtime = None
        self.log = None        # the node's NodeLog, with log options
        self.title = None      # (node, driver pid)
        self.reset(name, faults, book, logs, driver_pid)

    def __repr__(self):
        return self.name   # Ray prefixes the actor's output with it

    def reset(self, name, faults=None, book=None, logs=None,
              driver_pid=None):
        """Become node ``name`` with an empty workspace and no plans (an
        actor taken from a pool), its output going where ``logs`` (``(log
        dir, echo)`` or None) says; the process's pid."""
        if self.runtime is not None:
            self.runtime.close()
        self.name = name
        self.title = (name, driver_pid if driver_pid else os.getppid())
        set_ray_title(*self.title)
        self._logs(name, logs)
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

    def _logs(self, name, logs):
        """Route this process's output to node ``name``'s log (or, with
        None, let it write through as Ray's own)."""
        if self.log is not None:
            route.set_default(None)
            self.log.close()
            self.log = None
        options = LogOptions(*logs) if logs else None
        if options is None or not options.active:
            return
        self.log = options.open(name, route.original_stream, prefix=False)
        route.install()   # once per process: later calls only count
        self.log.started(os.getpid())
        route.set_default(route.LineSink(_RayMarkers(self.log)))

    def pid(self):
        return os.getpid()

    def ray_node(self):
        """The id of the Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def stats(self):
        """This process's CPU and memory, read here: the driver may be
        on another machine."""
        return process_stats()

    def run(self, request, plan_bytes=None, channels=None):
        """``request``: ``(rid, plan id, trace, epoch, conditions)``
        pickled (`_raywire`: one raw buffer, which Ray moves without its
        own serialization); ``plan_bytes``: the plan, if this actor does
        not keep it yet (the driver passes a reference to the object
        store, shared by the actors it sends the plan to; Ray resolves it
        to the bytes); ``channels``: the run's queues between nodes
        (``{queue id: (channel actor, run, readers)}``), None if it has
        none -- actor handles, which only Ray's serialization passes on.
        A reply whose outputs are small is pickled too."""
        rid, plan_id, trace, epoch, conditions = wire.unpack(request)
        set_ray_title(*self.title)   # again, should Ray have reset it
        try:
            if plan_bytes is not None:
                try:
                    plan = unpack_plan(plan_bytes)
                except BaseException as exc:  # noqa: BLE001 - a plan error
                    return ("error", P.error_info(exc, P.PLAN))
                self.runtime.load(plan_id, plan)
            # queues between nodes: the run's channel actors; within the
            # node: in-process channels, new every run
            result = self.runtime.run(rid, plan_id, (channels or {}, {}),
                                      trace, epoch=epoch,
                                      conditions=conditions)
        except BaseException as exc:  # noqa: BLE001 - sent to the driver
            return ("error", P.error_info(exc))
        finally:
            if self.log is not None:
                route.flush_default()   # a line the run left unended
        reply = ("ok", result.outputs, result.trace)
        if wire.array_bytes(result.outputs.values()) <= wire.SMALL:
            try:
                return wire.pack(reply)
            except Exception:  # noqa: BLE001 - Ray's own pickling then
                pass
        return reply

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

    def pid(self):
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



class _RayMarkers:
    """A `NodeLog` that lets Ray's own actor-name lines (which Ray prints
    to sys.stdout itself) through to the real streams, not the log."""

    def __init__(self, node_log):
        self.log = node_log
        self.marker = _marker()

    def line(self, tag, raw, text=None):
        if self.marker and text is not None and \
                text.startswith(self.marker):
            stream = route.original_stream(tag)
            if stream is not None:
                stream.write(text + "\n")
                stream.flush()
            return
        self.log.line(tag, raw, text)


def _marker():
    marker = getattr(getattr(ray, "_private", None), "ray_constants", None)
    return getattr(marker, "LOG_PREFIX_ACTOR_NAME", None)


def announce_name(name):
    """Tell Ray's log monitor this actor's output is now ``name``'s (the
    line Ray itself writes when an actor starts; it prefixes the
    actor's later lines with the name)."""
    marker = _marker()
    if marker:
        for tag in ("out", "err"):
            stream = route.original_stream(tag) or \
                (sys.stdout if tag == "out" else sys.stderr)
            print(marker + name, file=stream, flush=True)
