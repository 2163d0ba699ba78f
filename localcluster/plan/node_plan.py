"""Per-node plans: the data that crosses the Session boundary.

`TaskGroup.node_plans` folds a group into one `NodePlan` per node; a
session hands each to the runtime of its node (a thread, a process) and
gets the output values back.  Pure, picklable data.
"""

import enum

from ..errors import PlanError

__all__ = ["WorkspaceType", "NodePlan", "as_workspace_type"]


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


class NodePlan:
    """What a session hands the runtime for one node of one group run."""

    __slots__ = ("node", "step", "workspace_type", "outputs", "node_kwargs",
                 "__weakref__")

    def __init__(self, node, step, workspace_type, outputs, node_kwargs=None):
        self.node = node
        self.step = step
        self.workspace_type = workspace_type
        self.outputs = tuple(outputs)
        self.node_kwargs = dict(node_kwargs or {})  # cpus, memory_limit, env

    def __getstate__(self):
        return (self.node, self.step, self.workspace_type, self.outputs,
                self.node_kwargs)

    def __setstate__(self, state):
        (self.node, self.step, self.workspace_type, self.outputs,
         self.node_kwargs) = state

    def __repr__(self):
        return f"NodePlan({self.node!r}, {self.step!r}, {self.workspace_type})"
