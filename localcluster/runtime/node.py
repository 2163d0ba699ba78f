"""One node's run of one group: the entry point every session calls.

``run_node_plan(plan, workspace, rc)`` runs a `NodePlan` (what
`TaskGroup.node_plans` produces) against the node's global workspace: a
PRIVATE plan runs in a child workspace that is dropped afterwards, a GLOBAL
plan in the global workspace itself.  It returns the values of the plan's
output blobs, captured before the child workspace is dropped.  Sessions
decide where this runs (a thread, a node process) and how the values
travel back.
"""

import numpy as np

from ..errors import BlobNotFoundError
from ..plan.node_plan import WorkspaceType
from .executor import execute

__all__ = ["run_node_plan"]


def run_node_plan(plan, workspace, rc, copy_outputs=True):
    run_ws = (workspace.child() if plan.workspace_type is WorkspaceType.PRIVATE
              else workspace)
    rc.root_step = plan.step
    execute(plan.step, run_ws, rc)
    outputs = {}
    for name in plan.outputs:
        value = run_ws.get_or_none(name)
        if value is None:
            raise BlobNotFoundError(
                name, rc.node,
                "it is an output of a task, but no blob of that name was in "
                "the task's workspace when the run ended; outputs must be "
                "written by the task itself, not only inside a task instance "
                "or a create_workspace step")
        outputs[name] = np.array(value, copy=True) if copy_outputs else value
    return outputs
