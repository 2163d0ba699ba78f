"""The task model: Cluster, Node, TaskGroup, Task and their outputs.

Users describe *where* work runs with contexts::

    with Cluster(), TaskGroup() as tg:
        with Node('trainer_0'):
            with Task(num_instances=4):
                ...ops DSL...

A `Task` is a step bound to a node, with outputs; a `TaskGroup` is the
unit a session runs: all its tasks start together and the group ends when
the last one ends.  `TaskGroup.node_plans` folds a group into one
`NodePlan` per node -- what a session hands the runtime -- and
`TaskGroup.tasks_by_node` into one grouped Task per node.  The folding
itself (setup and reporters lifted out of the nets they were attached to)
is `localcluster.plan.grouping`: this module hands it plain values (names,
steps, outputs) and wraps what comes back.  A group's rules that need no
Task -- one workspace type, unique task names, reporters, folding once --
are its `localcluster.plan.group_plan.GroupPlan`.

Building a Node (``Node(...)``, which ``Task(node=...)`` does) registers
it with the current Cluster, and building a Task takes its name in the
build scope; folding, printing and analysing a group do neither, so
looking at a plan never changes it.  This module is pure plan: nothing
here runs.
"""

import weakref

from .context import DefaultManaged, Managed, build_scope
from .errors import PlanError
from .plan.task_output import TaskOutput
from .plan.builder import NetBuilder
from .plan.conditions import Link, as_conditions
from .plan.group_plan import GroupPlan, as_node_plans, periodic_step
from .plan.grouping import TaskPlan, grouped_task_name, task_step
from .plan.instances import expand_nodes, instance_kwargs, prototype_of
from .plan.node_plan import (NodePlan, WorkspaceType, as_workspace_type,
                              check_node_name, check_node_options)
from .plan.setup import (LOCAL_SETUP, REPORT_STEP, TASK_INSTANCE_SETUP,
                         TASK_SETUP, SetupNets)
from .plan.step import to_execution_step

__all__ = ["Cluster", "Node", "WorkspaceType", "TaskGroup", "Task",
           "TaskOutput", "final_output", "SetupNets", "NodePlan"]


class Cluster(DefaultManaged):
    """The set of nodes a job uses, with each node's options, and the
    links between them (`Link` conditions: latency, bandwidth)."""

    def __init__(self, links=None):
        self._nodes = {}   # names, in order of first registration
        self._node_kwargs = {}
        self._prototypes = {}   # name -> num_instances
        self.links = tuple(as_conditions(links, "Cluster"))
        for link in self.links:
            if not isinstance(link, Link):
                raise PlanError(f"Cluster(links=...) takes Link values, got "
                                f"{link!r}")

    def add_node(self, node):
        name = str(node)
        kwargs = node.kwargs()
        if name not in self._nodes and not kwargs and \
                prototype_of(name, self._prototypes):
            return   # an instance of a prototype: its options are its own
        self._nodes.setdefault(name, None)
        merged = dict(self._node_kwargs.get(name, {}))
        merged.update(kwargs)
        self._node_kwargs[name] = merged
        if merged.get("num_instances") is not None:
            self._prototypes[name] = merged["num_instances"]

    def nodes(self):
        """Node names, in order of first registration (a prototype once,
        by its own name: see `instances`)."""
        return list(self._nodes)

    def instances(self):
        """The names of the nodes a session runs, in order: each
        prototype's instances ``<name>_0`` ... in its place."""
        return list(expand_nodes(self._nodes, self._node_kwargs.get))

    def node_kwargs(self):
        """``{node name: kwargs}`` (see `NODE_OPTIONS`)."""
        return {k: dict(v) for k, v in self._node_kwargs.items()}

    def kwargs_of(self, name):
        """Node ``name``'s options (a copy; ``{}`` if it has none): one
        node's, where a task needs them -- not every node's per task.  An
        instance of a prototype has the prototype's (`instance_kwargs`)."""
        found = self._node_kwargs.get(name)
        if found is not None:
            return dict(found)
        instance = prototype_of(name, self._prototypes)
        if instance is not None:
            return instance_kwargs(self._node_kwargs[instance[0]],
                                   instance[1])
        return {}

    def __repr__(self):
        return f"Cluster(nodes={list(self._nodes)})"


class Node(DefaultManaged):
    """A named place where tasks run; ``with Node('trainer'):``.

    ``Node('trainer', num_instances=N)`` is a prototype: its tasks are
    built once, and every session runs N instances of it, named
    ``trainer_0`` ... ``trainer_{N-1}`` (see `localcluster.plan.instances`).
    """

    def __init__(self, node="local", num_instances=None, **kwargs):
        self._name = check_node_name(str(node))
        if num_instances is not None:
            kwargs["num_instances"] = num_instances
        check_node_options(self._name, kwargs)
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

    @property
    def num_instances(self):
        """N of a prototype, else None."""
        return self._kwargs.get("num_instances")


class Task(Managed):
    """A step bound to a node, with outputs (see the module docstring)."""

    TASK_SETUP = TASK_SETUP
    TASK_INSTANCE_SETUP = TASK_INSTANCE_SETUP
    REPORT_STEP = REPORT_STEP

    def __init__(self, step=None, outputs=None, workspace_type=None,
                 group=None, node=None, name=None, num_instances=None):
        node = str(Node.current(None if node is None else
                                (node if isinstance(node, Node)
                                 else Node(node))))
        group = TaskGroup.current(group, required=False)
        # The node's options (cpus, memory_limit, env) as registered where
        # the task was built: they travel with the plan to the session,
        # which also finds the cluster's links through the task.
        cluster = Cluster.current()
        self._init(node, group, _unique_task_name(node, group, name or "task"),
                   cluster.kwargs_of(node), num_instances, workspace_type)
        self.cluster = cluster
        if step is not None:
            self.set_step(step)
        if outputs is not None:
            self.add_outputs(outputs)
        if self.group is not None:
            self.group.add(self)

    def _init(self, node, group, name, node_kwargs, num_instances,
              workspace_type):
        self.node = node
        self._group = None
        self.group = group
        self.name = name
        self.node_kwargs = node_kwargs
        self.cluster = None
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

    @classmethod
    def _of_folded_node(cls, plan, group, workspace_type):
        """The grouped task of a folded node ``plan`` (a TaskPlan whose
        outputs are TaskOutputs), in ``group``.  Made from plain values:
        its node is not registered with the current Cluster, nor its name
        taken in the build scope, as ``Task(...)`` would."""
        task = cls.__new__(cls)
        task._init(plan.node, group, grouped_task_name(plan.node),
                   dict(plan.node_kwargs or {}), None, workspace_type)
        task.set_step(plan.step)
        task.add_outputs(list(plan.outputs))
        group.add(task)
        return task

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
        """The task's step with its setup, instances and reporters (cached).

        The first call fixes the task: it cannot change afterwards."""
        if self._step_with_setup is None:
            self._used = True
            self._step_with_setup = self.planned_step()
        return self._step_with_setup

    def planned_step(self):
        """What `get_step` returns, without fixing the task (for printing
        and analysing a plan that may still change)."""
        if self._step_with_setup is not None:
            return self._step_with_setup
        return task_step(self.name, self._step, self._num_instances)


def _unique_task_name(node, group, name):
    base = f"{node}/{name}"
    if group is not None:
        return group._plan.task_name(base)
    scope = build_scope()
    return scope.unique("task", base, "{}:{}") if scope else base


class TaskGroup(Managed):
    """Tasks that run together; the unit a session runs."""

    LOCAL_SETUP = LOCAL_SETUP

    def __init__(self, workspace_type=None):
        # workspace type, task names, reporters, the folding: plain plan
        self._plan = GroupPlan(workspace_type)
        self._tasks = []
        self._tasks_to_add = []
        self._members = set()  # ids of the tasks of both lists
        self._remote_nets = []
        self._grouped = None   # the TaskGroup tasks_by_node returns
        self._used = False

    def __repr__(self):
        return (f"TaskGroup({self._plan.workspace_type}, "
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
        task._workspace_type = self._plan.join(task._workspace_type,
                                               task.name)
        if id(task) not in self._members:
            self._members.add(id(task))
            self._plan.add_task(task.name)
            self._tasks_to_add.append(task)
        task.group = self
        return task

    def tasks(self):
        self._tasks += self._tasks_to_add   # add() keeps them apart
        self._tasks_to_add = []
        return list(self._tasks)

    def num_registered_tasks(self):
        return len(self._all_tasks())

    def used_nodes(self):
        """The names of the nodes the group runs on, in order of first use
        (a prototype's instances in its place)."""
        used = {}
        for t in self._all_tasks():
            if t.node not in used:
                used[t.node] = t.node_kwargs
        return list(expand_nodes(used, used.get))

    def workspace_type(self):
        return self._plan.workspace_type or WorkspaceType.PRIVATE

    def settle_workspace_type(self, default):
        """The group's workspace type -- ``default`` if neither the group
        nor a task of it has chosen one yet (then it is fixed)."""
        return self._plan.settle(default)

    def report_step(self, step=None, node=None, interval_ms=1000):
        """Run ``step`` on ``node`` every ``interval_ms`` while the group runs
        there, and once after its tasks end."""
        self._assert_not_used()
        step = periodic_step(step, interval_ms)
        return self._plan.add_report_step(str(Node.current(_node(node))),
                                          step)

    def report_net(self, net=None, node=None, report_interval=5):
        """A net run every ``report_interval`` seconds on ``node`` (one per
        node; call again with no net to get it)."""
        return self._plan.report_net(str(Node.current(_node(node))), net,
                                     report_interval)

    def add_remote_net(self, net):
        self._remote_nets.append(net)

    def remote_nets(self):
        return list(self._remote_nets)

    def tasks_by_node(self, node_remap=None):
        """One task per node (named ``grouped_by_node``): the per-node plans.

        The first call (or `node_plans`) fixes the group: it cannot change
        afterwards, and later calls must use the same node mapping.
        """
        folded, workspace_type = self._fix(node_remap)
        if self._grouped is None:
            self._grouped = self._grouped_tasks(folded, workspace_type)
        return self._grouped

    def grouped_view(self, node_map=None):
        """What `tasks_by_node` returns, without fixing the group (nor its
        tasks): for showing and checking a plan that may still change."""
        folded = self._plan.fold(
            _task_plans(self._all_tasks(), Task.planned_step), node_map,
            repr(self))
        return self._grouped_tasks(folded, self.workspace_type())

    def node_plans(self):
        """The `NodePlan` of every node (what a session sends to nodes);
        fixes the group as `tasks_by_node` does."""
        return as_node_plans(*self._fix(None))

    def _fix(self, node_remap):
        """(per-node TaskPlans, workspace type): the group folded once and
        for all (see `tasks_by_node`); the plans' outputs are TaskOutputs."""
        tasks = self.tasks()
        node_map = {t.node: (node_remap(t.node) if node_remap else t.node)
                    for t in tasks}
        self._used = True   # from now on (already, if fixed before)
        return self._plan.fix(node_map,
                              lambda: _task_plans(tasks, Task.get_step),
                              repr(self))

    @staticmethod
    def _grouped_tasks(folded, workspace_type):
        grouped = TaskGroup(workspace_type=workspace_type)
        for plan in folded:
            Task._of_folded_node(plan, grouped, workspace_type)
        return grouped

    def to_task(self, node=None):
        """This group as one task on ``node`` (the current node by default)."""
        node = str(Node.current(_node(node)))
        tasks = self.tasks_by_node(lambda _: node).tasks()
        return tasks[0] if tasks else Task(node=node)


def _node(node):
    if node is None or isinstance(node, Node):
        return node
    return Node(node)


def _task_plans(tasks, full_step):
    """The `TaskPlan` of each of ``tasks``, its step given by ``full_step``
    (`Task.get_step` to fix them, `Task.planned_step` only to look)."""
    return [TaskPlan(t.node, full_step(t), tuple(t.outputs()), t.node_kwargs)
            for t in tasks]


def final_output(blob_or_record):
    """Add ``blob_or_record`` as an output of the current Task (or a new one);
    returns the `TaskOutput`."""
    task = Task.current(required=False)
    if task is None:
        task = Task()
    return task.add_output(blob_or_record)
