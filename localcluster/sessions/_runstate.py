"""The scheduler core of one LocalHostScheduler run, as plain state.

The master's wait loop feeds events in (a node replied, a node died, the
deadline passed) and asks what to do next; no processes or pipes here, so
the rules are unit-testable on their own:

- the run is over when no node is pending;
- the first failure (an op error, a node death) makes every other pending
  node *cancelled*: it is asked to stop, and killed if it has not stopped
  within the grace period;
- the error the run raises is the first real failure, never a cancellation
  that it caused.
"""

from ..errors import Cancelled

__all__ = ["RunState"]


class RunState:
    def __init__(self, nodes, rid):
        self.rid = rid
        self.pending = list(nodes)
        self.done = {}
        self.failures = []       # (node, exception), in the order they came
        self.cancelling = False
        self.cancel_deadline = None

    def __repr__(self):
        return (f"RunState(rid={self.rid}, pending={self.pending}, "
                f"done={sorted(self.done)}, failures="
                f"{[(n, type(e).__name__) for n, e in self.failures]})")

    def finished(self):
        return not self.pending

    def succeeded(self, node, payload):
        if node in self.pending:
            self.pending.remove(node)
            self.done[node] = payload

    def failed(self, node, error):
        if node in self.pending:
            self.pending.remove(node)
        self.failures.append((node, error))

    def should_cancel(self):
        """True once, when the others must be asked to stop."""
        return bool(self.failures) and not self.cancelling and \
            bool(self.pending)

    def start_cancelling(self, now, grace):
        self.cancelling = True
        self.cancel_deadline = now + grace

    def overdue(self, now):
        """Pending nodes that ignored the cancellation past its grace."""
        if self.cancelling and now >= self.cancel_deadline:
            return list(self.pending)
        return []

    def error(self):
        """The exception the run raises, or None if it succeeded."""
        real = [e for _, e in self.failures if not isinstance(e, Cancelled)]
        if real:
            return real[0]
        return self.failures[0][1] if self.failures else None
