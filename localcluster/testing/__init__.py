"""The testing kit: test the scheduling semantics of your own jobs.

- Fault plans (`FaultPlan` of `Kill`, `Hang`, `Delay`, `FailCheckpoint` at
  `Epoch`, `Op` or `Step`), taken by every session as ``faults=``.
- Hypothesis strategies drawing task groups and jobs with the values a
  reference model predicts, fault plans and schedule seeds: import
  `localcluster.testing.strategies` (it needs hypothesis; this package
  does not import it, so it works without).
"""

from ..plan.faults import (Delay, Epoch, FailCheckpoint, FaultPlan, Fired,
                           Hang, Kill, Op, Step)

__all__ = ["FaultPlan", "Kill", "Hang", "Delay", "FailCheckpoint", "Epoch",
           "Op", "Step", "Fired"]
