"""The Session boundary: a runnable goes in, per-node plans go out.

``Session.run(runnable)`` compiles the runnable to a `TaskGroup` (a Task,
step, net or list of nets becomes a one-task group, GLOBAL unless
``workspace_type`` says otherwise), folds it into one `NodePlan` per node,
hands the plans to ``_run_plans`` -- the one thing a concrete session
implements, besides blob access -- and sets the values that come back on
the group's `TaskOutput`s.

Every session takes ``log_dir`` and ``log_echo`` (`_nodelogs`): each
node's output appended to ``<log_dir>/<node>.log`` with a header at each
start of its process, and which nodes' output is shown on this process's
terminal; ``node_pids()`` says which process each node runs in.

Session states are an enum: OPEN -> CLOSED (you closed it) or BROKEN (a
failure it could not recover from, e.g. a thread that would not stop);
both refuse further runs with `SessionClosedError` saying which.
"""

import enum
import logging
import threading
import time
import weakref

from ..errors import (BlobNotFoundError, PlanError, RunTimeoutError,
                      SessionClosedError)
from ..plan.builder import NetBuilder
from ..plan.conditions import as_conditions
from ..plan.faults import Kill, as_fault_plan
from ..plan.instances import expand_nodes, expand_plans, instance_names
from ..plan.net import Net, plan_epoch
from ..plan.node_plan import WorkspaceType, as_workspace_type
from ..plan.step import ExecutionStep, to_execution_step
from ..plan.preflight import check_queue_ends
from ..plan.validate import check_seconds
from ..runtime.procstats import process_stats
from ..task import Cluster, Task, TaskGroup
from ._conditions import RunConditions, timeout_note
from ._nodelogs import LogOptions

__all__ = ["Session", "SessionState"]

log = logging.getLogger(__name__)


class SessionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"
    BROKEN = "broken"


class Session:
    """Base of every session; see the module docstring."""

    def __init__(self, faults=None, conditions=None, log_dir=None,
                 log_echo=True):
        #: where node output goes: ``log_dir`` (per-node files) and
        #: ``log_echo`` (which nodes are shown here), checked now
        #: (`_nodelogs`)
        self.log_options = LogOptions(log_dir, log_echo)
        #: the `FaultPlan` this session fires (None: no faults)
        self.faults = as_fault_plan(faults, type(self).__name__)
        #: the `Link` and `Slowdown` conditions of every run (after the
        #: links of the job's Cluster: these win)
        self.conditions = as_conditions(conditions, type(self).__name__)
        self._conds = RunConditions(self.conditions, self.faults)
        #: ``{node: NodeConditions}`` of the run in progress, or None
        self.run_conditions = None
        #: the virtual seconds the last run took under a deterministic
        #: schedule (None without one)
        self.last_run_simulated_seconds = None
        self._fault_times = None   # the fault book's times: the session's
        self._fault_seen = set()
        #: the JobRunner epoch the run in progress is part of (the runner
        #: sets it around each epoch's run), else None
        self.current_epoch = None
        self._state = SessionState.OPEN
        self._broken_reason = None
        self._run_lock = threading.RLock()
        self._compiled = weakref.WeakKeyDictionary()
        self._plans = weakref.WeakKeyDictionary()  # group -> (epoch, plans)
        #: ``{node: seconds}`` of the last run: when each node finished,
        #: counted from the start of the run
        self.last_run_seconds = {}
        self._run_started = time.monotonic()
        self._nodes_of_run = ()   # the nodes of the run in progress
        #: set True to record step spans: ``last_run_trace`` then holds
        #: ``{node: [(step, task, thread, start, end), ...]}`` of the last
        #: run (times in `time.time` seconds)
        self.trace_steps = False
        self.last_run_trace = {}
        #: ``{node: the PRIVATE plans it ran}`` (weakly): what a fetch of a
        #: blob such a run made, and dropped, says
        self._private_plans = {}
        #: ``{name: N}`` of the node prototypes this session has run
        self._prototypes = {}

    # -- lifecycle ------------------------------------------------------------------

    def is_open(self):
        return self._state is SessionState.OPEN

    def _check_open(self):
        if self._state is SessionState.CLOSED:
            raise SessionClosedError(
                f"{type(self).__name__} is closed; open a new session")
        if self._state is SessionState.BROKEN:
            raise SessionClosedError(
                f"{type(self).__name__} is broken and cannot run: "
                f"{self._broken_reason}; close it and open a new session")

    def _mark_broken(self, reason):
        log.warning("%s broken: %s", type(self).__name__, reason)
        self._state = SessionState.BROKEN
        self._broken_reason = reason

    def close(self):
        """Release everything the session holds; idempotent."""
        if self._state is not SessionState.CLOSED:
            try:
                self._close()
            finally:
                self._state = SessionState.CLOSED

    def _close(self):
        pass

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc):
        self.close()

    # -- running ------------------------------------------------------------------------

    def compile(self, runnable, workspace_type=None):
        """The TaskGroup this session runs for ``runnable``."""
        workspace_type = as_workspace_type(workspace_type, "Session.run")
        if runnable is None:
            raise PlanError("Session.run got None; pass a TaskGroup, Task, "
                            "ExecutionStep, Net or list of nets")
        if isinstance(runnable, TaskGroup):
            if workspace_type is not None and runnable.workspace_type() \
                    is not workspace_type and runnable.num_registered_tasks():
                raise PlanError(
                    f"{runnable!r} is {runnable.workspace_type()} but run() "
                    f"asked for {workspace_type}; leave workspace_type out")
            return runnable
        wtype = workspace_type
        if wtype is None and isinstance(runnable, Task):
            wtype = runnable.requested_workspace_type
        wtype = wtype or WorkspaceType.GLOBAL
        cacheable = isinstance(runnable, (Task, ExecutionStep, Net,
                                          NetBuilder))
        if cacheable:
            found = self._compiled.get(runnable, {}).get(wtype)
            if found is not None:
                return found
        group = TaskGroup(workspace_type=wtype)
        if isinstance(runnable, Task):
            _solo_copy(runnable, group, wtype)
        else:
            if not isinstance(runnable, (Net, ExecutionStep, NetBuilder,
                                         list, tuple)):
                raise PlanError(
                    f"cannot run {type(runnable).__name__} {runnable!r}; pass"
                    " a TaskGroup, Task, ExecutionStep, Net, NetBuilder or "
                    "list of nets")
            Task(step=to_execution_step(runnable, "runnable"), group=group,
                 workspace_type=wtype)
        if cacheable:
            self._compiled.setdefault(runnable, {})[wtype] = group
        return group

    def run(self, runnable, workspace_type=None, timeout=None):
        """Run ``runnable``; returns when every node is done.

        Raises `TaskFailedError`, `NodeFailedError` or `RunTimeoutError`
        (``timeout`` in seconds) -- the session stays usable after them
        unless ``is_open()`` turns False.
        """
        self._check_open()
        check_seconds(timeout)
        group = self.compile(runnable, workspace_type)
        plans, outputs = self._node_plans(group)
        with self._run_lock:
            self._check_open()
            log.debug("running %d node plan(s)", len(plans))
            self.last_run_seconds = {}
            self.last_run_trace = {}
            self.last_run_simulated_seconds = None
            self.run_conditions = self._conds.of_run(group, plans,
                                                     self.current_epoch)
            self._conds.fired(self.faults, self._fault_seen)
            self._run_started = time.monotonic()
            self._nodes_of_run = tuple(p.node for p in plans)
            self._note_private(plans)
            try:
                results = self._run_plans(plans, timeout)
            except RunTimeoutError as exc:
                note = timeout_note(self._conds.last_partitions)
                if not note:
                    raise
                raise RunTimeoutError(str(exc) + note, nodes=exc.nodes,
                                      killed=exc.killed,
                                      starting=exc.starting) from None
            finally:
                self._nodes_of_run = ()
                self.run_conditions = None
                self._sync_faults()
        for node, count, output in outputs:
            if count is None:
                values = results[node]
                output.set([values[n] for n in output.names])
            else:   # a prototype's: each blob's values, by instance
                each = [results[i] for i in instance_names(node, count)]
                output.set([[values[n] for values in each]
                            for n in output.names])

    def validate(self, runnable, workspace_type=None):
        """Check ``runnable`` as `run` would before it starts anything, and
        start nothing: a queue no task of the group writes, a condition
        naming no node of the job, a plan that cannot be sent -- each
        raises here what `run` would.  Like a run, it fixes the group (a `JobRunner`
        validates every group of its Job before it runs one)."""
        self._check_open()
        group = self.compile(runnable, workspace_type)
        plans, _ = self._node_plans(group)
        self._check_plans(group, plans)

    def _check_plans(self, group, plans):
        """What a run of ``plans`` checks before it starts (see
        `validate`); a session that sends plans adds their packing."""
        self._conds.check(group, plans)

    def _note_private(self, plans):
        for plan in plans:
            if plan.workspace_type is WorkspaceType.PRIVATE:
                self._private_plans.setdefault(
                    plan.node, weakref.WeakSet()).add(plan)

    def _blob_not_found(self, name, node):
        """The `BlobNotFoundError` of fetching ``name`` from the global
        workspace of ``node``, which has run: no run wrote it -- or a
        PRIVATE group's run writes it, made it in the group's workspace
        and dropped it with it, and the error says so."""
        hint = "no run on that node wrote it"
        for plan in list(self._private_plans.get(str(node), ())):
            writer = plan.writer_of(str(name))
            if writer is not None:
                net, op_type = writer
                hint = (
                    f"op {op_type} of net {net!r} writes it in a run of a "
                    "PRIVATE group, whose new blobs are dropped with the "
                    "group's workspace when the run ends; make it in a "
                    "GLOBAL group (the init group, say) to keep it, or "
                    "fetch it as an output (task.add_output(blob), then "
                    "output.fetch())")
                break
        return BlobNotFoundError(name, node, hint)

    def _not_running(self, name, node, why):
        """The `BlobNotFoundError` of fetching ``name`` from ``node``,
        which has no runtime here (``why``); for the name of a prototype,
        it names the instances that hold blobs instead."""
        count = self._prototypes.get(str(node))
        if count is not None:
            why = (f"{node!r} is a node prototype; its {count} instances "
                   f"{node}_0 .. {node}_{count - 1} hold the blobs: fetch "
                   f"from one of them, e.g. node='{node}_0'")
        return BlobNotFoundError(name, node, why)

    def _sync_faults(self):
        """Add the faults that fired since the last look to the plan's
        ``fired()``; returns them."""
        times = self._fault_times
        if times is None:
            return []
        new = []
        for index in range(len(times)):
            when = float(times[index])
            if when and index not in self._fault_seen:
                self._fault_seen.add(index)
                new.append(self.faults.record(index, when))
        return new

    def _kill_fault_on(self, node):
        """The `Kill` fault that fired on ``node`` (what a dead node's
        error names), or None."""
        killed = [f.fault for f in self._sync_faults()
                  if f.node == node and isinstance(f.fault, Kill)]
        return killed[-1] if killed else None

    def running_nodes(self):
        """The nodes of the run in progress that have not finished yet,
        in plan order (``[]`` between runs).  Safe to call from any thread
        while another runs: what a progress display shows as busy."""
        nodes, done = self._nodes_of_run, self.last_run_seconds
        return [n for n in nodes if n not in done]

    def _node_done(self, node):
        """Sessions call this as each node of a run finishes."""
        self.last_run_seconds[node] = time.monotonic() - self._run_started

    def _node_plans(self, group):
        """``group.node_plans()`` -- a prototype's expanded into its
        instances' -- and the group's ``(node, instances, TaskOutput)``
        triples (instances: a prototype's N, else None), made once while
        no net changes."""
        cached = self._plans.get(group)
        if cached is not None and cached[0] == plan_epoch():
            return cached[1]
        folded = group.node_plans()
        self._prototypes.update((p.node, p.count) for p in folded
                                if p.count is not None)
        plans = expand_plans(folded)
        check_queue_ends(plans, repr(group))
        outputs = [(task.node, task.node_kwargs.get("num_instances"),
                    output)
                   for task in group.tasks_by_node().tasks()
                   for output in task.outputs()]
        self._plans[group] = (plan_epoch(), (plans, outputs))
        return plans, outputs

    def _run_plans(self, plans, timeout):
        """Run the plans concurrently; return ``{node: {blob: value}}``."""
        raise NotImplementedError

    def _nodes_wanted(self, nodes):
        """``{name: Node options}`` of ``nodes`` (names, or a Cluster;
        None: ``Cluster.current()``'s), for a session that starts nodes
        ahead of a run."""
        self._check_open()
        if nodes is None or isinstance(nodes, Cluster):
            cluster = nodes or Cluster.current()
            kwargs = cluster.node_kwargs()
            names = cluster.nodes()
        else:
            names = [str(n) for n in nodes]
            kwargs = Cluster.current().node_kwargs()
        # a prototype's name stands for its instances
        return expand_nodes(names, lambda n: kwargs.get(n, {}))

    @property
    def log_dir(self):
        """The absolute directory of the node logs, or None."""
        return self.log_options.log_dir

    def log_path(self, node):
        """The file ``node``'s output is appended to (whether it exists
        yet or not), or None without a ``log_dir``."""
        return self.log_options.path(node)

    # -- blobs ----------------------------------------------------------------------

    def node_pids(self):
        """``{node: pid}`` of the process each started node runs in."""
        raise NotImplementedError

    def node_stats(self):
        """``{node: {"pid", "cpu_seconds", "rss_bytes", "peak_rss_bytes",
        "age_seconds"}}`` of each started node's process (nodes of one
        process share its figures)."""
        stats = {node: process_stats(pid)
                 for node, pid in self.node_pids().items()}
        return {node: s for node, s in stats.items() if s is not None}

    def fetch_blob(self, name, node="local", copy=True):
        raise NotImplementedError

    def feed_blob(self, name, value, node="local"):
        raise NotImplementedError

    def blobs(self, node="local"):
        raise NotImplementedError

    def has_blob(self, name, node="local"):
        raise NotImplementedError


def _solo_copy(task, group, wtype):
    """A Task that runs ``task``'s step and outputs inside ``group``.

    The user's task keeps its own group; the copy shares its step and
    TaskOutput objects, so ``output.fetch()`` works after the run.
    """
    solo = Task(step=task.get_step(), node=task.node, group=group,
                name=task.name.split("/", 1)[1], workspace_type=wtype)
    solo.cluster = task.cluster
    for output in task.outputs():
        solo.add_output(output)
    return solo
