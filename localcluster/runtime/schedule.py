"""Deterministic schedules as values: a seed, or decisions to replay.

::

    LocalSession(schedule=7)                      # Schedule(7)
    LocalSession(schedule=Schedule(7, op_seconds=1e-6))
    session.run(group); decisions = session.last_schedule
    LocalSession(schedule=Schedule.replay(decisions)).run(group)  # again

A `Schedule` is plain, picklable data.  Each run of a session under it
gets a fresh `Chooser` (`Schedule.chooser`), which the run's scheduler
(`localcluster.runtime.scheduler`) asks whenever more than one branch of
the run could go on: with a seed it picks one with ``random.Random(seed)``
from the runnable branches ordered by name, so a run's decisions depend
only on the seed, the plan and what the workspaces hold -- not on the run's
place in the session, nor on threads or timing.  A replay, too, starts
from its first decision in every run and follows them one by one; it
raises `ScheduleDivergedError` the moment one of them names a branch that
cannot go on, or when the run needs more than it has.  A run that needs
fewer (a one-branch setup run makes no decision at all) uses the ones it
needs; to replay one run of several, set ``session.schedule`` to the
replay just before it.

A decision is the name of the branch picked, such as
``"trainer_0/trainer_0/task:body:0/sgd:instances:instance:1"``: the node,
then one part per concurrent branching below it (see the scheduler).
Only real choices are recorded -- a point where one branch alone could go
on is not a decision.

``op_seconds`` is how much virtual time each op takes on a node of
slowdown 1 (0 by default: ops take no time; the clock moves only when
every branch waits); ``op_seconds="measured"`` charges each op the real
time it took -- the virtual clock then says how long the run would take
with every node on a core of its own, but which branch goes first depends
on those measurements, so two runs may interleave differently.  A replay
must use the ``op_seconds`` of the run it repeats.
"""

import random

from ..errors import ScheduleDivergedError

__all__ = ["Schedule", "Chooser", "as_schedule"]


class Schedule:
    """``Schedule(seed=0, op_seconds=0.0)``; ``Schedule.replay(decisions)``."""

    __slots__ = ("seed", "decisions", "op_seconds")

    def __init__(self, seed=0, *, op_seconds=0.0):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"Schedule seed must be an int, got {seed!r}")
        self.seed = seed
        self.decisions = None
        self.op_seconds = _op_seconds(op_seconds)

    @classmethod
    def replay(cls, decisions, *, op_seconds=0.0):
        """A schedule that makes exactly ``decisions`` (a run's
        ``session.last_schedule``), in every run."""
        if isinstance(decisions, (str, bytes)) or not all(
                isinstance(d, str) for d in decisions):
            raise TypeError(
                "Schedule.replay takes a list of branch names, as "
                f"session.last_schedule holds; got {decisions!r}")
        schedule = cls(0, op_seconds=op_seconds)
        schedule.seed = None
        schedule.decisions = tuple(decisions)
        return schedule

    @property
    def op_ns(self):
        """Virtual ns per op (0 when ops are measured instead)."""
        if self.op_seconds == "measured":
            return 0
        return int(round(self.op_seconds * 1e9))

    def chooser(self):
        """The decisions of one run."""
        return Chooser(self)

    def __repr__(self):
        extra = f", op_seconds={self.op_seconds!r}" if self.op_seconds else ""
        if self.decisions is None:
            return f"Schedule({self.seed!r}{extra})"
        return f"Schedule.replay({list(self.decisions)!r}{extra})"

    def _key(self):
        return (self.seed, self.decisions, self.op_seconds)

    def __eq__(self, other):
        return isinstance(other, Schedule) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __getstate__(self):
        return self._key()

    def __setstate__(self, state):
        self.seed, self.decisions, self.op_seconds = state


def _op_seconds(value):
    if value == "measured":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not value >= 0 or value == float("inf"):
        raise ValueError(
            f"op_seconds must be a finite number of seconds >= 0 or "
            f"'measured', got {value!r}")
    return float(value)


def as_schedule(value, what="LocalSession(schedule=...)"):
    """``value`` (None, a seed or a `Schedule`) as a Schedule or None."""
    if value is None or isinstance(value, Schedule):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return Schedule(value)
    raise TypeError(
        f"{what} takes a seed (an int) or a localcluster.testing.Schedule, "
        f"got {value!r}")


class Chooser:
    """Picks the next branch of one run (see the module docstring)."""

    def __init__(self, schedule):
        self._replay = schedule.decisions
        self._rng = random.Random(schedule.seed) \
            if schedule.decisions is None else None
        #: the names picked so far, in order: the run's decisions
        self.decisions = []

    def choose(self, ready):
        """One of ``ready`` (branch names, sorted, at least two)."""
        if self._replay is None:
            name = ready[self._rng.randrange(len(ready))]
        else:
            index = len(self.decisions)
            if index >= len(self._replay):
                raise ScheduleDivergedError(
                    f"the replayed schedule has {len(self._replay)} "
                    f"decisions, but this run needs more (branches "
                    f"{ready} could go on); the run differs from the one "
                    "recorded: replay it with the same plan, on a session "
                    "in the same state")
            name = self._replay[index]
            if name not in ready:
                raise ScheduleDivergedError(
                    f"decision {index} of the replayed schedule picks "
                    f"branch {name!r}, which cannot go on here (the "
                    f"branches that can: {ready}); the run differs from the"
                    " one recorded: replay it with the same plan, on a "
                    "session in the same state")
        self.decisions.append(name)
        return name
