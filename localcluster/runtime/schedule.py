"""Deterministic schedules as values: a seed and a strategy, or decisions
to replay.

::

    LocalSession(schedule=7)                      # Schedule(7)
    LocalSession(schedule=Schedule(7, strategy="pct", depth=2))
    session.run(group); decisions = session.last_schedule
    LocalSession(schedule=Schedule.replay(decisions)).run(group)  # again
    JobRunner(job, ...).train(session); log = session.schedule_log
    LocalSession(schedule=Schedule.replay(log))   # the whole training again

A `Schedule` is plain, picklable data.  Each run of a session under it
gets a fresh `Chooser` (`Schedule.chooser`), which the run's scheduler
(`localcluster.runtime.scheduler`) asks whenever more than one branch of
the run could go on, the branches ordered by name.  A seeded schedule
explores with one of three strategies:

- ``"random"``: uniformly among the branches that can go on;
- ``"pct"``, probabilistic concurrency testing (Burckhardt et al.,
  ASPLOS 2010): each branch gets a random priority when first seen, the
  highest that can go on runs, and at ``depth - 1`` change points drawn
  uniformly over the run's decisions the branch that runs drops below
  every other -- a bug that needs d ordering constraints among n branches
  and k decisions is found with probability at least 1/(n k^(d-1)); the
  number of decisions is what earlier runs of the same plan in the
  session made (`DEFAULT_ESTIMATE` before one ran);
- ``"mixed"``: random, then pct at depth 1, 2, ... ``depth``, over
  consecutive seeds (`Schedule.kind`) -- what the job checks use, since
  neither alone finds every kind of bug (a lost update needs a switch at
  one of few points, which a random walk makes easily; a starved worker
  needs one branch to run long unswitched, which only PCT does).

Each run's generator is seeded with (seed, run index): the runs of one
session -- the init group, each epoch, each checkpoint save -- explore
different interleavings, and a session's runs depend only on the seed, the
plans and what the workspaces hold, not on threads or timing.  Setting
``session.schedule`` starts the count again.

A replay repeats decisions: one run's (``Schedule.replay(decisions)``,
made again by every run) or a session's (``Schedule.replay(log)``, run i
makes the i-th); it raises `ScheduleDivergedError` the moment a decision
names a branch that cannot go on, or when a run needs more than it has.
``Schedule.switches([(run, decision, branch), ...])`` writes a schedule
down by its switches alone: every other decision lets the branch that
ran last go on (or, if it cannot, the first that can, by name), so a
counter-example shrunk to a few preemptions is a few triples
(`localcluster.testing._check_shrink`).

A decision is the name of the branch picked, such as
``"trainer_0/trainer_0/task:body:0/sgd:instances:instance:1"``: the node,
then one part per concurrent branching below it (see the scheduler).
Only real choices are recorded -- a point where one branch alone could go
on is not a decision -- and points are only where branches can interact:
before an op that uses a queue, a clock, a blob another branch of the
node uses concurrently (one of them writing it), and the like
(`localcluster.plan.races.switch_points`); the ops between run without
one, since any order of them among the other branches' ops gives the
same result.  A decision that switches away from a branch that
could have gone on is a preemption; the chooser counts them.

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

__all__ = ["Schedule", "Chooser", "as_schedule", "STRATEGIES"]

#: the strategies a seeded `Schedule` explores with
STRATEGIES = ("random", "pct", "mixed")

#: the decisions a run of a plan is assumed to make before one has been
#: seen (PCT draws its change points over it).  A run decides only before
#: the ops that can interact with another branch (the scheduler's switch
#: points), a few of a small job's dozens of ops: a larger guess would put
#: most change points past the end of a first run, which then never
#: preempts
DEFAULT_ESTIMATE = 16


class Schedule:
    """``Schedule(seed=0, strategy="random", depth=3, op_seconds=0.0)``;
    ``Schedule.replay(decisions_or_log)``; ``Schedule.switches(...)``."""

    __slots__ = ("seed", "strategy", "depth", "decisions", "log",
                 "switched", "op_seconds")

    def __init__(self, seed=0, strategy="random", depth=3, *,
                 op_seconds=0.0):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"Schedule seed must be an int, got {seed!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"Schedule strategy must be one of "
                             f"{', '.join(map(repr, STRATEGIES))}, got "
                             f"{strategy!r}")
        if isinstance(depth, bool) or not isinstance(depth, int) or \
                depth < 1:
            raise ValueError(f"Schedule depth must be an int >= 1 (the "
                             f"ordering constraints PCT aims at), got "
                             f"{depth!r}")
        self.seed = seed
        self.strategy = strategy
        self.depth = depth
        self.decisions = None
        self.log = None
        self.switched = None
        self.op_seconds = _op_seconds(op_seconds)

    @classmethod
    def replay(cls, decisions, *, op_seconds=0.0):
        """A schedule that makes exactly ``decisions``: one run's (a list
        of branch names, ``session.last_schedule``: every run replays
        them), or a whole session's (a list of such lists,
        ``session.schedule_log``: run i replays the i-th)."""
        if isinstance(decisions, (str, bytes)):
            raise TypeError(_REPLAY_TAKES + f"; got {decisions!r}")
        decisions = list(decisions)
        schedule = cls(0, op_seconds=op_seconds)
        schedule.seed = None
        if decisions and all(isinstance(d, (list, tuple))
                             for d in decisions):
            if not all(isinstance(n, str) for d in decisions for n in d):
                raise TypeError(_REPLAY_TAKES + f"; got {decisions!r}")
            schedule.log = tuple(tuple(d) for d in decisions)
        elif all(isinstance(d, str) for d in decisions):
            schedule.decisions = tuple(decisions)
        else:
            raise TypeError(_REPLAY_TAKES + f"; got {decisions!r}")
        return schedule

    @classmethod
    def switches(cls, switched, *, op_seconds=0.0):
        """A schedule that runs each branch for as long as it can go on,
        except at the decisions ``switched`` names: ``[(run, decision,
        branch), ...]`` -- at decision ``decision`` of the session's run
        ``run`` it picks ``branch`` (when that branch can go on).  Where
        the branch that ran last cannot go on, the first that can, by
        name, goes on.  This is how a shrunk counter-example is written:
        each switch away from a branch that could have gone on is a
        preemption."""
        entries = []
        for entry in switched:
            try:
                run, index, name = entry
            except (TypeError, ValueError):
                raise TypeError(
                    "Schedule.switches takes (run, decision, branch) "
                    f"triples, got {entry!r}") from None
            if not (isinstance(run, int) and isinstance(index, int) and
                    isinstance(name, str)) or run < 0 or index < 0:
                raise TypeError(
                    "Schedule.switches takes (run, decision, branch) "
                    f"triples of ints >= 0 and a branch name, got "
                    f"{entry!r}")
            entries.append((run, index, name))
        schedule = cls(0, op_seconds=op_seconds)
        schedule.seed = None
        schedule.switched = tuple(sorted(entries))
        return schedule

    @property
    def op_ns(self):
        """Virtual ns per op (0 when ops are measured instead)."""
        if self.op_seconds == "measured":
            return 0
        return int(round(self.op_seconds * 1e9))

    def kind(self):
        """``(strategy, depth)`` this seed explores with: ``"mixed"``
        cycles random and pct at depths 1..depth over consecutive
        seeds."""
        if self.strategy != "mixed":
            return self.strategy, self.depth
        turn = self.seed % (self.depth + 1)
        return ("random", self.depth) if turn == 0 else ("pct", turn)

    def chooser(self, run=0, estimate=None):
        """The decisions of the session's run number ``run``;
        ``estimate``: how many decisions runs of its plan made before
        (PCT draws its change points over it)."""
        return Chooser(self, run, estimate)

    def __repr__(self):
        extra = f", op_seconds={self.op_seconds!r}" if self.op_seconds else ""
        if self.switched is not None:
            return f"Schedule.switches({list(self.switched)!r}{extra})"
        if self.log is not None:
            return f"Schedule.replay({[list(d) for d in self.log]!r}{extra})"
        if self.decisions is not None:
            return f"Schedule.replay({list(self.decisions)!r}{extra})"
        how = ""
        if self.strategy != "random":
            how = f", strategy={self.strategy!r}"
            if self.depth != 3:
                how += f", depth={self.depth!r}"
        return f"Schedule({self.seed!r}{how}{extra})"

    def _key(self):
        return (self.seed, self.strategy, self.depth, self.decisions,
                self.log, self.switched, self.op_seconds)

    def __eq__(self, other):
        return isinstance(other, Schedule) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __getstate__(self):
        return self._key()

    def __setstate__(self, state):
        (self.seed, self.strategy, self.depth, self.decisions, self.log,
         self.switched, self.op_seconds) = state


_REPLAY_TAKES = (
    "Schedule.replay takes a list of branch names, as "
    "session.last_schedule holds, or a list of such lists, as "
    "session.schedule_log holds")


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

    def __init__(self, schedule, run=0, estimate=None):
        self._replay = schedule.decisions
        self._switched = None
        if schedule.log is not None:
            self._replay = schedule.log[run] if run < len(schedule.log) \
                else ()
        if schedule.switched is not None:
            self._switched = {index: name for r, index, name in
                              schedule.switched if r == run}
        self.run = run
        self.kind = None
        self._rng = None
        if schedule.seed is not None:
            self.kind = schedule.kind()
            # seeded by (seed, run): each run of a session explores anew
            self._rng = random.Random(f"{schedule.seed}:{run}")
        self._priority = {}
        self._changes = ()
        self._lowered = 0
        if self.kind is not None and self.kind[0] == "pct":
            depth = self.kind[1]
            span = max(int(estimate or DEFAULT_ESTIMATE), 1)
            count = min(depth - 1, span)
            self._changes = frozenset(self._rng.sample(range(span), count))
        #: the names picked so far, in order: the run's decisions
        self.decisions = []
        #: how many decisions switched away from a branch that could
        #: have gone on
        self.preemptions = 0
        #: ``(decision, name)`` of each decision `Schedule.switches`
        #: would not make by itself
        self.switched = []

    def choose(self, ready, last=None):
        """One of ``ready`` (branch names, sorted, at least two);
        ``last``: the branch that ran last (None: it ended)."""
        if self._switched is not None:
            name = self._switched.get(len(self.decisions))
            if name not in ready:
                name = last if last in ready else ready[0]
        elif self._replay is not None:
            name = self._replayed(ready)
        elif self.kind[0] == "random":
            name = ready[self._rng.randrange(len(ready))]
        else:
            name = self._pct(ready, last)
        if last in ready and name != last:
            self.preemptions += 1
        if name != (last if last in ready else ready[0]):
            self.switched.append((len(self.decisions), name))
        self.decisions.append(name)
        return name

    def _pct(self, ready, last):
        """Probabilistic concurrency testing: the highest-priority branch
        goes on; at a change point the branch that ran (or would run)
        drops below every other."""
        for name in ready:
            if name not in self._priority:
                # distinct with probability 1, above every lowered one
                self._priority[name] = self.kind[1] + self._rng.random()
        if len(self.decisions) in self._changes:
            top = last if last in ready else max(
                ready, key=self._priority.__getitem__)
            self._lowered += 1
            self._priority[top] = -self._lowered
        return max(ready, key=self._priority.__getitem__)

    def _replayed(self, ready):
        index = len(self.decisions)
        if index >= len(self._replay):
            raise ScheduleDivergedError(
                f"the replayed schedule has {len(self._replay)} "
                f"decisions{self._of_run()}, but this run needs more "
                f"(branches {ready} could go on); the run differs from the"
                " one recorded: replay it with the same plan, on a session "
                "in the same state")
        name = self._replay[index]
        if name not in ready:
            raise ScheduleDivergedError(
                f"decision {index}{self._of_run()} of the replayed schedule"
                f" picks branch {name!r}, which cannot go on here (the "
                f"branches that can: {ready}); the run differs from the"
                " one recorded: replay it with the same plan, on a "
                "session in the same state")
        return name

    def _of_run(self):
        return f" of run {self.run}" if self.run else ""
