"""LocalHostScheduler's run I/O: what the run driver (`driver.drive`)
waits on, cancels and kills when the nodes are processes.

One poll on the control sockets of the scheduler's zygotes gives the
run's events, through the nodes' inboxes (`_handle.Mux`): a reply (after
the node's output written before it has been shown: the reply carries how
many bytes of output preceded it), a death (its zygote reaped it), or a
node outside the run that spoke late or died idle (its death is reported
by the next run that includes it).  A cancel writes the run id into the
node's control word and has the zygote send SIGUSR1 (one command per
zygote); a kill SIGKILLs the node's process group.
"""

import logging
import signal
import time

from ..errors import RunTimeoutError
from . import _protocol as P
from . import driver
from ._handle import CONN, SENTINEL, NodeState, signal_all

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
                self.s._poller.discard(handle)
                continue
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
            msg = handle.recv()
        except EOFError:
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
            outputs = msg[2]["outputs"]
            return (driver.DONE, handle.name,
                    self.s._reader.outputs(handle.name, outputs)
                    if outputs else {})
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
                handle.recv()  # a reply to an abandoned request
                return
            except EOFError:
                pass
        # Nobody waits on this node now: the next run that includes it
        # reports the death (instead of quietly restarting it empty).
        error = self.s._death(handle, "idle")
        self.s._unreported[handle.name] = error
        log.info("%s", error)  # (raised by that run: said once)

    def cancel(self, nodes, rid):
        handles = [self.by_name[name] for name in nodes]
        for handle in handles:
            # one aligned 8-byte store (struct.pack_into would zero the word
            # first, and the node could read 0 in between)
            handle.control_word[0] = rid
        # its death, if it is gone, comes from its zygote
        signal_all([h for h in handles if not h.gone], signal.SIGUSR1)

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
