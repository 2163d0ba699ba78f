"""The task model: Cluster, Node, TaskGroup, Task and their outputs.

Users describe *where* work runs with contexts::

    with Cluster(), TaskGroup() as tg:
        with Node('trainer_0'):
            with Task(num_instances=4):
                ...ops DSL...

A `Task` is a step bound to a node, with outputs; a `TaskGroup` is the
unit a session runs: all its tasks start together and the group ends when
the last one ends.  `TaskGroup.tasks_by_node` folds a group into one task
per node -- the per-node plan a session executes -- with setup nets lifted
out of the nets they were attached to:

    node step = [LOCAL_SETUP init] -> concurrent(report steps, task steps)
                -> [LOCAL_SETUP exit]
    task step = [TASK_SETUP init] -> instances(
                    [TASK_INSTANCE_SETUP init] -> body (+report steps)
                    -> [TASK_INSTANCE_SETUP exit]) -> [TASK_SETUP exit]

This module is pure plan: nothing here runs.  Sessions take the grouped
tasks and hand each node's `NodePlan` to the runtime.
"""

import weakref

from .context import DefaultManaged, Managed, build_scope
from .errors import PlanError
from .plan.net import BlobRef, Net, blob_names
from .plan.builder import NetBuilder
from .plan.node_plan import NodePlan, WorkspaceType, as_workspace_type
from .plan.setup import (LOCAL_SETUP, REPORT_STEP, TASK_INSTANCE_SETUP,
                         TASK_SETUP, SetupNets)
from .plan.step import ExecutionStep, execution_step, to_execution_step

__all__ = ["Cluster", "Node", "WorkspaceType", "TaskGroup", "Task",
           "TaskOutput", "final_output", "SetupNets", "NodePlan"]


class Cluster(DefaultManaged):
    """The set of nodes a job uses, with each node's options."""

    def __init__(self):
        self._nodes = []
        self._node_kwargs = {}

    def add_node(self, node):
        name = str(node)
        if name not in self._nodes:
            self._nodes.append(name)
        merged = dict(self._node_kwargs.get(name, {}))
        merged.update(node.kwargs())
        self._node_kwargs[name] = merged

    def nodes(self):
        """Node names, in order of first registration."""
        return list(self._nodes)

    def node_kwargs(self):
        """``{node name: kwargs}`` (cpus, memory_limit, env)."""
        return {k: dict(v) for k, v in self._node_kwargs.items()}

    def __repr__(self):
        return f"Cluster(nodes={self._nodes})"


_NODE_KWARGS = ("cpus", "memory_limit", "env")


class Node(DefaultManaged):
    """A named place where tasks run; ``with Node('trainer'):``."""

    def __init__(self, node="local", **kwargs):
        self._name = str(node)
        if not self._name or "/" in self._name:
            raise PlanError(
                f"node name {self._name!r} is not valid; use a non-empty "
                "name without '/' such as 'trainer_0'")
        unknown = sorted(set(kwargs) - set(_NODE_KWARGS))
        if unknown:
            raise PlanError(
                f"Node({self._name!r}) got unknown option(s) "
                f"{', '.join(unknown)}; options are {', '.join(_NODE_KWARGS)}")
        _check_node_kwargs(self._name, kwargs)
        self._kwargs = kwargs
        Cluster.current().add_node(self)

    def __str__(self):
        return self._name

    def __repr__(self):
        return f"Node({self._name!r}, kwargs={self._kwargs})"

    @property
    def name(self):
        return self._name

    def kwargs(self):
        return dict(self._kwargs)


def _check_node_kwargs(name, kwargs):
    cpus = kwargs.get("cpus")
    if cpus is not None and (not isinstance(cpus, (list, tuple)) or not cpus or
                             not all(isinstance(c, int) and c >= 0
                                     for c in cpus)):
        raise PlanError(
            f"Node({name!r}): cpus must be a non-empty list of CPU ids, got "
            f"{cpus!r}")
    limit = kwargs.get("memory_limit")
    if limit is not None and (isinstance(limit, bool) or
                              not isinstance(limit, int) or limit <= 0):
        raise PlanError(
            f"Node({name!r}): memory_limit must be a positive number of "
            f"bytes, got {limit!r}")
    env = kwargs.get("env")
    if env is not None and (not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise PlanError(
            f"Node({name!r}): env must be a dict of str to str, got {env!r}")


class TaskOutput:
    """An output of a Task: blob names now, fetched values after a run.

    ``get()`` returns the output's BlobRef (or list of them, or the record
    of them); ``fetch()`` returns the value(s) captured when the last run
    that included the task ended.
    """

    def __init__(self, blobs):
        self._schema = None
        if isinstance(blobs, dict):
            self._schema = list(blobs)
            self.names = [BlobRef(b) for b in blobs.values()]
            self._is_scalar = False
        elif isinstance(blobs, str):
            self.names = [BlobRef(blobs)]
            self._is_scalar = True
        else:
            self.names = [BlobRef(b) for b in blob_names(list(blobs),
                                                           "task outputs")]
            self._is_scalar = False
        self._values = None

    def __repr__(self):
        return f"TaskOutput({[str(n) for n in self.names]})"

    def _shape(self, items):
        if self._is_scalar:
            return items[0]
        if self._schema is not None:
            return dict(zip(self._schema, items))
        return list(items)

    def get(self):
        return self._shape(self.names)

    def set(self, values):
        """Called by sessions with the captured values, in name order."""
        if len(values) != len(self.names):
            raise ValueError(
                f"{self!r} expects {len(self.names)} values, got {len(values)}")
        self._values = list(values)

    def fetch(self):
        if self._values is None:
            raise PlanError(
                f"{self!r} has no value yet: run the task (or its group) in a"
                " session first")
        return self._shape(self._values)


class Task(Managed):
    """A step bound to a node, with outputs (see the module docstring)."""

    TASK_SETUP = TASK_SETUP
    TASK_INSTANCE_SETUP = TASK_INSTANCE_SETUP
    REPORT_STEP = REPORT_STEP

    def __init__(self, step=None, outputs=None, workspace_type=None,
                 group=None, node=None, name=None, num_instances=None):
        self.node = str(Node.current(None if node is None else
                                     (node if isinstance(node, Node)
                                      else Node(node))))
        self._group = None
        self.group = TaskGroup.current(group, required=False)
        self.name = _unique_task_name(self.node, self.group, name or "task")
        # The node's options (cpus, memory_limit, env) as registered where
        # the task was built: they travel with the plan to the session.
        self.node_kwargs = Cluster.current().node_kwargs().get(self.node, {})
        if num_instances is not None and (isinstance(num_instances, bool) or
                                          not isinstance(num_instances, int)
                                          or num_instances < 1):
            raise PlanError(
                f"task {self.name!r}: num_instances must be an int >= 1, got "
                f"{num_instances!r}")
        self._num_instances = num_instances
        self._workspace_type = as_workspace_type(workspace_type, self.name)
        self._requested_workspace_type = self._workspace_type
        self._step = None
        self._step_with_setup = None
        self._outputs = []
        self._builder = None
        self._used = False
        if step is not None:
            self.set_step(step)
        if outputs is not None:
            self.add_outputs(outputs)
        if self.group is not None:
            self.group.add(self)

    def __repr__(self):
        return f"Task({self.name!r})"

    # The group holds its tasks; a task refers back weakly, so a finished
    # job is freed by reference counting alone (which frees its names).
    @property
    def group(self):
        return self._group() if self._group is not None else None

    @group.setter
    def group(self, group):
        self._group = weakref.ref(group) if group is not None else None

    # -- the step ----------------------------------------------------------------

    def __enter__(self):
        if self._step is not None:
            raise PlanError(f"{self!r} already has a step; 'with Task():' "
                            "opens a builder only for a task without one")
        self._assert_not_used()
        super().__enter__()
        self._builder = NetBuilder(_fullname=self.name)
        self._builder.__enter__()
        return self

    def __exit__(self, etype, *args):
        builder, self._builder = self._builder, None
        builder.__exit__(etype, *args)
        super().__exit__(etype, *args)
        if etype is None:
            self.set_step(builder)

    def set_step(self, step):
        self._assert_not_used()
        if self._step is not None:
            raise PlanError(f"{self!r} already has a step")
        self._step = to_execution_step(step, default_name=self.name)

    def _assert_not_used(self):
        if self._used:
            raise PlanError(
                f"{self!r} has been used in a run and cannot change; build a "
                "new Task")

    def num_instances(self):
        return self._num_instances

    def workspace_type(self):
        return self._workspace_type

    @property
    def requested_workspace_type(self):
        """The workspace type given when the task was made (None if none):
        what running the task alone uses, whatever its group settled."""
        return self._requested_workspace_type

    # -- outputs -------------------------------------------------------------------

    def add_output(self, output):
        if not isinstance(output, TaskOutput):
            output = TaskOutput(output)
        self._outputs.append(output)
        return output

    def add_outputs(self, outputs):
        if isinstance(outputs, (list, tuple)):
            return [self.add_output(o) for o in outputs]
        return self.add_output(outputs)

    def outputs(self):
        return list(self._outputs)

    def output_list(self):
        """All output blob names, flattened, in order."""
        return [n for o in self._outputs for n in o.names]

    # -- the full step with setup --------------------------------------------------

    def get_step(self):
        """The task's step with its setup, instances and reporters (cached)."""
        if self._step_with_setup is not None:
            return self._step_with_setup
        self._used = True
        if self._step is None:
            self._step_with_setup = ExecutionStep(self.name, task=self.name)
            return self._step_with_setup
        body = self._step
        report_steps = attributes_of([body], REPORT_STEP)
        roots = [body] + report_steps
        task_init, task_exit = collect_setup(TASK_SETUP, roots)
        inst_init, inst_exit = collect_setup(TASK_INSTANCE_SETUP, roots)
        if report_steps:
            body = execution_step(f"{self.name}:body", report_steps + [body])
        body = _with_setup(body, inst_init, inst_exit, f"{self.name}:instance")
        if self._num_instances and self._num_instances > 1:
            body = ExecutionStep(f"{self.name}:instances", substeps=[body],
                                 num_concurrent_instances=self._num_instances)
        step = _with_setup(body, task_init, task_exit, self.name)
        if step.task is None:  # else it is already a task's full step
            step = step.replace(task=self.name)
        self._step_with_setup = step
        return step


def _unique_task_name(node, group, name):
    base = f"{node}/{name}"
    if group is not None:
        used = {t.name for t in group._all_tasks()}
        candidate, i = base, 0
        while candidate in used:
            i += 1
            candidate = f"{base}:{i}"
        return candidate
    scope = build_scope()
    return scope.unique("task", base, "{}:{}") if scope else base


def attributes_of(roots, key):
    """Attribute ``key`` of the nets under ``roots``, in order.

    A task's full step (``step.task`` set) has had its task-level attributes
    lifted out already, so the walk does not enter it for those keys -- that
    is what keeps a task's setup from running twice when its step is wrapped
    again (grouping, running a Task directly).
    """
    found = []

    def walk(step):
        if step.task is not None and key != LOCAL_SETUP:
            return
        for net in step.nets:
            found.extend(net.get_attributes(key))
        for sub in step.substeps:
            walk(sub)

    for root in roots:
        walk(root)
    return found


def collect_setup(key, roots):
    """(init steps, exit steps) of the SetupNets under ``roots``, each once."""
    seen, inits, exits = set(), [], []
    for obj in attributes_of(roots, key):
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        inits.extend(obj.init_nets)
        exits.extend(obj.exit_nets)
    return inits, exits


def _with_setup(step, inits, exits, name):
    if not inits and not exits:
        return step
    steps = []
    if inits:
        steps.append(execution_step(f"{name}:init", inits))
    steps.append(step)
    if exits:
        steps.append(execution_step(f"{name}:exit", exits))
    return execution_step(name, steps)


class TaskGroup(Managed):
    """Tasks that run together; the unit a session runs."""

    LOCAL_SETUP = LOCAL_SETUP

    def __init__(self, workspace_type=None):
        self._workspace_type = as_workspace_type(workspace_type, "TaskGroup")
        self._tasks = []
        self._tasks_to_add = []
        self._report_steps = []
        self._report_nets = {}
        self._remote_nets = []
        self._grouped = None
        self._used = False

    def __repr__(self):
        return (f"TaskGroup({self._workspace_type}, "
                f"{self.num_registered_tasks()} tasks)")

    def _assert_not_used(self):
        if self._used:
            raise PlanError(
                f"{self!r} has been run and cannot change; build a new "
                "TaskGroup")

    def _all_tasks(self):
        return self._tasks + self._tasks_to_add

    def add(self, task):
        self._assert_not_used()
        if not isinstance(task, Task):
            raise PlanError(f"TaskGroup.add needs a Task, got {task!r}")
        if (self._workspace_type is not None and task._workspace_type
                is not None and self._workspace_type != task._workspace_type):
            raise PlanError(
                f"task {task.name!r} is {task._workspace_type} but its group "
                f"is {self._workspace_type}; a group's tasks share one "
                "workspace type")
        if task._workspace_type is None:
            task._workspace_type = self._workspace_type or \
                WorkspaceType.PRIVATE
        if self._workspace_type is None:
            self._workspace_type = task._workspace_type
        if task not in self._tasks_to_add and task not in self._tasks:
            self._tasks_to_add.append(task)
        task.group = self
        return task

    def tasks(self):
        for t in self._tasks_to_add:
            if t not in self._tasks:
                self._tasks.append(t)
        self._tasks_to_add = []
        return list(self._tasks)

    def num_registered_tasks(self):
        return len(self._all_tasks())

    def used_nodes(self):
        used = []
        for t in self._all_tasks():
            if t.node not in used:
                used.append(t.node)
        return used

    def workspace_type(self):
        return self._workspace_type or WorkspaceType.PRIVATE

    def settle_workspace_type(self, default):
        """The group's workspace type -- ``default`` if neither the group
        nor a task of it has chosen one yet (then it is fixed)."""
        if self._workspace_type is None:
            self._workspace_type = as_workspace_type(default, "TaskGroup")
        return self._workspace_type

    def report_step(self, step=None, node=None, interval_ms=1000):
        """Run ``step`` on ``node`` every ``interval_ms`` while the group runs
        there, and once after its tasks end."""
        self._assert_not_used()
        step = to_execution_step(step if step is not None else [])
        step = step.replace(run_every_ms=int(interval_ms))
        self._report_steps.append((str(Node.current(_node(node))), step))
        return step

    def report_net(self, net=None, node=None, report_interval=5):
        """A net run every ``report_interval`` seconds on ``node`` (one per
        node; call again with no net to get it)."""
        node = str(Node.current(_node(node)))
        if net is not None and node in self._report_nets:
            raise PlanError(f"node {node!r} already has a report net")
        if node not in self._report_nets:
            self._report_nets[node] = (net if net is not None
                                       else Net(f"{node}/reporter"),
                                       report_interval)
        return self._report_nets[node][0]

    def add_remote_net(self, net):
        self._remote_nets.append(net)

    def remote_nets(self):
        return list(self._remote_nets)

    def tasks_by_node(self, node_remap=None):
        """One task per node (named ``grouped_by_node``): the per-node plans.

        The first call fixes the group: it cannot change afterwards, and
        later calls must use the same node mapping.
        """
        tasks = self.tasks()
        node_map = {t.node: (node_remap(t.node) if node_remap else t.node)
                    for t in tasks}
        if self._grouped is not None:
            grouped, previous_map = self._grouped
            if previous_map != node_map:
                raise PlanError(
                    f"{self!r} was already grouped with another node_remap")
            return grouped
        self._used = True
        grouped = self.grouped_view(node_map)
        self._grouped = (grouped, node_map)
        return grouped

    def grouped_view(self, node_map=None):
        """What `tasks_by_node` returns, without fixing the group."""
        tasks = self._all_tasks()
        node_map = node_map or {}
        report_steps = list(self._report_steps) + [
            (node, to_execution_step(net).replace(
                run_every_ms=max(1, int(interval * 1000))))
            for node, (net, interval) in self._report_nets.items()]
        by_node = {}
        for t in tasks:
            by_node.setdefault(str(node_map.get(t.node, t.node)), []).append(t)
        reports = {}
        for node, step in report_steps:
            node = str(node_map.get(node, node))
            if node not in by_node:
                raise PlanError(
                    f"report step {step.name!r} is for node {node!r}, where "
                    f"{self!r} runs no task; add a task on {node!r} or report"
                    " from a node that runs one")
            reports.setdefault(node, []).append(step)
        grouped = TaskGroup(workspace_type=self.workspace_type())
        for node, node_tasks in by_node.items():
            steps = reports.get(node, []) + [t.get_step() for t in node_tasks]
            inits, exits = collect_setup(LOCAL_SETUP, steps)
            if len(steps) == 1:
                body = steps[0]
            else:
                body = ExecutionStep(f"{node}:body", substeps=steps,
                                     concurrent_substeps=True)
            step = _with_setup(body, inits, exits, node)
            outputs = [o for t in node_tasks for o in t.outputs()]
            kwargs = {}
            for t in node_tasks:
                kwargs.update(t.node_kwargs)
            grouped_task = Task(step=step, outputs=outputs, node=node,
                                name="grouped_by_node", group=grouped,
                                workspace_type=self.workspace_type())
            grouped_task.node_kwargs = kwargs
        return grouped

    def node_plans(self):
        """The `NodePlan` of every node (what a session sends to nodes)."""
        grouped = self.tasks_by_node()
        return [NodePlan(t.node, t.get_step(), t.workspace_type(),
                         t.output_list(), t.node_kwargs)
                for t in grouped.tasks()]

    def to_task(self, node=None):
        """This group as one task on ``node`` (the current node by default)."""
        node = str(Node.current(_node(node)))
        tasks = self.tasks_by_node(lambda _: node).tasks()
        return tasks[0] if tasks else Task(node=node)


def _node(node):
    if node is None or isinstance(node, Node):
        return node
    return Node(node)


def final_output(blob_or_record):
    """Add ``blob_or_record`` as an output of the current Task (or a new one);
    returns the `TaskOutput`."""
    task = Task.current(required=False)
    if task is None:
        task = Task()
    return task.add_output(blob_or_record)
