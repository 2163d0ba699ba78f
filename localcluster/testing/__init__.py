"""The testing kit: test the scheduling semantics of your own jobs.

- Fault plans (`FaultPlan` of `Kill`, `Hang`, `Delay`, `FailCheckpoint` at
  `Epoch`, `Op` or `Step`), taken by every session as ``faults=``.
- Job checks (`check_job` and its four checks, each a function of its
  own), raising `JobCheckFailed` with the smallest counter-example and a
  line of Python that replays it.
"""

from .checks import (ALL_CHECKS, JobCheckFailed, check_job,
                     restart_recovers, resume_equals_uninterrupted,
                     schedule_independent, sessions_agree)
from ..plan.faults import (Delay, Epoch, FailCheckpoint, FaultPlan, Fired,
                           Hang, Kill, Op, Step)

__all__ = ["FaultPlan", "Kill", "Hang", "Delay", "FailCheckpoint", "Epoch",
           "Op", "Step", "Fired", "check_job", "sessions_agree",
           "resume_equals_uninterrupted", "restart_recovers",
           "schedule_independent", "ALL_CHECKS", "JobCheckFailed"]
