"""Fault plans: faults to inject into a run, as plain, picklable data.

::

    plan = FaultPlan(Kill("trainer_0", at=Epoch(2)),
                     Delay("reader", at=Op("EnqueueRecords", nth=3),
                           seconds=0.5),
                     FailCheckpoint("ps", epoch=1))
    session = LocalHostScheduler(faults=plan)   # or LocalSession(faults=)

A fault names a node and a trigger point (``at=``): `Epoch` (the node's
part of epoch k -- the run a `JobRunner` makes of the epoch group, counted
by the runner), `Op` (just before the nth op of that type the node runs,
counted since the node started) or `Step` (just before a step of that
name starts, as `printer.to_string` names it).  It fires once per session, in the first run that reaches
it -- a node restarted after a `Kill` does not die again at the same
point, which is what lets ``JobRunner(max_restarts=...)`` recover -- and
``plan.fired()`` lists what fired, with node and time.

What a fault does is carried out inside the node's runtime (never by
patching code), so every session shows the real consequence: `Kill`
SIGKILLs (``how="sigkill"``) or ends (``how="exit"``, exit status 3) a
node process -- under `LocalSession` the same `NodeFailedError`, the
node's workspace dropped as a dead process's is -- or raises an op error
(``how="raise"``); `Hang` stops the node until its run is cancelled (the
run's timeout); `Delay` holds the node for ``seconds``; `FailCheckpoint`
fails the node's save of one epoch.

This module holds the plan: `FaultPlan`, what sessions take, and `Fired`,
what it records.  The faults and trigger points are values of their own
(`localcluster.plan.fault_types`), their text form -- ``str(plan)``,
``FaultPlan.parse``, ``--faults`` -- is `localcluster.plan.fault_text`,
and both are re-exported here, where users import them from.  This is
data only; `localcluster.runtime.faults` fires the faults.
"""

import dataclasses
import threading

from ..errors import PlanError
# SYNTAX: the text syntax, importable from here as it always was
from .fault_text import SYNTAX, fault_text, parse_faults  # noqa: F401
from .fault_types import (EXIT_STATUS, FAULTS, KILL_HOWS, Delay, Epoch,
                          FailCheckpoint, Hang, Kill, Op, Partition, Step)

__all__ = ["Epoch", "Op", "Step", "Kill", "Hang", "Delay", "FailCheckpoint",
           "Partition", "FaultPlan", "Fired", "KILL_HOWS", "EXIT_STATUS"]


@dataclasses.dataclass(frozen=True)
class Fired:
    """A fault that fired: which, on which node, when (`time.time`)."""
    fault: object
    node: str
    time: float


class FaultPlan:
    """``FaultPlan(*faults)``: a value sessions take as ``faults=``.

    Equal plans have equal faults; ``repr`` is the Python that makes the
    plan.  `fired` lists the faults that fired in the sessions given this
    plan, in the order they fired.
    """

    def __init__(self, *faults):
        for fault in faults:
            if not isinstance(fault, FAULTS):
                raise PlanError(
                    f"FaultPlan takes Kill, Hang, Delay, FailCheckpoint and "
                    f"Partition faults, got {fault!r}")
        self.faults = tuple(faults)
        self._fired = []
        self._lock = threading.Lock()

    def __repr__(self):
        return f"FaultPlan({', '.join(map(repr, self.faults))})"

    def __str__(self):
        """The plan in the text syntax `parse` reads (see `parse`)."""
        return "; ".join(map(fault_text, self.faults))

    @classmethod
    def parse(cls, text):
        """A FaultPlan from its text form -- what ``str(plan)`` prints, and
        what ``--faults`` takes: faults separated by ``;``, each one of ::

            kill NODE at TRIGGER [by sigkill|exit|raise]
            hang NODE at TRIGGER
            delay NODE SECONDSs at TRIGGER
            fail-checkpoint NODE at epoch K
            partition NODES from NODES at epoch K|SECONDSs
                [heal at epoch M|SECONDSs]

        where TRIGGER is ``epoch K``, ``op TYPE [nth N]`` or ``step NAME``,
        and a name with spaces or ``;`` is quoted as in a shell.  A
        PlanError names the part it cannot read and the syntax."""
        return cls(*parse_faults(text))

    def __eq__(self, other):
        return isinstance(other, FaultPlan) and self.faults == other.faults

    def __hash__(self):
        return hash(self.faults)

    def __len__(self):
        return len(self.faults)

    def __iter__(self):
        return iter(self.faults)

    def __getstate__(self):
        return {"faults": self.faults, "fired": list(self._fired)}

    def __setstate__(self, state):
        self.faults = state["faults"]
        self._fired = list(state["fired"])
        self._lock = threading.Lock()

    def nodes(self):
        """The node names the faults name (a partition's sides are
        patterns: see `partitions`)."""
        return sorted({f.node for f in self.faults
                       if not isinstance(f, Partition)})

    def partitions(self):
        """``[(index, Partition)]`` of the plan."""
        return [(i, f) for i, f in enumerate(self.faults)
                if isinstance(f, Partition)]

    def fired(self):
        """``[Fired(fault, node, time), ...]``, in the order they fired."""
        with self._lock:
            return sorted(self._fired, key=lambda f: f.time)

    def record(self, index, when):
        """Note that fault ``index`` fired at ``when`` (sessions call it);
        the `Fired` record."""
        fault = self.faults[index]
        fired = Fired(fault, fault.node, when)
        with self._lock:
            self._fired.append(fired)
        return fired


def as_fault_plan(faults, who):
    """``faults`` (None, a FaultPlan, or an iterable of faults) as a
    FaultPlan or None; a PlanError naming ``who`` for anything else."""
    if faults is None or isinstance(faults, FaultPlan):
        return faults
    if isinstance(faults, FAULTS):
        return FaultPlan(faults)
    try:
        return FaultPlan(*faults)
    except TypeError:
        raise PlanError(f"{who}(faults=) takes a FaultPlan, got "
                        f"{faults!r}") from None
