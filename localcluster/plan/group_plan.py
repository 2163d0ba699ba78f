"""A task group's plan apart from its tasks: its workspace type, its
tasks' names, its reporters, and its folding into per-node plans, fixed
once.

`localcluster.task.TaskGroup` keeps one `GroupPlan` and hands it plain
values: node names (the group resolves ``Node`` contexts itself), steps
and nets for the reporters, and `TaskPlan` tuples made from its tasks --
a Task, Node or TaskGroup never crosses, so this layer does not import
the task model.  What is here are the group's rules that need no Task:

- one workspace type for all a group's tasks: the first one chosen, by
  the group or by a task, holds for the others (`join`), and a group
  nobody chose for settles on the default its runner gives (`settle`);
- a task's name is unique in its group: ``node/name``, else the first
  free ``node/name:i`` (`task_name`; `add_task` notes it taken);
- reporters: periodic steps the group runs on a node beside its tasks
  (``TaskGroup.report_step``, made by `periodic_step`) and at most one
  report net per node, run every so many seconds
  (``TaskGroup.report_net``); `periodic_steps` gives both as the ``(node,
  step)`` pairs `fold_by_node` takes;
- folding (`localcluster.plan.grouping`): `fold` only looks, for printing
  and checking a plan that may still change; `fix` folds once and for
  all -- the plan a group ran is the plan it is -- and asking again with
  another node mapping is a `PlanError`; `as_node_plans` turns what it
  folded into the `NodePlan` of each node, which a session sends there.
"""

from ..errors import PlanError
from .grouping import fold_by_node, to_node_plans
from .net import Net
from .node_plan import WorkspaceType, as_workspace_type
from .step import to_execution_step

__all__ = ["GroupPlan", "periodic_step", "as_node_plans"]


def periodic_step(step, interval_ms):
    """``step`` (a step, net or list of them; None: an empty one) run
    every ``interval_ms`` beside what else runs, and once after it."""
    step = to_execution_step(step if step is not None else [])
    return step.replace(run_every_ms=int(interval_ms))


class GroupPlan:
    """What a TaskGroup holds besides its tasks (see the module docstring).

    ``workspace_type``: the group's, or None while neither the group nor
    a task of it has chosen one."""

    def __init__(self, workspace_type=None):
        self.workspace_type = as_workspace_type(workspace_type, "TaskGroup")
        self._names = set()       # its tasks' (a new task's must differ)
        self._report_steps = []   # (node, periodic step), in order given
        self._report_nets = {}    # node -> (net, interval in seconds)
        self._fixed = None        # (folded, node map, workspace type)

    # -- the workspace type ---------------------------------------------------

    def join(self, task_type, task_name):
        """The workspace type of task ``task_name`` joining the group, its
        own being ``task_type`` (None: not chosen); a group without one
        takes it.  A `PlanError` if the two differ."""
        if (self.workspace_type is not None and task_type is not None
                and self.workspace_type != task_type):
            raise PlanError(
                f"task {task_name!r} is {task_type} but its group "
                f"is {self.workspace_type}; a group's tasks share one "
                "workspace type")
        if task_type is None:
            task_type = self.workspace_type or WorkspaceType.PRIVATE
        if self.workspace_type is None:
            self.workspace_type = task_type
        return task_type

    def settle(self, default):
        """The group's workspace type -- ``default`` if none was chosen
        yet (then it is fixed)."""
        if self.workspace_type is None:
            self.workspace_type = as_workspace_type(default, "TaskGroup")
        return self.workspace_type

    # -- task names -----------------------------------------------------------

    def task_name(self, base):
        """A name for a new task of the group: ``base`` unless a task of
        it has that name, else ``base:1``, ``base:2``..."""
        candidate, i = base, 0
        while candidate in self._names:
            i += 1
            candidate = f"{base}:{i}"
        return candidate

    def add_task(self, name):
        """Note task ``name`` a member: no new task may take its name."""
        self._names.add(name)

    # -- reporters ------------------------------------------------------------

    def add_report_step(self, node, step):
        """Run ``step`` (see `periodic_step`) on ``node``; returns it."""
        self._report_steps.append((node, step))
        return step

    def report_net(self, node, net, interval):
        """``node``'s report net, run every ``interval`` seconds: ``net``
        if given (a node has one: a second is a `PlanError`), else the one
        it has, else a new empty one."""
        if net is not None and node in self._report_nets:
            raise PlanError(f"node {node!r} already has a report net")
        if node not in self._report_nets:
            self._report_nets[node] = (net if net is not None
                                       else Net(f"{node}/reporter"),
                                       interval)
        return self._report_nets[node][0]

    def periodic_steps(self):
        """``[(node, periodic step)]``: the report steps, then each node's
        report net as a step."""
        return list(self._report_steps) + [
            (node, to_execution_step(net).replace(
                run_every_ms=max(1, int(interval * 1000))))
            for node, (net, interval) in self._report_nets.items()]

    # -- folding --------------------------------------------------------------

    def fold(self, tasks, node_map, owner):
        """`fold_by_node` of ``tasks`` (`TaskPlan` of each task, its full
        step) with the group's reporters; ``owner`` names the group in
        errors.  Fixes nothing."""
        return fold_by_node(tasks, self.periodic_steps(), node_map,
                            owner=owner)

    def fix(self, node_map, tasks, owner):
        """``(folded, workspace type)`` of the group, folded once and for
        all: the first call folds what ``tasks()`` returns (the TaskPlans;
        only called then, as making them fixes the tasks), later ones
        return that, and must give the same ``node_map``."""
        if self._fixed is not None:
            folded, previous_map, workspace_type = self._fixed
            if previous_map != node_map:
                raise PlanError(
                    f"{owner} was already grouped with another node_remap")
            return folded, workspace_type
        folded = self.fold(tasks(), node_map, owner)
        self._fixed = (folded, node_map,
                       self.workspace_type or WorkspaceType.PRIVATE)
        return folded, self._fixed[2]


def as_node_plans(folded, workspace_type):
    """The `NodePlan` of each node of what `GroupPlan.fix` returned (what
    a session sends to nodes): the outputs, TaskOutputs, as blob names."""
    return to_node_plans(
        [p._replace(outputs=[n for o in p.outputs for n in o.names])
         for p in folded], workspace_type)
