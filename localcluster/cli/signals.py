"""How ``python -m localcluster.run`` stops on Ctrl-C, SIGTERM and SIGHUP.

One handler for the three signals, installed before anything slow.  It
has two modes:

- *recording* (until the command line is ready to stop a run, and again
  once it is stopping): the handler only notes the signal.  A Python
  handler that raises at the wrong moment loses its exception -- inside
  an at-fork hook or a finalizer CPython prints it and goes on -- or cuts
  a cleanup short; noting is always safe.
- *armed* (while the command line can stop cleanly): the first signal
  raises `Interrupted` where the main thread is, and every later one is
  only noted -- a second Ctrl-C must not cut short the cleanup the first
  started, nor end the process by the signal (exit -2 instead of 130).

A block that must finish once begun -- an epoch's line and its record in
``metrics.jsonl``, written after its checkpoint is complete -- runs
`deferred`: a signal there is noted, and raised when the block ends.

Where the handler's exception cannot propagate -- it ran inside a weakref
callback or a finalizer, and CPython hands the exception to
`sys.unraisablehook` -- the hook installed here takes it back silently
and has the signal sent again, a moment later, to the main thread.  (A
fork is the one such place where that would still be too early:
`NodeHandle.spawn` defers the stop signals itself.)  `check()` raises for
a signal that was noted but never reached the command line: it is called
where stopping is safe -- on arming, after every epoch, after training --
so no signal is lost.

The exit status of a stop is 128 + the first signal's number: 130 for
Ctrl-C, 143 for SIGTERM, 129 for SIGHUP.
"""

import contextlib
import signal
import sys
import threading

__all__ = ["Interrupted", "StopSignals", "STOP", "exit_status"]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP: every node stopped, the last complete
    checkpoint kept, exit 128 + ``signum``."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(exc):
    """128 + the signal of an interrupt (a bare KeyboardInterrupt: 130)."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


class StopSignals:
    """The command line's signal state (one per process: `STOP`)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.received = None    # the first signal, once one came
        self.raised = False     # the handler raised it (once at most)
        self.delivered = False  # the command line caught it: stopping
        self.armed = False
        self._old = None
        self._old_hook = None

    def install(self):
        """Handle the three signals (from the main thread only); recording
        until `arm`."""
        if self._old is None:
            self._old = {s: signal.signal(s, self._handle)
                         for s in self.SIGNALS}
            self._old_hook = sys.unraisablehook
            sys.unraisablehook = self._unraisable

    def restore(self):
        """The handlers there were before `install`."""
        if self._old is not None:
            for sig, old in self._old.items():
                signal.signal(sig, old)
            self._old = None
            sys.unraisablehook = self._old_hook
        self.armed = False

    def arm(self):
        """From now on the first signal raises; one noted already does, now.
        """
        self.armed = True
        self.check()

    @contextlib.contextmanager
    def deferred(self):
        """A block no stop signal cuts short: a signal in it is noted, and
        raised as the block ends (if the signals were armed before it)."""
        armed, self.armed = self.armed, False
        try:
            yield
        finally:
            self.armed = armed and not self.delivered
        if self.armed:
            self.check()

    def stopping(self):
        """The command line caught the interrupt and cleans up: back to
        recording, so that no later signal cuts the cleanup short."""
        self.delivered = True
        self.armed = False

    def exiting(self):
        """The process is about to exit with its status: ignore the three
        signals from now on.  (The interpreter gives every Python handler
        back to the default action as it shuts down, and a signal then
        would end the process by that signal instead of its status.)"""
        self.stopping()
        for sig in self.SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def check(self):
        """Raise `Interrupted` for a signal noted and not yet caught by the
        command line (never raised, or raised and swallowed on the way)."""
        if self.received is not None and not self.delivered:
            self.raised = True
            raise Interrupted(self.received)

    def _unraisable(self, unraisable):
        if isinstance(unraisable.exc_value, Interrupted) and \
                not self.delivered:
            # Lost where it was raised: raise it again a moment later, from
            # another thread -- a signal sent from here would be handled
            # at once, inside this hook, and lost again.  A real signal to
            # the main thread also wakes it from a blocking wait.
            self.raised = False
            again = threading.Timer(0.01, signal.pthread_kill, (
                threading.main_thread().ident, unraisable.exc_value.signum))
            again.daemon = True
            again.start()
            return
        self._old_hook(unraisable)

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
        if self.armed and not self.raised:
            self.raised = True
            raise Interrupted(signum)


#: the state of this process's command line
STOP = StopSignals()
