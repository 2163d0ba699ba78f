"""LocalSession's host side: node worker threads and the run driver's I/O,
with or without a deterministic schedule.

::

    LocalSession._run_plans
      |  a job per node -> that node's worker thread (`work`):
      |     run_node: runtime.run(...)             (no schedule)
      |     run_scheduled_node: sched.run_as(node branch, runtime.run(...,
      |                         clock=sched)); a failure cancels the run's
      |                         other nodes before the baton moves on
      |  (node, result, error) events --> ThreadRunIO / ScheduledRunIO
      v
    driver.drive(state, io): first error wins, timeouts, cancels

Under a schedule (`run_scheduled`) the run has one `Scheduler` for all its
nodes, and the driver's clock is the schedule's: ``io.now()`` is the
run's start plus the larger of the virtual and the real time elapsed, so
a run's timeout is virtual -- a run that sleeps past it times out at once
in wall time -- and still bounds a run whose ops take that long for real.
The scheduler holds still at the timeout (an alarm) and when it fails (a
deadlock, a replay that diverged) and wakes the driver with a tick (a None
event); the driver then cancels the nodes and the scheduler goes on from
that point, so what a cancel interrupts is the same in every run.  Once
the driver has cancelled, time is real again (the grace period before a
node thread counts as stuck is wall time).
"""

import functools
import queue
import time

from ..errors import RunTimeoutError
from ..plan.races import switch_points
from ..runtime.faults import NodeDeath
from ..runtime.scheduler import Scheduler
from . import driver

__all__ = ["ThreadRunIO", "ScheduledRunIO", "work", "run_node",
           "run_scheduled", "CANCEL_GRACE"]

#: seconds a cancelled run's threads get to stop before the session breaks
CANCEL_GRACE = 2.0


class ThreadRunIO(driver.RunIO):
    """The driver's I/O for nodes on worker threads."""

    def __init__(self, session, timeout):
        self.session = session
        self.timeout = timeout
        self.events = queue.SimpleQueue()   # (node, result, error)

    now = staticmethod(time.monotonic)

    def wait(self, timeout):
        return [self._event(*item) for item in self._take(timeout)
                if item is not None]

    def _take(self, timeout):
        events = self.events
        try:
            found = [events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while not events.empty():
            found.append(events.get_nowait())
        return found

    def _event(self, node, result, error):
        if isinstance(error, NodeDeath):   # a Kill fault
            return (driver.DIED, node, self.session._died(error))
        if error is not None:
            return (driver.FAILED, node, error)
        self.session._finished(node, result)
        return (driver.DONE, node, result.outputs)

    def cancel(self, nodes, rid):
        for node in nodes:
            self.session._runtime(node).cancel(rid)

    def kill(self, nodes):
        # a thread cannot be stopped from outside: the session breaks
        self.session._mark_broken(
            f"{len(nodes)} node thread(s) did not stop within "
            f"{CANCEL_GRACE} s of a cancelled run")

    def timeout_error(self, timeout, late, killed):
        return RunTimeoutError(
            f"run did not finish within {timeout} s; it was cancelled"
            + (f" ({len(killed)} node thread(s) did not stop, so the session "
               "is now broken)" if killed else ""), nodes=late, killed=killed)


def work(jobs):
    """A node's worker thread: runs the jobs handed to it, in order."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job()


def run_node(runtime, rid, plan, channels, trace, events, epoch=None,
             conditions=None):
    """A worker's job: ``plan`` on ``runtime``; the outcome to ``events``."""
    try:
        result = runtime.run(rid, plan, channels, trace, epoch=epoch,
                             conditions=conditions)
    except BaseException as exc:  # noqa: BLE001 - handed to the driver
        events.put((plan.node, None, exc))
    else:
        events.put((plan.node, result, None))


# -- under a deterministic schedule -------------------------------------------

class ScheduledRunIO(ThreadRunIO):
    """`ThreadRunIO` on the clock of the run's schedule (module docstring)."""

    def __init__(self, session, timeout, nodes, rid, start_ns):
        super().__init__(session, timeout)
        self.sched = None
        self._nodes, self._rid = list(nodes), rid
        #: ``now()`` at the start of the run: the driver's deadline counts
        #: from it exactly, so the virtual timeout meets it exactly
        self.started = time.monotonic()
        self._v0 = start_ns
        self._timed_out = False
        self._cancelled_at = None    # (io time, wall time) of the cancel
        self._failure_handled = False

    def now(self):
        if self._cancelled_at is not None:
            at, wall = self._cancelled_at
            return at + (time.monotonic() - wall)
        elapsed = max(time.monotonic() - self.started,
                      (self.sched.now_ns() - self._v0) / 1e9)
        if self._timed_out:
            elapsed = max(elapsed, self.timeout)
        return self.started + elapsed

    def tick(self):
        """The scheduler holds still for the driver (under its lock)."""
        self.events.put(None)

    def deadline(self):
        """The virtual clock reached the run's timeout."""
        self._timed_out = True
        self.events.put(None)

    def wait(self, timeout):
        found = super().wait(timeout)
        if self.sched.failure is not None and not self._failure_handled:
            # a deadlock or a diverged replay: every node stops here
            self._failure_handled = True
            self.cancel(self._nodes, self._rid)
        return found

    def cancel(self, nodes, rid):
        if self._cancelled_at is None:
            self._cancelled_at = (self.now(), time.monotonic())
        super().cancel(nodes, rid)
        self.sched.kick()   # go on from where the scheduler held still

    def timeout_error(self, timeout, late, killed):
        return RunTimeoutError(
            f"run did not finish within {timeout} s of its schedule's virtual"
            " time; it was cancelled"
            + (f" ({len(killed)} node thread(s) did not stop, so the session "
               "is now broken)" if killed else ""), nodes=late, killed=killed)


def run_scheduled_node(sched, branch, cancel_run, runtime, rid, plan,
                       channels, trace, events, epoch=None, conditions=None):
    """A worker's job under a schedule: the node's run as its branch."""
    def body():
        try:
            return runtime.run(rid, plan, channels, trace, clock=sched,
                               epoch=epoch, conditions=conditions)
        except BaseException:
            # the other nodes stop at this point of the schedule, not when
            # the driver gets round to it
            cancel_run()
            raise

    try:
        result = sched.run_as(branch, body)
    except BaseException as exc:  # noqa: BLE001 - handed to the driver
        events.put((plan.node, None, exc))
    else:
        events.put((plan.node, result, None))


#: the switch points of this many runs' plans a session keeps
POINTS_KEPT = 16


def _points(session, plans, runtimes):
    """`switch_points` of ``plans``, each node knowing the blobs its
    workspace holds -- worked out once per plans and blobs (the epochs of
    a training run the same plans on the same blobs)."""
    known = {node: frozenset(runtime.workspace.local_names())
             for node, runtime in runtimes.items()}
    key = (tuple((p.node, id(p.step)) for p in plans),
           tuple(sorted(known.items())))
    kept = session._switch_points
    found = kept.get(key)
    if found is None:
        if len(kept) >= POINTS_KEPT:
            kept.pop(next(iter(kept)))
        # the steps are kept with their points: their ids stay theirs
        found = kept[key] = ([p.step for p in plans], switch_points(
            [(p.node, p.step) for p in plans], known))
    return found[1]


def run_scheduled(session, plans, rid, channels, trace, timeout):
    """Run ``plans`` under ``session``'s schedule; ``{node: outputs}``.

    Sets ``session.last_schedule`` (the decisions), appends them to
    ``session.schedule_log`` and moves the session's
    virtual clock on, whatever the run's outcome."""
    nodes = [p.node for p in plans]
    io = ScheduledRunIO(session, timeout, nodes, rid, session._virtual_ns)
    key = tuple((p.node, p.step.name) for p in plans)
    runtimes = {node: session._runtime(node) for node in nodes}
    sched = io.sched = Scheduler(
        session.schedule, session._virtual_ns, on_idle=io.tick,
        run=len(session.schedule_log),
        estimate=session._decision_counts.get(key),
        points=_points(session, plans, runtimes))

    def cancel_run():
        for runtime in runtimes.values():
            runtime.cancel(rid)

    if timeout is not None:
        sched.alarm(timeout, io.deadline)
    for plan in plans:
        conditions = session._conditions_of(plan.node)
        branch = sched.add(plan.node, conditions.slowdown if conditions
                           else 1.0)
        session._worker(plan.node).put(functools.partial(
            run_scheduled_node, sched, branch, cancel_run,
            runtimes[plan.node], rid, plan, channels, trace, io.events,
            session.current_epoch, conditions))
    state = driver.start(nodes, rid, io.started, timeout)
    sched.kick()
    try:
        return driver.drive(state, io, CANCEL_GRACE, timeout)
    except Exception:
        if sched.failure is not None:  # what stopped the run, not its
            raise sched.failure from None  # cancellation
        raise
    finally:
        session.last_schedule = list(sched.decisions)
        session.schedule_log.append(session.last_schedule)
        session.last_preemptions = sched.preemptions
        session.schedule_preemptions += sched.preemptions
        run = len(session.schedule_log) - 1
        session.schedule_switches.extend(
            (run, index, name) for index, name in sched.switched)
        session._decision_counts[key] = max(
            len(sched.decisions), session._decision_counts.get(key, 0))
        end = sched.end_ns()
        session.last_run_simulated_seconds = (end - io._v0) / 1e9
        session._virtual_ns = end
        sched.close()
