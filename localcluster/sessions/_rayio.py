"""RaySession's run I/O: what the run driver (`driver.drive`) waits on,
cancels and kills when the nodes are Ray actors.

A run's events are its object refs becoming ready: a reply (outputs, or
an error as `error_info`), or a `RayActorError` -- the actor died.  The
replies of the nodes ready together are fetched in one ``ray.get``.  A
cancel is a ``cancel.remote(rid)`` (the actor's second thread takes it
during the run); a kill is ``ray.kill`` without restart.
"""

import time

import ray

from ..errors import PlanError, RunTimeoutError
from . import _protocol as P
from . import _raywire as wire
from . import driver
from ._rayoptions import unimportable

__all__ = ["RayRunIO", "GATHER"]

#: seconds the driver waits for all of a run's nodes at once before it
#: waits for the first (a failure is seen this much later at most)
GATHER = 0.005


class RayRunIO(driver.RunIO):
    """The driver's I/O over the run's Ray object refs."""

    def __init__(self, session, refs):
        self.session = session
        self.refs = dict(refs)       # object ref -> node

    now = staticmethod(time.monotonic)

    def wait(self, timeout):
        """The events of the nodes that finish within ``timeout``: a run's
        nodes mostly finish together, so first up to GATHER seconds for
        all of them (one call), then for the first of them."""
        refs = list(self.refs)
        if not refs:
            return []
        gather = GATHER if timeout is None else min(timeout, GATHER)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=gather)
        if not ready:
            rest = None if timeout is None else timeout - gather
            if rest is not None and rest <= 0:
                return []
            ready, _ = ray.wait(refs, num_returns=1, timeout=rest)
            if not ready:
                return []
            if len(refs) > 1:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        try:   # the replies of the ready nodes in one call
            replies = ray.get(ready)
        except ray.exceptions.RayActorError:
            replies = [None] * len(ready)   # one by one: who died
        return [self._event(ref, reply) for ref, reply in zip(ready, replies)]

    def _event(self, ref, reply=None):
        node = self.refs.pop(ref)
        try:
            reply = reply if reply is not None else ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return (driver.DIED, node, self.session._died(node, exc))
        reply = wire.unpack(reply)   # a reply with small outputs: pickled
        if reply[0] == "error":
            error = P.rebuild_error(node, reply[1])
            if isinstance(error, PlanError):
                error = unimportable(error, self.session._by_reference)
            return (driver.FAILED, node, error)
        _, outputs, trace = reply
        self.session._node_done(node)
        if trace is not None:
            self.session.last_run_trace[node] = trace
        return (driver.DONE, node, outputs)

    def cancel(self, nodes, rid):
        for name in nodes:
            node = self.session._nodes.get(name)
            if node is not None:
                node.actor.cancel.remote(rid)

    def kill(self, nodes):
        for name in nodes:
            node = self.session._nodes.get(name)
            if node is not None:
                ray.kill(node.actor, no_restart=True)

    def timeout_error(self, timeout, late, killed):
        return RunTimeoutError(
            f"run did not finish within {timeout} s (still running: {late})"
            + (f"; {killed} did not stop when cancelled and were killed"
               if killed else ""), nodes=late, killed=killed)
