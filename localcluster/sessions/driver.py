"""The run driver: the rules of a run, once, for every session.

A session starts a plan on each node of a run, then hands the waiting to
`drive`, with its I/O passed in (the way dask's local scheduler takes
``apply_async``)::

    session                         driver (this module)
      start(nodes, rid, timeout) --> RunState
      io.wait(seconds) -> events --> apply(): done / failed / died
                         <-- io.cancel(nodes, rid)  the first failure
                         <-- io.kill(nodes)         past the grace period
                         <-- io.timeout_error(...)  the deadline passed
      drive() returns {node: payload} or raises the run's error

The rules, as small functions over the explicit `RunState`:

- the run is over when no node is pending;
- the first failure (an op error, a node death) cancels every other
  pending node; a node that has not stopped ``grace`` seconds after its
  cancel is killed (a process is; a thread cannot be, and its session
  breaks instead -- that is the host's ``kill``);
- past the run's timeout the pending nodes are cancelled the same way and
  the run raises the session's `RunTimeoutError`;
- the error a run raises is the first real failure, never a cancellation
  it caused;
- a node that dies outside a run it is pending in (idle, or after it
  replied) is remembered in ``unreported`` and raised, once, by the next
  run that uses it (`take_unreported`): its workspace is gone.

Nothing here starts a process or touches a pipe, so the rules are
unit-tested with scripted events and a fake clock.
"""

import abc

from ..errors import Cancelled, first_error

__all__ = ["RunState", "RunIO", "DONE", "FAILED", "DIED", "start", "apply",
           "drive", "abort", "take_unreported"]

#: event kinds: ``(kind, node, value)`` -- the payload of a node that
#: finished, the error of one whose run failed (the node lives on), the
#: error describing a node's death
DONE, FAILED, DIED = "done", "failed", "died"


class RunState:
    """One run: who is pending, done or failed, and the clock's marks."""

    def __init__(self, nodes, rid, deadline=None):
        self.rid = rid
        # in start order; a dict, so that each node's event is O(1) and a
        # run of n nodes O(n), not O(n^2)
        self.pending = dict.fromkeys(nodes)
        self.done = {}
        self.failures = []          # (node, exception), in arrival order
        self.deadline = deadline    # monotonic seconds, or None
        self.cancelling = False
        self.cancel_deadline = None
        self.timed_out = None       # the nodes pending at the deadline
        self.killed = []

    def __repr__(self):
        return (f"RunState(rid={self.rid}, pending={list(self.pending)}, "
                f"done={sorted(self.done)}, failures="
                f"{[(n, type(e).__name__) for n, e in self.failures]})")

    def finished(self):
        return not self.pending

    def error(self):
        """The exception the run raises, or None if it succeeded."""
        return first_error([e for _, e in self.failures])


class RunIO(abc.ABC):
    """What a session gives the driver; every method is the session's."""

    @abc.abstractmethod
    def now(self):
        """Monotonic seconds."""
        raise NotImplementedError

    @abc.abstractmethod
    def wait(self, timeout):
        """The events that arrive within ``timeout`` seconds (None: until
        one does); an empty list if none did."""
        raise NotImplementedError

    @abc.abstractmethod
    def cancel(self, nodes, rid):
        """Ask ``nodes`` to stop run ``rid``."""
        raise NotImplementedError

    @abc.abstractmethod
    def kill(self, nodes):
        """Stop ``nodes`` by force: they did not stop when asked."""
        raise NotImplementedError

    @abc.abstractmethod
    def timeout_error(self, timeout, late, killed):
        """The error of a run that passed its ``timeout``: ``late`` nodes
        were pending then, ``killed`` had to be killed."""
        raise NotImplementedError


def start(nodes, rid, now, timeout):
    return RunState(nodes, rid,
                    None if timeout is None else now + timeout)


def apply(state, event, unreported):
    """Record one ``(kind, node, value)`` event."""
    kind, node, value = event
    if node not in state.pending:
        if kind == DIED:  # after its reply, or while not in this run
            unreported[node] = value
        return
    del state.pending[node]
    if kind == DONE:
        state.done[node] = value
    else:
        state.failures.append((node, value))


def _cancel(state, io, now, grace):
    state.cancelling = True
    state.cancel_deadline = now + grace
    io.cancel(list(state.pending), state.rid)


def _step(state, io, now, grace):
    """What is due at ``now``: a cancel, a timeout, a kill."""
    if state.pending and not state.cancelling:
        if state.failures:
            _cancel(state, io, now, grace)
        elif state.deadline is not None and now >= state.deadline:
            state.timed_out = list(state.pending)
            _cancel(state, io, now, grace)
    if state.cancelling and state.pending and now >= state.cancel_deadline:
        late = list(state.pending)
        io.kill(late)
        for node in late:
            state.killed.append(node)
            del state.pending[node]
            state.failures.append((node, Cancelled(f"node {node!r} killed")))


def _next_wait(state, now):
    mark = state.cancel_deadline if state.cancelling else state.deadline
    return None if mark is None else max(0.0, mark - now)


def drive(state, io, grace, timeout=None, unreported=None):
    """Wait the run out; ``{node: payload}``, or raise its error."""
    unreported = {} if unreported is None else unreported
    try:
        while state.pending:
            if state.failures or state.deadline is not None:
                now = io.now()
                _step(state, io, now, grace)
                if not state.pending:
                    break
                wait = _next_wait(state, now)
            else:
                wait = None  # nothing is due until something happens
            for event in io.wait(wait):
                apply(state, event, unreported)
    except BaseException:
        abort(state, io, grace, unreported)
        raise
    if state.timed_out is not None:
        raise io.timeout_error(timeout, state.timed_out, state.killed)
    error = state.error()
    if error is not None:
        raise error
    return state.done


def abort(state, io, grace, unreported=None):
    """An interrupted run (Ctrl-C, an internal error): cancel the pending
    nodes, wait out the grace period, kill the rest."""
    unreported = {} if unreported is None else unreported
    if not state.pending:
        return
    if not state.cancelling:
        _cancel(state, io, io.now(), grace)
    while state.pending:
        now = io.now()
        _step(state, io, now, grace)
        if state.pending:
            for event in io.wait(_next_wait(state, now)):
                apply(state, event, unreported)


def take_unreported(unreported, nodes):
    """The death, not yet raised, of one of ``nodes`` (removed), or None."""
    for node in nodes:
        error = unreported.pop(node, None)
        if error is not None:
            return error
    return None
