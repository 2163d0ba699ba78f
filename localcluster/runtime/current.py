"""Which node's runtime the calling thread works for.

A host that shares one process between nodes (LocalSession) needs to
know, when a thread writes to ``sys.stdout``, whose output that is.
`NodeRuntime.run` marks the calling thread as working for its runtime for
the run's length, and the executor marks each branch thread it starts
(concurrent substeps, instances, timers) with its parent's mark; a thread
nobody marked (the user's own, the session's) has none.  It costs one
thread-local read and write per run and per branch.
"""

import threading

__all__ = ["current_runtime", "enter", "leave", "inherit"]

_LOCAL = threading.local()


def current_runtime():
    """The `NodeRuntime` the calling thread works for, or None."""
    return getattr(_LOCAL, "runtime", None)


def enter(runtime):
    """Mark the calling thread as working for ``runtime``; returns the
    mark it had, for `leave`."""
    previous = getattr(_LOCAL, "runtime", None)
    _LOCAL.runtime = runtime
    return previous


def leave(previous):
    """Restore the mark `enter` returned."""
    _LOCAL.runtime = previous


def inherit(fn):
    """``fn`` wrapped to run, on whatever thread, for the runtime the
    calling thread works for now."""
    runtime = current_runtime()
    if runtime is None:
        return fn

    def marked(*args, **kwargs):
        previous = enter(runtime)
        try:
            return fn(*args, **kwargs)
        finally:
            leave(previous)
    return marked
