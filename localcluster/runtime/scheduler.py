"""The scheduler of one run under a deterministic schedule: a baton and a
virtual clock.

::

    session (LocalSession)                 branches (real threads)
      sched = Scheduler(schedule, ...)
      sched.add(node) per node ---------->  node worker: sched.run_as(b, fn)
      sched.alarm(deadline, tick)             ops that interact:
                                                clock.point()     -- switch
      sched.kick()   starts the run           waits: clock.wait(...) -- switch
      driver waits; on a tick:                run_concurrently / reporters:
        cancel nodes, sched.kick()              clock.branches(...).start()
      sched.close()                               .join()         -- switch
      sched.decisions -> last_schedule

Every concurrent branch of the run -- a node, the tasks of a group on it,
task instances, concurrent substeps (pipe threads), ``run_every_ms``
reporters -- stays a real thread, but only the one holding the baton
runs.  At each switch point it gives the baton back: before every op that
can interact with another branch (`point`; which ops those are is
``points``, worked out by the host with
`localcluster.plan.races.switch_points`), at every wait (`wait`) and when
it ends.  The ops between two points touch nothing another branch uses,
so they run on without a decision or a hand-over of the baton (`ran`
charges their virtual time), and every interleaving of the interacting
ops -- all a run's result can depend on -- stays reachable.  The scheduler then
picks the next branch among those that can go on -- ready ones, and
waiting ones whose condition holds or whose timeout has passed -- ordered
by name, with the run's `Chooser` (a seeded generator, or a replay) when
there is a choice.  So a run's interleaving is a function of the seed,
the plan and the data, and two runs with one seed are the same run.

Branch names are stable paths, never thread ids: a node's name, then one
``/<label>`` per branching below it (``<step>:<i>`` for concurrent
substeps and instances, ``<step>:every:<i>`` for reporters).

Virtual time: every branch has a clock of its own, as every machine of
a cluster does.  An op costs the schedule's ``op_seconds`` times the
branch's node's slowdown (or, with ``op_seconds="measured"``, the real
time it took times the slowdown); a wait with a timeout ends at the
branch's time plus the timeout; a branch woken by another (a record put,
a branch ended) goes on at the later of its own time and the waker's.
The next branch to run is one that could start within one op's cost (on
the earliest branch's node) of the earliest time among those that can go
on -- ready ones, waiting ones whose condition holds or whose timeout has
come: the schedule chooses among them, since ops that start that close
together overlap on real machines; so what a branch sees happened before
it in virtual time, up to one op, and a run's virtual length is what it
would take with every node on a machine of its own.  With
``op_seconds=0`` (the default) every branch's clock stands still while it
runs and all that can go on are tied.  If no branch can go on and none
waits with a timeout, nothing ever will (whatever the run's own
timeout): the scheduler records a `DeadlockError` naming each waiting
branch and what it waits for, goes idle and tells the session
(``on_idle``), which cancels the run's nodes (their waits then end) and
raises the error.  A wait for time with no end (``timeout=math.inf``: a
partition that never heals) is not a deadlock while the run has a
timeout: that comes first.  An `alarm` (the run's timeout) also leaves
the scheduler idle when it is due, until the session has acted on it and
calls `kick`: whatever the session does in between (a cancel) happens at
that one point of the schedule, so a timed-out run is deterministic too.

A wait inside a branch must not hold a lock another branch may take
while parked: the condition of ``wait(cond, until=...)`` is released
while the branch is parked, and ops hold the node's lock only inside one
op, with no switch point inside.  A Python op that blocks on something
of its own (a lock, a socket) is outside the schedule's view.
"""

import bisect
import math
import threading
import time

from ..errors import Cancelled, DeadlockError, ScheduleDivergedError
from .clock import REAL_TIME

__all__ = ["Scheduler"]

READY, RUNNING, WAITING, DONE = "ready", "running", "waiting", "done"

#: seconds a parked branch looks again if unwoken: a safety net only --
#: handing over the baton opens the gate of the branch that gets it
PARK_WAKE = 1.0


class _Branch:
    __slots__ = ("name", "state", "gate", "until", "deadline", "what", "t",
                 "slowdown", "since", "woken", "held", "timed_out", "group",
                 "mark", "skipped", "joins")

    def __init__(self, name, t, slowdown):
        self.name = name
        self.state = READY
        # a binary semaphore: held while the branch may not run; the
        # branch that hands it the baton releases it (`_open`), the
        # branch's own thread takes it back to park (`Scheduler._park`)
        self.gate = threading.Lock()
        self.gate.acquire()
        self.until = None     # what ends its wait (a callable)
        self.deadline = None  # virtual ns at which its wait times out
        self.what = None      # what it waits for, in words
        self.t = t            # its virtual time, ns
        self.slowdown = slowdown
        self.since = 0        # perf_counter_ns when it last got the baton
        self.woken = None     # the time its wait's condition first held
        self.held = False     # it waits for time with no end
        self.timed_out = False
        self.group = None     # the `_Branches` it is one of
        self.mark = t         # its time when its last op that could wake
        #                       a branch ended (see `ran`)
        self.joins = None     # the `_Branches` its wait is the join of
        self.skipped = 0      # ops run without a point since its last
        #                       charge

    def __repr__(self):
        return f"<branch {self.name!r} {self.state}>"


class Scheduler:
    """One run's baton and virtual clock; a clock as `REAL_TIME` is (see
    `localcluster.runtime.clock`), plus the session's side (`add`,
    `run_as`, `alarm`, `kick`, `close`, `decisions`, `failure`)."""

    #: the executor calls `point` between ops
    switches = True

    def __init__(self, schedule, start_ns=0, on_idle=None, run=0,
                 estimate=None, points=None):
        self.schedule = schedule
        #: ``{node: {id(net): op indices}}``: the ops that get a switch
        #: point (`localcluster.plan.races.switch_points`); None: every op
        self.points = points
        self._op_ns = schedule.op_ns
        self._measured = schedule.op_seconds == "measured"
        self._chooser = schedule.chooser(run, estimate)
        self._ran = None      # the branch that had the baton last
        self._op_sum = self._op_count = 0   # measured op costs, ns
        self._lock = threading.Lock()
        self._branches = {}   # live branches by name
        self._names = []      # their names, sorted
        self._order = []      # the branches in the order of ``_names``
        self._current = None  # the branch holding the baton
        self._ns = int(start_ns)   # the time of the last pick
        self._end = self._ns       # the latest time a branch ended at
        self._last = self._ns      # the time of the branch that yielded last
        self._alarms = []     # [(ns, fn)]
        self._alarm_at = None  # the earliest alarm's ns, or None
        self._on_idle = on_idle or (lambda: None)
        self._local = threading.local()
        self._closed = False
        #: what stopped the run from here (`DeadlockError`,
        #: `ScheduleDivergedError`), or None
        self.failure = None

    def __repr__(self):
        return (f"Scheduler({self.schedule!r}, t={self.now():.9f} s, "
                f"{len(self._branches)} branches, "
                f"{len(self.decisions)} decisions)")

    # -- the clock ----------------------------------------------------------

    def now(self):
        return self.now_ns() / 1e9

    def now_ns(self):
        """The calling branch's time; elsewhere (the session's side) the
        time the run has reached."""
        me = getattr(self._local, "branch", None)
        return self._ns if me is None else me.t

    def end_ns(self):
        """The latest time the run reached: when its last branch ended."""
        return max(self._ns, self._end)

    def points_of(self, node):
        """``{id(net): op indices}``: the ops of ``node`` that get a
        switch point (`point`) before them -- the others cannot interact
        with another branch, so they run on without one (`ran`); None:
        every op gets one."""
        if self.points is None:
            return None
        return self.points.get(node, _NO_POINTS)

    def point(self):
        """An op boundary: the next branch may run first."""
        me = getattr(self._local, "branch", None)
        if me is None:
            return
        with self._lock:
            if self._measured:
                self._charge(me)
            else:   # `_charge`, without the measuring
                self._ran = me.name
                me.skipped = 0
            # a branch woken by what ran since its last decision goes on
            # at the time that op ended, not later (`ran`)
            self._last = me.mark
            if self._op_ns:
                me.t += int(self._op_ns * me.slowdown)
            me.state = READY
            try:
                self._pick()
                if self._current is not me:
                    self._park(me)
                else:   # it goes on: `_park` without the parking
                    me.mark = me.t
                    if self._measured:
                        me.since = time.perf_counter_ns()
            finally:
                me.state = RUNNING

    def ran(self, ops, after_point=True):
        """The calling branch ran ``ops`` more ops without a point before
        them (``after_point``: right after the op of its last `point`):
        each costs the time it would have been charged at its own point.
        They cannot wake another branch, so what the op at the point woke
        it woke at the time that op ended (the branch's ``mark``), not
        after them.  No decision and no lock: only the branch holding the
        baton runs."""
        me = getattr(self._local, "branch", None)
        if me is None:
            return
        if after_point:
            me.mark = me.t
        if ops > 0:
            me.t += ops * int(self._op_ns * me.slowdown)
            me.skipped += ops

    def wait(self, on, timeout=None, *, until=None, what=None):
        """The wait primitive, in virtual time (see the clock module)."""
        me = getattr(self._local, "branch", None)
        if me is None:  # not a branch of this run: nothing to schedule
            return REAL_TIME.wait(on, timeout, until=until, what=what)
        ready = on.is_set if until is None else until
        if until is not None:
            on.release()  # others may change what ``until`` reads
        try:
            timed_out = self._wait(me, ready, timeout, what or "an event")
        finally:
            if until is not None:
                on.acquire()
        return not timed_out and bool(ready())

    def branches(self, labels, fns, thread_name):
        """Branches ``<this branch>/<label>`` running ``fns``."""
        return _Branches(self, labels, fns, thread_name)

    # -- the session's side -------------------------------------------------

    @property
    def decisions(self):
        """The decisions made so far (branch names)."""
        return self._chooser.decisions

    @property
    def switched(self):
        """``(decision, branch)`` of the decisions a non-preemptive
        schedule would not have made (see `Schedule.switches`)."""
        return self._chooser.switched

    @property
    def preemptions(self):
        """How many decisions so far switched away from a branch that
        could have gone on."""
        return self._chooser.preemptions

    def add(self, name, slowdown=1.0):
        """A root branch (a node, whose ops take ``slowdown`` times as
        long), before `kick` starts the run."""
        with self._lock:
            return self._add(name, self._ns, slowdown)

    def run_as(self, branch, fn):
        """``fn()`` on this thread as ``branch``, once it has the baton."""
        try:
            self._enter(branch)
        except BaseException:
            self._leave(branch)
            raise
        try:
            return fn()
        finally:
            self._leave(branch)

    def alarm(self, seconds, fn):
        """Call ``fn()`` (quick; under the scheduler's lock) once the
        virtual clock reaches ``seconds`` after now, and stay idle until
        `kick`."""
        with self._lock:
            self._alarms.append((self._ns + _ns(seconds), fn))
            self._alarm_at = min(a for a, _ in self._alarms)

    def kick(self):
        """Start the run, or go on after an alarm or a failure (once the
        session has acted on it); nothing if a branch has the baton."""
        with self._lock:
            if self._current is None and not self._closed:
                self._pick()

    def close(self):
        """End the run's scheduling: a branch still parked raises
        `Cancelled` (only after a run that could not stop)."""
        with self._lock:
            self._closed = True
            for b in self._branches.values():
                _open(b)

    # -- inside -------------------------------------------------------------

    def _add(self, name, t, slowdown):
        if name in self._branches:  # same label twice under one parent
            k = 2
            while f"{name}~{k}" in self._branches:
                k += 1
            name = f"{name}~{k}"
        branch = self._branches[name] = _Branch(name, t, float(slowdown))
        at = bisect.bisect_left(self._names, name)
        self._names.insert(at, name)
        self._order.insert(at, branch)
        return branch

    def _charge(self, me):
        """With measured op costs: the real time ``me`` ran since it got
        the baton, times its slowdown, onto its clock (lock held)."""
        self._ran = me.name
        skipped, me.skipped = me.skipped, 0
        if self._measured and me.since:
            cost = time.perf_counter_ns() - me.since
            self._op_sum += cost
            self._op_count += 1 + skipped   # the ops ``cost`` covers
            me.t += int(cost * me.slowdown)

    def _window(self, branch):
        """One op's cost on ``branch``, in ns: branches that could start
        within it of the earliest are the schedule's choice."""
        slowdown = branch.slowdown
        if self._measured:
            return int(self._op_sum / max(self._op_count, 1) * slowdown)
        return int(self._op_ns * slowdown)

    def _enter(self, branch):
        self._local.branch = branch
        with self._lock:
            self._park(branch)
            branch.state = RUNNING

    def _leave(self, branch):
        self._local.branch = None
        with self._lock:
            self._charge(branch)
            branch.since = 0
            self._last = branch.t
            self._end = max(self._end, branch.t)
            self._done(branch)
            if self._current is branch:
                self._pick()

    def _done(self, branch):
        """``branch`` has ended (lock held)."""
        if branch.state is not DONE:
            branch.state = DONE
            if branch.group is not None:
                branch.group.remaining -= 1
        name = branch.name
        if self._branches.get(name) is branch:
            del self._branches[name]
            at = bisect.bisect_left(self._names, name)
            del self._names[at]
            del self._order[at]

    def _wait(self, me, ready, timeout, what, joins=None):
        """Park ``me`` until ``ready()`` or its timeout; True if it timed
        out.  ``joins``: the `_Branches` whose end ``ready`` waits for
        (``remaining == 0``, which only `_done` changes): `_pick` passes
        over ``me`` without asking while some of them run."""
        with self._lock:
            self._charge(me)
            self._last = me.t
            me.state, me.until, me.what = WAITING, ready, what
            me.joins = joins
            me.held = timeout == math.inf
            me.deadline = None if timeout is None or me.held \
                else me.t + _ns(timeout)
            me.woken, me.timed_out = None, False
            try:
                self._switch(me)
            finally:
                me.state, me.until, me.deadline = RUNNING, None, None
                me.held, me.joins = False, None
            return me.timed_out

    def _switch(self, me):
        """Hand the baton on (lock held); return once ``me`` has it."""
        self._pick()
        self._park(me)

    def _park(self, me):
        """Wait (lock held, released meanwhile) until ``me`` has the
        baton."""
        if self._current is not me:
            lock, gate = self._lock, me.gate
            while self._current is not me:
                if self._closed:
                    raise Cancelled(f"branch {me.name!r} was still waiting "
                                    "when its run's schedule ended")
                lock.release()
                try:
                    gate.acquire(True, PARK_WAKE)
                finally:
                    lock.acquire()
        me.mark = me.t
        if self._measured:
            me.since = time.perf_counter_ns()

    def _pick(self):
        """Give the baton to the branch that can go on earliest (the
        schedule's choice among those tied), or go idle (lock held).

        The branches that can go on are found by one pass over the live
        ones, in name order: ready ones at their time, waiting ones whose
        condition holds (from when it first held, `woken`) or whose
        timeout is due (at their deadline)."""
        self._current = None
        found = []   # [(branch, time it can go on at, by its timeout)]
        first = None   # the earliest of them (by name among equals)
        last = self._last
        for b in self._order:
            state = b.state
            if state is READY:
                at, late = b.t, False
            elif state is WAITING:
                if b.joins is not None and b.joins.remaining and \
                        b.deadline is None:
                    continue   # `until` is false: its branches still run
                try:
                    holds = b.until()
                except Exception:  # noqa: BLE001 - the waiter looks again
                    holds = True
                deadline = b.deadline
                if holds:
                    woken = b.woken
                    if woken is None:
                        woken = b.woken = b.t if b.t > last else last
                    if deadline is not None and deadline < woken:
                        at, late = deadline, True
                    else:
                        at, late = woken, False
                else:
                    b.woken = None
                    if deadline is None:
                        continue
                    at, late = deadline, True
            else:
                continue
            entry = (b, at, late)
            found.append(entry)
            if first is None or at < first[1]:
                first = entry
        if first is not None:
            key = first[1]
            alarm = self._alarm_at
            if alarm is not None and alarm <= key:
                self._fire_alarms(alarm)   # at its own time, not later
                return
            if len(found) == 1:
                branch, at, late = first
            else:
                if self._measured:
                    within = key + self._window(first[0])
                else:   # `_window`
                    within = key + int(self._op_ns * first[0].slowdown)
                tied = []
                for entry in found:
                    if entry[1] <= within:
                        tied.append(entry)
                if len(tied) == 1 or self.failure is not None:
                    # no choice, or draining a failed run (`_choose`)
                    branch, at, late = tied[0]
                else:
                    name = self._choose([entry[0].name for entry in tied])
                    if name is None:
                        return
                    for branch, at, late in tied:
                        if branch.name == name:
                            break
            self._current = branch
            branch.timed_out = late
            if branch.t < at:
                branch.t = at
            if self._ns < at:
                self._ns = at
            if branch is not getattr(self._local, "branch", None):
                _open(branch)   # its thread parks: wake it
            return
        if not self._branches:
            return  # the run is over
        if self._alarms and any(b.held for b in self._branches.values()):
            # held for good (a partition that never heals): the run's
            # timeout comes first
            self._fire_alarms(self._alarm_at)
            return
        if self.failure is None:
            self.failure = self._deadlock()
            self._on_idle()

    def _choose(self, ready):
        if len(ready) == 1 or self.failure is not None:
            return ready[0]  # no choice, or draining a failed run
        try:
            return self._chooser.choose(ready, self._ran)
        except ScheduleDivergedError as exc:
            self.failure = exc
            self._on_idle()
            return None

    def _fire_alarms(self, now):
        """The clock reached ``now``: fire the alarms due by then."""
        self._ns = max(self._ns, now)
        self._last = self._ns
        for alarm in [a for a in self._alarms if a[0] <= now]:
            self._alarms.remove(alarm)
            self._alarm_at = min((a for a, _ in self._alarms), default=None)
            alarm[1]()

    def _deadlock(self):
        waiting = sorted((name, b.what) for name, b in self._branches.items()
                         if b.state is WAITING)
        said = "; ".join(f"branch {n!r} waits for {w}" for n, w in waiting)
        return DeadlockError(
            f"deadlock at virtual time {self.now():.6f} s: every branch of "
            f"the run waits and no timer is pending, so none can go on -- "
            f"{said}.  Usually a queue is read that nothing writes or "
            "closes (or written while nothing reads it): check which task "
            "writes, reads and closes each queue", waiting=waiting)


_NO_POINTS = {}


def _open(branch):
    """Let ``branch``'s parked thread go on (the scheduler's lock held):
    release its gate unless it is open already."""
    gate = branch.gate
    if gate.locked():
        gate.release()


def _ns(seconds):
    return max(0, int(round(float(seconds) * 1e9)))


class _Branches:
    """Branches of the current branch, as threads that wait for the baton
    (see `localcluster.runtime.clock`)."""

    def __init__(self, scheduler, labels, fns, thread_name):
        self._s = scheduler
        self._labels = list(labels)
        self._fns = list(fns)
        self._thread_name = thread_name
        self.children = []
        self.threads = []
        self.remaining = 0   # children not ended yet

    def start(self):
        s = self._s
        parent = getattr(s._local, "branch", None)
        prefix = parent.name + "/" if parent is not None else ""
        with s._lock:
            if parent is not None:
                s._charge(parent)
                parent.since = time.perf_counter_ns() if s._measured else 0
            t, slow = (parent.t, parent.slowdown) if parent is not None \
                else (s._ns, 1.0)
            self.children = [s._add(prefix + label, t, slow)
                             for label in self._labels]
            for child in self.children:
                child.group = self
            self.remaining = len(self.children)
        for i, (child, fn) in enumerate(zip(self.children, self._fns)):
            t = threading.Thread(target=self._main, args=(child, fn),
                                 daemon=True, name=f"{self._thread_name}:{i}")
            try:
                t.start()
            except BaseException:
                with s._lock:
                    for c in self.children[i:]:
                        s._done(c)
                raise
            self.threads.append(t)

    def _main(self, child, fn):
        try:
            self._s.run_as(child, fn)
        except Cancelled:
            pass  # the run's schedule ended before this branch could start

    def join(self):
        s, children = self._s, self.children
        me = getattr(s._local, "branch", None)
        if me is not None and children:
            s._wait(me, lambda: self.remaining == 0, None,
                    f"its branches {[c.name for c in children]} to end",
                    joins=self)
        for t in self.threads:
            t.join()  # each has left the schedule: it is ending now

    def stop(self, seconds):
        for t in self.threads:
            t.join(seconds)
