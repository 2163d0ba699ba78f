"""LocalHostScheduler: one OS process per Node, workspaces in shared memory.

::

    master (this module)                  zygote (_zygote)      node (_node)
    ----------------------------------    -----------------    -------------
    run(group)
      plans packed once (_prepare)   -- a plan that cannot be sent fails
      start missing/dead nodes: one       before anything runs
        zygote per batch (_handle)  ----> forks each node  --> NodeRuntime
        with the batch's plans            (plans inherited)
      ("run", rid, plan id) pickled once per distinct message, written
        on the run board (shm); each node's control slot says where,
        and the run word changed: its nodes woken at once  --> read there
        (too big for the board: through the zygote's control socket)
      driver.drive(state, io)       <--- ("ok", rid, outputs as shm
        io.wait: one poll on the           descriptors) / error: on the
          zygotes' sockets -> events        batch's reply pipe, straight;
                                          [("x", node, exit code)] and
                                          other answers: by the zygote
        io.cancel: control word + SIGUSR1 (through the zygote)
        io.kill: SIGKILL the node's process group (through the zygote)
        node death (reported by its zygote) -> NodeFailedError, segments
          swept, restart with an empty workspace on the next run
      outputs copied out of shared memory (_shmread)
    node output: one pipe per zygote, frames tagged by node --> LogPump
      -> "[node] line" in the master and/or <log_dir>/<node>.log
    fetch_blob(name, node)  -> ("fetch") -> descriptor -> map segment

A run reaches all its nodes with one system call (a futex wake-up on the
run word, for the bits of its nodes, `_bell`) and none of the zygotes':
the zygote is off the path of a run both ways.  Where a futex cannot be
called (`_bell.AVAILABLE`), every request goes through the zygote, as
the other requests (fetch, feed, shutdown) always do.

The master holds a few descriptors per zygote and none per node: a run
of a thousand nodes waits on two sockets.  Under ``fork`` (the default) a
zygote is forked from the master when its batch starts, so its nodes
see the master as it is then (its imports, ``__main__``, patches); under
``spawn`` and ``forkserver`` the zygote is started that way and forks
its nodes, which then hold nothing of the master's state.

The rules of a run (first error wins, the others cancelled and killed past
a grace period, timeouts, a death while idle raised once by the next run)
are the run driver's (`driver`); this module gives it the process I/O
(`_processio`).  Node output goes where ``log_dir``/``log_echo`` say
(`_nodelogs`); a node's log gets a header line at each start of its
process, the first frame the node writes.
Shutdown asks (and reads each node's goodbye: an exit without one is a
crash), waits, then SIGTERMs and SIGKILLs each node's process group; every
segment with the session's prefix is unlinked on ``close()``, at exit, and
by the next scheduler if this master was killed (see
`localcluster.runtime.shm`).
"""

import atexit
import itertools
import logging
import multiprocessing
import os
import signal
import time
import weakref

import numpy as np

from ..errors import RunTimeoutError
from ..plan.node_plan import process_options
from ..plan.validate import check_feedable
from ..runtime import shm
from ..runtime.faults import faults_of_node, shared_book
from ..task import Cluster
from . import _bell
from . import _protocol as P
from . import driver
from ._descriptors import is_emfile, make_room, out_of_descriptors
from ._groupwatch import GroupWatcher
from ._handle import (SHUTDOWN_STEP, Board, ControlWords, Mux, NodeHandle,
                      NodeState, ZygoteLink, await_ready, join_all, kill_all,
                      make_batch, node_spec, read_goodbyes,
                      send_all, send_each, wait_events)
from ._logpump import LogPump
from ._nodelogs import NodeLogs, std_stream
from ._plumbing import MASTER_ENDS, check_arguments, check_cpus
from ._prepare import Prepared, QueueChannels, must_send, run_message
from ._processio import OUTPUT_WAIT, ProcessRunIO
from ._shmread import SegmentReader
from .base import Session

__all__ = ["LocalHostScheduler"]

log = logging.getLogger(__name__)

#: seconds a node gets to stop after a cancel before it is killed
CANCEL_GRACE = 1.0
#: seconds a fetch/feed/blobs request may take
REQUEST_TIMEOUT = 30.0
#: seconds of one CPU a node may take to stop (its goodbye, its exit)
STOP_COST = 0.003

_live = weakref.WeakSet()


class LocalHostScheduler(Session):
    """Run every Node of a group in its own process (see module docstring).

    ``start_method`` is ``'fork'`` (default), ``'forkserver'`` or
    ``'spawn'``; ``timeout`` is the default of ``run(timeout=)``;
    ``nodes`` (a `Cluster` or a list of node names) starts those nodes now
    instead of on first use; ``faults``: a `FaultPlan`; ``conditions``:
    `Link` and `Slowdown` conditions of every run; ``log_dir``: append
    each node's output to ``<log_dir>/<node>.log``; ``log_echo``: which
    nodes' output the master shows as ``[node] line`` (True: all, False:
    none, a pattern or list of fnmatch patterns).  Each node process is
    titled ``localcluster: <node> (<master pid>)``.
    """

    def __init__(self, start_method="fork", timeout=None, nodes=None,
                 faults=None, schedule=None, conditions=None, log_dir=None,
                 log_echo=True):
        check_arguments(start_method, timeout, schedule)
        super().__init__(faults=faults, conditions=conditions,
                         log_dir=log_dir, log_echo=log_echo)
        self._ctx = multiprocessing.get_context(start_method)
        self._start_method = start_method
        self._default_timeout = timeout
        self._owner_pid = os.getpid()
        self._prefix = shm.session_prefix()
        self._nodes = {}
        self._unreported = {}   # node -> NodeFailedError of an idle death
        self._node_seq = itertools.count()
        self._feed_seq = itertools.count()
        self._rids = itertools.count(1)
        self._reader = SegmentReader()
        self._prepared = Prepared()
        self._queues = QueueChannels(self._prefix)
        self._poller = Mux()    # the zygotes' control sockets
        self._controls = ControlWords(f"{self._prefix}ctl")
        #: where a run's messages are posted for the nodes, and the word
        #: they sleep on (`_bell`); None where futexes cannot be used: every
        #: request goes through the zygotes
        self._board = None
        if _bell.AVAILABLE:
            try:
                self._board = Board(self._prefix)
            except OSError as exc:   # a full /dev/shm, say: runs still go
                log.debug("no run board (%s): runs go through the zygotes",
                          exc)
        #: kills the node groups if this process dies (started with the
        #: first node)
        self._watcher = GroupWatcher(self._prefix, shm.SHM_DIR)
        shm.sweep_stale()
        if self.faults is not None:
            self._fault_book, self._fault_times = shared_book(
                self._prefix, len(self.faults))
        self._logs = NodeLogs(self.log_options, std_stream,
                              fork_ends=MASTER_ENDS)
        self._pump = LogPump()
        _live.add(self)
        log.debug("LocalHostScheduler %s started (%s)", self._prefix,
                  start_method)
        if nodes is not None:
            self.start_nodes(nodes)

    def __repr__(self):
        return (f"LocalHostScheduler({self._start_method!r}, "
                f"nodes={sorted(self._nodes)}, {self._state.value})")

    @property
    def shm_prefix(self):
        """The name prefix of every shared-memory segment this scheduler
        makes (``/dev/shm/<prefix>...``); `close()` removes them all."""
        return self._prefix

    # -- node lifecycle ---------------------------------------------------------

    def start_nodes(self, nodes=None):
        """Start the given nodes now (default: ``Cluster.current()``'s)."""
        self._ensure(self._nodes_wanted(nodes))

    def node_pids(self):
        """``{node: pid}`` of the running node processes (a node that died
        and has not restarted yet is left out)."""
        return {n: h.pid for n, h in self._nodes.items()
                if h.alive() and h.pid is not None}

    def _ensure(self, wanted, timeout=None, queues=0, plans=None):
        """Start every node of ``{name: kwargs}`` that is not running, each
        ready within ``timeout`` seconds (a run's) if one is given; first
        make sure the descriptors they and ``queues`` new queue channels
        need can be opened (`_descriptors`).  The missing nodes start
        together, from one zygote, which is given the packed plans of
        ``plans`` (``{node: (plan id, bytes, ...)}``) that they run next:
        each node inherits its plan instead of being sent it."""
        missing = {}
        for name, kwargs in wanted.items():
            handle = self._nodes.get(name)
            if handle is not None and handle.alive():
                if kwargs and process_options(kwargs) != \
                        process_options(handle.kwargs):
                    log.warning("node %r runs with %s; new options %s apply "
                                "after it restarts", name, handle.kwargs,
                                kwargs)
                continue
            if handle is not None and not kwargs:
                kwargs = handle.kwargs  # a restart keeps the node's options
            check_cpus(name, kwargs)
            missing[name] = kwargs
        make_room(len(missing), queues)
        starting = []
        if missing:
            try:
                starting = self._spawn(missing, plans or {})
            except OSError as exc:
                if not is_emfile(exc):
                    raise
                raise out_of_descriptors(len(missing), queues) from None
        if starting:
            try:
                await_ready(starting, timeout)
            finally:
                for handle in starting:
                    if not handle.alive():
                        self._forget(handle)
                    elif handle.pid is not None:
                        self._watcher.add(handle.pid)
        return [self._nodes[n] for n in wanted]

    def _spawn(self, missing, plans):
        """Start the nodes of ``missing`` (``{name: kwargs}``) from one new
        zygote; their handles, not ready yet."""
        handles, specs, sinks, packed = [], [], [], {}
        for name, kwargs in missing.items():
            prefix = f"{self._prefix}{next(self._node_seq)}_"
            faults = None
            if self.faults is not None:
                faults = (self._fault_book, faults_of_node(self.faults, name))
            sinks.append(self._logs.get(name))  # cannot open: nothing ran
            handle = NodeHandle(name, prefix, dict(kwargs))
            control, handle.control_word = self._controls.take()
            if self._board is not None:
                handle.board, handle.bit = self._board, _bell.bit_of(
                    control[1])
            plan_ids = ()
            prepared = plans.get(name)
            if prepared is not None:
                plan_ids = (prepared[0],)
                packed[prepared[0]] = prepared[1]
                must_send(handle.plans, prepared[0])   # it has it now
            specs.append(node_spec(
                name, prefix, handle.kwargs, control, faults, plan_ids,
                None if self._board is None else self._board.segment))
            handles.append(handle)
        batch = make_batch(self._ctx, specs, packed)
        # the watcher knows the zygote from its start (it leads its own
        # group), the nodes once they said ready
        link = ZygoteLink.start(self._ctx, self._poller, self._pump, batch,
                                handles, sinks, self._zygote_gone,
                                replies=self._board is not None)
        self._watcher.add(link.pid)
        for handle in handles:
            self._nodes[handle.name] = handle
        return handles

    def _zygote_gone(self, link):
        self._watcher.remove(link.pid)

    def _forget(self, handle):
        """A reaped node: out of the wait set, its mappings dropped."""
        self._poller.discard(handle)
        self._reader.forget(handle.name)
        if handle.pid is not None:
            self._watcher.remove(handle.pid)
        handle.release()

    def _death(self, handle, during):
        error = handle.death_error(during, self._kill_fault_on(handle.name))
        self._forget(handle)
        return error

    def _out_of_memory(self, handle, info):
        """A node that answered with a ``memory`` error: it ends; reaped
        and forgotten, its error."""
        error = handle.memory_error(info)
        self._forget(handle)
        return error

    def _kill(self, handle):
        handle.kill()
        self._forget(handle)

    # -- running ---------------------------------------------------------------

    def _check_plans(self, group, plans):
        super()._check_plans(group, plans)
        self._prepared(plans)   # packed now (and kept): sendable

    def _run_plans(self, plans, timeout):
        timeout = timeout if timeout is not None else self._default_timeout
        prepared, shared = self._prepared(plans)
        error = driver.take_unreported(self._unreported, prepared)
        if error is not None:
            raise error
        queues = self._queues.missing(shared)
        handles = self._ensure({p.node: p.node_kwargs for p in plans},
                               timeout, queues, prepared)
        rid = next(self._rids)
        try:
            channels = self._queues.for_run(shared, plans, prepared)
        except OSError as exc:
            if not is_emfile(exc):
                raise
            raise out_of_descriptors(0, queues) from None
        state = driver.start([h.name for h in handles], rid,
                             time.monotonic(), timeout)
        io = ProcessRunIO(self, state, handles)
        options = {"trace": self.trace_steps}
        if self.current_epoch is not None:
            options["epoch"] = self.current_epoch
        conditions = self.run_conditions or {}
        try:
            # nodes given the same message (a prototype's instances) get
            # it pickled once -- with the plan's bytes, for instances
            # started before they ran it: sent to the zygote once, which
            # writes them to each -- and every message of a zygote's nodes
            # goes in one command: one write and one wake-up of the zygote
            # per run, not one per node
            same, sends = {}, []
            for handle in handles:
                node_options = self._queues.options_for(handle.name, options)
                if handle.name in conditions:
                    node_options = dict(node_options,
                                        conditions=conditions[handle.name])
                msg = run_message(handle, rid, prepared[handle.name],
                                  channels, node_options)
                if node_options is options:
                    key = (msg[2], msg[3] is None)
                    found = same.get(key)
                    if found is None:
                        found = same[key] = ([], msg)
                        sends.append(found)
                    found[0].append(handle)
                    continue
                sends.append(([handle], msg))
            self._send_run(sends, state)
        except BaseException:
            # interrupted while sending: what was sent is cancelled, and
            # what was not is not waited for
            state.pending = dict.fromkeys(
                h.name for h in handles
                if h.state is NodeState.RUNNING and h.name in state.pending)
            driver.abort(state, io, CANCEL_GRACE, self._unreported)
            raise
        return driver.drive(state, io, CANCEL_GRACE, timeout,
                            self._unreported)

    def _send_run(self, sends, state):
        """Send each ``(handles, msg)`` of ``sends`` (`send_each`)."""
        failed = set(send_each(sends, self._board))
        for handles, _ in sends:
            for handle in handles:
                if handle in failed:
                    driver.apply(state, (driver.DIED, handle.name,
                                         self._death(handle,
                                                     "receiving a plan")),
                                 self._unreported)
                else:
                    handle.state = NodeState.RUNNING

    # -- requests between runs --------------------------------------------------

    def _request(self, handle, *msg):
        with self._run_lock:  # one conversation on a node's pipe at a time
            return self._converse(handle, *msg)

    def _converse(self, handle, *msg):
        rid = next(self._rids)
        deadline = time.monotonic() + REQUEST_TIMEOUT
        try:
            handle.send((msg[0], rid) + msg[1:])
        except (OSError, EOFError):
            raise self._death(handle, f"handling {msg[0]}") from None
        while True:
            if not wait_events([handle], deadline):
                self._kill(handle)
                raise RunTimeoutError(
                    f"node {handle.name!r} did not answer {msg[0]!r} within "
                    f"{REQUEST_TIMEOUT} s; it was killed")
            try:
                reply = handle.recv()
            except EOFError:
                raise self._death(handle, f"handling {msg[0]}") from None
            if reply[1] != rid:
                continue
            handle.log.wait_for(reply[-1], OUTPUT_WAIT)
            if reply[0] == P.ERROR and reply[2]["kind"] == P.MEMORY:
                raise self._out_of_memory(handle, reply[2])
            if reply[0] == P.ERROR:
                raise P.rebuild_error(handle.name, reply[2])
            return reply[2]

    def _idle_node(self, node):
        handle = self._nodes.get(str(node))
        return handle if handle is not None and handle.alive() else None

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
            if handle is not None:
                raise self._blob_not_found(name, node)
            raise self._not_running(name, node, "that node is not running "
                                    "in this session")
        return self._reader.read((str(node), "blob", str(name)), desc, copy)

    def feed_blob(self, name, value, node="local"):
        self._check_open()
        array = np.asarray(value)
        check_feedable(name, value, array)  # the node keeps numbers only
        node = str(node)
        handle = self._idle_node(node) or self._ensure(
            {node: Cluster.current().kwargs_of(node)})[0]
        # copied once, straight into a segment whose memory is reserved
        # first: a full /dev/shm is an error here, not a SIGBUS
        segment, mm = shm.create_unique(
            f"{handle.prefix}m{next(self._feed_seq)}_", array.nbytes,
            blob=str(name))
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

    # -- shutdown -------------------------------------------------------------------

    def _close(self):
        if os.getpid() != self._owner_pid:
            return  # a forked copy of the scheduler owns nothing
        live = [h for h in self._nodes.values() if h.alive()]
        try:
            self._shut_down(live)
        finally:
            # Whatever interrupted the polite part (Ctrl-C, an error), no
            # node and no segment outlives close().
            left = [h for h in live if h.alive()]
            kill_all(left, signal.SIGKILL)
            join_all(left, SHUTDOWN_STEP)
            for handle in live:
                if handle.alive():
                    handle.reap(sweep=False)   # all swept below
                self._forget(handle)
            for link in self._poller.links():
                link.close()   # its nodes are gone: it exits
            self._reader.clear()
            if self._board is not None:
                self._board.close()
            self._queues.close()
            self._sync_faults()
            self._fault_times = None
            self._pump.stop()
            self._logs.close()
            self._watcher.close()
            shm.sweep(self._prefix)
            _live.discard(self)
            log.debug("LocalHostScheduler %s closed", self._prefix)

    def _shut_down(self, live):
        """Ask and read each goodbye, wait, then SIGTERM and SIGKILL the
        nodes' process groups."""
        failed = send_all(live, (P.SHUTDOWN, 0))
        failed = set(failed)
        asked = [h for h in live if h not in failed]
        # (a node's goodbye or death moves the deadline: a thousand nodes
        # stopping on two cores take more than a step, and are no crash;
        # the first answer may take longer still: thousands of nodes all
        # runnable at once leave their zygote, one task among them, a CPU
        # share too small to relay anything for seconds)
        first = _stopping_time(len(asked))
        read_goodbyes(asked, time.monotonic() + first, extend=SHUTDOWN_STEP)
        join_all(live, first, extend=True)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [h for h in live if not h.gone]
            if not alive:
                break
            names = [h.name for h in alive]
            shown = names if len(names) <= 10 else \
                names[:10] + [f"... {len(names) - 10} more"]
            log.warning("node(s) %s did not stop when asked; sending %s",
                        shown, sig.name)
            kill_all(alive, sig)
            join_all(alive, SHUTDOWN_STEP)
        for handle in live:
            handle.reap(sweep=False)   # _close sweeps the session's prefix

    def __del__(self):
        try:
            if self._state.value == "open" and \
                    os.getpid() == self._owner_pid:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


def _stopping_time(nodes):
    """Seconds ``nodes`` asked to stop together get before the first of
    them is heard from: a shutdown step, or `STOP_COST` each over the
    CPUs this process may use if that is longer."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(SHUTDOWN_STEP, nodes * STOP_COST / max(1, cpus))


@atexit.register
def _close_all():
    """At exit: stop every node and sweep every segment, even of a
    scheduler whose close() was interrupted."""
    for scheduler in list(_live):
        try:
            scheduler._close()  # also one whose close() was interrupted
        except Exception:  # noqa: BLE001 - best effort at exit
            log.exception("closing %r at exit failed", scheduler)
