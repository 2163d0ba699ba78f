"""The master's handle on one node process: spawn, ready, reap, kill, and
the error that describes a death.

A `NodeHandle` is one incarnation of a node: its process, its duplex pipe,
its output stream (`_logpump`), its shared control word (the run id to
cancel) and the mirror of the plans it keeps.  A restart is a new handle.

`wait_events(handles, deadline)` is the one wait of the master: a single
``poll`` on the handles' pipes *and* process sentinels, so a reply and a
death are seen alike, at once, and no wait is unbounded by accident
(``deadline`` is on the `time.monotonic` clock; None waits until
something happens).  A run keeps a `Poller` over every live node so its
wait is one system call; the other waits (start-up, a request, shutdown)
pass the handles they wait for.
"""

import collections
import enum
import logging
import math
import multiprocessing.process
import os
import select
import signal
import sys
import threading
import time

import numpy as np

from ..errors import NodeFailedError, RunTimeoutError
from ..runtime import shm
from . import _protocol as P
from ._node import EXIT_MEMORY, NodeSpec, node_main
from ._plumbing import MASTER_ENDS, close_master_ends

__all__ = ["NodeState", "NodeHandle", "ControlWords", "Poller",
           "wait_events", "CONN",
           "SENTINEL", "await_ready", "read_goodbyes", "join_all",
           "START_TIMEOUT", "SHUTDOWN_STEP"]

log = logging.getLogger(__name__)

#: seconds a node gets to start and report ready
START_TIMEOUT = 30.0
#: seconds for each step of shutdown: ask, SIGTERM, SIGKILL
SHUTDOWN_STEP = 1.0

CONN, SENTINEL = "conn", "sentinel"


class NodeState(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    DEAD = "dead"


class NodeHandle:
    """The master's handle on one node process (one incarnation)."""

    def __init__(self, name, prefix, kwargs):
        self.name = name
        self.prefix = prefix
        self.kwargs = kwargs
        self.process = None
        self._exitcode = None   # kept once the process object is closed
        self.conn = None
        self.log = None       # LogPump stream
        self.state = NodeState.IDLE
        self.pid = None
        self.plans = collections.OrderedDict()  # mirror of the node's cache
        self.control_word = None  # shared int64: the run id to cancel
        self.started_at = None    # monotonic seconds: when it was forked

    def __repr__(self):
        return f"NodeHandle({self.name!r}, pid={self.pid}, {self.state.value})"

    def send(self, msg):
        P.send(self.conn, msg)

    def alive(self):
        return self.state is not NodeState.DEAD

    # -- start --------------------------------------------------------------

    @classmethod
    def spawn(cls, ctx, name, prefix, kwargs, pump, controls, faults=None,
              sink=None):
        """Start the node process; returns before it is ready.
        ``controls``: the scheduler's `ControlWords`; ``faults``: (the
        fault book's segment, the node's faults); ``sink``: the node's
        `NodeLog` (its start header is written once the pid is known,
        before any of its output)."""
        handle = cls(name, prefix, dict(kwargs))
        master_conn, node_conn = ctx.Pipe(duplex=True)
        log_r, log_w = ctx.Pipe(duplex=False)
        fork = ctx.get_start_method() == "fork"
        control, handle.control_word = controls.take()
        # A forked child closes its copies of every master-side pipe end --
        # its own included -- so that EOF reaches the nodes that need it.
        MASTER_ENDS.update((master_conn, log_r))
        inherited = close_master_ends if fork else None
        spec = NodeSpec(name, prefix, handle.kwargs, os.getpid(),
                        pdeathsig=ctx.get_start_method() != "forkserver" and
                        threading.current_thread() is threading.main_thread(),
                        control=control, close_inherited=inherited,
                        faults=faults)
        process = ctx.Process(target=node_main, args=(spec, node_conn, log_w),
                              name=f"lc-node-{name}", daemon=False)
        # Unflushed output would be written again by the forked child.
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        # A Python signal handler that raises during the fork loses its
        # exception (it runs inside an at-fork hook, whose exceptions
        # CPython prints and drops) and the master would go on as if
        # nothing came: while the process starts, the handlers of the stop
        # signals only note a signal, raised again below once the node is
        # wholly ours -- or killed, if that raises.  (Handlers run in the
        # main thread only: from another thread there is nothing to hold.)
        deferred, master, held = [], os.getpid(), {}

        def note(signum, frame):
            if os.getpid() != master:
                # the new node, before it reset the master's handlers: a
                # signal does to it what it would have done without them
                if signum != signal.SIGINT:  # Ctrl-C is the master's
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)
                return
            deferred.append(signum)

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                if callable(signal.getsignal(sig)):
                    held[sig] = signal.signal(sig, note)
        started = False
        try:
            process.start()
            started = True
            # The handle reaps its process itself: out of multiprocessing's
            # list of children, which every Process.start polls with one
            # waitpid per live child (quadratic in the nodes started).
            multiprocessing.process._children.discard(process)
        finally:
            for sig, old in held.items():
                signal.signal(sig, old)
            if not started:  # the start failed: the signal still counts
                for end in (master_conn, log_r, node_conn, log_w):
                    MASTER_ENDS.discard(end)
                    end.close()
                for sig in dict.fromkeys(deferred):
                    signal.raise_signal(sig)
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
        handle.started_at = time.monotonic()
        if sink is not None:
            sink.started(process.pid)
        handle.log = pump.add(log_r, name, sink)
        log.debug("started node %r (pid %d)", name, process.pid)
        try:
            for sig in dict.fromkeys(deferred):  # the handlers run here
                signal.raise_signal(sig)
        except BaseException:
            handle.kill()  # the caller never gets it: no node outlives
            raise
        return handle

    # -- stop ---------------------------------------------------------------

    def killpg(self, sig):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def reap(self, wait=SHUTDOWN_STEP):
        """Collect a (dying) node: join it, kill what it started, close its
        pipe, sweep its segments."""
        self.process.join(wait)
        # Processes the node started share its group: they go with it (the
        # unreaped leader still holds the group id).
        self.killpg(signal.SIGKILL)
        if self.process.is_alive():
            self.process.join(SHUTDOWN_STEP)
        self.state = NodeState.DEAD
        MASTER_ENDS.discard(self.conn)
        self.conn.close()
        self.log.closed.wait(0.5)
        shm.sweep(self.prefix)

    def kill(self):
        self.killpg(signal.SIGKILL)
        self.reap()

    @property
    def exitcode(self):
        """The node process's exit status (None while it runs)."""
        return self._exitcode if self._exitcode is not None \
            else self.process.exitcode

    def release(self):
        """Once reaped: close the process object, whose sentinel and pipe
        descriptors would otherwise stay open until it is collected."""
        process = self.process
        if process is not None and self._exitcode is None and \
                process.exitcode is not None:
            self._exitcode = process.exitcode
            process.close()

    def death_error(self, during, fault=None):
        """Reap a dead node; the NodeFailedError describing its death
        (``fault``: the `Kill` fault that fired on it, if one did)."""
        self.reap()
        code = self.exitcode
        signame = signal_name(code)
        lines = self.log.last if self.log else ()
        if fault is not None:
            cause = f"{fault!r} fired"
        elif code == EXIT_MEMORY:
            limit = self.kwargs.get("memory_limit")
            cause = (f"it exceeded its memory_limit of {limit} bytes" if limit
                     else "it ran out of memory (MemoryError)")
            cause += "; " + _memory_fix(limit)
        elif signame == "SIGKILL":
            cause = ("likely killed by the OOM killer or a test" +
                     (f" (memory_limit={self.kwargs['memory_limit']})"
                      if self.kwargs.get("memory_limit") else ""))
        elif signame == "SIGSEGV":
            cause = "it crashed (segmentation fault) in native code"
        elif signame:
            cause = f"it was killed by {signame}"
        else:
            cause = f"it exited with status {code}"
        what = f"{signame}, exit {code}" if signame else f"exit {code}"
        tail = "; last log lines:\n  " + "\n  ".join(lines) if lines else ""
        return NodeFailedError(
            f"node {self.name!r} died ({what}) while {during}; {cause}; "
            f"it restarts with an empty workspace on the next run{tail}",
            node=self.name, exitcode=code, signal_name=signame,
            last_log_lines=lines)

    def memory_error(self, info):
        """Reap a node that answered with a ``memory`` error (`_node`:
        it ran out of memory and ends); the NodeFailedError saying so."""
        self.reap(wait=START_TIMEOUT)
        limit = self.kwargs.get("memory_limit")
        doing = f" while {info['doing']}" if info.get("doing") else ""
        what = info["type"] + (f": {info['message']}" if info["message"]
                               else "")
        error = NodeFailedError(
            (f"node {self.name!r} exceeded its memory_limit of {limit} bytes"
             if limit else f"node {self.name!r} ran out of memory")
            + f"{doing} ({what}); it was stopped and restarts with an empty "
            f"workspace on the next run; {_memory_fix(limit)}",
            node=self.name, exitcode=self.exitcode)
        error.__cause__ = P.RemoteTraceback(info["traceback"])
        return error


def _memory_fix(limit):
    """What to do about a node that ran out of memory."""
    return ("give it fewer or smaller blobs, or more memory" +
            (" (a higher memory_limit)" if limit else ""))


class ControlWords:
    """Each node's control word (the run id to cancel), a slot of a page
    shared by many nodes.

    One page holds the words of 512 node starts, so the master maps one
    segment per 512 nodes, not one per node: every mapping of the master
    is copied into each node forked after it, so per-node mappings made
    start-up quadratic (and a mapping kept out of forks with
    MADV_DONTFORK is not safe either: the child's copy of its Python
    object would unmap whatever the child mapped later at that address).
    A slot is not reused: a page is a few KiB per 512 starts, swept with
    the scheduler's prefix on close.
    """

    PAGE = 4096

    def __init__(self, prefix):
        self._prefix = prefix
        self._page = None      # (segment, int64 array)
        self._used = 0
        self._pages = 0

    def take(self):
        """``((segment, slot), word)``: where the node finds its word, and
        the master's one-element view of it."""
        slots = self.PAGE // 8
        if self._page is None or self._used == slots:
            segment, mm = shm.create_unique(
                f"{self._prefix}{self._pages}_", self.PAGE,
                what="the nodes' control words")
            self._pages += 1
            self._page = (segment, np.ndarray(slots, np.int64, buffer=mm))
            self._used = 0
        segment, words = self._page
        slot = self._used
        self._used += 1
        return (segment, slot), words[slot:slot + 1]


def signal_name(exitcode):
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return None


# -- waiting ----------------------------------------------------------------


class Poller:
    """One persistent poll set over live nodes' pipes and sentinels."""

    def __init__(self):
        self._poll = select.poll()
        self._fds = {}

    def add(self, handle, kinds=(CONN, SENTINEL)):
        for fd, kind in ((handle.conn.fileno(), CONN),
                         (handle.process.sentinel, SENTINEL)):
            if kind in kinds:
                self._poll.register(fd, select.POLLIN)
                self._fds[fd] = (handle, kind)

    def remove(self, handle):
        for fd, (owner, _) in list(self._fds.items()):
            if owner is handle:
                self._poll.unregister(fd)
                del self._fds[fd]

    def wait(self, deadline):
        """``(handle, kind)`` of what is ready before ``deadline``."""
        if deadline is None:
            ms = None
        else:
            ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
        return [self._fds[fd] for fd, _ in self._poll.poll(ms)
                if fd in self._fds]


def wait_events(handles, deadline, kinds=(CONN, SENTINEL)):
    """``(handle, kind)`` of the ``handles``' pipes and sentinels (or only
    the ``kinds`` asked for) that are ready before ``deadline`` (monotonic
    seconds; None: no bound); an empty list when the deadline passed
    first."""
    poller = Poller()
    for handle in handles:
        if handle.conn is not None and not handle.conn.closed:
            poller.add(handle, kinds)
    return poller.wait(deadline)


def await_ready(handles, timeout=None):
    """Wait for each new node's READY, each within `START_TIMEOUT` of its
    start -- or within ``timeout`` (the run's, in seconds) if that is
    shorter: a node stopped or starved before it is ready holds a run no
    longer than the run's own bound.  If one does not start, kill every
    node still starting and raise: a `RunTimeoutError` naming the late
    nodes when the run's timeout was the bound, else a `NodeFailedError`
    (as for a node that died starting, whose error says why)."""
    bound = START_TIMEOUT if timeout is None else min(START_TIMEOUT, timeout)
    waiting = set(handles)
    problems = []
    while waiting:
        first = min(h.started_at for h in waiting)
        ready = wait_events(waiting, first + bound)
        if not ready:
            now = time.monotonic()
            late = [h for h in waiting if now >= h.started_at + bound]
            if not late:
                continue
            for handle in waiting:
                handle.kill()
            raise _not_started(sorted(h.name for h in late),
                               sorted(h.name for h in waiting), bound,
                               by_run=timeout is not None and
                               timeout <= START_TIMEOUT)
        for handle, kind in ready:
            if handle not in waiting:
                continue
            waiting.discard(handle)
            problem = _ready_problem(handle, kind)
            if problem is not None:
                problems.append(problem)
    if problems:
        raise problems[0]


def _not_started(late, killed, bound, by_run):
    """The error of nodes ``late`` that were not ready ``bound`` seconds
    after they were started (``killed``: the nodes killed for it)."""
    names = ", ".join(map(repr, late))
    what = f"node {names}" if len(late) == 1 else f"nodes {names}"
    what += " did not start"
    why = ("stopped, or starved of CPU, before ready; killed, it starts "
           "again on the next run")
    if not by_run:
        return NodeFailedError(f"{what} within {bound:g} s ({why})",
                               node=late[0])
    return RunTimeoutError(
        f"{what} within the run's timeout of {bound:g} s ({why})",
        nodes=late, killed=killed, starting=True)


def _ready_problem(handle, kind):
    """None when ``handle`` said READY; else its NodeFailedError."""
    if kind == SENTINEL and not handle.conn.poll(0):
        return handle.death_error("starting")
    try:
        msg = P.recv(handle.conn)
    except (EOFError, OSError):
        return handle.death_error("starting")
    if msg[2] is None:
        return None
    handle.reap()
    return NodeFailedError(
        f"node {handle.name!r} could not start: {msg[2]}; check its "
        "Node(...) options", node=handle.name)


def read_goodbyes(handles, deadline):
    """Read each node's answer to SHUTDOWN: a node whose pipe ends without
    its ``bye`` crashed while shutting down (said in the log)."""
    waiting = set(handles)
    while waiting:
        ready = wait_events(waiting, deadline, kinds=(CONN,))
        if not ready:
            break
        for handle, _ in ready:
            try:
                msg = P.recv(handle.conn)
            except (EOFError, OSError):
                waiting.discard(handle)
                handle.process.join(SHUTDOWN_STEP)
                log.warning(
                    "node %r crashed while shutting down (exit %s) before it"
                    " said goodbye", handle.name, handle.process.exitcode)
                continue
            if msg[0] == P.BYE:
                waiting.discard(handle)


def join_all(handles, timeout):
    """Reap the nodes that exit within ``timeout``."""
    deadline = time.monotonic() + timeout
    waiting = set(handles)
    while waiting:
        ready = wait_events(waiting, deadline, kinds=(SENTINEL,))
        if not ready:
            return
        for handle, _ in ready:
            waiting.discard(handle)
            # What the node started goes with it; then a blocking join
            # (the sentinel closes a moment before the exit can be
            # collected, so not join(0)) reaps the leader.
            try:
                os.killpg(handle.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            handle.process.join(SHUTDOWN_STEP)
