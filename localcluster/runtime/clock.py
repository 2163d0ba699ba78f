"""The clock of a run: the one way the runtime reads time, waits and
starts concurrent branches.

Every run has a clock, ``rc.clock`` in the executor and ``ctx.clock`` in a
``context=True`` kernel.  Without a schedule it is `REAL_TIME`, the one
`RealClock`: real time and real threads.  Under a deterministic schedule it
is the run's `localcluster.runtime.scheduler.Scheduler`, which keeps the
same interface on a virtual clock.  Code that waits inside a run uses only
this interface, so it behaves the same in both::

    clock.now() / clock.now_ns()      seconds / nanoseconds: monotonic
                                      (virtual under a schedule)
    clock.wait(event, timeout, what=...)
    clock.wait(cond, timeout, until=ready, what=...)
    clock.branches(labels, fns, thread_name).start() / .join() / .stop(s)
    clock.switches                    True: a schedule -- call
                                      clock.point() before each op that
                                      clock.points_of(node) names and
                                      clock.ran(n) after ops run without

`wait` is the wait primitive:

- ``wait(event, timeout)`` waits until ``event`` (a `threading.Event` or
  the run's `CancelEvent`) is set;
- ``wait(cond, timeout, until=ready)``: the caller holds the
  `threading.Condition` ``cond`` (acquired once) and waits until
  ``ready()`` is true; whoever changes what ``ready`` reads notifies
  ``cond`` (the real clock sleeps on it; a schedule re-evaluates
  ``ready`` at each of its decisions, with ``cond`` released);
- at most ``timeout`` seconds (None: no bound of its own -- then
  ``ready`` or the event must include the run's cancellation, which is
  what bounds every wait of a run); it returns True if the wait ended by
  its event or ``ready``, False if the time ran out;
- ``what`` says what is awaited, in words a user reads in a
  `DeadlockError`: ``"a record from queue 'queue/q'"``.

A wait that should end when the run is cancelled waits on the run's
`CancelEvent` itself (``Sleep``: ``wait(ctx.cancelled, seconds)`` is True
if cancelled) or puts ``cancelled.is_set()`` in ``ready``.
"""

import threading
import time

__all__ = ["RealClock", "REAL_TIME", "SAFETY_WAKE", "wait_meter",
           "metered"]

#: seconds after which a condition waiter looks again even unwoken: a
#: safety net only -- every state change notifies, so nothing depends on it
SAFETY_WAKE = 5.0


class _Meter(threading.local):
    """Seconds this thread spent waiting while a slow node's op loop
    measures its ops (`localcluster.runtime.links`): what an op waits
    for is not what a slower machine would take longer at."""
    seconds = 0.0
    active = 0

    def stop(self):
        self.active -= 1


_METER = _Meter()


def wait_meter():
    """This thread's wait meter, counting until its ``stop()``."""
    _METER.active += 1
    return _METER


def metered(wait):
    """``wait`` (a blocking call), its time noted on the thread's meter."""
    def measured(*args, **kwargs):
        if not _METER.active:
            return wait(*args, **kwargs)
        start = time.monotonic()
        try:
            return wait(*args, **kwargs)
        finally:
            _METER.seconds += time.monotonic() - start
    return measured


class RealClock:
    """Real time and real threads: the clock of a run without a schedule."""

    #: no switch points between ops: branches run truly concurrently
    switches = False

    def __repr__(self):
        return "REAL_TIME"

    now = staticmethod(time.monotonic)
    now_ns = staticmethod(time.perf_counter_ns)

    @metered
    def wait(self, on, timeout=None, *, until=None, what=None):
        """See the module docstring (``what`` is not needed here;
        ``timeout=math.inf`` is no timeout)."""
        if timeout == float("inf"):
            timeout = None
        if until is None:
            return on.wait(timeout)
        if until():
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if deadline is None:
                on.wait(SAFETY_WAKE)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                on.wait(min(left, SAFETY_WAKE))
            if until():
                return True

    def point(self):
        """An op boundary: nothing to do in real time."""

    def branches(self, labels, fns, thread_name):
        """Threads running ``fns`` (not started yet); ``labels`` name them
        under a schedule only."""
        return _Threads(fns, thread_name)


class _Threads:
    """Concurrent branches as plain threads."""

    def __init__(self, fns, thread_name):
        self.threads = [threading.Thread(target=fn, daemon=True,
                                         name=f"{thread_name}:{i}")
                        for i, fn in enumerate(fns)]

    def start(self):
        for t in self.threads:
            t.start()

    def join(self):
        """Until every branch has ended: bounded by the run's cancellation
        (a branch stops at its next op or wait once the run is cancelled)."""
        for t in self.threads:
            t.join()

    def stop(self, seconds):
        """After the run was cancelled: give each branch ``seconds``."""
        for t in self.threads:
            if t.ident is not None:
                t.join(seconds)


#: the clock of every run without a schedule
REAL_TIME = RealClock()
