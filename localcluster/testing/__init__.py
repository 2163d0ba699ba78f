"""The testing kit: test the scheduling semantics of your own jobs.

- Fault plans (`FaultPlan` of `Kill`, `Hang`, `Delay`, `FailCheckpoint` at
  `Epoch`, `Op` or `Step`), taken by every session as ``faults=``.
"""

from ..plan.faults import (Delay, Epoch, FailCheckpoint, FaultPlan, Fired,
                           Hang, Kill, Op, Step)

__all__ = ["FaultPlan", "Kill", "Hang", "Delay", "FailCheckpoint", "Epoch",
           "Op", "Step", "Fired"]
