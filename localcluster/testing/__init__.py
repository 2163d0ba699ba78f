"""The testing kit: test the scheduling semantics of your own jobs.

- Fault plans (`FaultPlan` of `Kill`, `Hang`, `Delay`, `FailCheckpoint` at
  `Epoch`, `Op` or `Step`, and `Partition`), taken by every session as
  ``faults=``; cluster conditions (`Link`, `Slowdown`), as
  ``conditions=``.
- Deterministic schedules: ``LocalSession(schedule=seed)`` or
  ``LocalSession(schedule=Schedule(...))`` runs one branch at a time, in
  an order a seeded generator picks, on a virtual clock;
  ``session.last_schedule`` and ``Schedule.replay(decisions)`` repeat a
  run exactly.  A run whose branches all wait for each other raises
  `DeadlockError`; a replay that does not fit its run,
  `ScheduleDivergedError`.
- Job checks (`check_job` and its four checks, each a function of its
  own), raising `JobCheckFailed` with the smallest counter-example and a
  line of Python that replays it; with ``conditions=`` (a list of
  `Link` and `Slowdown` values, or a strategy drawing them) they also
  check that the job's result does not depend on the cluster's
  conditions.
- Static race analysis: `races` of a Job, TaskGroup or Task lists the
  `Race`s of its plan -- a blob two concurrent branches of a node use,
  one writing, with no atomic op, setup/exit net or queue ordering them
  -- each naming the blob, the node and both ops; a job's intended races
  are its options' ``allow_races=("blob", ...)``.
- Hypothesis strategies drawing task groups and jobs with the values a
  reference model predicts, fault plans, cluster conditions and schedule
  seeds: import
  `localcluster.testing.strategies` (it needs hypothesis; this package
  does not import it, so it works without).
"""

from ..errors import DeadlockError, ScheduleDivergedError
from .checks import (ALL_CHECKS, CheckResult, JobCheckFailed, check_job,
                     races, restart_recovers, resume_equals_uninterrupted,
                     schedule_independent, sessions_agree)
from ..plan.conditions import Link, Slowdown
from ..plan.faults import (Delay, Epoch, FailCheckpoint, FaultPlan, Fired,
                           Hang, Kill, Op, Partition, Step)
from ..runtime.schedule import Schedule
from ._races import Race

__all__ = ["FaultPlan", "Kill", "Hang", "Delay", "FailCheckpoint", "Epoch",
           "Op", "Step", "Partition", "Link", "Slowdown", "Fired", "Schedule",
           "DeadlockError", "ScheduleDivergedError", "check_job", "races",
           "Race", "sessions_agree", "resume_equals_uninterrupted",
           "restart_recovers", "schedule_independent", "ALL_CHECKS",
           "JobCheckFailed", "CheckResult"]
