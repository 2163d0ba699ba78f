"""LocalHostScheduler's run I/O: what the run driver (`driver.drive`)
waits on, cancels and kills when the nodes are processes.

One poll on the scheduler's persistent set of node pipes and process
sentinels gives the run's events: a reply (after the node's output
written before it has been shown: the reply carries how many bytes of
output preceded it), a death (the sentinel, or EOF), or a node outside
the run that spoke late or died idle (its death is reported by the next
run that includes it).  A cancel writes the run id into the node's
control word and sends SIGUSR1; a kill SIGKILLs the node's process
group.
"""

import logging
import os
import signal
import time

from ..errors import RunTimeoutError
from . import _protocol as P
from . import driver
from ._handle import CONN, SENTINEL, NodeState

__all__ = ["ProcessRunIO", "OUTPUT_WAIT"]

log = logging.getLogger(__name__)

#: seconds a reply waits for the node's output written before it
OUTPUT_WAIT = 2.0


class ProcessRunIO(driver.RunIO):
    """The driver's I/O for node processes: the scheduler's poll set,
    control words and signals."""

    def __init__(self, scheduler, state, handles):
        self.s = scheduler
        self.state = state
        self.by_name = {h.name: h for h in handles}

    now = staticmethod(time.monotonic)

    def wait(self, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        events = []
        for handle, kind in self.s._poller.wait(deadline):
            if not handle.alive():
                continue  # its pipe and sentinel both fired: seen once
            if self.by_name.get(handle.name) is not handle:
                self._idle_event(handle, kind)
                continue
            event = self._event(handle, kind)
            if event is not None:
                events.append(event)
        return events

    def _event(self, handle, kind):
        if kind == SENTINEL:
            return self._died(handle, "running")
        try:
            msg = P.recv(handle.conn)
        except (EOFError, OSError):
            return self._died(handle, "running")
        if msg[1] != self.state.rid:
            return None  # a late reply to an earlier, abandoned request
        handle.state = NodeState.IDLE
        handle.log.wait_for(msg[-1], OUTPUT_WAIT)
        if msg[0] == P.OK:
            self.s._node_done(handle.name)
            if msg[2].get("trace") is not None:
                self.s.last_run_trace[handle.name] = msg[2]["trace"]
            # Copied now: the node may die before the run ends, and its
            # outbox goes with it.
            return (driver.DONE, handle.name,
                    self.s._reader.outputs(handle.name, msg[2]["outputs"]))
        info = msg[2]
        if info["kind"] == P.MEMORY:
            return (driver.FAILED, handle.name,
                    self.s._out_of_memory(handle, info))
        if info["kind"] == P.PLAN:
            handle.plans.clear()  # the node kept none of what failed to load
        return (driver.FAILED, handle.name,
                P.rebuild_error(handle.name, info))

    def _died(self, handle, during):
        error = self.s._death(handle, during)
        if handle.name not in self.state.pending:
            # after its reply: the next run that includes it raises this
            # error -- a warning now would say it twice
            log.info("%s", error)
        return (driver.DIED, handle.name, error)

    def _idle_event(self, handle, kind):
        """A node outside the run spoke (a late reply) or died."""
        if not handle.alive():
            return
        if kind == CONN:
            try:
                P.recv(handle.conn)  # a reply to an abandoned request
                return
            except (EOFError, OSError):
                pass
        # Nobody waits on this node now: the next run that includes it
        # reports the death (instead of quietly restarting it empty).
        error = self.s._death(handle, "idle")
        self.s._unreported[handle.name] = error
        log.info("%s", error)  # (raised by that run: said once)

    def cancel(self, nodes, rid):
        for name in nodes:
            handle = self.by_name[name]
            # one aligned 8-byte store (struct.pack_into would zero the word
            # first, and the node could read 0 in between)
            handle.control_word[0] = rid
            try:
                os.kill(handle.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass  # its death shows on the sentinel

    def kill(self, nodes):
        for name in nodes:
            self.s._kill(self.by_name[name])

    def timeout_error(self, timeout, late, killed):
        what = (f"; hung node(s) {killed} were killed and restart with an "
                "empty workspace on the next run" if killed else
                "; the late nodes stopped when cancelled")
        return RunTimeoutError(
            f"run did not finish within {timeout} s (still running: "
            f"{late}){what}", nodes=late, killed=killed)
