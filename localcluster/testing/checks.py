"""Job checks: does a job train to the same blobs however it is run?

::

    from localcluster.testing import check_job
    check_job(build)        # build() -> a fresh Job, or (job, options)

Four checks, each also a function of its own taking the same ``build``:

- `sessions_agree` -- every session kind ends with the same blobs;
- `resume_equals_uninterrupted` -- resuming from every saved epoch (in a
  fresh session, from a copy of the checkpoints) ends as the uninterrupted
  run does;
- `restart_recovers` -- a node SIGKILLed at an epoch (a `Kill` fault), with
  ``max_restarts=1``, ends as the uninterrupted run; without restarts the
  run raises `NodeFailedError` naming that node;
- `schedule_independent` -- deterministic schedules (`LocalSession`'s
  ``schedule=`` seeds) give the same blobs.

Every check also takes ``conditions=``: cluster conditions (`Link`,
`Slowdown`) the job's result must not depend on -- a list, applied to
every session the check opens but its reference run, which runs without
them; or a hypothesis strategy drawing such lists
(`localcluster.testing.strategies.conditions`), drawn once per example
and shrunk when one fails (`localcluster.testing._check_conditions`).
A failure names the conditions, and its replay line gives them as
``conditions=[...]``.

"The blobs" are every array blob of the job's checkpointed nodes
(``job.nodes_to_checkpoint()``) after training.  They compare exactly,
unless the options ``build()`` returns give ``{"rtol": ..., "atol":
...}``.

Counter-examples are tried smallest first -- epochs in ascending order,
then nodes in their order, seeds from 0 -- so the first that fails is the
smallest: a check raises `JobCheckFailed` with it and one line of Python
that replays it (for a ``build`` importable by its module and name).
Enumerating, not drawing at random, keeps a check deterministic: the same
job gives the same verdict on every machine and in every CI run.

This module is the checks' logic: what each runs and in which order.
How a run is made -- a fresh job, a session of a kind, the blobs it ends
with -- is `._check_runs`; how two runs are compared and a failure
replayed, `._check_verdicts`.
"""

import inspect
import shutil

from ..errors import NodeFailedError
from ..plan.faults import Epoch, FaultPlan, Kill
from ..sessions.local import LocalSession
from ..runtime.schedule import Schedule
from ._check_conditions import (CheckConditions, bind, session_kwargs,
                                under, with_conditions)
from ._check_runs import SESSION_KINDS, Scratch, make_job, reference, train
from ._check_verdicts import difference, replay

__all__ = ["check_job", "sessions_agree", "resume_equals_uninterrupted",
           "restart_recovers", "schedule_independent", "ALL_CHECKS",
           "JobCheckFailed", "SESSION_KINDS", "OP_SECONDS"]

#: virtual seconds per op of `schedule_independent`'s runs under
#: conditions: ops take time, so a `Slowdown` changes the interleaving
OP_SECONDS = 1e-6


class JobCheckFailed(AssertionError):
    """A job check failed: ``check`` (its name), ``counterexample`` (a
    dict: what made it fail), ``replay`` (one line of Python)."""

    def __init__(self, check, message, counterexample, replay):
        super().__init__(f"{check}: {message}\n  counter-example: "
                         f"{counterexample}\n  replay: {replay}")
        self.check = check
        self.message = message
        self.counterexample = counterexample
        self.replay = replay


# -- the checks ---------------------------------------------------------------

def sessions_agree(build, *, sessions=("local", "localhost"),
                   conditions=None, max_examples=20, max_epochs=None,
                   timeout=60):
    """Every session kind in ``sessions`` ends with the same blobs.

    ``conditions``: the job under each session kind and these conditions
    (a list, or a strategy drawing ``max_examples`` lists) ends as it
    does under the first kind without them."""
    kinds = tuple(sessions)
    conds = CheckConditions(conditions, "sessions_agree")
    with Scratch() as scratch:
        def run(kind, cs):
            with scratch.session(kind, **session_kwargs(cs)) as session:
                return train(build, session, scratch.sub(kind),
                             max_epochs=max_epochs, timeout=timeout)

        first = kinds[0]
        expected, _, options = run(first, None)

        def case(kind, cs):
            diff = difference(expected, run(kind, cs)[0], options)
            if diff:
                raise JobCheckFailed(
                    "sessions_agree", f"{kind}{under(cs)} differs from "
                    f"{first}{'' if cs is None else ' without them'}: "
                    f"{diff}",
                    with_conditions({"sessions": (first, kind)}, cs),
                    replay("sessions_agree", build,
                           sessions=(first, kind),
                           conditions=cs, max_epochs=max_epochs))

        examples = conds.examples(max_examples if conds.strategy is not None
                                   else 1)
        for cs in examples:
            for i, kind in enumerate(kinds):
                if cs is None and i == 0:
                    continue        # the reference itself
                conds.attempt(bind(case, kind), cs,
                              [bind(case, k) for k in kinds[:i]])


def resume_equals_uninterrupted(build, *, sessions=("local",), epochs=None,
                                conditions=None, max_epochs=None,
                                timeout=60):
    """Resuming from each saved epoch (``epochs``: those only), in a fresh
    session from a copy of the checkpoints, ends as the uninterrupted run
    does.  ``conditions``: the resumed runs are under them (one draw per
    epoch for a strategy); the uninterrupted run is not."""
    conds = CheckConditions(conditions, "resume_equals_uninterrupted")
    with Scratch() as scratch:
        for kind in sessions:
            expected, last, options, source = reference(
                build, scratch, kind, max_epochs=max_epochs, timeout=timeout)

            def case(epoch, cs, kind=kind, expected=expected,
                     options=options, source=source):
                copy = scratch.sub(f"resume-{kind}-{epoch}")
                shutil.copytree(source, copy)
                with scratch.session(kind, **session_kwargs(cs)) as session:
                    final, _, _ = train(build, session, copy, resume=epoch,
                                        max_epochs=max_epochs,
                                        timeout=timeout)
                shutil.rmtree(copy, ignore_errors=True)
                diff = difference(expected, final, options)
                if diff:
                    raise JobCheckFailed(
                        "resume_equals_uninterrupted",
                        f"resumed from epoch {epoch} under {kind}"
                        f"{under(cs)}, the job ends differently: {diff}",
                        with_conditions({"epoch": epoch, "session": kind}, cs),
                        replay("resume_equals_uninterrupted", build,
                               sessions=(kind,), epochs=[epoch],
                               conditions=cs, max_epochs=max_epochs))

            tried = list(range(last + 1) if epochs is None
                         else sorted(epochs))
            for epoch, cs in zip(tried, conds.examples(len(tried))):
                conds.attempt(bind(case, epoch), cs)


def restart_recovers(build, *, sessions=("local", "localhost"), faults=None,
                     conditions=None, max_examples=20, max_epochs=None,
                     timeout=60):
    """A node SIGKILLed at an epoch: ``max_restarts=1`` recovers the
    uninterrupted blobs; without restarts `NodeFailedError` names it.
    ``faults``: the kills to try (default: each checkpointed node at each
    epoch, earliest epoch first, at most ``max_examples``).
    ``conditions``: the runs with a kill are under them (one draw per
    kill for a strategy); the uninterrupted runs are not."""
    conds = CheckConditions(conditions, "restart_recovers")
    with Scratch() as scratch:
        references = {kind: reference(build, scratch, kind,
                                      max_epochs=max_epochs,
                                      timeout=timeout)
                      for kind in sessions}
        if faults is None:
            last = min(ref[1] for ref in references.values())
            nodes = make_job(build, None)[0].nodes_to_checkpoint()
            faults = [Kill(node, at=Epoch(k)) for k in range(1, last + 1)
                      for node in nodes][:max_examples]
        for fault, cs in zip(faults, conds.examples(len(faults))):
            for kind in sessions:
                expected, _, options, _ = references[kind]
                conds.attempt(bind(
                    _restart_case, build, kind, fault, expected, options,
                    scratch, max_epochs, timeout), cs)


def _restart_case(build, kind, fault, expected, options, scratch,
                  max_epochs, timeout, cs):
    def fail(message):
        raise JobCheckFailed(
            "restart_recovers", f"under {kind}{under(cs)}, {message}",
            with_conditions({"fault": fault, "session": kind}, cs),
            replay("restart_recovers", build, sessions=(kind,),
                   faults=[fault], conditions=cs, max_epochs=max_epochs))

    extra = session_kwargs(cs)
    with scratch.session(kind, faults=FaultPlan(fault), **extra) as session:
        final, _, _ = train(build, session, scratch.sub("restart"),
                            max_epochs=max_epochs, timeout=timeout,
                            max_restarts=1)
    diff = difference(expected, final, options)
    if diff:
        fail(f"after {fault!r} and a restart the job ends differently: "
             f"{diff}")
    with scratch.session(kind, faults=FaultPlan(fault), **extra) as session:
        try:
            train(build, session, scratch.sub("no-restart"),
                  max_epochs=max_epochs, timeout=timeout)
        except NodeFailedError as exc:
            if exc.node != fault.node:
                fail(f"{fault!r} without restarts raised NodeFailedError "
                     f"naming {exc.node!r}, not {fault.node!r}")
            return
    fail(f"{fault!r} without restarts raised no NodeFailedError (the "
         "fault never fired: does the node run in that epoch?)")


def schedule_independent(build, *, seeds=None, conditions=None,
                         op_seconds=OP_SECONDS, max_examples=20,
                         max_epochs=None, timeout=60):
    """Deterministic schedules (seeds 0, 1, ... or ``seeds``) give the
    blobs of the first; a job that relies on an unsynchronized race fails
    with the seed that shows it.

    ``conditions``: every seed runs under them (one draw per seed for a
    strategy), as ``Schedule(seed, op_seconds=op_seconds)`` -- ops take
    virtual time, so slow nodes and links change which branch runs next
    -- and must give the blobs of the first seed without conditions; a
    job whose result depends on when records arrive fails, naming the
    seed and the conditions, and saying whether that seed alone, without
    them, ends differently too."""
    seeds = list(range(max_examples)) if seeds is None else list(seeds)
    conds = CheckConditions(conditions, "schedule_independent")
    with Scratch() as scratch:
        def run(seed, cs):
            schedule = seed if cs is None else Schedule(
                seed, op_seconds=op_seconds)
            with LocalSession(schedule=schedule,
                              **session_kwargs(cs)) as session:
                return train(build, session, scratch.sub(f"seed-{seed}"),
                             max_epochs=max_epochs, timeout=timeout)

        first = seeds[0]
        expected, _, options = run(first, None)

        def case(seed, cs):
            diff = difference(expected, run(seed, cs)[0], options)
            if diff:
                raise JobCheckFailed(
                    "schedule_independent",
                    f"schedule seed {seed}{under(cs)} ends differently "
                    f"from seed {first}{'' if cs is None else ' without them'}"
                    f": {diff}", with_conditions({"seeds": (first, seed)}, cs),
                    replay("schedule_independent", build,
                           seeds=list(dict.fromkeys((first, seed))),
                           conditions=cs, op_seconds=None if cs is None or
                           op_seconds == OP_SECONDS else op_seconds,
                           max_epochs=max_epochs))

        examples = conds.examples(len(seeds))
        try:
            for i, (seed, cs) in enumerate(zip(seeds, examples)):
                if cs is None and i == 0:
                    continue        # the reference itself
                conds.attempt(bind(case, seed), cs,
                              [bind(case, s) for s in seeds[:i]])
        except JobCheckFailed as failed:
            if "conditions" not in failed.counterexample:
                raise
            raise _blame(failed, run, expected, options) from None


def _blame(failed, run, expected, options):
    """``failed`` saying whether its seed alone, without its conditions,
    ends differently too."""
    first, seed = failed.counterexample["seeds"]
    alone = difference(expected, run(seed, [])[0], options)
    blame = ("without the conditions that seed ends as the reference: "
             "the result depends on the conditions" if alone is None else
             "that seed ends differently without the conditions too: the "
             "result depends on the schedule")
    return JobCheckFailed(failed.check, f"{failed.message}; {blame}",
                          failed.counterexample, failed.replay)


ALL_CHECKS = (sessions_agree, resume_equals_uninterrupted, restart_recovers,
              schedule_independent)


def check_job(build, *, checks=ALL_CHECKS, sessions=("local", "localhost"),
              conditions=None, max_examples=20, max_epochs=None, timeout=60):
    """Run ``checks`` on the job ``build()`` makes, in order; raises the
    first `JobCheckFailed`.  ``sessions``: the session kinds to use
    (resumes run under the first); ``conditions``: cluster conditions the
    result must not depend on -- None, a list of `Link` and `Slowdown`
    values, or a hypothesis strategy drawing such lists, drawn per
    example (see each check; inside a hypothesis ``@given`` test, pass a
    list drawn there rather than a strategy); ``max_examples`` bounds the
    kills, seeds and drawn conditions tried; ``max_epochs`` caps
    training; ``timeout`` bounds every run, in seconds.

    ::

        check_job(build, conditions=[Link("reader", "trainer_*",
                                          latency=0.002)])
        check_job(build, conditions=strategies.conditions(["reader",
                                                            "trainer_0"]))
    """
    given = {"sessions": tuple(sessions), "conditions": conditions,
             "max_examples": max_examples, "max_epochs": max_epochs,
             "timeout": timeout}
    for check in checks:
        run_one(check, build, given)

def run_one(check, build, given):
    """Run ``check`` with those of ``given`` it takes (resumes: under the
    first session kind only)."""
    accepted = inspect.signature(check).parameters
    kwargs = {k: v for k, v in given.items() if k in accepted}
    if check is resume_equals_uninterrupted and "sessions" in kwargs:
        kwargs["sessions"] = tuple(kwargs["sessions"])[:1]
    check(build, **kwargs)
