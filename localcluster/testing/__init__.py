"""The testing kit: test the scheduling semantics of your own jobs.

- Fault plans (`FaultPlan` of `Kill`, `Hang`, `Delay`, `FailCheckpoint` at
  `Epoch`, `Op` or `Step`, and `Partition`), taken by every session as
  ``faults=``; cluster conditions (`Link`, `Slowdown`), as
  ``conditions=``.
- Deterministic schedules: ``LocalSession(schedule=seed)`` or
  ``LocalSession(schedule=Schedule(seed, strategy, depth))`` runs one
  branch at a time, in an order a seeded strategy (random, PCT or mixed)
  picks, on a virtual clock;
  ``session.last_schedule`` and ``Schedule.replay(decisions)`` repeat a
  run exactly.  A run whose branches all wait for each other raises
  `DeadlockError`; a replay that does not fit its run,
  `ScheduleDivergedError`.
- Static race analysis: `races(obj)` lists the `Race`\\ s of a Job,
  TaskGroup or Task -- blobs concurrent branches of a node share without
  an atomic op or an order; intended ones go in the options'
  ``allow_races``.
- Job checks (`check_job` and its five checks, each a function of its
  own: `races`, `schedule_independent`, `sessions_agree`,
  `resume_equals_uninterrupted`, `restart_recovers`), each run in a fresh
  process and judged on its own (finite results, ``invariant=``,
  ``expected=``) and against the others; a failure raises
  `JobCheckFailed` with the counter-example (a failing schedule shrunk to
  its fewest preemptions) and a line of Python that replays it; with
  ``conditions=`` they also check that the job's result does not depend
  on the cluster's conditions.
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
