"""Firing a fault plan's faults inside a node's runtime.

A session hands each `NodeRuntime` a `NodeFaults`: the faults that name
the node (with their index in the session's `FaultPlan`), a `FaultBook`
shared by every node of the session, and the host's way to end the node
(``die``).  The runtime asks it at three points::

    NodeRuntime.run(..., epoch=k)  -> at_run(k)        Epoch(k) faults
    executor.execute(step)         -> before_step(..)  Step(name) faults
    a compiled op                  -> trigger(op)      Op(type, nth),
                                                       FailCheckpoint

Only the op types and steps a fault names are touched: a node without
faults compiles and runs exactly as before, and an op of another type
runs its kernel as it is.  An op a fault names fires it just before it
runs -- before an atomic op takes the node's lock, so a `Delay` or `Hang`
there blocks no other branch.

The book is an array of float64, one per fault of the plan: 0 until the
fault fires, then the time it fired (`time.time`).  A fault fires when
its slot is still 0, so it fires once per session -- also across a node's
restarts, since the book outlives the node (under LocalHostScheduler it
is a shared-memory segment every node process maps, written before the
node acts, so a node that SIGKILLs itself still leaves its mark).  The
session reads the book after every run into ``plan.fired()``.

What a fault does:

- ``Kill(how="sigkill"|"exit")``: ``die(how)`` -- a process host SIGKILLs
  itself or ``os._exit(3)``; a thread host raises `NodeDeath`, which the
  session turns into the `NodeFailedError` a dead process would give;
- ``Kill(how="raise")`` and `FailCheckpoint`: an `InjectedFault` raised
  in the op (a `TaskFailedError` naming node, step and op);
- `Hang`: waits for the run's cancellation (its timeout, or a failure
  elsewhere), then leaves as a cancelled run does;
- `Delay`: waits ``seconds`` (a cancellation cuts it short).

Both wait on the run's clock: under a deterministic schedule a `Delay`
takes virtual time, and a `Hang` is a branch waiting for its cancel (a run
whose every branch then waits is a `DeadlockError`, unless its timeout
comes first).
"""

import collections
import os
import signal
import sys
import threading
import time

import numpy as np

from . import shm
from ..errors import Cancelled, InjectedFault, TaskFailedError
from ..plan.faults import (EXIT_STATUS, Delay, Epoch, FailCheckpoint, Hang,
                           Kill, Op, Step)

__all__ = ["NodeFaults", "FaultBook", "NodeDeath", "faults_of_node",
           "shared_book", "mapped_book", "die_in_thread", "die_in_process"]


class NodeDeath(BaseException):
    """A `Kill` fault ending a node hosted on a thread (a process host
    dies for real instead).  A BaseException: no op error handler may
    turn it into an op failure."""

    def __init__(self, node, how, fault):
        super().__init__(f"node {node!r} killed by {fault!r}")
        self.node = node
        self.how = how
        self.fault = fault
        self.exitcode = EXIT_STATUS if how == "exit" else None
        self.signal_name = "SIGKILL" if how == "sigkill" else None


class FaultBook:
    """When each fault of a plan fired (0: not yet); see the module
    docstring.  ``times`` is any writable float64 array (shared memory
    for node processes)."""

    def __init__(self, times):
        self.times = times
        self._lock = threading.Lock()

    def take(self, index):
        """Mark fault ``index`` fired now; False if it had fired."""
        with self._lock:
            if self.times[index]:
                return False
            self.times[index] = time.time()
            return True


def shared_book(prefix, size):
    """A new fault book in shared memory, for node processes to map:
    ``(segment name, times)``."""
    name, mm = shm.create_unique(prefix + "faults_", 8 * max(size, 1),
                                 what="the fault plan's book")
    return name, np.ndarray(size, np.float64, buffer=mm)


def mapped_book(name):
    """The `FaultBook` of segment ``name`` (made by `shared_book`)."""
    mm = shm.map_segment(name, writable=True)
    return FaultBook(np.ndarray(len(mm) // 8, np.float64, buffer=mm))


def faults_of_node(plan, node):
    """``[(index, fault), ...]`` of ``plan``'s faults that name ``node``."""
    if plan is None:
        return []
    return [(i, f) for i, f in enumerate(plan.faults) if f.node == node]


class NodeFaults:
    """One node's faults, indexed by trigger point (module docstring)."""

    def __init__(self, node, faults, book, die=None):
        self.node = node
        self.book = book
        self.die = die
        self.cancelled = None      # the runtime's CancelEvent (set by it)
        self.clock = None          # () -> the run's clock (set by it)
        self._epochs = collections.defaultdict(list)
        self._steps = collections.defaultdict(list)
        self._ops = collections.defaultdict(list)
        self._saves = collections.defaultdict(list)
        for index, fault in faults:
            if isinstance(fault, FailCheckpoint):
                self._saves[fault.epoch].append((index, fault))
                continue
            at = fault.at
            if isinstance(at, Epoch):
                self._epochs[at.k].append((index, fault))
            elif isinstance(at, Step):
                self._steps[at.name].append((index, fault))
            elif isinstance(at, Op):
                self._ops[at.op_type].append((index, fault))
        self._counts = collections.Counter()
        self._count_lock = threading.Lock()
        self.steps = frozenset(self._steps)   # what `execute` looks up

    def __bool__(self):
        return bool(self._epochs or self._steps or self._ops or self._saves)

    # -- trigger points -----------------------------------------------------

    def at_run(self, epoch):
        """A run starts; ``epoch`` is the runner's epoch it is part of."""
        for index, fault in self._epochs.get(epoch, ()):
            self._fire(index, fault, (None, None))

    def before_step(self, step, task):
        for index, fault in self._steps.get(step, ()):
            self._fire(index, fault, (task, step))

    def names(self, op):
        """Whether a fault of this node names ``op`` (its trigger counts
        ops of its type across the node's branches: under a schedule
        such an op gets a switch point)."""
        return op.type in self._ops or (
            op.type == "SaveCheckpoint" and
            op.args.get("epoch") in self._saves)

    def trigger(self, op):
        """A callable that fires ``op``'s faults, to call just before the
        op runs -- or None when no fault names this op."""
        counted = self._ops.get(op.type)
        saves = self._saves.get(op.args.get("epoch")) \
            if op.type == "SaveCheckpoint" else None
        if not counted and not saves:
            return None

        def fire():
            if counted:
                with self._count_lock:
                    self._counts[op.type] += 1
                    nth = self._counts[op.type]
                for index, fault in counted:
                    if fault.at.nth == nth:
                        self._fire(index, fault, None)
            for index, fault in saves or ():
                if self.book.take(index):
                    raise InjectedFault(
                        f"{fault!r}: the save of epoch {fault.epoch} on "
                        f"node {self.node!r} fails")

        return fire

    # -- what a fault does --------------------------------------------------

    def _fire(self, index, fault, where):
        """Fire ``fault`` unless it fired before.  ``where`` is (task,
        step) outside an op -- an error raised there is wrapped as the
        op error the executor would give -- or None inside one."""
        if not self.book.take(index):
            return
        if isinstance(fault, Kill):
            if fault.how == "raise":
                self._raise(InjectedFault(f"{fault!r} fired on node "
                                          f"{self.node!r}"), where)
            self.die(fault.how, fault)
        elif isinstance(fault, Hang):
            self.clock().wait(self.cancelled, None,
                              what=f"nothing: {fault!r} holds it")
            raise Cancelled(f"{fault!r}: the hung run on node "
                            f"{self.node!r} was cancelled")
        elif isinstance(fault, Delay):
            if self.clock().wait(self.cancelled, fault.seconds,
                                 what=f"the end of {fault!r}"):
                raise Cancelled(f"run on node {self.node!r} was cancelled "
                                f"during {fault!r}")

    def _raise(self, error, where):
        if where is None:
            raise error
        task, step = where
        raise TaskFailedError(
            f"{error}" + (f" (task {task!r}, step {step!r})" if step else ""),
            node=self.node,
            task=task, step=step, cause_type=type(error).__name__,
            cause_message=str(error)) from error


def die_in_thread(node):
    """The ``die`` of a thread host: raise `NodeDeath`."""
    def die(how, fault):
        raise NodeDeath(node, how, fault)
    return die


def die_in_process(how, fault):
    """The ``die`` of a process host (a node process, an engine's worker):
    the process ends as a real failure would -- SIGKILL, or exit status 3
    -- once its buffered output is flushed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(EXIT_STATUS)
