"""NodeRuntime: one node's runtime, whatever hosts it.

::

    host (a LocalSession thread | a node process | an engine's worker)
      load(plan_id, plan) / run(run_id, plan_id, channels=..., clock=...)
                                                           --> outputs
      cancel(run_id)   from any thread, also before the run starts
      fetch / feed / blobs / has   on the node's global workspace
                 |
    NodeRuntime: plan cache, global Workspace (its store: a dict, or
      shared memory), RunContext (compiled nets, the run's CancelEvent),
      the run's ChannelHub (queues from ``channel_factory``), tracing

It knows nothing of pipes, signals, descriptors or processes: a host turns
its own transport into these calls.  Outputs leave as arrays -- copies, or
with ``copy_outputs=False`` the arrays the store holds, for a host that
packs them itself.

A run id orders runs: ``cancel(run_id)`` cancels that run and every
earlier one, so a cancel that reaches the node before its run starts (a
signal racing a pipe) cancels it as it starts.  Queues come from
``channel_factory(queue_id, capacity, channels)`` where ``channels`` is
what the host passed to `run` for that run (LocalSession: the run's
shared in-process channels; a node process: the shared-memory channel
descriptors the master sent); they start empty and open at every run.

``clock`` is the run's clock (`localcluster.runtime.clock`): None for
real time, or a deterministic schedule's `Scheduler`, which the host
makes per run (LocalSession: one for all the nodes of a run) and on whose
branch the host calls `run`.
"""

import collections
import logging
import threading
import time
import weakref

from ..plan.node_plan import NodePlan
from ..plan.validate import queue_writers
from .cancel import CancelEvent
from .channels import ChannelHub, LocalChannel
from . import current
from .clock import REAL_TIME
from .executor import RunContext
from .links import RunLinks
from .node import run_node_plan
from .workspace import Workspace

__all__ = ["NodeRuntime", "RunResult", "PLAN_CACHE", "local_channels"]

log = logging.getLogger(__name__)

#: plans a node keeps (first in, first out); a host that mirrors the cache
#: (to skip sending a plan the node has) uses the same size and order
PLAN_CACHE = 64


def local_channels(queue_id, capacity, channels):
    """The default channel factory: one in-process channel per queue and
    run, shared by every runtime given the same ``channels`` dict."""
    if channels is None:
        return LocalChannel(capacity, queue_id)
    found = channels.get(queue_id)
    if found is None:
        found = channels.setdefault(queue_id,
                                    LocalChannel(capacity, queue_id))
    return found


class RunResult:
    """What a run gives back: output values, seconds, step spans."""

    __slots__ = ("outputs", "seconds", "trace")

    def __init__(self, outputs, seconds, trace):
        self.outputs = outputs
        self.seconds = seconds
        self.trace = trace

    def __repr__(self):
        return (f"RunResult({sorted(self.outputs)}, "
                f"{self.seconds * 1000:.3f} ms)")


class NodeRuntime:
    """One node: its workspace, plans and runs (see the module docstring).

    ``store`` is where the global workspace keeps its arrays (a dict by
    default; a node process passes its shared-memory store);
    ``channel_factory`` makes the run's queue channels.
    """

    def __init__(self, name, store=None, channel_factory=None,
                 plan_cache=PLAN_CACHE, faults=None, now_ns=time.monotonic_ns):
        self.name = str(name)
        self._now_ns = now_ns   # the clock records over a link are sent by
        self.workspace = Workspace(self.name, store=store)
        self.cancelled = CancelEvent()
        self._hub = ChannelHub(channel_factory or local_channels,
                               self.cancelled)
        #: plan -> `queue_writers` of it (plans this node ran)
        self._writers = weakref.WeakKeyDictionary()
        self._resources = {"workspace": self.workspace, "queues": self._hub,
                           "instance": (0, 1)}
        self._rc = RunContext(self.name, self.workspace.lock, self.cancelled,
                              self._resources)
        self.faults = faults if faults else None
        if self.faults is not None:
            faults.cancelled = self.cancelled
            faults.clock = lambda: self._rc.clock
            self._rc.faults = faults
            self._rc.fault_steps = faults.steps or None
        self._plans = collections.OrderedDict()
        self._plan_cache = plan_cache
        self._lock = threading.Lock()   # current run id and cancel mark
        self._current = None
        self._cancelled_upto = 0
        self._closed = False

    def __repr__(self):
        return (f"NodeRuntime({self.name!r}, run={self._current}, "
                f"{len(self._plans)} plans)")

    # -- plans --------------------------------------------------------------

    def load(self, plan_id, plan):
        """Keep ``plan`` as ``plan_id`` (the oldest goes past the cache
        size)."""
        self._plans[plan_id] = plan
        self._plans.move_to_end(plan_id)
        while len(self._plans) > self._plan_cache:
            self._plans.popitem(last=False)

    def plan(self, plan_id):
        """A kept plan; KeyError if it was never loaded or was evicted."""
        return self._plans[plan_id]

    # -- runs ---------------------------------------------------------------

    def run(self, run_id, plan, channels=None, trace=False,
            copy_outputs=True, epoch=None, clock=None, conditions=None):
        """Run ``plan`` (a `NodePlan`, or the id of a loaded one) as run
        ``run_id`` on ``clock`` (None: real time); its `RunResult`.
        ``epoch``: the JobRunner epoch this run is the node's part of (for
        `Epoch` faults), or None; ``conditions``: the node's
        `NodeConditions` in this run (slowdown, links), or None.  Raises
        what the run raised: `TaskFailedError`, `Cancelled`, ..."""
        if not isinstance(plan, NodePlan):
            plan = self.plan(plan)
        # what ops.NodeIndex() / ops.NodeCount() give in this run
        self._resources["instance"] = plan.instance_of(self.name)
        self._begin(run_id, channels, trace, clock, conditions,
                    self._queue_writers(plan))
        start = time.perf_counter()
        marked = current.enter(self)   # output of this thread is ours
        try:
            if self.faults is not None and epoch is not None:
                self.faults.at_run(epoch)
            outputs = run_node_plan(plan, self.workspace, self._rc,
                                    copy_outputs=copy_outputs)
        except BaseException:
            # whatever of the run still runs (a timer thread, a branch
            # stuck in a wait) stops now
            self.cancelled.set()
            raise
        finally:
            current.leave(marked)
            self._current = None  # a late cancel of it now does nothing
            self._rc.clock = REAL_TIME  # the run's scheduler is not kept
        return RunResult(outputs, time.perf_counter() - start,
                         self._rc.trace)

    def _queue_writers(self, plan):
        """`queue_writers` of ``plan``, worked out once per plan."""
        found = self._writers.get(plan)
        if found is None:
            found = self._writers[plan] = queue_writers(plan)
        return found

    def _begin(self, run_id, channels, trace, clock, conditions, writers):
        links = None
        if conditions and (conditions.outgoing or conditions.incoming):
            start = clock.now_ns() if clock is not None else self._now_ns()
            links = RunLinks(conditions, start, self._now_ns)
        with self._lock:
            self._current = run_id
            self._rc.begin(trace, clock)
            self._rc.slowdown = conditions.slowdown if conditions else 1.0
            self._hub.begin(channels, links, writers)
            if self._cancelled_upto >= run_id:
                self.cancelled.set()

    def cancel(self, run_id=None):
        """Cancel run ``run_id`` and every earlier one (None: whatever runs
        now, and nothing later).  Safe from any thread."""
        with self._lock:
            if run_id is not None:
                self._cancelled_upto = max(self._cancelled_upto, run_id)
            if self._current is not None and \
                    (run_id is None or self._current <= run_id):
                self.cancelled.set()

    @property
    def running(self):
        """The id of the run in progress, or None."""
        return self._current

    # -- the global workspace -----------------------------------------------

    def fetch(self, name):
        """The array ``name`` holds in the global workspace, or None."""
        return self.workspace.get_or_none(str(name))

    def feed(self, name, value):
        self.workspace.set(str(name), value)

    def blobs(self):
        return sorted(self.workspace.local_names())

    def has(self, name):
        return self.workspace.has(str(name))

    def close(self):
        """Cancel what runs and drop the workspace; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.cancel()
        self._plans.clear()
        self.cancelled.close()
