"""Folding tasks into per-node plans: pure functions on plan data.

The task model (`localcluster.task`) calls these to build a task's full
step (`task_step`, for ``Task.get_step``) and to fold a group into one plan
per node (`fold_by_node`, then `to_node_plans` for ``TaskGroup.node_plans``
or grouped Tasks for ``TaskGroup.tasks_by_node``); `localcluster.printer`
calls them to show and check the same plans.  What crosses into this module
is plain values -- names, steps, lists, `TaskPlan` tuples -- never a Task,
Node, TaskGroup or Cluster, so folding a group has no effect on the task
model's global state and this layer does not import it.

Setup nets and reporters are attributes of nets (keys in
`localcluster.plan.setup`); they are lifted out of the nets they were
attached to, each object once however many nets carry it::

    node step = [LOCAL_SETUP init] -> concurrent(local reporters,
                    group report steps, task steps) -> [LOCAL_SETUP exit]
    task step = [TASK_SETUP init] -> instances(
                    [TASK_INSTANCE_SETUP init] -> body (+report steps)
                    -> [TASK_INSTANCE_SETUP exit]) -> [TASK_SETUP exit]

A node's step is itself wrapped as the full step of a task named
``<node>/grouped_by_node``, which labels what runs there in errors.
"""

from typing import NamedTuple

from ..errors import PlanError
from .node_plan import NodePlan, check_node_name
from .setup import (LOCAL_REPORT_STEP, LOCAL_SETUP, REPORT_STEP,
                    TASK_INSTANCE_SETUP, TASK_SETUP)
from .step import ExecutionStep, execution_step

__all__ = ["TaskPlan", "GROUPED_TASK", "NODE_KEYS", "attributes_of",
           "collect_setup", "with_setup", "task_step", "local_report_steps",
           "node_step", "grouped_task_name", "fold_by_node", "to_node_plans"]

#: the name (after ``<node>/``) of the task each node's plan runs as
GROUPED_TASK = "grouped_by_node"

#: attribute keys lifted per node, so also found inside tasks' full steps
NODE_KEYS = (LOCAL_SETUP, LOCAL_REPORT_STEP)


class TaskPlan(NamedTuple):
    """One task's share of a group -- or, folded, one node's.

    ``outputs`` is opaque here (the task model passes TaskOutput objects,
    `to_node_plans` wants blob names): folding concatenates it per node.
    """
    node: str
    step: ExecutionStep
    outputs: tuple = ()
    node_kwargs: dict = None   # cpus, memory_limit, env


# -- lifting attributes -------------------------------------------------------

def attributes_of(roots, key):
    """Attribute ``key`` of the nets under ``roots``, in order.

    A task's full step (``step.task`` set) has had its task-level attributes
    lifted out already, so the walk does not enter it for those keys -- that
    is what keeps a task's setup from running twice when its step is wrapped
    again (grouping, running a Task directly).  Node-level keys
    (`NODE_KEYS`) are found inside task steps: that is where they are.
    """
    found = []
    enter_tasks = key in NODE_KEYS

    def walk(step):
        if step.task is not None and not enter_tasks:
            return
        for net in step.nets:
            found.extend(net.get_attributes(key))
        for sub in step.substeps:
            walk(sub)

    for root in roots:
        walk(root)
    return found


def _once(objects, seen):
    """``objects`` not in ``seen`` (by identity), in order; adds them."""
    out = []
    for obj in objects:
        if id(obj) not in seen:
            seen.add(id(obj))
            out.append(obj)
    return out


def collect_setup(key, roots):
    """(init steps, exit steps) of the SetupNets under ``roots``, each once."""
    inits, exits = [], []
    for obj in _once(attributes_of(roots, key), set()):
        inits.extend(obj.init_nets)
        exits.extend(obj.exit_nets)
    return inits, exits


def with_setup(step, inits, exits, name):
    """``step`` between ``name:init`` and ``name:exit`` steps (as given)."""
    if not inits and not exits:
        return step
    steps = []
    if inits:
        steps.append(execution_step(f"{name}:init", inits))
    steps.append(step)
    if exits:
        steps.append(execution_step(f"{name}:exit", exits))
    return execution_step(name, steps)


# -- one task -----------------------------------------------------------------

def task_step(name, body, num_instances=None):
    """The full step of task ``name`` whose step is ``body`` (None: empty):
    its setup, instances and reporters lifted around it, labelled
    ``task=name`` unless ``body`` is already some task's full step."""
    if body is None:
        return ExecutionStep(name, task=name)
    report_steps = attributes_of([body], REPORT_STEP)
    roots = [body] + report_steps
    task_init, task_exit = collect_setup(TASK_SETUP, roots)
    inst_init, inst_exit = collect_setup(TASK_INSTANCE_SETUP, roots)
    if report_steps:
        body = execution_step(f"{name}:body", report_steps + [body])
    body = with_setup(body, inst_init, inst_exit, f"{name}:instance")
    if num_instances and num_instances > 1:
        body = ExecutionStep(f"{name}:instances", substeps=[body],
                             num_concurrent_instances=num_instances)
    step = with_setup(body, task_init, task_exit, name)
    if step.task is None:  # else it is already a task's full step
        step = step.replace(task=name)
    return step


# -- one node -----------------------------------------------------------------

def local_report_steps(roots):
    """The local reporters (`LOCAL_REPORT_STEP`) under ``roots``, each once,
    with those attached inside other local reporters' steps."""
    seen, found = set(), []
    pending = list(roots)
    while pending:
        pending = _once(attributes_of(pending, LOCAL_REPORT_STEP), seen)
        found.extend(pending)
    return found


def node_step(node, steps):
    """What ``node`` runs for ``steps`` (report steps and tasks' full
    steps): them, concurrently, between the node's LOCAL_SETUP."""
    inits, exits = collect_setup(LOCAL_SETUP, steps)
    if len(steps) == 1:
        body = steps[0]
    else:
        body = ExecutionStep(f"{node}:body", substeps=steps,
                             concurrent_substeps=True)
    return with_setup(body, inits, exits, node)


def grouped_task_name(node):
    return f"{node}/{GROUPED_TASK}"


def _reports_by_node(report_steps, node_map, nodes, owner):
    reports = {}
    for node, step in report_steps:
        node = str(node_map.get(node, node))
        if node not in nodes:
            raise PlanError(
                f"report step {step.name!r} is for node {node!r}, where "
                f"{owner} runs no task; add a task on {node!r} or report"
                " from a node that runs one")
        reports.setdefault(node, []).append(step)
    return reports


def fold_by_node(tasks, report_steps=(), node_map=None, owner="the group"):
    """One `TaskPlan` per node, in order of the nodes' first task.

    ``tasks``: `TaskPlan` of every task of a group (its full step, see
    `task_step`).  ``report_steps``: the group's ``(node, periodic step)``
    pairs.  ``node_map``: ``{node: node it runs on}`` (missing: itself).
    ``owner`` names the group in errors.  A node's plan has the step it
    runs (see the module docstring) as the full step of its grouped task,
    its tasks' outputs concatenated, and their node options merged.
    """
    node_map = node_map or {}
    by_node = {}
    for task in tasks:
        node = check_node_name(str(node_map.get(task.node, task.node)))
        by_node.setdefault(node, []).append(task)
    reports = _reports_by_node(report_steps, node_map, by_node, owner)
    folded = []
    for node, node_tasks in by_node.items():
        task_steps = [t.step for t in node_tasks]
        group_reports = reports.get(node, [])
        steps = (local_report_steps(group_reports + task_steps) +
                 group_reports + task_steps)
        kwargs = {}
        for t in node_tasks:
            kwargs.update(t.node_kwargs or {})
        folded.append(TaskPlan(
            node, task_step(grouped_task_name(node), node_step(node, steps)),
            tuple(o for t in node_tasks for o in t.outputs), kwargs))
    return folded


def to_node_plans(folded, workspace_type):
    """The `NodePlan` of each folded node (``outputs``: blob names)."""
    return [NodePlan(p.node, p.step, workspace_type, p.outputs,
                     p.node_kwargs) for p in folded]
