"""Node prototypes: ``Node("trainer", num_instances=N)`` built once, run N
times.

A prototype is a node whose options carry ``num_instances``.  Its tasks
are built and folded once, into one `NodePlan`; a session expands that
plan at run time into the plans of the instances ``trainer_0`` ...
``trainer_{N-1}`` (`expand_plans`), which share the prototype's step and
know their index.  The names are what users name everywhere else (fetch,
faults, conditions, checkpoints, logs).  ``cpus`` given as a list of CPU
lists is spread over the instances (instance ``i`` takes list ``i mod
len``); every other option applies to each instance as it is.
"""

from ..errors import PlanError
from .node_plan import NodePlan

__all__ = ["instance_name", "instance_names", "expand_plans",
           "instance_kwargs", "expand_nodes", "prototype_of"]


def instance_name(prototype, index):
    return f"{prototype}_{index}"


def instance_names(prototype, count):
    """The names of a prototype's instances, in index order."""
    return [f"{prototype}_{i}" for i in range(count)]


def _spread_cpus(cpus):
    return bool(cpus) and all(isinstance(c, (list, tuple)) for c in cpus)


def instance_kwargs(kwargs, index):
    """The options of instance ``index`` of a prototype with options
    ``kwargs``: without ``num_instances``, with its own CPU set."""
    own = {k: v for k, v in kwargs.items() if k != "num_instances"}
    cpus = own.get("cpus")
    if cpus is not None and _spread_cpus(cpus):
        own["cpus"] = list(cpus[index % len(cpus)])
    return own


def expand_plans(plans):
    """``plans`` with every prototype's plan replaced by its instances'
    (in index order); a plain node named like an instance of a prototype
    in the same run is a `PlanError`."""
    if not any(p.count is not None for p in plans):
        return plans
    expanded = []
    for plan in plans:
        if plan.count is None:
            expanded.append(plan)
            continue
        for index in range(plan.count):
            expanded.append(NodePlan(
                instance_name(plan.node, index), plan.step,
                plan.workspace_type, plan.outputs,
                instance_kwargs(plan.node_kwargs, index), index=index,
                count=plan.count, origin=plan))
    _check_unique(plans, expanded)
    return expanded


def _check_unique(plans, expanded):
    if len({p.node for p in expanded}) == len(expanded):
        return
    seen = {}
    for plan in expanded:
        other = seen.get(plan.node)
        if other is not None:
            proto = plan.origin or other.origin
            raise PlanError(
                f"node {plan.node!r} is both a node of its own and instance "
                f"{plan.node!r} of prototype Node({proto.node!r}, "
                f"num_instances={proto.count}); rename one of them")
        seen[plan.node] = plan


def expand_nodes(names, kwargs_of):
    """``{name: options}`` of the nodes ``names`` stand for: a prototype's
    name stands for its instances (``kwargs_of(name)``: its options)."""
    wanted = {}
    for name in names:
        kwargs = kwargs_of(name) or {}
        count = kwargs.get("num_instances")
        if count is None:
            wanted[name] = kwargs
            continue
        for index in range(count):
            wanted[instance_name(name, index)] = instance_kwargs(kwargs,
                                                                 index)
    return wanted


def prototype_of(name, counts):
    """``(prototype, index)`` when ``name`` is an instance of one of the
    prototypes ``counts`` (``{prototype: N}``), else None."""
    head, sep, tail = str(name).rpartition("_")
    if sep and tail.isdigit() and head in counts and \
            int(tail) < counts[head] and str(int(tail)) == tail:
        return head, int(tail)
    return None
