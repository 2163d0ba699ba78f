"""Readable text of plans, and a static check of them.

`to_string` renders a Net, ExecutionStep, Task or TaskGroup (a group is
shown as its per-node plans, exactly what a session runs) as an indented
tree.  `analyze` walks the per-node plans in the order they would run and
raises `PlanError` for a blob read before anything on that node wrote it,
and for a blob written by two steps that run concurrently on one node
(two tasks of a group, or concurrent substeps).

Both only look: they fold groups with `TaskGroup.grouped_view` and
`localcluster.plan.grouping`, which neither fix a group or task (it can
still change and run afterwards) nor register nodes or take names.
"""

import functools

import numpy as np

from .errors import PlanError
from .plan.grouping import TaskPlan, fold_by_node
from .plan.net import Net
from .plan.node_plan import WorkspaceType
from .plan.step import ExecutionStep
from .task import Task, TaskGroup

__all__ = ["to_string", "analyze"]

_INDENT = "  "


# -- to_string ------------------------------------------------------------------

def to_string(obj):
    """Indented text of a Net, ExecutionStep, Task, TaskGroup or Job."""
    lines = []
    _render(obj, 0, lines)
    return "\n".join(lines)


def _render(obj, depth, lines):
    groups = _job_groups(obj)
    if groups is not None:
        lines.append(_INDENT * depth + "Job")
        for label, group in groups:
            if group is not None and group.num_registered_tasks():
                lines.append(_INDENT * (depth + 1) + f"{label}:")
                _render_group(group, depth + 2, lines)
        return
    if isinstance(obj, TaskGroup):
        _render_group(obj, depth, lines)
    elif isinstance(obj, Task):
        _render_task(obj, depth, lines)
    elif isinstance(obj, ExecutionStep):
        _render_step(obj, depth, lines)
    elif isinstance(obj, Net):
        _render_net(obj, depth, lines)
    else:
        raise TypeError(
            f"to_string needs a Net, ExecutionStep, Task, TaskGroup or Job, "
            f"got {type(obj).__name__}")


def _job_groups(obj):
    groups = getattr(type(obj), "printable_groups", None)
    return None if groups is None else obj.printable_groups()


def _render_group(group, depth, lines):
    grouped = group.grouped_view()
    nodes = [t.node for t in grouped.tasks()]
    lines.append(_INDENT * depth +
                 f"TaskGroup ({group.workspace_type()}) on "
                 f"{len(nodes)} node(s): {', '.join(nodes) or '-'}")
    for task in grouped.tasks():
        count = (task.node_kwargs or {}).get("num_instances")
        lines.append(_INDENT * (depth + 1) + f"node {task.node}" + (
            f" (prototype: {count} instances {task.node}_0.."
            f"{task.node}_{count - 1})" if count is not None else "") + ":")
        _render_task(task, depth + 2, lines)


def _render_task(task, depth, lines):
    extra = []
    if task.workspace_type() is not None:
        extra.append(str(task.workspace_type()))
    if task.num_instances():
        extra.append(f"{task.num_instances()} instances")
    head = f"task {task.name}" + (f" ({', '.join(extra)})" if extra else "")
    lines.append(_INDENT * depth + head)
    outputs = task.output_list()
    if outputs:
        lines.append(_INDENT * (depth + 1) + "outputs: " +
                     ", ".join(str(o) for o in outputs))
    _render_step(task.planned_step(), depth + 1, lines)


def _step_options(step):
    opts = []
    if step.num_iter is not None:
        opts.append(f"num_iter={step.num_iter}")
    if step.should_stop_blob:
        opts.append(f"until {step.should_stop_blob}" +
                    (" (once)" if step.only_once else ""))
    if step.concurrent_substeps:
        opts.append("concurrent")
    if step.num_concurrent_instances:
        opts.append(f"{step.num_concurrent_instances} instances")
    if step.create_workspace:
        opts.append("private workspace")
    if step.run_every_ms:
        opts.append(f"every {step.run_every_ms} ms")
    return opts


def _render_step(step, depth, lines):
    opts = _step_options(step)
    lines.append(_INDENT * depth + f"step {step.name}" +
                 (f" [{', '.join(opts)}]" if opts else ""))
    for net in step.nets:
        _render_net(net, depth + 1, lines)
    for sub in step.substeps:
        _render_step(sub, depth + 1, lines)


def _render_net(net, depth, lines):
    lines.append(_INDENT * depth + f"net {net.name}")
    for i, op in enumerate(net.ops):
        args = ", ".join(f"{k}={_arg(v)}" for k, v in sorted(op.args.items()))
        out = ", ".join(op.outputs)
        text = f"{op.type}({', '.join(op.inputs)})"
        if args:
            text += f" {{{args}}}"
        if out:
            text += f" -> {out}"
        lines.append(_INDENT * (depth + 1) + text)


def _arg(value):
    if isinstance(value, np.ndarray):
        if value.ndim > 1 and value.size > 8:  # one line: what, not values
            return f"<{value.dtype} array of shape {list(value.shape)}>"
        return np.array2string(value, threshold=8, separator=", ",
                               max_line_width=1 << 20)
    if isinstance(value, functools.partial):
        # the function and what it is given, not a repr with its address
        given = [_arg(a) for a in value.args] + \
            [f"{k}={_arg(v)}" for k, v in value.keywords.items()]
        return f"{_arg(value.func)}({', '.join(given)})"
    if callable(value):
        return f"{getattr(value, '__module__', '?')}." \
               f"{getattr(value, '__qualname__', repr(value))}"
    return repr(value)


# -- analyze --------------------------------------------------------------------

def analyze(obj):
    """Raise `PlanError` if a blob is read before it is written on its node,
    or written by two steps that run concurrently on one node.

    Accepts a Job, a TaskGroup or a Task.  Nodes keep what earlier groups
    defined (a Job's init group defines what its epoch group reads).
    """
    defined = {}
    groups = _job_groups(obj)
    if groups is not None:
        for _, group in groups:
            if group is not None:
                _analyze_group(group, defined)
    elif isinstance(obj, TaskGroup):
        _analyze_group(obj, defined)
    elif isinstance(obj, Task):
        # as a session runs a Task alone: a group of just it, GLOBAL unless
        # the task says otherwise
        folded = fold_by_node([TaskPlan(obj.node, obj.planned_step())])
        _analyze_plans(folded, obj.workspace_type() or WorkspaceType.GLOBAL,
                       defined)
    else:
        raise TypeError(f"analyze needs a Job, TaskGroup or Task, got "
                        f"{type(obj).__name__}")


def _analyze_group(group, defined):
    plans = [TaskPlan(t.node, t.planned_step())
             for t in group.grouped_view().tasks()]
    _analyze_plans(plans, group.workspace_type(), defined)


def _analyze_plans(plans, wtype, defined):
    """Walk each node's plan, in order; ``defined``: blobs per node so far."""
    for plan in plans:
        node_defined = defined.setdefault(plan.node, set())
        scope = node_defined if wtype is WorkspaceType.GLOBAL \
            else set(node_defined)
        _Walk(plan.node).step(plan.step, scope, None)


class _Walk:
    def __init__(self, node):
        self.node = node

    def step(self, step, defined, task):
        """Walk ``step``; return the blobs it writes that outlive it."""
        task = step.task or task
        private = step.create_workspace or step.num_concurrent_instances
        scope = set(defined) if private else defined
        written = set()
        periodic = [s for s in step.substeps if s.run_every_ms]
        regular = [s for s in step.substeps if not s.run_every_ms]
        for net in step.nets:
            written |= self.net(net, scope)
        if step.concurrent_substeps and len(regular) > 1:
            written |= self.concurrent(step, regular, scope, task)
        else:
            for sub in regular:
                written |= self.step(sub, scope, task)
        for sub in periodic:  # they run once more after the others
            written |= self.step(sub, set(scope), task) & scope
        if private:
            return written & defined
        return written

    def concurrent(self, parent, steps, defined, task):
        seen = {}
        all_new = set()
        for sub in steps:
            scope = set(defined)
            written = self.step(sub, scope, task)
            for name in sorted(written):
                if name in seen:
                    raise PlanError(
                        f"Blob {name} is written by two concurrent steps on "
                        f"node {self.node!r}: {seen[name]!r} and "
                        f"{_label(sub)!r} (in {parent.name!r}); they race -- "
                        "give each its own blob, or run them in order")
                seen[name] = _label(sub)
            all_new |= scope - defined
        defined |= all_new
        return set(seen)

    def net(self, net, defined):
        written = set()
        for i, op in enumerate(net.ops):
            for name in op.inputs:
                if name not in defined:
                    raise PlanError(
                        f"Blob undefined: {name} (read by op {op.type} #{i} "
                        f"of net {net.name!r} on node {self.node!r} before "
                        "anything on that node wrote it)")
            for name in op.outputs:
                defined.add(name)
                written.add(name)
        return written


def _label(step):
    return step.task or step.name
