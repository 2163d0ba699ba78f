"""RaySession: every node a Ray actor hosting a `NodeRuntime`.

::

    RaySession (driver)                        Ray actor per node
      run(group)                               NodeActor (max_concurrency=2)
        plans packed once (_prepare.Prepared)    runtime: NodeRuntime
        run.remote(pickled (rid, plan id,        run(): unpack the plan if
                   ...)[, plan ref, channels]) ->  sent, NodeRuntime.run
        driver.drive(state, _RayRunIO)             -> ("ok", outputs) or
          io.wait: ray.wait on the run refs           ("error", error_info)
          io.cancel: cancel.remote(rid)  ------>   cancel(): on the 2nd thread
          io.kill: ray.kill(actor)
        an actor that died -> NodeFailedError; a new, empty actor next run
      fetch_blob / feed_blob / blobs / has_blob -> actor calls

The same job that runs under `LocalHostScheduler` runs here unchanged: the
rules of a run are the run driver's, the node is the shared runtime, and
plans travel as the bytes `plan.packing` makes (with the user's
registered ops), put in Ray's object store once per run for every actor
that lacks them -- a prototype's instances share one plan, so N instances
cost one copy, not N.  With no ``address`` the session starts a local Ray
instance sized to this machine, without the dashboard unless asked, and
shuts it down on `close()` -- and should this process die first, a
watcher process kills Ray's processes (`_raywatch`); with an address --
or a Ray already initialised in this process -- it connects and leaves
the cluster running.

Never Ray's own actor restarts: an actor restarted by Ray has lost its
workspace silently.  A dead actor is a `NodeFailedError` naming the node
and Ray's reason (exit code and signal None: Ray does not give them), and
the next run that uses the node starts a new, empty actor, as a dead node
process is restarted -- so ``JobRunner(max_restarts=...)`` recovers.

Queues between nodes go through a channel actor per queue
(`_raychannel`).  A fault plan's book is a small actor every node
actor asks before it fires a fault; a `Kill` ends the actor's process.
Both live on the driver's Ray node: a Ray node that leaves takes only
the nodes placed on it.  The actors are in `_rayactors`; Node options
become actor options in `_rayoptions`, which also refuses a node no Ray
node can hold, and a run whose nodes together ask for more than the
cluster has.  With an `ActorPool` (`_raypool`) a session takes warm
actors and gives them back, reset, at `close()`.
"""

import collections
import functools
import itertools
import logging
import os
import time

import numpy as np
import psutil

try:
    import ray
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "RaySession needs Ray: pip install 'localcluster[ray]'") from exc

from ..errors import NodeFailedError
from ..plan.faults import EXIT_STATUS
from ..plan.node_plan import process_options
from ..plan.validate import feedable
from ..runtime.faults import faults_of_node
from ..task import Cluster
from . import _raywire as wire
from . import driver
from ._prepare import Prepared, must_send
from ._rayactors import BookActor, NodeActor
from ._raychannel import ChannelActor
from ._rayoptions import (actor_options, beside_driver, check_fits,
                          check_placeable, connect, dumps_by_value,
                          options_key, shutdown)
from ._rayio import RayRunIO
from ._raypool import ActorPool
from .base import Session

__all__ = ["RaySession", "ActorPool", "connect", "shutdown"]

log = logging.getLogger(__name__)

#: seconds a node gets to stop after a cancel before its actor is killed
CANCEL_GRACE = 1.0
#: seconds a fetch/feed/blobs request may take
REQUEST_TIMEOUT = 60.0
#: seconds a node's actor may take to start (placement included)
START_TIMEOUT = 120.0
#: seconds `close()` waits for the processes of the actors it killed
CLOSE_WAIT = 10.0


class _Node:
    """The driver's handle of one node's actor."""

    def __init__(self, name, actor, kwargs):
        self.name = name
        self.actor = actor
        self.kwargs = kwargs     # its Node options
        self.key = options_key(kwargs)   # as a pool keeps it
        self.plans = collections.OrderedDict()   # mirrors its plan cache
        self.pid = None
        self.ray_node = None     # the Ray node's id, once asked


class RaySession(Session):
    """Run every Node as a Ray actor (see the module docstring).

    ``address``: a Ray cluster to connect to (None: a local instance, or
    the Ray this process already initialised); ``namespace``: Ray's;
    ``pool``: an `ActorPool` to take warm actors from and give them back
    to at `close()` (None: actors are started here and killed at
    `close()`); ``faults``, ``conditions``, ``log_dir``, ``log_echo``: as
    every session's (each actor writes its node's log itself, so
    ``log_dir`` must be a path the actors can write: on one machine it
    is); further keyword arguments go to ``ray.init``.  Each actor's
    process is titled ``localcluster: <node> (<driver pid>)``."""

    #: what a checkpoint error adds: each actor writes its own files
    CHECKPOINT_REACH = (
        " -- under RaySession every node writes its checkpoints itself, so "
        "db_prefix must be a directory every Ray node and this driver "
        "reach at the same absolute path (a shared filesystem)")

    def __init__(self, address=None, namespace=None, faults=None, pool=None,
                 conditions=None, log_dir=None, log_echo=True,
                 **ray_init_kwargs):
        super().__init__(faults=faults, conditions=conditions,
                         log_dir=log_dir, log_echo=log_echo)
        #: what every node actor is started (or reset) with after its
        #: faults and book: (log options or None, this driver's pid)
        self._actor_args = (self.log_options.as_tuple() if
                            self.log_options.active else None, os.getpid())
        self._pool = pool
        self._owns_ray = connect(address, namespace, **ray_init_kwargs)
        self._actor_class = ray.remote(max_concurrency=2,
                                       max_restarts=0)(NodeActor)
        self._channel_class = ray.remote(max_restarts=0)(ChannelActor)
        self._queue_actors = {}   # (queue id, capacity) -> channel actor
        self._nodes = {}
        self._placeable = set()  # option keys check_placeable passed
        self._kwargs = {}        # node -> its options, kept past a death
        self._rids = itertools.count(1)
        self._started_at = time.time()
        # plans pickle the user's functions by value: a job defined in
        # __main__ or a test module reaches actors that cannot import it
        self._by_reference = {}   # module -> functions pickled by name
        self._prepared = Prepared(functools.partial(
            dumps_by_value, by_reference=self._by_reference))
        self._book = None
        if self.faults is not None:
            self._book = self._pooled("book", len(self.faults))
            if self._book is None:
                self._book = ray.remote(BookActor).options(
                    **beside_driver()).remote(len(self.faults))

    def _pooled(self, kind, *reset_args):
        """A warm actor of ``kind`` from the pool, reset with
        ``reset_args`` (None if the pool has none alive)."""
        while self._pool is not None:
            taken = self._pool.take(kind, ())
            if taken is None:
                return None
            try:
                ray.get(taken[0].reset.remote(*reset_args),
                        timeout=REQUEST_TIMEOUT)
                return taken[0]
            except Exception:  # noqa: BLE001 - died idle: take another
                log.debug("a pooled %s actor is gone", kind, exc_info=True)
        return None

    def __repr__(self):
        return f"RaySession(nodes={sorted(self._nodes)}, " \
               f"{self._state.value})"

    def start_nodes(self, nodes=None):
        """Start the given nodes' actors now (default:
        ``Cluster.current()``'s), all at once."""
        self._ensure(self._nodes_wanted(nodes))

    def node_pids(self):
        """``{node: pid}`` of each started node's actor process (on the
        machine Ray placed it on)."""
        return {name: node.pid for name, node in self._nodes.items()}

    def ray_node_ids(self):
        """``{node: id of the Ray node its actor runs on}`` of each started
        node: where Ray placed it, within what its Node's ``resources``
        and ``placement`` allow (a node whose actor died is left out)."""
        unknown = [n for n in self._nodes.values() if n.ray_node is None]
        refs = [n.actor.ray_node.remote() for n in unknown]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=REQUEST_TIMEOUT)
        for node, ref in zip(unknown, refs):
            try:
                node.ray_node = ray.get(ref, timeout=0)
            except ray.exceptions.RayError:
                pass    # died (or slow): the next run reports it
        return {name: node.ray_node for name, node in self._nodes.items()
                if node.ray_node is not None}

    def node_stats(self):
        """Each node actor's CPU and memory, as the actor reads them."""
        nodes = list(self._nodes.values())
        if not nodes:
            return {}
        refs = [n.actor.stats.remote() for n in nodes]
        ready, _ = ray.wait(refs, num_returns=len(refs),
                            timeout=REQUEST_TIMEOUT)
        out = {}
        for node, ref in zip(nodes, refs):
            try:
                stats = ray.get(ref, timeout=0) if ref in ready else None
            except ray.exceptions.RayError:
                stats = None    # died: the next run reports it
            if stats is not None:
                out[node.name] = stats
        return out

    # -- nodes ----------------------------------------------------------------

    def _ensure(self, wanted):
        """The `_Node` of each of ``{name: Node options}``, starting the
        actors that are missing (all at once) and waiting until they run."""
        missing = {}
        for name, kwargs in wanted.items():
            node = self._nodes.get(name)
            if node is None:   # a restart keeps the node's options
                missing[name] = kwargs or self._kwargs.get(name, {})
            elif kwargs and process_options(kwargs) != \
                    process_options(node.kwargs):
                log.warning("node %r runs with %s; new options %s apply "
                            "after it restarts", name, node.kwargs, kwargs)
        for name, kwargs in missing.items():   # before any actor starts
            key = options_key(kwargs)
            if key not in self._placeable:
                check_placeable(name, kwargs)
                self._placeable.add(key)
        if missing:   # all of them at once, as a run needs them
            check_fits({name: missing[name] if name in missing else
                        self._nodes[name].kwargs for name in wanted})
        started = {n: self._start(n, k) for n, k in missing.items()}
        for name, (node, ref) in started.items():
            try:
                node.pid = ray.get(ref, timeout=START_TIMEOUT)
            except ray.exceptions.RayError as exc:
                # dead, not placed in time, or one Ray cannot place at all
                # (its Ray node left since check_placeable looked)
                self._not_started(started)
                why = f"not placed within {START_TIMEOUT} s" if isinstance(
                    exc, ray.exceptions.GetTimeoutError) else _reason(exc)
                raise NodeFailedError(
                    f"node {name!r} could not start as a Ray actor: {why}; "
                    f"check its Node(...) options {missing[name]} against "
                    "the cluster's free resources", node=name) from exc
        for name, (node, _) in started.items():
            self._nodes[name] = node
            self._kwargs[name] = node.kwargs
        return [self._nodes[name] for name in wanted]

    def _not_started(self, started):
        """After one of ``started`` failed: keep those that run, kill the
        rest (pending placement, or dead)."""
        for node, ref in started.values():
            ready, _ = ray.wait([ref], timeout=0)
            try:
                node.pid = ray.get(ready[0], timeout=0) if ready else None
            except Exception:  # noqa: BLE001 - this one failed too
                node.pid = None
            if node.pid is not None:
                self._nodes[node.name] = node
            else:
                _kill(node.actor)

    def _start(self, name, kwargs):
        """``(_Node, ref of its pid)`` of node ``name``: a pooled actor
        reset for it (one that died idle is passed over), or a new one."""
        key = options_key(kwargs)
        faults = faults_of_node(self.faults, name)
        while self._pool is not None:
            taken = self._pool.take("node", key)
            if taken is None:
                break
            actor = taken[0]
            ref = actor.reset.remote(name, faults, self._book,
                                     *self._actor_args)
            ready, _ = ray.wait([ref], timeout=REQUEST_TIMEOUT)
            try:
                ray.get(ready or ref, timeout=0)
            except Exception:  # noqa: BLE001 - died idle, or stuck: killed
                log.debug("a pooled node actor is gone", exc_info=True)
                _kill(actor)
                continue
            return _Node(name, actor, kwargs), ref
        actor = self._actor_class.options(**actor_options(kwargs)).remote(
            name, faults, self._book, *self._actor_args)
        return _Node(name, actor, kwargs), actor.pid.remote()

    def _died(self, name, exc):
        """The NodeFailedError of a dead actor; it is forgotten, so the
        next run starts a new, empty one."""
        self._nodes.pop(name, None)
        # where it could go may be gone with it (a Ray node that left):
        # its restart checks again
        self._placeable.discard(options_key(self._kwargs.get(name, {})))
        fault = self._kill_fault_on(name)
        why = f"{fault!r} fired; " if fault is not None else ""
        # Ray does not say how a process ended; a Kill fault that fired does
        exitcode = signal_name = None
        if fault is not None:
            signal_name = "SIGKILL" if fault.how == "sigkill" else None
            exitcode = EXIT_STATUS if fault.how == "exit" else None
        return NodeFailedError(
            f"node {name!r} died (its Ray actor: {_reason(exc)}); {why}it "
            "restarts with an empty workspace on the next run", node=name,
            exitcode=exitcode, signal_name=signal_name)

    def _sync_faults(self):
        if self._book is not None:
            self._fault_times = ray.get(self._book.read.remote(),
                                        timeout=REQUEST_TIMEOUT)
        return super()._sync_faults()

    def _close(self):
        if self._book is not None:
            try:
                self._sync_faults()
            except Exception:  # noqa: BLE001 - Ray gone: nothing to read
                log.debug("fault book unreadable at close", exc_info=True)
        if self._pool is not None:
            self._give_back()
        others = list(self._queue_actors.values()) + \
            ([self._book] if self._book is not None else [])
        pids = [n.pid for n in self._nodes.values()] + _pids_of(others)
        for actor in [n.actor for n in self._nodes.values()] + others:
            _kill(actor)
        # Ray kills asynchronously: closed means the processes are gone
        _wait_gone(pids, CLOSE_WAIT)
        self._book = None
        self._nodes.clear()
        self._queue_actors.clear()
        if self._owns_ray:
            shutdown()

    def _give_back(self):
        """Hand every live node actor (and the queues' channel actors,
        the fault book) to the pool, its workspace dropped -- waited
        for: an actor's two threads may run a later session's reset
        first."""
        nodes = list(self._nodes.values())
        refs = [n.actor.reset.remote(f"idle ({n.name})", None, None, None,
                                     os.getpid()) for n in nodes]
        for node, ref in zip(nodes, refs):
            try:
                ray.get(ref, timeout=REQUEST_TIMEOUT)
            except Exception:  # noqa: BLE001 - dead or stuck: not kept
                continue
            self._pool.give("node", node.key, node.actor, node.pid)
            self._nodes.pop(node.name)
        # the others: reset answers with the pid the pool keeps
        others = [("channel", key, h, h.reset.remote(None))
                  for key, h in self._queue_actors.items()]
        if self._book is not None:
            others.append(("book", None, self._book,
                           self._book.reset.remote(0)))
        for kind, key, handle, ref in others:
            try:
                pid = ray.get(ref, timeout=REQUEST_TIMEOUT)
            except Exception:  # noqa: BLE001 - dead or stuck: not kept
                continue
            self._pool.give(kind, (), handle, pid)
            if kind == "book":
                self._book = None
            else:
                del self._queue_actors[key]

    # -- running --------------------------------------------------------------

    def _check_plans(self, group, plans):
        super()._check_plans(group, plans)
        self._prepared(plans)   # packed now (and kept): sendable

    def _run_plans(self, plans, timeout):
        prepared, shared = self._prepared(plans)
        rid = next(self._rids)
        channels = self._channels_for(shared, rid)
        nodes = self._ensure({p.node: p.node_kwargs for p in plans})
        refs = {}
        stored = {}   # plan id -> its bytes in Ray's object store
        for plan, node in zip(plans, nodes):
            plan_id, payload = prepared[plan.node][:2]
            send = None
            if must_send(node.plans, plan_id):
                # a prototype's instances share one plan (one id): its
                # bytes go to the object store once, every actor that
                # lacks it gets the same reference
                send = stored.get(plan_id)
                if send is None:
                    send = stored[plan_id] = ray.put(payload)
            request = wire.pack((rid, plan_id, self.trace_steps,
                                 self.current_epoch, (self.run_conditions
                                                      or {}).get(plan.node)))
            if channels:
                ref = node.actor.run.remote(request, send, channels)
            elif send is not None:
                ref = node.actor.run.remote(request, send)
            else:   # a run's usual call: one argument, raw bytes
                ref = node.actor.run.remote(request)
            refs[ref] = plan.node
        io = RayRunIO(self, refs)
        state = driver.start(list(refs.values()), rid, time.monotonic(),
                             timeout)
        return driver.drive(state, io, CANCEL_GRACE, timeout)

    def _channels_for(self, shared, rid):
        """``{queue id: (channel actor, run, readers)}`` of the run's
        cross-node queues (``{queue id: SharedQueue}``), each made (or
        taken from the pool) on first use and reset -- empty, open, told
        how many writers end in the run -- for the run (``run``: this
        session's run ``rid``, unlike any other session's: a pooled channel
        actor refuses a late batch of any earlier run; ``readers``: the
        reader nodes, who take only what they read when several share)."""
        run = (id(self), self._started_at, rid)
        channels, resets = {}, []
        for queue, use in shared.items():
            capacity = use.capacity
            handle = self._queue_actors.get((queue, capacity))
            if handle is None:
                handle = self._pooled("channel", 0, capacity, str(queue))
            if handle is None:
                handle = self._channel_class.options(
                    **beside_driver()).remote(capacity, str(queue))
            self._queue_actors[(queue, capacity)] = handle
            channels[queue] = (handle, run, len(use.reader_nodes))
            resets.append(handle.reset.remote(run, capacity, str(queue),
                                              use.writers))
        if resets:
            ray.get(resets, timeout=REQUEST_TIMEOUT)
        return channels

    # -- blobs ----------------------------------------------------------------

    def _call(self, name, method, *args):
        node = self._nodes.get(str(name))
        if node is None:
            return None
        try:
            return ray.get(getattr(node.actor, method).remote(*args),
                           timeout=REQUEST_TIMEOUT)
        except ray.exceptions.RayActorError as exc:
            raise self._died(node.name, exc) from None

    def fetch_blob(self, name, node="local", copy=True):
        self._check_open()
        value = self._call(node, "fetch", str(name))
        if value is None:
            if str(node) in self._nodes:
                raise self._blob_not_found(name, node)
            raise self._not_running(name, node, "that node has not run "
                                    "anything in this session")
        if copy:
            return np.array(value, copy=True)
        view = value.view()
        view.flags.writeable = False
        return view

    def feed_blob(self, name, value, node="local"):
        self._check_open()
        value = feedable(name, value)
        node = str(node)
        if node not in self._nodes:   # started where its Node says
            self._ensure({node: self._kwargs.get(node) or
                          Cluster.current().kwargs_of(node)})
        self._call(node, "feed", str(name), value)

    def blobs(self, node="local"):
        self._check_open()
        return self._call(node, "blobs") or []

    def has_blob(self, name, node="local"):
        self._check_open()
        return bool(self._call(node, "has", str(name)))


def _kill(actor):
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - dead already
        pass


def _pids_of(actors):
    """The process ids of ``actors`` (channel actors, the fault book)
    that answer within a second; one that does not is left out."""
    refs = [actor.pid.remote() for actor in actors]
    if not refs:
        return []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
    pids = []
    for ref in ready:
        try:
            pids.append(ray.get(ref, timeout=0))
        except Exception:  # noqa: BLE001 - dead already
            pass
    return pids


def _wait_gone(pids, timeout):
    """Wait up to ``timeout`` seconds for the killed actors' processes
    among ``pids`` that run on this machine (a Ray worker's process, by
    its name: a pid of another machine's actor is not waited for)."""
    procs = []
    for pid in pids:
        if pid is None or pid == os.getpid():
            continue
        try:
            proc = psutil.Process(pid)
            title = " ".join(proc.cmdline()) or proc.name()
        except psutil.Error:
            continue
        if title.startswith(("ray::", "localcluster: ")):
            procs.append(proc)
    if procs:
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        for proc in alive:
            log.warning("a killed node actor's process %d is still running "
                        "%.0f s after close()", proc.pid, timeout)


def _reason(exc):
    """Ray's reason for an actor's death, in one line."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
