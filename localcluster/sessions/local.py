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
"""

import itertools
import logging
import os
import queue
import threading
import time
import weakref

import numpy as np

from ..errors import BlobNotFoundError, NodeFailedError, RunTimeoutError
from ..plan.validate import check_cross_node_queues, feedable, queues_of
from ..runtime.faults import (FaultBook, NodeDeath, NodeFaults,
                              die_in_thread, faults_of_node)
from ..runtime.host import NodeRuntime
from . import driver
from .base import Session

__all__ = ["LocalSession"]

log = logging.getLogger(__name__)

#: seconds a cancelled run's threads get to stop before the session breaks
CANCEL_GRACE = 2.0


class LocalSession(Session):
    """Run every node in this process (see the module docstring)."""

    def __init__(self, faults=None):
        super().__init__(faults=faults)
        if self.faults is not None:
            self._fault_times = np.zeros(len(self.faults))
            self._fault_book = FaultBook(self._fault_times)
        self._runtimes = {}
        self._workers = {}
        self._rids = itertools.count(1)
        self._queues = weakref.WeakKeyDictionary()  # plan -> its queues
        self._checked = None   # the plans of the last run, found valid

    def __repr__(self):
        return f"LocalSession(nodes={sorted(self._runtimes)}, " \
               f"{self._state.value})"

    def node_pids(self):
        """``{node: pid}``: every node of this session is this process."""
        return dict.fromkeys(self._runtimes, os.getpid())

    def _runtime(self, node):
        runtime = self._runtimes.get(node)
        if runtime is None:
            faults = None
            if self.faults is not None:
                faults = NodeFaults(node, faults_of_node(self.faults, node),
                                    self._fault_book, die_in_thread(node))
            runtime = self._runtimes[node] = NodeRuntime(node, faults=faults)
        return runtime

    def _died(self, death):
        """A `Kill` fault ended ``death.node``: its workspace goes, as a
        dead process's does; the error a dead process would give."""
        node = death.node
        runtime = self._runtimes.pop(node, None)
        if runtime is not None:
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
            runtime.close()
        self._runtimes.clear()

    # -- running ----------------------------------------------------------------

    def _worker(self, node):
        worker = self._workers.get(node)
        if worker is None:
            worker = self._workers[node] = queue.SimpleQueue()
            threading.Thread(target=_work, args=(worker,), daemon=True,
                             name=f"lc:{node}").start()
        return worker

    def _run_plans(self, plans, timeout):
        if plans is not self._checked:  # a group run again: checked already
            check_cross_node_queues(plans, {p.node: self._queues_of(p)
                                            for p in plans})
            self._checked = plans
        rid = next(self._rids)
        channels = {}  # queues start empty and open at every run
        trace = self.trace_steps
        if len(plans) == 1 and timeout is None:
            plan = plans[0]
            runtime = self._runtime(plan.node)
            try:
                result = runtime.run(rid, plan, channels, trace,
                                     epoch=self.current_epoch)
            except NodeDeath as death:
                raise self._died(death) from None
            except BaseException:
                runtime.cancel(rid)
                raise
            self._finished(plan.node, result)
            return {plan.node: result.outputs}
        io = _ThreadRunIO(self, timeout)
        for plan in plans:
            self._worker(plan.node).put(
                (self._runtime(plan.node), rid, plan, channels, trace,
                 self.current_epoch, io.events))
        state = driver.start([p.node for p in plans], rid, time.monotonic(),
                             timeout)
        return driver.drive(state, io, CANCEL_GRACE, timeout)

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
            raise BlobNotFoundError(
                name, node, "no run on that node wrote it" if runtime
                is not None else "that node has not run anything in this "
                "session")
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


class _ThreadRunIO(driver.RunIO):
    """The driver's I/O for nodes on worker threads."""

    def __init__(self, session, timeout):
        self.session = session
        self.timeout = timeout
        self.events = queue.SimpleQueue()   # (node, result, error)

    now = staticmethod(time.monotonic)

    def wait(self, timeout):
        events = self.events
        try:
            found = [self._event(*events.get(timeout=timeout))]
        except queue.Empty:
            return []
        while not events.empty():
            found.append(self._event(*events.get_nowait()))
        return found

    def _event(self, node, result, error):
        if isinstance(error, NodeDeath):
            return (driver.DIED, node, self.session._died(error))
        if error is not None:
            return (driver.FAILED, node, error)
        self.session._finished(node, result)
        return (driver.DONE, node, result.outputs)

    def cancel(self, nodes, rid):
        for node in nodes:
            self.session._runtime(node).cancel(rid)

    def kill(self, nodes):
        # a thread cannot be stopped from outside: the session breaks
        self.session._mark_broken(
            f"{len(nodes)} node thread(s) did not stop within "
            f"{CANCEL_GRACE} s of a cancelled run")

    def timeout_error(self, timeout, late, killed):
        return RunTimeoutError(
            f"run did not finish within {timeout} s; it was cancelled"
            + (f" ({len(killed)} node thread(s) did not stop, so the session "
               "is now broken)" if killed else ""), nodes=late, killed=killed)


def _work(jobs):
    """A node's worker thread: runs the plans handed to it, in order."""
    while True:
        job = jobs.get()
        if job is None:
            return
        runtime, rid, plan, channels, trace, epoch, events = job
        try:
            result = runtime.run(rid, plan, channels, trace, epoch=epoch)
        except BaseException as exc:  # noqa: BLE001 - handed to the driver
            events.put((plan.node, None, exc))
        else:
            events.put((plan.node, result, None))
