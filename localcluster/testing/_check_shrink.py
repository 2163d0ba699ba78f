"""Shrinking a failing schedule to the fewest preemptions that still fail.

::

    smallest = shrink(attempt, switches)

A run under a seeded schedule that fails is rarely the simplest
interleaving that does: a random walk switches branches at almost every
op.  What a person needs is the few switches that matter.  A schedule is
written as its *switches* (`Schedule.switches`): the decisions where it
did not let the branch that ran go on (or, where that branch could not,
did not take the first that could, by name) -- every other decision
follows from that rule.  ``attempt(switches)`` runs the job under
``Schedule.switches(switches)`` and returns the switches that run
actually made if it still fails the same way, else None.

The search is delta debugging (Zeller's ddmin, complement only): leave
out chunks of the switches -- halves, then quarters, down to one at a
time -- and keep any run that still fails, with the switches it really
made (a switch left out can make later ones moot; they drop too).  It
stops when no single switch can go, or after ``budget`` runs or
``seconds`` of wall time: a shrunk counter-example is a convenience, and
the check's verdict never waits on it.
"""

import time

__all__ = ["shrink"]


def shrink(attempt, switches, budget=150, seconds=30.0):
    """The smallest failing switches found from ``switches`` (see the
    module docstring)."""
    best = list(switches)
    deadline = time.monotonic() + seconds
    runs = 0
    chunk = max(len(best) // 2, 1)
    while best:
        index, removed = 0, False
        while index < len(best):
            if runs >= budget or time.monotonic() > deadline:
                return best
            runs += 1
            found = attempt(best[:index] + best[index + chunk:])
            if found is not None and len(found) < len(best):
                best, removed = list(found), True
                continue
            index += chunk
        if chunk == 1 and not removed:
            return best
        chunk = max(chunk // 2, 1)
    return best
