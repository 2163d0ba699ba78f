"""LocalSession: every node a `NodeRuntime` in this process, run on threads.

The reference semantics, and the fastest session for small tests.  Each
node name gets its own `NodeRuntime` (workspace, compiled nets, plan cache)
and worker thread the first time it is used; a run hands each node's plan
to its worker -- or runs it on the calling thread when there is one node
and no timeout -- and the run driver (`driver.drive`) waits for them: the
first failure cancels the others, a timeout cancels them all.  Every node
of a run gets the same ``channels`` dict, so a queue between nodes is one
in-process channel here.

A thread stuck inside one op (a Python op that never returns) cannot be
stopped in-process: the driver's ``kill`` of such a node marks the session
broken (``is_open()`` is False) rather than leave it hung.

``LocalSession(schedule=seed_or_Schedule)`` runs every run under a
deterministic schedule (`localcluster.runtime.scheduler`, hosted by
`_threads.run_scheduled`): one branch at a time, picked by the schedule,
on a virtual clock that the session keeps from run to run (it starts at
0, so timers read the same in every fresh session).  Each run starts the
schedule afresh: its decisions depend on the seed, the plan and the
workspaces only; ``last_schedule`` holds them after the run.

With ``log_dir`` or ``log_echo`` other than True, node output is routed
by node (`_outroute`): whatever a thread running for a node writes to
sys.stdout/sys.stderr goes to that node's log file and, if the node is
echoed, to the terminal as ``[node] line``; a node's log gets a header
(this process's pid) when its runtime is made -- at its first run, and
after a `Kill` fault ended it.  Without them, output is untouched.
"""

import functools
import itertools
import logging
import os
import queue
import threading
import time
import weakref

import numpy as np

from ..errors import NodeFailedError
from ..plan.validate import feedable, queues_of, shared_queues
from ..runtime.channels import LocalChannel
from ..runtime.faults import (FaultBook, NodeDeath, NodeFaults,
                              die_in_thread, faults_of_node)
from ..runtime.host import NodeRuntime
from ..runtime.schedule import as_schedule
from . import _outroute as route
from . import driver
from ._nodelogs import NodeLogs
from ._threads import (CANCEL_GRACE, ThreadRunIO, run_node, run_scheduled,
                       work)
from .base import Session

__all__ = ["LocalSession"]

log = logging.getLogger(__name__)


class LocalSession(Session):
    """Run every node in this process (see the module docstring).

    ``schedule``: None (threads run freely), a seed (an int) or a
    `localcluster.testing.Schedule`; ``faults``: a `FaultPlan` to fire;
    ``conditions``: `Link` and `Slowdown` conditions of every run;
    ``log_dir``, ``log_echo``: where node output goes (module
    docstring)."""

    def __init__(self, schedule=None, faults=None, conditions=None,
                 log_dir=None, log_echo=True):
        super().__init__(faults=faults, conditions=conditions,
                         log_dir=log_dir, log_echo=log_echo)
        if self.faults is not None:
            self._fault_times = np.zeros(len(self.faults))
            self._fault_book = FaultBook(self._fault_times)
        self._schedule = as_schedule(schedule)
        #: under a schedule, the decisions of the last run (branch names),
        #: for ``Schedule.replay``; None without a schedule
        self.last_schedule = None
        #: under a schedule, every run's decisions since the schedule was
        #: set, for ``Schedule.replay`` of a whole training
        self.schedule_log = []
        #: how many of the last run's decisions were preemptions, and of
        #: every run's since the schedule was set
        self.last_preemptions = self.schedule_preemptions = 0
        #: ``[(run, decision, branch)]`` since the schedule was set: the
        #: `Schedule.switches` that repeats those runs
        self.schedule_switches = []
        self._decision_counts = {}   # plan -> decisions its runs made
        self._switch_points = {}     # plans -> where schedules decide
        self._virtual_ns = 0
        self._runtimes = {}
        self._workers = {}
        self._rids = itertools.count(1)
        self._queues = weakref.WeakKeyDictionary()  # plan -> its queues
        self._checked = None   # the plans of the last run
        self._shared = {}      # and their queues used on several nodes
        self._logs = None
        if self.log_options.active:
            self._logs = NodeLogs(self.log_options, route.original_stream)
            route.install()

    def __repr__(self):
        schedule = "" if self._schedule is None else f"{self._schedule!r}, "
        return f"LocalSession({schedule}nodes={sorted(self._runtimes)}, " \
               f"{self._state.value})"

    @property
    def schedule(self):
        """The `Schedule` every run follows, or None.  Settable between
        runs -- a seed to set a workspace up, then the replay of the run
        that matters -- but not to or from None: a session's nodes run
        under a schedule or not, for its whole life."""
        return self._schedule

    @schedule.setter
    def schedule(self, value):
        value = as_schedule(value, "LocalSession.schedule")
        if (value is None) != (self._schedule is None):
            raise ValueError(
                "a session runs under a schedule or not for its whole life; "
                "open a new LocalSession(schedule=...) instead")
        self._schedule = value
        # runs count from 0 under the new one
        self.schedule_log, self.schedule_switches = [], []
        self.schedule_preemptions = 0

    def node_pids(self):
        """``{node: pid}`` of every node this session has started: all
        this process's pid (the nodes are threads of it)."""
        return dict.fromkeys(self._runtimes, os.getpid())

    def _runtime(self, node):
        runtime = self._runtimes.get(node)
        if runtime is None:
            faults = None
            if self.faults is not None:
                faults = NodeFaults(node, faults_of_node(self.faults, node),
                                    self._fault_book, die_in_thread(node))
            runtime = self._runtimes[node] = NodeRuntime(node, faults=faults)
            if self._logs is not None:
                sink = self._logs.get(node)
                sink.started(os.getpid())
                route.attach(runtime, route.LineSink(sink))
        return runtime

    def _died(self, death):
        """A `Kill` fault ended ``death.node``: its workspace goes, as a
        dead process's does; the error a dead process would give."""
        node = death.node
        runtime = self._runtimes.pop(node, None)
        if runtime is not None:
            route.detach(runtime)
            runtime.close()
        what = death.signal_name or f"exit status {death.exitcode}"
        return NodeFailedError(
            f"node {node!r} died ({what}) while running a plan; "
            f"{death.fault!r} fired; it restarts with an empty workspace "
            "on the next run", node=node, exitcode=death.exitcode,
            signal_name=death.signal_name)

    def _close(self):
        for worker in self._workers.values():
            worker.put(None)
        self._workers.clear()
        for runtime in self._runtimes.values():
            route.detach(runtime)
            runtime.close()
        self._runtimes.clear()
        if self._logs is not None:
            route.uninstall()
            self._logs.close()

    # -- running ----------------------------------------------------------------

    def _worker(self, node):
        worker = self._workers.get(node)
        if worker is None:
            worker = self._workers[node] = queue.SimpleQueue()
            threading.Thread(target=work, args=(worker,), daemon=True,
                             name=f"lc:{node}").start()
        return worker

    def _run_plans(self, plans, timeout):
        try:
            return self._run_nodes(plans, timeout)
        finally:
            if self._logs is not None:   # a line a run left unended
                for plan in plans:
                    route.flush(self._runtimes.get(plan.node))

    def _run_nodes(self, plans, timeout):
        if plans is not self._checked:  # a group run again: known already
            self._shared = shared_queues(plans, {p.node: self._queues_of(p)
                                                 for p in plans})
            self._checked = plans
        rid = next(self._rids)
        # queues start empty and open at every run; one several nodes
        # share counts its writers on all of them (the last closes it)
        channels = {queue: LocalChannel(use.capacity, queue, use.writers)
                    for queue, use in self._shared.items()}
        trace = self.trace_steps
        if self._schedule is not None:
            return run_scheduled(self, plans, rid, channels, trace, timeout)
        if len(plans) == 1 and timeout is None:
            plan = plans[0]
            runtime = self._runtime(plan.node)
            try:
                result = runtime.run(rid, plan, channels, trace,
                                     epoch=self.current_epoch,
                                     conditions=self._conditions_of(
                                         plan.node))
            except NodeDeath as death:
                raise self._died(death) from None
            except BaseException:
                runtime.cancel(rid)
                raise
            self._finished(plan.node, result)
            return {plan.node: result.outputs}
        io = ThreadRunIO(self, timeout)
        for plan in plans:
            self._worker(plan.node).put(functools.partial(
                run_node, self._runtime(plan.node), rid, plan, channels,
                trace, io.events, self.current_epoch,
                self._conditions_of(plan.node)))
        state = driver.start([p.node for p in plans], rid, time.monotonic(),
                             timeout)
        return driver.drive(state, io, CANCEL_GRACE, timeout)

    def _conditions_of(self, node):
        """The run's `NodeConditions` of ``node``, or None."""
        found = self.run_conditions
        return found.get(node) if found is not None else None

    def _queues_of(self, plan):
        found = self._queues.get(plan)
        if found is None:
            found = self._queues[plan] = queues_of(plan)
        return found

    def _finished(self, node, result):
        self._node_done(node)
        if result.trace is not None:
            self.last_run_trace[node] = result.trace

    # -- blobs ---------------------------------------------------------------------

    def fetch_blob(self, name, node="local", copy=True):
        self._check_open()
        runtime = self._runtimes.get(str(node))
        value = runtime.fetch(name) if runtime is not None else None
        if value is None:
            if runtime is not None:
                raise self._blob_not_found(name, node)
            raise self._not_running(name, node, "that node has not run "
                                    "anything in this session")
        if copy:
            return np.array(value, copy=True)
        view = value.view()  # read-only, as under LocalHostScheduler
        view.flags.writeable = False
        return view

    def feed_blob(self, name, value, node="local"):
        self._check_open()
        self._runtime(str(node)).feed(name, feedable(name, value))

    def blobs(self, node="local"):
        self._check_open()
        runtime = self._runtimes.get(str(node))
        return runtime.blobs() if runtime is not None else []

    def has_blob(self, name, node="local"):
        self._check_open()
        runtime = self._runtimes.get(str(node))
        return runtime is not None and runtime.has(name)
