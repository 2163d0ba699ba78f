"""LocalSession: every node an in-process workspace, tasks on threads.

The reference semantics, and the fastest session for small tests.  Each
node name gets its own `Workspace`, `RunContext` (compiled nets are kept
across runs) and worker thread the first time it is used; a run hands each
node's plan to its worker (or runs it on the calling thread when there is
one node and no timeout), and the first failure cancels the others.  All
nodes share one set of queue channels per run, so a queue between nodes
is an in-process queue here.

A run that times out is cancelled; its threads stop at their next op.  A
thread stuck inside one op (a Python op that never returns) cannot be
stopped in-process: if any is still running after a short grace period the
session is marked broken (``is_open()`` is False) rather than left hung.
"""

import logging
import os
import queue
import threading
import time

import numpy as np

from ..errors import BlobNotFoundError, RunTimeoutError
from ..runtime.channels import ChannelHub
from ..errors import Cancelled
from ..runtime.executor import RunContext
from ..runtime.node import run_node_plan
from ..runtime.workspace import Workspace
from .base import Session

__all__ = ["LocalSession"]

log = logging.getLogger(__name__)

#: seconds a cancelled run's threads get to stop before the session breaks
CANCEL_GRACE = 2.0


class LocalSession(Session):
    """Run every node in this process (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self._workspaces = {}
        self._contexts = {}
        self._workers = {}

    def __repr__(self):
        return f"LocalSession(nodes={sorted(self._workspaces)}, " \
               f"{self._state.value})"

    def node_pids(self):
        """``{node: pid}``: every node of this session is this process."""
        return dict.fromkeys(self._workspaces, os.getpid())

    def _workspace(self, node):
        ws = self._workspaces.get(node)
        if ws is None:
            ws = self._workspaces[node] = Workspace(node)
        return ws

    def _close(self):
        for worker in self._workers.values():
            worker.put(None)
        self._workers.clear()
        self._workspaces.clear()
        self._contexts.clear()

    # -- running ----------------------------------------------------------------

    def _context(self, node):
        rc = self._contexts.get(node)
        if rc is None:
            ws = self._workspace(node)
            rc = self._contexts[node] = RunContext(
                node, ws.lock, resources={"workspace": ws})
        return rc

    def _worker(self, node):
        worker = self._workers.get(node)
        if worker is None:
            worker = self._workers[node] = queue.SimpleQueue()
            threading.Thread(target=_work, args=(worker,), daemon=True,
                             name=f"lc:{node}").start()
        return worker

    def _run_plans(self, plans, timeout):
        contexts = {p.node: self._context(p.node) for p in plans}
        hub = ChannelHub()  # queues start empty and open at every run
        for rc in contexts.values():
            rc.begin(trace=self.trace_steps)
            rc.op_context.resources["queues"] = hub
        if len(plans) == 1 and timeout is None:
            plan = plans[0]
            try:
                result = {plan.node: run_node_plan(
                    plan, self._workspace(plan.node), contexts[plan.node])}
                self._node_done(plan.node)
                return result
            except BaseException:
                contexts[plan.node].cancelled.set()
                hub.abort()
                raise
        done = queue.SimpleQueue()

        def cancel_all():
            for rc in contexts.values():
                rc.cancelled.set()
            hub.abort()

        for plan in plans:
            self._worker(plan.node).put(
                (plan, self._workspace(plan.node), contexts[plan.node],
                 done, cancel_all))
        deadline = None if timeout is None else time.monotonic() + timeout
        results, errors, pending = {}, [], len(plans)
        try:
            while pending:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise queue.Empty
                node, result, exc = done.get(timeout=wait)
                pending -= 1
                if exc is None:
                    results[node] = result
                    self._node_done(node)
                else:
                    errors.append(exc)
                    break
        except queue.Empty:
            cancel_all()
            _, stuck = self._collect(done, pending)
            raise RunTimeoutError(
                f"run did not finish within {timeout} s; it was cancelled"
                + (f" ({stuck} node thread(s) did not stop, so the session "
                   "is now broken)" if stuck else "")) from None
        except BaseException:
            cancel_all()
            self._collect(done, pending)
            raise
        if errors:
            errors.extend(self._collect(done, pending)[0])
            real = [e for e in errors if not isinstance(e, Cancelled)]
            raise (real or errors)[0]
        return results

    def _node_done(self, node):
        super()._node_done(node)
        trace = self._contexts[node].trace
        if trace is not None:
            self.last_run_trace[node] = trace

    def _collect(self, done, pending):
        """(errors, threads still running) of a cancelled run's other nodes,
        waiting for them at most CANCEL_GRACE seconds."""
        errors = []
        deadline = time.monotonic() + CANCEL_GRACE
        while pending:
            try:
                _, _, exc = done.get(timeout=max(0.0, deadline -
                                                 time.monotonic()))
            except queue.Empty:
                self._mark_broken(
                    f"{pending} node thread(s) did not stop within "
                    f"{CANCEL_GRACE} s of a cancelled run")
                break
            pending -= 1
            if exc is not None:
                errors.append(exc)
        return errors, pending

    # -- blobs ---------------------------------------------------------------------

    def fetch_blob(self, name, node="local", copy=True):
        self._check_open()
        ws = self._workspaces.get(str(node))
        value = ws.get_or_none(str(name)) if ws is not None else None
        if value is None:
            raise BlobNotFoundError(
                name, node, "no run on that node wrote it" if ws is not None
                else "that node has not run anything in this session")
        if copy:
            return np.array(value, copy=True)
        view = value.view()  # read-only, as under LocalHostScheduler
        view.flags.writeable = False
        return view

    def feed_blob(self, name, value, node="local"):
        self._check_open()
        array = np.array(value, copy=True)
        if array.dtype == object:
            raise TypeError(
                f"feed_blob({name!r}): value must be numeric array-like, got "
                f"{type(value).__name__}")
        self._workspace(str(node)).set(str(name), array)

    def blobs(self, node="local"):
        self._check_open()
        ws = self._workspaces.get(str(node))
        return sorted(ws.local_names()) if ws is not None else []

    def has_blob(self, name, node="local"):
        self._check_open()
        ws = self._workspaces.get(str(node))
        return ws is not None and ws.has(str(name))


def _work(jobs):
    """A node's worker thread: runs the plans handed to it, in order."""
    while True:
        job = jobs.get()
        if job is None:
            return
        plan, workspace, rc, done, cancel_all = job
        try:
            result = run_node_plan(plan, workspace, rc)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            cancel_all()
            done.put((plan.node, None, exc))
        else:
            done.put((plan.node, result, None))
