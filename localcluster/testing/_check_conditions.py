"""The ``conditions=`` of a job check: none, one list, or a strategy.

A check (`localcluster.testing.checks`) runs its reference without
conditions and every other run under the conditions of its example:

- None: no conditions anywhere -- the check as it always was;
- a list (or one condition): the same conditions in every example, and a
  failure names them as given;
- a hypothesis strategy drawing lists of conditions (such as
  `localcluster.testing.strategies.conditions`): one draw per example,
  drawn with the check's seed (the same draws on every machine and every
  run, whatever else the test file holds), the examples with fewer
  conditions tried first; drawn latencies reach past the plan's own
  time constants (`time_constants`).  A failing draw
  is shrunk by leaving its conditions out one at a time while the
  example still fails, then tried on the examples before it (an earlier
  seed, session kind) -- so the check raises the smallest failure, and
  its replay line, with ``conditions=[...]`` as found, fails the same
  way.

Drawing runs hypothesis's own ``@given``: inside a ``@given`` test pass a
list drawn there (``data.draw(conditions(...))``) rather than a strategy
(hypothesis refuses a ``@given`` nested in another unless the outer one
suppresses ``HealthCheck.nested_given``).
"""

import random
import sys

from ..errors import PlanError
from ..plan.conditions import as_conditions

__all__ = ["CheckConditions", "session_kwargs", "under", "bind",
           "with_conditions", "time_constants"]


def _as_list(value, who):
    try:
        return list(as_conditions(value, who))
    except PlanError as exc:   # a wrong kind of argument, to a check
        raise TypeError(f"{exc}; or a hypothesis strategy drawing lists of "
                        "them, such as localcluster.testing.strategies."
                        "conditions(...)") from None


def _is_strategy(value):
    # a strategy exists only once hypothesis is imported: no import here
    found = sys.modules.get("hypothesis.strategies")
    return found is not None and isinstance(value, found.SearchStrategy)


def _draw(strategy, count, who, seed=0, horizon=0.0):
    """Up to ``count`` distinct draws of ``strategy``, fewest conditions
    first (the same draws for one seed on every run).

    `localcluster.testing.strategies.conditions` draws with a generator of
    its own, seeded with ``seed`` alone -- hypothesis would mix constants
    of the test's module into its draws, so an unrelated literal could
    change a verdict -- and its latencies reach past ``horizon``, the
    plan's longest time constant.  Another strategy is drawn by
    hypothesis, seeded with ``seed``."""
    own = getattr(strategy, "draw_conditions", None)
    if own is not None:
        rng = random.Random(f"conditions:{seed}")
        drawn = [_as_list(own(rng, horizon), who) for _ in range(count)]
    else:
        drawn = _hypothesis_draws(strategy, count, who, seed)
    unique = []
    for value in drawn:
        if value not in unique:
            unique.append(value)
    return sorted(unique, key=len) or [[]]


def _hypothesis_draws(strategy, count, who, seed):
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded

    drawn = []

    @seeded(seed)
    @settings(max_examples=count, database=None, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value):
        drawn.append(_as_list(value, who))

    collect()
    return drawn


class CheckConditions:
    """A check's ``conditions=`` argument (see the module docstring)."""

    def __init__(self, value, who, seed=0):
        self.who = who
        self.seed = seed
        #: the plan's longest time constant, seconds: drawn latencies
        #: reach past it (set by the check)
        self.horizon = 0.0
        self.given = value is not None
        self.strategy = value if _is_strategy(value) else None
        self.fixed = None
        if self.given and self.strategy is None:
            self.fixed = _as_list(value, who)

    def examples(self, count):
        """The conditions of ``count`` examples (None: no conditions)."""
        if not self.given:
            return [None] * count
        if self.strategy is None:
            return [self.fixed] * count
        drawn = _draw(self.strategy, max(count, 1), self.who, self.seed,
                      self.horizon)
        return [drawn[i % len(drawn)] for i in range(count)]

    def attempt(self, case, conds, earlier=(), failure=AssertionError):
        """``case(conds)`` (what it returns), which raises ``failure``
        when the example fails; for a drawn ``conds`` its failure is made smallest (see the
        module docstring) before it is raised.  ``earlier``: the cases of
        the examples before this one, taking conditions too."""
        try:
            return case(conds)
        except failure as found:
            if self.strategy is None:
                raise
            smallest, kept = found, list(conds)
        index = 0
        while index < len(kept):
            fewer = kept[:index] + kept[index + 1:]
            try:
                case(fewer)
            except failure as found:
                smallest, kept = found, fewer
                continue
            index += 1
        for other in earlier:
            try:
                other(kept)
            except failure as found:
                raise found from None
        raise smallest from None


def session_kwargs(conds):
    """What a session constructor takes for ``conds`` (None: nothing)."""
    return {} if conds is None else {"conditions": list(conds)}


def under(conds):
    """`` under conditions=[...]`` for a message, or nothing."""
    return "" if conds is None else f" under conditions={list(conds)!r}"


def bind(fn, *args):
    """A case of `CheckConditions.attempt`: ``fn(*args, conds)``."""
    return lambda conds: fn(*args, conds)


def with_conditions(counterexample, conds):
    """``counterexample`` with ``"conditions"`` when there are any."""
    if conds is not None:
        counterexample["conditions"] = list(conds)
    return counterexample


def time_constants(job):
    """The seconds a job's plans wait for by design: `Sleep`\\ s,
    ``run_every_ms`` intervals and the durations a timer is compared with
    (``ReaderWithTimeLimit``) -- what drawn latencies must reach past."""
    found = [0.0]
    for group in (job.init_group, job.epoch_group, job.download_group,
                  job.exit_group):
        if group is None or not group.num_registered_tasks():
            continue
        for plan in group.node_plans():
            stack = [plan.step]
            while stack:
                step = stack.pop()
                stack.extend(step.substeps)
                if step.run_every_ms:
                    found.append(step.run_every_ms / 1e3)
            for net in plan.step.walk_nets():
                timed = any(op.type.startswith("Timer") for op in net.ops)
                for op in net.ops:
                    if op.type == "Sleep":
                        found.append(float(op.args.get("seconds", 0)))
                    elif timed and op.type == "GivenTensorFill":
                        value = op.args.get("values")
                        if getattr(value, "dtype", None) is not None and \
                                value.dtype.kind in "iu" and value.size == 1 \
                                and int(value) >= 1000:
                            found.append(int(value) / 1e9)   # ns
    return max(found)
