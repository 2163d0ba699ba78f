"""LocalHostScheduler: one OS process per Node, workspaces in shared memory.

::

    master (this module)                                node process (_node)
    ----------------------------------------------    ----------------------
    run(group)
      plans = group.node_plans()       -- pickled here: a plan that cannot
      start missing/dead nodes            be sent fails before anything runs
      send ("run", rid, plan) ---------- duplex pipe ----> run_node_plan()
      wait(pipes + process sentinels)  <--- ("ok", rid, outputs as shm
        first failure -> ("cancel", rid)      descriptors) / ("error", ...)
          to the others; kill any that    node's stdout/stderr ---> LogPump
          ignore it past the grace           -> "[node] line" in the master
        node death (sentinel, EOF) -> NodeFailedError, segments swept,
          restart with an empty workspace on the next run
      copy outputs out of shared memory
    fetch_blob(name, node)  -> ("fetch") -> descriptor -> map segment

The wait is one multiplexed ``poll`` on every live node's pipe
*and* process sentinel, so a death is seen at once; every other wait has a
bound.  The per-run bookkeeping is `_runstate.RunState`.  Shutdown asks,
waits, then SIGTERMs and SIGKILLs each node's process group; every segment
with the session's prefix is unlinked on ``close()``, at exit, and by the
next scheduler if this master was killed (see `localcluster.runtime.shm`).
"""

import atexit
import collections
import enum
import functools
import itertools
import math
import logging
import multiprocessing
import os
import pickle
import select
import signal
import sys
import threading
import time
import weakref
from multiprocessing import connection

import numpy as np

from ..errors import (BlobNotFoundError, NodeFailedError, PlanError,
                      RunTimeoutError)
from ..kernels import registry
from ..runtime import shm
from ..errors import Cancelled
from ..task import Cluster
from . import _protocol as P
from ._logpump import LogPump
from ._node import EXIT_MEMORY, NodeSpec, node_main
from ._runstate import RunState
from ..runtime.shm_channel import ChannelParts
from .base import Session

__all__ = ["LocalHostScheduler"]

log = logging.getLogger(__name__)

#: seconds a node gets to stop after a cancel before it is killed
CANCEL_GRACE = 1.0
#: seconds a node gets to start and report ready
START_TIMEOUT = 30.0
#: seconds a fetch/feed/blobs request may take
REQUEST_TIMEOUT = 30.0
#: seconds for each step of shutdown: ask, SIGTERM, SIGKILL
SHUTDOWN_STEP = 1.0
#: seconds a reply waits for the node's output written before it
OUTPUT_WAIT = 2.0

_BUILTIN_KERNELS = ("localcluster.kernels.numpy_ops",
                    "localcluster.kernels.io_ops")

_live = weakref.WeakSet()


class NodeState(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    DEAD = "dead"


_CONN, _SENTINEL = "conn", "sentinel"


class _Poller:
    """One persistent poll set over every live node's pipe and sentinel,
    so a run's wait costs one system call, not a selector built anew."""

    def __init__(self):
        self._poll = select.poll()
        self._fds = {}

    def add(self, handle):
        for fd, kind in ((handle.conn.fileno(), _CONN),
                         (handle.process.sentinel, _SENTINEL)):
            self._poll.register(fd, select.POLLIN)
            self._fds[fd] = (handle, kind)

    def remove(self, handle):
        for fd, (owner, _) in list(self._fds.items()):
            if owner is handle:
                self._poll.unregister(fd)
                del self._fds[fd]

    def wait(self, timeout):
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        return [self._fds[fd] for fd, _ in self._poll.poll(ms)
                if fd in self._fds]


class _Node:
    """The master's handle on one node process (one incarnation)."""

    def __init__(self, name, prefix, kwargs):
        self.name = name
        self.prefix = prefix
        self.kwargs = kwargs
        self.process = None
        self.conn = None
        self.log = None       # LogPump stream
        self.state = NodeState.IDLE
        self.pid = None
        self.unreported = None  # NodeFailedError of a death while idle
        self.plans = collections.OrderedDict()  # mirror of the node's cache
        self.control = None   # shared int64: the run id to cancel
        self.control_word = None

    def __repr__(self):
        return f"_Node({self.name!r}, pid={self.pid}, {self.state.value})"

    def send(self, msg):
        P.send(self.conn, msg)


def _signal_name(exitcode):
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return None


class LocalHostScheduler(Session):
    """Run every Node of a group in its own process (see module docstring).

    ``start_method`` is ``'fork'`` (default), ``'forkserver'`` or
    ``'spawn'``; ``timeout`` is the default of ``run(timeout=)``;
    ``nodes`` (a `Cluster` or a list of node names) starts those nodes now
    instead of on first use.
    """

    def __init__(self, start_method="fork", timeout=None, nodes=None):
        super().__init__()
        if start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"start_method {start_method!r} is not available here; use "
                f"one of {multiprocessing.get_all_start_methods()}")
        if timeout is not None and (isinstance(timeout, bool) or not
                                    isinstance(timeout, (int, float)) or
                                    timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds,"
                             f" got {timeout!r}")
        self._ctx = multiprocessing.get_context(start_method)
        self._start_method = start_method
        self._default_timeout = timeout
        self._owner_pid = os.getpid()
        self._prefix = shm.session_prefix()
        self._nodes = {}
        self._node_seq = itertools.count()
        self._feed_seq = itertools.count()
        self._rids = itertools.count(1)
        self._maps = {}
        self._prepared = weakref.WeakKeyDictionary()  # NodePlan -> (id, bytes)
        self._plan_ids = itertools.count(1)
        self._poller = _Poller()
        self._channels = {}  # (queue id, capacity) -> ChannelParts
        self._channel_seq = itertools.count()
        shm.sweep_stale()
        self._pump = LogPump()
        _live.add(self)
        log.debug("LocalHostScheduler %s started (%s)", self._prefix,
                  start_method)
        if nodes is not None:
            self.start_nodes(nodes)

    def __repr__(self):
        return (f"LocalHostScheduler({self._start_method!r}, "
                f"nodes={sorted(self._nodes)}, {self._state.value})")

    # -- node lifecycle -----------------------------------------------------------

    def start_nodes(self, nodes=None):
        """Start the given nodes now (default: ``Cluster.current()``'s)."""
        self._check_open()
        if nodes is None or isinstance(nodes, Cluster):
            cluster = nodes or Cluster.current()
            kwargs = cluster.node_kwargs()
            names = cluster.nodes()
        else:
            names = [str(n) for n in nodes]
            kwargs = Cluster.current().node_kwargs()
        self._ensure({n: kwargs.get(n, {}) for n in names})

    @property
    def shm_prefix(self):
        """The name prefix of every shared-memory segment this scheduler
        makes (``/dev/shm/<prefix>...``); `close()` removes them all."""
        return self._prefix

    def node_pids(self):
        """``{node: pid}`` of the running node processes."""
        return {n: h.pid for n, h in self._nodes.items()
                if h.state is not NodeState.DEAD}

    def _ensure(self, wanted):
        """Start every node of ``{name: kwargs}`` that is not running."""
        starting = []
        for name, kwargs in wanted.items():
            handle = self._nodes.get(name)
            if handle is not None and handle.state is not NodeState.DEAD:
                if kwargs and kwargs != handle.kwargs:
                    log.warning("node %r runs with %s; new options %s apply "
                                "after it restarts", name, handle.kwargs,
                                kwargs)
                continue
            if handle is not None and not kwargs:
                kwargs = handle.kwargs  # a restart keeps the node's options
            _check_cpus(name, kwargs)
            starting.append(self._spawn(name, kwargs))
        if starting:
            self._await_ready(starting)
        return [self._nodes[n] for n in wanted]

    def _spawn(self, name, kwargs):
        prefix = f"{self._prefix}{next(self._node_seq)}_"
        handle = _Node(name, prefix, dict(kwargs))
        master_conn, node_conn = self._ctx.Pipe(duplex=True)
        log_r, log_w = self._ctx.Pipe(duplex=False)
        fork = self._start_method == "fork"
        handle.control = shm.create_segment(prefix + "ctl", 8)
        handle.control_word = np.ndarray(1, np.int64, buffer=handle.control)
        # A forked child closes its copies of every master-side pipe end --
        # its own included -- so that EOF reaches the nodes that need it.
        inherited = (functools.partial(_close_all_of, _master_ends() +
                                       [master_conn, log_r])
                     if fork else None)
        spec = NodeSpec(name, prefix, handle.kwargs, os.getpid(),
                        pdeathsig=self._start_method != "forkserver" and
                        threading.current_thread() is threading.main_thread(),
                        control=prefix + "ctl", close_inherited=inherited)
        process = self._ctx.Process(target=node_main,
                                    args=(spec, node_conn, log_w),
                                    name=f"lc-node-{name}", daemon=False)
        # Unflushed output would be written again by the forked child.
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        process.start()
        # Close our copies of the child's ends now, before the next fork,
        # so a node's EOF means what it says.
        node_conn.close()
        log_w.close()
        try:
            os.setpgid(process.pid, process.pid)
        except OSError:
            pass  # the child did it first
        handle.process, handle.conn, handle.pid = process, master_conn, \
            process.pid
        handle.log = self._pump.add(log_r, name)
        self._nodes[name] = handle
        self._poller.add(handle)
        log.debug("started node %r (pid %d)", name, process.pid)
        return handle

    def _await_ready(self, handles):
        deadline = time.monotonic() + START_TIMEOUT
        waiting = {h.conn: h for h in handles}
        sentinels = {h.process.sentinel: h for h in handles}
        problems = []
        while waiting:
            ready = connection.wait(list(waiting) + list(sentinels),
                                    max(0.0, deadline - time.monotonic()))
            if not ready:
                for h in waiting.values():
                    self._kill(h)
                raise NodeFailedError(
                    f"node(s) {[h.name for h in waiting.values()]} did not "
                    f"start within {START_TIMEOUT} s",
                    node=next(iter(waiting.values())).name)
            for obj in ready:
                handle = waiting.pop(obj, None)
                if handle is None:
                    handle = sentinels.get(obj)
                    if handle is not None and handle.conn in waiting:
                        waiting.pop(handle.conn)
                        problems.append(self._death_error(handle, "starting"))
                    continue
                sentinels.pop(handle.process.sentinel, None)
                try:
                    msg = P.recv(handle.conn)
                except (EOFError, OSError):
                    problems.append(self._death_error(handle, "starting"))
                    continue
                if msg[2] is not None:
                    self._reap(handle)
                    problems.append(NodeFailedError(
                        f"node {handle.name!r} could not start: {msg[2]}; "
                        "check its Node(...) options", node=handle.name))
        if problems:
            raise problems[0]

    def _reap(self, handle, wait=SHUTDOWN_STEP):
        """Collect a (dying) node: join it, kill what it started, close its
        pipe, sweep its segments."""
        handle.process.join(wait)
        # Processes the node started share its group: they go with it (the
        # unreaped leader still holds the group id).
        self._killpg(handle, signal.SIGKILL)
        if handle.process.is_alive():
            handle.process.join(SHUTDOWN_STEP)
        handle.state = NodeState.DEAD
        self._poller.remove(handle)
        handle.conn.close()
        handle.log.closed.wait(0.5)
        shm.sweep(handle.prefix)
        for key in [k for k in self._maps if k[0] == handle.name]:
            del self._maps[key]

    def _killpg(self, handle, sig):
        try:
            os.killpg(handle.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(handle.pid, sig)
            except ProcessLookupError:
                pass

    def _kill(self, handle):
        self._killpg(handle, signal.SIGKILL)
        self._reap(handle)

    def _death_error(self, handle, during):
        """Reap a dead node; the NodeFailedError describing its death."""
        self._reap(handle)
        code = handle.process.exitcode
        signame = _signal_name(code)
        lines = handle.log.last if handle.log else ()
        if code == EXIT_MEMORY:
            cause = "it exceeded its memory_limit"
        elif signame == "SIGKILL":
            cause = ("likely killed by the OOM killer or a test" +
                     (f" (memory_limit={handle.kwargs['memory_limit']})"
                      if handle.kwargs.get("memory_limit") else ""))
        elif signame == "SIGSEGV":
            cause = "it crashed (segmentation fault) in native code"
        elif signame:
            cause = f"it was killed by {signame}"
        else:
            cause = f"it exited with status {code}"
        what = f"{signame}, exit {code}" if signame else f"exit {code}"
        tail = "; last log lines:\n  " + "\n  ".join(lines) if lines else ""
        return NodeFailedError(
            f"node {handle.name!r} died ({what}) while {during}; {cause}; "
            f"it restarts with an empty workspace on the next run{tail}",
            node=handle.name, exitcode=code, signal_name=signame,
            last_log_lines=lines)

    # -- running ---------------------------------------------------------------------

    def _channels_for(self, shared):
        """The shared-memory channels of this run's cross-node queues,
        made on first use and reset -- empty and open -- for this run."""
        channels = {}
        for queue, capacity in sorted(shared.items()):
            parts = self._channels.get((queue, capacity))
            if parts is None:
                parts = ChannelParts(
                    f"{self._prefix}q{next(self._channel_seq)}_", capacity)
                self._channels[(queue, capacity)] = parts
            else:
                parts.reset()
            channels[queue] = parts.desc
        return channels

    def _prepare(self, plan):
        """(plan id, pickled plan, queue ids it uses), once per NodePlan."""
        prepared = self._prepared.get(plan)
        if prepared is None:
            prepared = (next(self._plan_ids), _pickle_plan(plan),
                        _queues_of(plan))
            self._prepared[plan] = prepared
        return prepared

    def _run_message(self, handle, rid, prepared, channels):
        plan_id, payload, _ = prepared
        if plan_id in handle.plans:
            payload = None  # the node has it
        else:
            handle.plans[plan_id] = True
            if len(handle.plans) > P.PLAN_CACHE:
                handle.plans.popitem(last=False)
        return (P.RUN, rid, plan_id, payload, channels,
                {"trace": self.trace_steps})

    def _raise_unreported(self, nodes):
        """A node of this run that died while idle, its workspace lost:
        that death is this run's NodeFailedError (the next run restarts
        it)."""
        for name in nodes:
            handle = self._nodes.get(name)
            if handle is not None and handle.unreported is not None:
                error, handle.unreported = handle.unreported, None
                raise error

    def _run_plans(self, plans, timeout):
        timeout = timeout if timeout is not None else self._default_timeout
        # a plan that cannot be sent fails here, before anything starts
        prepared = {p.node: self._prepare(p) for p in plans}
        self._raise_unreported(prepared)
        shared = _cross_node_queues(prepared)
        handles = self._ensure({p.node: p.node_kwargs for p in plans})
        rid = next(self._rids)
        channels = self._channels_for(shared)
        state = RunState([h.name for h in handles], rid)
        by_name = {h.name: h for h in handles}
        for handle in handles:
            try:
                handle.send(self._run_message(
                    handle, rid, prepared[handle.name], channels))
                handle.state = NodeState.RUNNING
            except (OSError, EOFError):
                state.failed(handle.name, self._death_error(
                    handle, "receiving a plan"))
        try:
            self._wait_run(state, by_name, timeout)
        except BaseException:
            self._abort(state, by_name)
            raise
        error = state.error()
        if error is not None:
            raise error
        return state.done

    def _wait_run(self, state, by_name, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        while not state.finished():
            now = time.monotonic()
            if state.should_cancel():
                self._cancel(state, by_name, now)
            for name in state.overdue(now):
                self._kill(by_name[name])
                state.failed(name, Cancelled(f"node {name!r} killed"))
            if state.finished():
                break
            if deadline is not None and now >= deadline and \
                    not state.cancelling:
                self._timeout(state, by_name, timeout)
                return
            limit = state.cancel_deadline if state.cancelling else deadline
            self._events(state, by_name,
                         None if limit is None else max(0.0, limit - now))

    def _events(self, state, by_name, wait):
        """Wait up to ``wait`` s for the nodes; apply what happened."""
        for handle, kind in self._poller.wait(wait):
            if by_name.get(handle.name) is not handle or \
                    handle.name not in state.pending:
                self._idle_event(handle, kind)
            elif kind == _CONN:
                try:
                    msg = P.recv(handle.conn)
                except (EOFError, OSError):
                    state.failed(handle.name,
                                 self._death_error(handle, "running"))
                    continue
                self._on_message(handle, msg, state)
            else:
                state.failed(handle.name, self._death_error(handle, "running"))

    def _idle_event(self, handle, kind):
        """A node outside the run spoke (a late reply) or died."""
        if handle.state is NodeState.DEAD:
            return
        if kind == _CONN:
            try:
                P.recv(handle.conn)  # a reply to an abandoned request
                return
            except (EOFError, OSError):
                pass
        # Nobody waits on this node now: the next run that includes it
        # reports the death (instead of quietly restarting it empty).
        handle.unreported = self._death_error(handle, "idle")
        log.warning("%s", handle.unreported)

    def _on_message(self, handle, msg, state):
        kind, rid = msg[0], msg[1]
        if rid != state.rid:
            return  # a late reply to an earlier, abandoned request
        handle.state = NodeState.IDLE
        handle.log.wait_for(msg[-1], OUTPUT_WAIT)
        if kind == P.OK:
            self._node_done(handle.name)
            if msg[2].get("trace") is not None:
                self.last_run_trace[handle.name] = msg[2]["trace"]
            # Copied now: the node may die before the run ends, and its
            # outbox goes with it.
            state.succeeded(handle.name, self._copy_outputs(
                handle.name, msg[2]["outputs"]))
            return
        info = msg[2]
        if info["kind"] == P.MEMORY:
            self._reap(handle, wait=START_TIMEOUT)
            limit = handle.kwargs.get("memory_limit")
            error = NodeFailedError(
                f"node {handle.name!r} exceeded its memory_limit of {limit} "
                f"bytes ({info['type']}: {info['message']}); it was stopped "
                "and restarts with an empty workspace on the next run",
                node=handle.name, exitcode=handle.process.exitcode)
            error.__cause__ = P.RemoteTraceback(info["traceback"])
            state.failed(handle.name, error)
            return
        if info["kind"] == P.PLAN:
            handle.plans.clear()  # the node kept none of what failed to load
        state.failed(handle.name, P.rebuild_error(handle.name, info))

    def _cancel(self, state, by_name, now):
        state.start_cancelling(now, CANCEL_GRACE)
        for name in state.pending:
            handle = by_name[name]
            # one aligned 8-byte store (struct.pack_into would zero the word
            # first, and the node could read 0 in between)
            handle.control_word[0] = state.rid
            try:
                os.kill(handle.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass  # its death shows on the sentinel

    def _timeout(self, state, by_name, timeout):
        """Cancel the late nodes, kill those that do not stop, and raise."""
        late = list(state.pending)
        killed = self._stop_pending(state, by_name)
        what = (f"; hung node(s) {killed} were killed and restart with an "
                "empty workspace on the next run" if killed else
                "; the late nodes stopped when cancelled")
        raise RunTimeoutError(
            f"run did not finish within {timeout} s (still running: "
            f"{late}){what}")

    def _abort(self, state, by_name):
        """An interrupted run (Ctrl-C, an internal error): stop the nodes."""
        if not state.finished():
            self._stop_pending(state, by_name)

    def _stop_pending(self, state, by_name):
        """Cancel the pending nodes; kill those still running after the
        grace period.  Returns the names of the killed ones."""
        self._cancel(state, by_name, time.monotonic())
        while state.pending:
            now = time.monotonic()
            if state.overdue(now):
                break
            self._events(state, by_name, max(0.0, state.cancel_deadline - now))
        killed = list(state.pending)
        for name in killed:
            self._kill(by_name[name])
            state.failed(name, Cancelled(f"node {name!r} killed"))
        return killed

    def _copy_outputs(self, node, descriptors):
        return {name: self._read((node, "outbox"), desc, copy=True)
                for name, desc in descriptors.items()}

    # -- shared memory reads ------------------------------------------------------------

    def _read(self, key, desc, copy):
        """The value ``desc`` locates; ``key`` names what it is (a node's
        outbox, or one of its blobs) so a replaced segment's mapping is
        dropped, not kept next to the new one."""
        if "inline" in desc:
            return desc["inline"]
        segment = desc["segment"]
        cached = self._maps.get(key)
        if cached is not None and cached[0] == segment:
            mm = cached[1]
        else:
            mm = shm.map_segment(segment, inherit=False)
            if key[1] == "outbox" or not copy:
                self._maps[key] = (segment, mm)
            else:
                self._maps.pop(key, None)
        dtype = np.dtype(desc["dtype"])
        shape = tuple(desc["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        view = np.frombuffer(mm, dtype=dtype, count=count,
                             offset=desc.get("offset", 0)).reshape(shape)
        return np.array(view, copy=True) if copy else view

    # -- requests between runs --------------------------------------------------------

    def _request(self, handle, *msg):
        with self._run_lock:  # one conversation on a node's pipe at a time
            return self._converse(handle, *msg)

    def _converse(self, handle, *msg):
        rid = next(self._rids)
        deadline = time.monotonic() + REQUEST_TIMEOUT
        try:
            handle.send((msg[0], rid) + msg[1:])
        except (OSError, EOFError):
            raise self._death_error(handle, f"handling {msg[0]}") from None
        while True:
            remaining = deadline - time.monotonic()
            ready = connection.wait([handle.conn, handle.process.sentinel],
                                    max(0.0, remaining))
            if not ready:
                self._kill(handle)
                raise RunTimeoutError(
                    f"node {handle.name!r} did not answer {msg[0]!r} within "
                    f"{REQUEST_TIMEOUT} s; it was killed")
            try:
                reply = P.recv(handle.conn)
            except (EOFError, OSError):
                raise self._death_error(handle,
                                        f"handling {msg[0]}") from None
            if reply[1] != rid:
                continue
            handle.log.wait_for(reply[-1], OUTPUT_WAIT)
            if reply[0] == P.ERROR:
                raise P.rebuild_error(handle.name, reply[2])
            return reply[2]

    def _idle_node(self, node):
        handle = self._nodes.get(str(node))
        if handle is None or handle.state is NodeState.DEAD:
            return None
        return handle

    def fetch_blob(self, name, node="local", copy=True):
        """A blob of ``node``'s global workspace.

        ``copy=False`` returns a read-only view on the blob's shared memory,
        valid until the next run on that node.
        """
        self._check_open()
        handle = self._idle_node(node)
        desc = None if handle is None else self._request(handle, P.FETCH,
                                                         str(name))
        if desc is None:
            raise BlobNotFoundError(
                name, node, "that node is not running in this session"
                if handle is None else "no run on that node wrote it")
        return self._read((str(node), "blob", str(name)), desc, copy)

    def feed_blob(self, name, value, node="local"):
        self._check_open()
        array = np.array(value, copy=True)
        if array.dtype.hasobject:
            raise TypeError(
                f"feed_blob({name!r}): value must be numeric array-like, got "
                f"{type(value).__name__}")
        node = str(node)
        handle = self._idle_node(node) or self._ensure(
            {node: Cluster.current().node_kwargs().get(node, {})})[0]
        segment = f"{handle.prefix}m{next(self._feed_seq)}"
        mm = shm.create_segment(segment, array.nbytes)
        try:
            np.copyto(shm.array_on(mm, array.shape, array.dtype), array)
            self._request(handle, P.FEED, str(name), segment, array.shape,
                          array.dtype.str)
        except BaseException:
            shm.unlink(segment)
            raise

    def blobs(self, node="local"):
        self._check_open()
        handle = self._idle_node(node)
        return [] if handle is None else self._request(handle, P.BLOBS)

    def has_blob(self, name, node="local"):
        self._check_open()
        handle = self._idle_node(node)
        return False if handle is None else self._request(handle, P.HAS,
                                                          str(name))

    # -- shutdown -------------------------------------------------------------------------

    def _close(self):
        if os.getpid() != self._owner_pid:
            return  # a forked copy of the scheduler owns nothing
        live = [h for h in self._nodes.values()
                if h.state is not NodeState.DEAD]
        try:
            self._shut_down(live)
        finally:
            # Whatever interrupted the polite part (Ctrl-C, an error), no
            # node and no segment outlives close().
            for handle in live:
                if handle.state is not NodeState.DEAD:
                    self._killpg(handle, signal.SIGKILL)
                    self._reap(handle)
            self._maps.clear()
            for parts in self._channels.values():
                parts.close()
            self._channels.clear()
            self._pump.stop()
            shm.sweep(self._prefix)
            _live.discard(self)
            log.debug("LocalHostScheduler %s closed", self._prefix)

    def _shut_down(self, live):
        """Ask, wait, then SIGTERM and SIGKILL the nodes' process groups."""
        for handle in live:
            try:
                handle.send((P.SHUTDOWN, 0))
            except (OSError, EOFError):
                pass
        self._join_all(live, SHUTDOWN_STEP)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [h for h in live if h.process.is_alive()]
            if not alive:
                break
            log.warning("node(s) %s did not stop when asked; sending %s",
                        [h.name for h in alive], sig.name)
            for handle in alive:
                self._killpg(handle, sig)
            self._join_all(alive, SHUTDOWN_STEP)
        for handle in live:
            self._reap(handle)

    @staticmethod
    def _join_all(handles, timeout):
        """Reap the nodes that exit within ``timeout``."""
        deadline = time.monotonic() + timeout
        waiting = {h.process.sentinel: h for h in handles}
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for s in connection.wait(list(waiting), remaining):
                handle = waiting.pop(s)
                # What the node started goes with it; then a blocking join
                # (the sentinel closes a moment before the exit can be
                # collected, so not join(0)) reaps the leader.
                try:
                    os.killpg(handle.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                handle.process.join(SHUTDOWN_STEP)

    def __del__(self):
        try:
            if self._state.value == "open" and \
                    os.getpid() == self._owner_pid:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


def _check_cpus(name, kwargs):
    cpus = kwargs.get("cpus")
    if cpus:
        available = sorted(os.sched_getaffinity(0))
        missing = sorted(set(cpus) - set(available))
        if missing:
            raise PlanError(
                f"Node({name!r}) asks for cpus {missing} but this process "
                f"may only use cpus {available}; pick from those")


def _pickle_plan(plan):
    """The plan as bytes, with the kernels of any user ops it uses."""
    user_ops = {}
    for net in plan.step.walk_nets():
        for op in net.ops:
            schema = registry.lookup(op.type)
            if schema is not None and \
                    getattr(schema.kernel, "__module__", "") not in \
                    _BUILTIN_KERNELS:
                user_ops[op.type] = schema
    try:
        return pickle.dumps((plan, user_ops), pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - re-raised as a PlanError
        raise PlanError(_unpicklable(plan, user_ops, exc)) from exc


_QUEUE_ROLES = {"EnqueueRecord": "writes", "DequeueRecords": "reads"}


def _queues_of(plan):
    """``{queue id: (capacity, roles)}`` of the queue ops in ``plan``."""
    found = {}
    for net in plan.step.walk_nets():
        for op in net.ops:
            if "queue" in op.args:
                capacity, roles = found.get(op.args["queue"],
                                            (op.args["capacity"], set()))
                if op.type in _QUEUE_ROLES:
                    roles.add(_QUEUE_ROLES[op.type])
                found[op.args["queue"]] = (capacity, roles)
    return found


def _cross_node_queues(prepared):
    """``{queue id: capacity}`` of the queues used on more than one node.

    Such a queue gets a shared-memory channel; its writers must all be on
    one node and its readers on one (each side's index is guarded by a
    thread lock of its own process)."""
    users = {}
    for node, (_, _, queues) in prepared.items():
        for queue, (capacity, roles) in queues.items():
            users.setdefault(queue, (capacity, {}))[1][node] = roles
    shared = {}
    for queue, (capacity, by_node) in users.items():
        if len(by_node) < 2:
            continue
        for role in ("writes", "reads"):
            nodes = sorted(n for n, roles in by_node.items() if role in roles)
            if len(nodes) > 1:
                raise PlanError(
                    f"queue {queue!r} has tasks on nodes {nodes} that all "
                    f"{role[:-1]} it; a queue between node processes takes "
                    "its writers from one node and its readers from one node"
                    " -- use one queue per producing node")
        shared[queue] = capacity
    return shared


def _unpicklable(plan, user_ops, exc):
    for net in plan.step.walk_nets():
        for i, op in enumerate(net.ops):
            for key, value in op.args.items():
                try:
                    pickle.dumps(value)
                except Exception:  # noqa: BLE001 - we are naming the culprit
                    what = (f"its function {getattr(value, '__qualname__', value)!r}"
                            if key == "fn" else f"its argument {key}={value!r}")
                    return (f"op {op.type} #{i} of net {net.name!r} on node "
                            f"{plan.node!r} cannot be sent to the node "
                            f"process: {what} does not pickle ({exc}); define"
                            " functions at module level so they pickle by "
                            "reference")
    for name, schema in user_ops.items():
        try:
            pickle.dumps(schema)
        except Exception:  # noqa: BLE001 - we are naming the culprit
            return (f"registered op {name!r} cannot be sent to node "
                    f"{plan.node!r}: its kernel does not pickle ({exc}); "
                    "define it at module level")
    return f"the plan for node {plan.node!r} cannot be pickled: {exc}"


def _master_ends():
    """The master-side connections of every scheduler of this process."""
    ends = []
    for scheduler in list(_live):
        ends.extend(h.conn for h in scheduler._nodes.values()
                    if h.conn is not None)
        ends.extend(scheduler._pump.connections())
    return ends


def _close_all_of(connections):
    """In a forked node: close the inherited master-side connections, and
    disown every inherited scheduler copy."""
    for conn in connections:
        try:
            conn.close()
        except OSError:
            pass
    for scheduler in list(_live):
        scheduler._owner_pid = -1  # this copy must never shut anything down


@atexit.register
def _close_all():
    """At exit: stop every node and sweep every segment, even of a
    scheduler whose close() was interrupted."""
    for scheduler in list(_live):
        if scheduler._owner_pid == os.getpid():
            try:
                scheduler._close()
            except Exception:  # noqa: BLE001 - best effort at exit
                log.exception("closing %r at exit failed", scheduler)
