"""Job checks: does a job train to the right blobs however it is run?

::

    from localcluster.testing import check_job
    check_job(build)        # build() -> a fresh Job, or (job, options)

Five checks, run in this order by `check_job`, each also a function of
its own taking the same ``build``:

- `races` -- the static analysis (`localcluster.testing.races`): no blob
  is shared by concurrent branches without an atomic op or an order,
  unless the options declare it in ``allow_races``;
- `schedule_independent` -- deterministic schedules (``"mixed"``: random
  and PCT at depths 1-3, see `Schedule`) give the blobs of the run
  without preemptions; a job that relies on an unsynchronized race
  fails, with the schedule that shows it shrunk to its fewest
  preemptions;
- `sessions_agree` -- every session kind ends with the blobs of that
  scheduled run;
- `resume_equals_uninterrupted` -- resuming from every saved epoch, in a
  fresh Python process, ends as the uninterrupted run does, under a
  seeded schedule and under each session kind;
- `restart_recovers` -- a node killed at a drawn point (an epoch, an op,
  a step, the init group, a checkpoint save; `._check_kills`): under a
  seeded schedule the run without restarts raises `NodeFailedError`
  naming it and a resume from the last checkpoint, in a fresh process,
  ends as the uninterrupted run; under each real session kind but the
  threads of ``local`` (the schedule runs those) ``max_restarts=1``
  recovers the uninterrupted blobs.

Scheduled runs come first, so a deadlock is a `JobCheckFailed` naming
its schedule within seconds, never a run timeout.  Every run must also
stand on its own (`._check_verdicts.Truth`): finite blobs unless
``allow_nonfinite=True``, ``invariant(blobs)`` returning None,
``expected={node: {blob: value}}`` met -- so a bug every run shows alike
fails too.  "The blobs" are every array blob of the job's checkpointed
nodes (``job.nodes_to_checkpoint()``) after training; they compare
exactly unless the options give ``{"rtol": ..., "atol": ...}``.

Every check takes ``seed`` (0): the base of its schedule seeds, its
kills and the conditions it draws, so a check is deterministic -- the
same job and seed give the same verdict on every machine -- and another
``seed`` explores other interleavings.  Each returns a `CheckResult`
(how many runs, distinct interleavings, kills tried of how many) and
prints nothing; a failure raises `JobCheckFailed` with the
counter-example and one line of Python that replays it.

This module is the checks' logic: what each runs and in which order.
How a run is made is `._check_runs`; how a run is judged and a failure
replayed, `._check_verdicts`; kills are drawn by `._check_kills`,
schedules shrunk by `._check_shrink`, resumes run by `._check_fresh`.
"""

import contextlib
import inspect
import logging
import os
import shutil

from ..checkpoint.manager import MultiNodeCheckpointManager
from ..errors import NodeFailedError
from ..job import Job
from ..plan.faults import FaultPlan
from ..runtime.schedule import Schedule
from ..task import Task, TaskGroup
from ._check_conditions import (CheckConditions, bind, time_constants,
                                under, with_conditions)
from ._check_fresh import WIDTH, type_name
from ._check_kills import draw_kills
from ._check_runs import SESSION_KINDS, Runs, make_job
from ._check_shrink import shrink
from ._check_verdicts import difference, replay
from ._races import races as find_races

__all__ = ["check_job", "races", "sessions_agree",
           "resume_equals_uninterrupted", "restart_recovers",
           "schedule_independent", "ALL_CHECKS", "JobCheckFailed",
           "CheckResult", "SESSION_KINDS", "OP_SECONDS"]

#: virtual seconds per op of `schedule_independent`'s runs under
#: conditions: ops take time, so a `Slowdown` changes the interleaving
OP_SECONDS = 1e-6

#: the schedule of the runs the others are compared with: each branch
#: goes on for as long as it can
NO_PREEMPTIONS = Schedule.switches([])


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


class CheckResult:
    """What a check that passed ran: ``runs``, ``interleavings`` (the
    distinct ones of its scheduled runs), ``kills`` (``(tried, of)``) and
    a ``note`` (what it could not do, or cut)."""

    def __init__(self, check, runs=0, interleavings=0, kills=None, note=""):
        self.check = check
        self.runs = runs
        self.interleavings = interleavings
        self.kills = kills
        self.note = note

    def __repr__(self):
        said = f"{self.check}: passed, {self.runs} runs"
        if self.interleavings:
            said += f", {self.interleavings} distinct interleavings"
        if self.kills is not None:
            said += f", {self.kills[0]} of {self.kills[1]} kills tried"
        return f"<{said}{'; ' + self.note if self.note else ''}>"


@contextlib.contextmanager
def _checking(build, runs, conds, **kwargs):
    """``(runs, count of runs made before)``: the `Runs` a check uses --
    ``runs`` (check_job's) or its own; ``conds`` drawn past the plan's
    time constants.  The restarts and kills the check causes are not
    logged (they are what it checks, not news)."""
    owned = runs is None
    if owned:
        runs = Runs(build, **kwargs)
    if conds.strategy is not None:
        conds.horizon = time_constants(runs.job())
    quiet = logging.getLogger("localcluster.job")
    level = quiet.level
    quiet.setLevel(max(level, logging.ERROR))
    try:
        yield runs, runs.count
    finally:
        quiet.setLevel(level)
        if owned:
            runs.close()


def _common(max_epochs, timeout, allow_nonfinite, invariant, expected):
    return {"max_epochs": max_epochs, "timeout": timeout,
            "allow_nonfinite": allow_nonfinite, "invariant": invariant,
            "expected": expected}


def _replay(runs, check, **kwargs):
    """The replay line of ``check``, with the truth the runs were judged
    by (``invariant=``, ``expected=``, ``allow_nonfinite=``)."""
    return replay(check, runs.build, **kwargs, **runs.truth.replay_args())


def _verdict(runs, out, other=None):
    """What is wrong with the run ``out``: it raised, it breaks the
    user's truth, or it differs from ``other``; None if nothing."""
    if out.error is not None:
        if type_name(out.error) == "DeadlockError":
            return f"deadlock under {out.label}: {out.error}"
        return f"{out.label} raised {type_name(out.error)}: {out.error}"
    said = runs.truth.judge(out.label, out.blobs)
    if said is None and other is not None and other.blobs is not None:
        said = difference(other.label, other.blobs, out.label, out.blobs,
                          runs.options)
    return said


# -- races ----------------------------------------------------------------------

def races(obj, allow=(), *, max_epochs=None, _runs=None):
    """``races(job_or_group_or_task, allow=())``: the `Race`\\ s of a plan
    (`._races`; a ``(job, options)`` pair counts its ``allow_races``).  Given a job's ``build`` instead, the
    check: raises `JobCheckFailed` if the job has races its options do
    not declare in ``allow_races``."""
    if not callable(obj) or isinstance(obj, (Job, TaskGroup, Task)):
        return find_races(obj, allow=allow)
    job, options = make_job(obj, max_epochs)
    found = find_races((job, options), allow=allow)
    if found:
        listed = "; ".join(str(r) for r in found[:5])
        more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
        raise JobCheckFailed(
            "races", f"{len(found)} blob(s) shared by concurrent branches "
            f"without an atomic op or an order: {listed}{more}.  Make the "
            "accesses atomic or ordered (a setup or exit net, an earlier "
            "step), or declare an intended race with allow_races=(blob, "
            "...) in the options build() returns",
            {"races": [(r.node, r.blob) for r in found]},
            replay("races", obj))
    return CheckResult("races")


# -- schedules ------------------------------------------------------------------

def schedule_independent(build, *, seeds=None, schedules=None,
                         strategy="mixed", depth=3, conditions=None,
                         op_seconds=OP_SECONDS, max_examples=20,
                         max_epochs=None, timeout=60, seed=0,
                         allow_nonfinite=False, invariant=None,
                         expected=None, _runs=None):
    """Deterministic schedules give the blobs of the run without
    preemptions.

    The schedules: ``schedules`` (`Schedule` values), else
    ``Schedule(s, strategy, depth)`` for ``seeds``, else for seeds
    ``seed``, ``seed + 1``, ... until ``max_examples`` distinct
    interleavings ran (a seed whose decisions repeat an earlier one's
    does not count; at most 3 * ``max_examples`` seeds).  A failing
    schedule -- it ends differently, breaks the truth, deadlocks or
    raises -- is shrunk to its fewest preemptions (`._check_shrink`); the
    counter-example shows it as ``Schedule.switches([...])`` with its
    count, and the replay line runs it.

    ``conditions``: every schedule runs under them (one draw per seed for
    a strategy) with ops taking ``op_seconds`` of virtual time, and must
    still give the blobs of the run without them; a failure says whether
    that schedule alone, without them, ends differently too."""
    conds = CheckConditions(conditions, "schedule_independent", seed=seed)
    with _checking(build, _runs, conds, **_common(
            max_epochs, timeout, allow_nonfinite, invariant,
            expected)) as (runs, base):
        first = runs.reference("local", NO_PREEMPTIONS)
        said = _verdict(runs, first)
        if said:
            # the first run of every seed: the check's seed names it
            raise _schedule_failed(runs, said, first, NO_PREEMPTIONS, seed,
                                   conditions=None, op_seconds=None)
        if schedules is not None:
            chosen = [(s, None) for s in schedules]
        else:
            tried = list(seeds) if seeds is not None else \
                range(seed, seed + 3 * max_examples)
            chosen = [(Schedule(s, strategy, depth), s) for s in tried]
        wanted = len(chosen) if seeds is not None or schedules is not None \
            else max_examples
        examples = conds.examples(len(chosen))
        seen = {first.key()}

        def start(schedule, cs):
            if cs is not None and schedule.op_seconds == 0 and \
                    op_seconds is not None:
                schedule = _with_op_seconds(schedule, op_seconds)
            return runs.start("local", f"{_named(schedule)}{under(cs)}",
                              schedule=schedule, conditions=cs)

        def case(schedule, s, cs):
            out = start(schedule, cs)()
            said = _verdict(runs, out, first)
            if said:
                raise _Failing(said, out, schedule, s, cs)
            return out

        try:
            # WIDTH runs at a time, side by side in fresh processes; each
            # judged in seed order, so the verdict is the same as one by one
            flight = []
            cases = iter(zip(chosen, examples))
            ran = 0
            while ran < wanted:
                for (schedule, s), cs in cases:
                    flight.append((schedule, s, cs, start(schedule, cs)))
                    if len(flight) >= WIDTH:
                        break
                if not flight:
                    break
                schedule, s, cs, outcome = flight.pop(0)
                out = outcome()
                # the same decisions under other conditions may still read
                # other times: only a repeat under the same ones is skipped
                key = out.key() if cs is None else (out.key(), repr(cs))
                if key in seen:
                    continue     # an interleaving run already
                seen.add(key)
                ran += 1
                said = _verdict(runs, out, first)
                if said:
                    for *_, other in flight:
                        other()  # reaped before the failure is made smallest
                    if conds.strategy is not None:
                        conds.attempt(bind(case, schedule, s), cs,
                                      failure=_Failing)
                    raise _Failing(said, out, schedule, s, cs)
            for *_, other in flight:
                other()
        except _Failing as failing:
            cs = failing.conditions
            note = ""
            if cs is not None:
                alone = _verdict(runs, start(failing.schedule, [])(), first)
                note = ("; without the conditions that schedule ends as "
                        "the run without preemptions: the result depends "
                        "on the conditions" if alone is None else
                        "; that schedule fails without the conditions too:"
                        " the result depends on the schedule")
            raise _schedule_failed(
                runs, failing.message, failing.outcome, failing.schedule,
                failing.seed, conditions=cs, op_seconds=op_seconds,
                interleavings=len(seen), note=note,
                run=lambda sch, s=failing.seed, c=cs: case(sch, s, c))
        return CheckResult("schedule_independent", runs.count - base,
                           interleavings=len(seen))


class _Failing(AssertionError):
    """A scheduled run that failed, before it is shrunk."""

    def __init__(self, message, outcome, schedule, seed, conditions):
        super().__init__(message)
        self.message = message
        self.outcome = outcome
        self.schedule = schedule
        self.seed = seed
        self.conditions = conditions


def _with_op_seconds(schedule, op_seconds):
    made = Schedule.__new__(Schedule)
    made.__setstate__(schedule.__getstate__()[:-1] + (op_seconds,))
    return made


def _named(schedule):
    """A run's label by its schedule."""
    if schedule.switched is not None:
        count = len(schedule.switched)
        return ("the run without preemptions" if not count else
                f"the schedule of {count} switches")
    if schedule.seed is None:
        return f"{schedule!r}"
    kind, depth = schedule.kind()
    how = "random" if kind == "random" else f"pct, depth {depth}"
    return f"schedule seed {schedule.seed} ({how})"


def _schedule_failed(runs, said, out, schedule, seed, *, conditions,
                     op_seconds, interleavings=1, run=None, note=""):
    """The `JobCheckFailed` of a failing schedule, shrunk to its fewest
    preemptions when it can be (``note``: said after the verdict)."""
    switches = out.switches or []
    kind = _kind_of(out)
    if run is not None and switches:
        ran = {tuple(switches): out}

        def attempt(candidate):
            try:
                run(Schedule.switches(candidate,
                                      op_seconds=schedule.op_seconds))
            except _Failing as again:
                if _kind_of(again.outcome) == kind:
                    made = again.outcome.switches or []
                    ran.setdefault(tuple(made), again.outcome)
                    return made
            return None
        switches = shrink(attempt, switches)
        out = ran[tuple(switches)]
        out.label = (f"the schedule of {len(switches)} switch(es)"
                     f"{under(conditions)}")
        said = _verdict(runs, out, runs.reference("local", NO_PREEMPTIONS))\
            or said
    said += note
    found = Schedule.switches(switches, op_seconds=schedule.op_seconds)
    if schedule.seed is not None:
        said += (f" -- shrunk from {_named(schedule)} to "
                 f"{out.preemptions} preemption(s)")
    example = {"schedule": found, "preemptions": out.preemptions}
    if seed is not None:
        example["seed"] = seed
    example["interleavings"] = interleavings
    return JobCheckFailed(
        "schedule_independent", said, with_conditions(example, conditions),
        _replay(runs, "schedule_independent", schedules=[found],
                conditions=conditions, max_epochs=runs.max_epochs))


def _kind_of(out):
    """How a run failed, for shrinking: the same kind must stay."""
    if out.error is not None:
        return type_name(out.error)
    return "blobs"


# -- sessions -------------------------------------------------------------------

def sessions_agree(build, *, sessions=("local", "localhost"),
                   conditions=None, max_examples=20, max_epochs=None,
                   timeout=60, seed=0, allow_nonfinite=False,
                   invariant=None, expected=None, _runs=None):
    """Every session kind in ``sessions`` ends with the blobs of the
    scheduled run without preemptions (which runs first: a deadlock
    fails here at once, not at a timeout).

    ``conditions``: each kind also runs under them (a list, or a strategy
    drawing ``max_examples`` lists) and must still end so."""
    kinds = tuple(sessions)
    conds = CheckConditions(conditions, "sessions_agree", seed=seed)
    with _checking(build, _runs, conds, **_common(
            max_epochs, timeout, allow_nonfinite, invariant,
            expected)) as (runs, base):
        first = runs.reference("local", NO_PREEMPTIONS)

        def case(kind, cs):
            out = runs.run(kind, f"{kind}{under(cs)}", conditions=cs) \
                if kind != "local" or cs is not None \
                else runs.reference("local")
            said = _verdict(runs, out, first)
            if said:
                raise JobCheckFailed(
                    "sessions_agree", said,
                    with_conditions({"session": kind}, cs),
                    _replay(runs, "sessions_agree", sessions=(kind,),
                           conditions=cs, max_epochs=max_epochs))

        said = _verdict(runs, first)
        if said:
            raise JobCheckFailed(
                "sessions_agree", said, {"schedule": NO_PREEMPTIONS,
                                         "seed": seed},
                _replay(runs, "sessions_agree", sessions=kinds[:1],
                       max_epochs=max_epochs))
        examples = conds.examples(max_examples if conds.strategy is not None
                                  else 1) if conds.given else [None]
        for cs in examples:
            for i, kind in enumerate(kinds):
                conds.attempt(bind(case, kind), cs,
                              [bind(case, k) for k in kinds[:i]])
        return CheckResult("sessions_agree", runs.count - base)


# -- resumes and restarts -------------------------------------------------------

def resume_equals_uninterrupted(build, *, sessions=("local",), epochs=None,
                                conditions=None, max_epochs=None,
                                timeout=60, seed=0, allow_nonfinite=False,
                                invariant=None, expected=None, _runs=None):
    """Resuming from each saved epoch (``epochs``: those only), in a fresh
    Python process from a copy of the checkpoints, ends as the
    uninterrupted run does: under ``Schedule(seed)`` first, then under
    each kind of ``sessions``.  ``conditions``: the resumed runs are
    under them (one draw per epoch for a strategy)."""
    conds = CheckConditions(conditions, "resume_equals_uninterrupted",
                            seed=seed)
    with _checking(build, _runs, conds, **_common(
            max_epochs, timeout, allow_nonfinite, invariant,
            expected)) as (runs, base):
        note = "" if runs.fresh is not None else _IN_THIS_PROCESS
        for kind, schedule in [("local", Schedule(seed))] + \
                [(k, None) for k in sessions]:
            ref = runs.reference(kind, schedule)
            said = _verdict(runs, ref)
            if said:
                raise JobCheckFailed(
                    "resume_equals_uninterrupted", said,
                    {"session": kind, "schedule": schedule},
                    _replay(runs, "resume_equals_uninterrupted",
                           sessions=(kind,), max_epochs=max_epochs,
                           seed=seed or None))
            how = kind if schedule is None else f"{kind} under {schedule!r}"

            def launch(epoch, cs, kind=kind, schedule=schedule, ref=ref,
                       how=how):
                copy = runs.scratch.sub(f"resume-{kind}-{epoch}")
                shutil.copytree(ref.directory, copy)
                return runs.start(
                    kind, f"the run resumed from epoch {epoch} in a fresh "
                    f"process ({how}{under(cs)})", schedule=schedule,
                    conditions=cs, resume=epoch, directory=copy)

            def judge(epoch, cs, outcome, kind=kind, ref=ref):
                out = outcome()
                shutil.rmtree(out.directory, ignore_errors=True)
                said = _verdict(runs, out, ref)
                if said:
                    raise JobCheckFailed(
                        "resume_equals_uninterrupted", said + note,
                        with_conditions({"epoch": epoch, "session": kind},
                                        cs),
                        _replay(runs, "resume_equals_uninterrupted",
                               sessions=(kind,), epochs=[epoch],
                               conditions=cs, max_epochs=max_epochs,
                               seed=seed or None))

            tried = list(range(ref.last + 1) if epochs is None
                         else sorted(epochs))
            flight = []
            cases = list(zip(tried, conds.examples(len(tried))))
            for index, (epoch, cs) in enumerate(cases):
                flight.append((epoch, cs, launch(epoch, cs)))
                while flight and (len(flight) >= WIDTH or
                                  index == len(cases) - 1):
                    epoch, cs, outcome = flight.pop(0)
                    try:
                        judge(epoch, cs, outcome)
                    except JobCheckFailed:
                        for *_, other in flight:
                            other()
                        if conds.strategy is None:
                            raise
                        conds.attempt(lambda c, e=epoch: judge(
                            e, c, launch(e, c)), cs)
                        raise
        return CheckResult("resume_equals_uninterrupted", runs.count - base,
                           note=note.strip("; "))


_IN_THIS_PROCESS = ("; build cannot be pickled (a lambda or closure?), so "
                    "the resumes ran in this process, where state kept "
                    "outside the checkpoints survives: give a module-level"
                    " function to resume in a fresh one")


def restart_recovers(build, *, sessions=("local", "localhost"), faults=None,
                     max_kills=20, conditions=None, max_examples=None,
                     max_epochs=None, timeout=60, seed=0,
                     allow_nonfinite=False, invariant=None, expected=None,
                     _runs=None):
    """A node killed anywhere recovers (see the module docstring).

    ``faults``: the kills to try (each must fire); default: up to
    ``max_kills`` drawn with ``seed`` (`._check_kills`) -- a drawn kill
    no run reaches is passed over.  When ``max_kills`` cuts the list, the
    result's note (and any failure) says how many of how many were
    tried.  ``conditions``: the runs with a kill are under them (one draw
    per kill for a strategy); the uninterrupted runs are not.
    ``max_examples``: an older name of ``max_kills``."""
    if max_examples is not None:
        max_kills = max_examples
    conds = CheckConditions(conditions, "restart_recovers", seed=seed)
    with _checking(build, _runs, conds, **_common(
            max_epochs, timeout, allow_nonfinite, invariant,
            expected)) as (runs, base):
        schedule = Schedule(seed)
        ref = runs.reference("local", schedule)   # resume's reference too
        said = _verdict(runs, ref)
        if said:
            raise JobCheckFailed("restart_recovers", said,
                                 {"schedule": schedule},
                                 _replay(runs, "restart_recovers",
                                        max_epochs=max_epochs))
        drawn = faults is None
        if drawn:
            faults, total = draw_kills(runs.job(), ref.last, seed, max_kills)
        else:
            faults, total = list(faults), len(faults)
        note = "" if len(faults) == total else (
            f"tried {len(faults)} of {total} kills (max_kills={max_kills}; "
            "raise it to try more)")
        if runs.fresh is None:
            note = "; ".join(filter(None, [note, _IN_THIS_PROCESS[2:]]))
        reals = [k for k in sessions if k != "local"]
        references = {kind: runs.reference(kind) for kind in reals}
        for kind in reals:
            said = _verdict(runs, references[kind])
            if said:
                raise JobCheckFailed("restart_recovers", said,
                                     {"session": kind},
                                     _replay(runs, "restart_recovers",
                                            sessions=(kind,),
                                            max_epochs=max_epochs))
        def case(i, fault, cs):
            return _restart_case(runs, fault, Schedule(seed + i, "mixed"),
                                 ref, reals, references, drawn, note, cs)

        # two kills at a time: one's resume runs beside the next one's kill
        before = steps = None
        try:
            for i, (fault, cs) in enumerate(zip(
                    faults, conds.examples(len(faults)))):
                steps = case(i, fault, cs)
                try:
                    next(steps)            # its runs started
                    next(steps, None)      # its kill seen, its resume started
                except BaseException:
                    if before is not None:   # the earlier kill's verdict
                        earlier, before = before, None
                        _finish(*earlier, conds)
                    raise
                if before is not None:
                    earlier, before = before, None
                    _finish(*earlier, conds)
                before, steps = (steps, i, fault, cs, case), None
            if before is not None:
                earlier, before = before, None
                _finish(*earlier, conds)
        finally:
            for left in (steps, before and before[0]):
                if left is not None:
                    left.close()           # its runs reaped
        return CheckResult("restart_recovers", runs.count - base,
                           kills=(len(faults), total), note=note)


def _finish(steps, i, fault, cs, case, conds):
    """Run a kill's case to its verdict; a failure under drawn conditions
    is made smallest (`CheckConditions.attempt`) before it is raised."""
    try:
        for _ in steps:
            pass
    except JobCheckFailed:
        if conds.strategy is None:
            raise
        conds.attempt(lambda c: [*case(i, fault, c)], cs)
        raise


def _restart_case(runs, fault, schedule, ref, reals, references, drawn,
                  note, cs):
    """A kill's runs, as a generator: it yields once its first runs are
    started and once its resume is, and ends with the verdict."""
    def fail(message, kind):
        raise JobCheckFailed(
            "restart_recovers", message + (f"; {note}" if note else ""),
            with_conditions({"fault": fault, "session": kind}, cs),
            _replay(runs, "restart_recovers", sessions=(kind,),
                   faults=[fault], conditions=cs,
                   max_epochs=runs.max_epochs,
                   seed=schedule.seed or None))

    how = f"local under {schedule!r}{under(cs)}"
    started = runs.start("local", f"the run with {fault!r} ({how})",
                         schedule=schedule, conditions=cs,
                         faults=FaultPlan(fault))
    # the real kinds' runs go on beside the scheduled ones
    restarted = [(kind, runs.start(
        kind, f"{kind} with {fault!r} and max_restarts=1{under(cs)}",
        conditions=cs, faults=FaultPlan(fault), max_restarts=1))
        for kind in reals]
    resumed = None
    try:
        yield
        killed = started()
        if killed.error is None:
            if drawn:
                return      # no run reaches that point
            fail(f"{fault!r} without restarts raised no NodeFailedError "
                 "(the fault never fired: does the node run there?)",
                 "local")
        if not isinstance(killed.error, NodeFailedError):
            fail(_verdict(runs, killed), "local")
        if killed.error.node != fault.node:
            fail(f"{fault!r} without restarts raised NodeFailedError naming"
                 f" {killed.error.node!r}, not {fault.node!r}: "
                 f"{killed.error}", "local")
        manager = MultiNodeCheckpointManager(killed.directory)
        epoch = manager.latest_epoch_on_disk() \
            if os.path.isdir(killed.directory) else None
        resumed = runs.start(
            "local", f"the run resumed after {fault!r} from "
            f"{'scratch' if epoch is None else f'epoch {epoch}'} in a fresh"
            f" process ({how})", schedule=schedule, conditions=cs,
            resume=epoch, directory=killed.directory)
        yield
        out, resumed = resumed(), None
        said = _verdict(runs, out, ref)
        if said:
            fail(said, "local")
        for kind, outcome in restarted:
            said = _verdict(runs, outcome(), references[kind])
            if said:
                fail(said, kind)
        restarted = []
    finally:
        for outcome in [o for _, o in restarted] + [resumed]:
            if outcome is not None:
                outcome()    # reaped, whatever the verdict


ALL_CHECKS = (races, schedule_independent, sessions_agree,
              resume_equals_uninterrupted, restart_recovers)


def check_job(build, *, checks=ALL_CHECKS, sessions=("local", "localhost"),
              conditions=None, max_examples=20, max_epochs=None, timeout=60,
              seed=0, max_kills=20, allow_nonfinite=False, invariant=None,
              expected=None):
    """Run ``checks`` on the job ``build()`` makes, in order; raises the
    first `JobCheckFailed`, else returns ``{check name: CheckResult}``.

    ``sessions``: the session kinds to use (resumes run under the first);
    ``conditions``: cluster conditions the result must not depend on --
    None, a list of `Link` and `Slowdown` values, or a hypothesis
    strategy drawing such lists, drawn per example with the checks' own
    seeded generator; ``max_examples``: the distinct interleavings
    `schedule_independent` runs and the conditions drawn;
    ``max_kills``: the kills `restart_recovers` tries; ``max_epochs``
    caps training; ``timeout`` bounds every run, in seconds; ``seed``:
    the base of every seed the checks draw; ``allow_nonfinite``,
    ``invariant``, ``expected``: the truth every run must meet (see the
    module docstring).

    ::

        check_job(build, conditions=[Link("reader", "trainer_*",
                                          latency=0.002)])
        check_job(build, invariant=lambda blobs: None if blobs["ps"]["w"]
                  .sum() > 0 else "the weights never moved")
    """
    given = {"sessions": tuple(sessions), "conditions": conditions,
             "max_examples": max_examples, "max_epochs": max_epochs,
             "timeout": timeout, "seed": seed, "max_kills": max_kills}
    results = {}
    runs = Runs(build, **_common(max_epochs, timeout, allow_nonfinite,
                                 invariant, expected))
    try:
        for check in checks:
            result = run_one(check, build, dict(given, _runs=runs))
            if isinstance(result, CheckResult):
                results[result.check] = result
    finally:
        runs.close()
    return results


def run_one(check, build, given):
    """Run ``check`` with those of ``given`` it takes (resumes: under the
    first session kind only)."""
    accepted = inspect.signature(check).parameters
    kwargs = {k: v for k, v in given.items() if k in accepted}
    if check is resume_equals_uninterrupted and "sessions" in kwargs:
        kwargs["sessions"] = tuple(kwargs["sessions"])[:1]
    if check is restart_recovers:
        kwargs.pop("max_examples", None)
    return check(build, **kwargs)
