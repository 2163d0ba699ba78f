"""Per-node plans: the data that crosses the Session boundary.

`TaskGroup.node_plans` folds a group into one `NodePlan` per node; a
session hands each to the runtime of its node (a thread, a process) and
gets the output values back.  Pure, picklable data.  What a node may be
called and the options it may carry are checked here, for ``Node(...)``
and for the nodes a group is folded onto alike.
"""

import enum

from ..errors import PlanError

__all__ = ["WorkspaceType", "NodePlan", "as_workspace_type",
           "NODE_OPTIONS", "check_node_name", "check_node_options",
           "process_options", "check_num_instances"]

#: the options a node may carry (NodePlan.node_kwargs); ``num_instances``
#: makes the node a prototype (`localcluster.plan.instances`)
NODE_OPTIONS = ("cpus", "memory_limit", "env", "resources", "placement",
                "slowdown", "num_instances")


#: options that hold for a run, not for the process a node runs in
RUN_OPTIONS = ("slowdown", "num_instances")


def process_options(kwargs):
    """``kwargs`` without the options each run applies anew (`RUN_OPTIONS`):
    what a node's process (or actor) is started with."""
    return {k: v for k, v in (kwargs or {}).items() if k not in RUN_OPTIONS}


class WorkspaceType(enum.Enum):
    """Where a group's new blobs live.

    PRIVATE: in a child workspace of the node's, discarded after the run
    (writes to blobs the node already had persist).  GLOBAL: in the node's
    workspace, persisting across runs.
    """
    PRIVATE = "private"
    GLOBAL = "global"

    def __str__(self):
        return self.name


def as_workspace_type(value, what):
    if value is None or isinstance(value, WorkspaceType):
        return value
    if isinstance(value, str) and value.upper() in WorkspaceType.__members__:
        return WorkspaceType[value.upper()]
    raise PlanError(
        f"{what}: workspace_type must be WorkspaceType.PRIVATE or "
        f"WorkspaceType.GLOBAL, got {value!r}")


def check_node_name(name):
    """``name`` if it may name a node, else `PlanError`."""
    if not name or "/" in name:
        raise PlanError(
            f"node name {name!r} is not valid; use a non-empty name without "
            "'/' such as 'trainer_0'")
    return name


def check_node_options(name, kwargs):
    """Raise `PlanError` unless ``kwargs`` are valid options of node
    ``name`` (see `NODE_OPTIONS`)."""
    unknown = sorted(set(kwargs) - set(NODE_OPTIONS))
    if unknown:
        raise PlanError(
            f"Node({name!r}) got unknown option(s) "
            f"{', '.join(unknown)}; options are {', '.join(NODE_OPTIONS)}")
    count = kwargs.get("num_instances")
    if count is not None:
        check_num_instances(name, count)
    cpus = kwargs.get("cpus")
    if cpus is not None and not _cpu_ids(cpus) and not (
            count is not None and isinstance(cpus, (list, tuple)) and cpus
            and all(_cpu_ids(c) for c in cpus)):
        raise PlanError(
            f"Node({name!r}): cpus must be a non-empty list of CPU ids"
            + (" (or, for a prototype, a list of such lists, spread over "
               "its instances)" if count is not None else "")
            + f", got {cpus!r}")
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
    _check_engine_options(name, kwargs)
    if kwargs.get("slowdown") is not None:
        from .conditions import check_slowdown
        check_slowdown(kwargs["slowdown"], f"Node({name!r}, slowdown)")


def _cpu_ids(cpus):
    return isinstance(cpus, (list, tuple)) and bool(cpus) and all(
        isinstance(c, int) and not isinstance(c, bool) and c >= 0
        for c in cpus)


def check_num_instances(name, count):
    """Raise `PlanError` unless ``count`` may be node ``name``'s
    ``num_instances``."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise PlanError(
            f"Node({name!r}): num_instances must be an int >= 1, got "
            f"{count!r}")


def _check_engine_options(name, kwargs):
    """``resources`` and ``placement`` say where an engine's scheduler
    (RaySession) puts the node; the sessions on this machine have one
    place and ignore them."""
    resources = kwargs.get("resources")
    if resources is not None and (not isinstance(resources, dict) or not all(
            isinstance(k, str) and k and isinstance(v, (int, float)) and
            not isinstance(v, bool) and v >= 0
            for k, v in resources.items())):
        raise PlanError(
            f"Node({name!r}): resources must be a dict of resource name to "
            f"an amount >= 0, such as {{'GPU': 1}}, got {resources!r}")
    placement = kwargs.get("placement")
    if placement is not None and not (
            (isinstance(placement, str) and placement) or
            (isinstance(placement, dict) and placement and all(
                isinstance(k, str) and isinstance(v, str)
                for k, v in placement.items()))):
        raise PlanError(
            f"Node({name!r}): placement must be a Ray node id or a dict of "
            f"node labels to values, such as {{'zone': 'a'}}, got "
            f"{placement!r}")


class NodePlan:
    """What a session hands the runtime for one node of one group run.

    A prototype's plan (``node_kwargs["num_instances"]``) is expanded by
    the session into one plan per instance (`plan.instances`): each has
    the instance's name, the prototype's step (the same object), its
    ``index`` and ``count``, and ``origin``, the prototype's plan -- what
    a session that sends plans packs, once for all instances.
    """

    __slots__ = ("node", "step", "workspace_type", "outputs", "node_kwargs",
                 "index", "count", "origin", "__weakref__")

    def __init__(self, node, step, workspace_type, outputs, node_kwargs=None,
                 index=None, count=None, origin=None):
        self.node = node
        self.step = step
        self.workspace_type = workspace_type
        self.outputs = tuple(outputs)
        self.node_kwargs = dict(node_kwargs or {})  # see NODE_OPTIONS
        self.index = index     # an instance's index, else None
        self.count = count if count is not None else \
            self.node_kwargs.get("num_instances")   # a prototype's N
        self.origin = origin   # an instance's prototype plan, else None

    def __getstate__(self):
        return (self.node, self.step, self.workspace_type, self.outputs,
                self.node_kwargs, self.index, self.count)

    def __setstate__(self, state):
        (self.node, self.step, self.workspace_type, self.outputs,
         self.node_kwargs, self.index, self.count) = state
        self.origin = None

    def instance_of(self, node):
        """``(index, count)`` of the instance ``node`` running this plan:
        ``(0, 1)`` for a plain node's plan."""
        if self.count is None:
            return 0, 1
        if self.index is not None:
            return self.index, self.count
        # the prototype's own plan, run by the instance it was sent to
        return int(str(node).rsplit("_", 1)[1]), self.count

    def __repr__(self):
        return f"NodePlan({self.node!r}, {self.step!r}, {self.workspace_type})"

    def writer_of(self, blob):
        """``(net name, op type)`` of the first op of the plan that writes
        ``blob``, or None."""
        for net in self.step.walk_nets():
            for op in net.ops:
                if blob in op.outputs:
                    return net.name, op.type
        return None
