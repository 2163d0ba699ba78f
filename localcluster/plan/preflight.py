"""What makes a run unusable however it is scheduled, found before it
starts: a queue nothing writes, and faults naming nodes the job lacks.

A session calls `check_queue_ends` on a group's node plans the first time
it folds them (``Session.run`` and ``Session.validate`` alike), and a
`JobRunner` validates every group of its Job, and the session's fault plan
(`check_fault_nodes`), before it runs the init group -- so a bad epoch
group is refused before init ran and before epoch 0 is checkpointed.

What counts as unusable is what no schedule, timing or data can save
(a queue starts empty and open at every run, so a group's queue is the
group's alone):

- a queue that a task of the group reads and no task of it writes: its
  reader waits for records that never come, and the run ends only by its
  timeout (a queue written in the init group and read in the epoch group
  is this: its records do not outlive the init group's run);
- a fault (`Kill`, `Hang`, `Delay`, `FailCheckpoint`) naming a node no
  group of the job uses: it can never fire.  (A `Partition`'s sides are
  patterns, checked with the session's conditions when a group runs.)

A queue that a group writes and no task of it reads is *not* refused: as
in the job model this API follows, a pipe whose queue nobody reads runs
while its records fit (``capacity``, 100 for a queue `pipe` makes; they
are dropped when the run ends), and a writer past that waits like any
wait, until the run's timeout -- how many records a writer writes is data,
not plan.  Writers and readers may be on any number of nodes
(`localcluster.plan.validate.shared_queues`).
"""

from ..errors import PlanError
from .fault_types import Partition
from .validate import queues_of

__all__ = ["check_queue_ends", "check_fault_nodes"]


def _shown(names):
    names = sorted(names)
    return ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")


def check_queue_ends(plans, owner="its group"):
    """A `PlanError` for the first queue of ``plans`` (a group's node
    plans) that a task reads and none writes; ``owner`` names the group
    in the message."""
    readers, written = {}, set()   # queue id -> reading nodes; queue ids
    for plan in plans:
        for queue, (_, roles) in queues_of(plan).items():
            if "reads" in roles:
                readers.setdefault(queue, set()).add(plan.node)
            if "writes" in roles:
                written.add(queue)
    for queue, nodes in sorted(readers.items()):
        if queue not in written:
            raise PlanError(
                f"queue {queue!r} is read on node(s) {sorted(nodes)} but no "
                f"task of {owner} writes it: a queue starts empty at every "
                "run, so its reader would wait forever; write it in the "
                "group that reads it (a pipe into it, or its writer())")


def check_fault_nodes(faults, nodes):
    """A `PlanError` for the first fault of ``faults`` (a FaultPlan, or
    None) naming a node not in ``nodes`` (the job's): it could never fire.
    """
    if faults is None:
        return
    for fault in faults:
        if not isinstance(fault, Partition) and fault.node not in nodes:
            raise PlanError(
                f"{fault!r} names node {fault.node!r}, which no group of "
                f"the job uses (its nodes: {_shown(nodes)}), so it could "
                "never fire; name a node of the job")
