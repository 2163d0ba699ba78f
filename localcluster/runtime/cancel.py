"""The cancellation of a node's run: an event that waits can wake on.

A run is cancelled by a failure on another branch or node, a timeout or an
interrupt.  Whatever waits inside the run must wake at once, not at its
next poll:

- ops and timer threads wait on it like a `threading.Event` (``wait``);
- in-process queue waits sleep on their channel's condition, which the
  run's channel hub notifies from a callback registered here
  (``subscribe``);
- a wait on a file descriptor (a cross-node queue's FIFO) selects on
  ``fileno()`` beside its own fd: an eventfd made on first use, readable
  while the event is set.

``clear`` starts the next run.  The eventfd is made only for runs that ask
for it, so a session with hundreds of in-process nodes holds no
descriptor per node.
"""

import os
import threading

__all__ = ["CancelEvent"]


class CancelEvent:
    """A `threading.Event` that also wakes subscribers and an fd."""

    def __init__(self):
        self._event = threading.Event()
        # the event's own method: every op, queue wait and scheduled
        # decision asks, so not through a call of ours
        self.is_set = self._event.is_set
        self._lock = threading.Lock()
        self._fd = None
        self._subscribers = []

    def __repr__(self):
        return f"CancelEvent({'set' if self.is_set() else 'clear'})"

    def wait(self, timeout=None):
        return self._event.wait(timeout)

    def set(self):
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            if self._fd is not None:
                os.eventfd_write(self._fd, 1)
            subscribers = list(self._subscribers)
        for fn in subscribers:
            fn()

    def clear(self):
        """Unset it and drop the subscribers of the run that ended."""
        if not self._subscribers and not self._event.is_set():
            return  # nothing to undo: the common case, without a lock
        with self._lock:
            self._event.clear()
            self._subscribers = []
            if self._fd is not None:
                try:
                    os.eventfd_read(self._fd)
                except BlockingIOError:
                    pass

    def subscribe(self, fn):
        """Call ``fn()`` when the event is set (at once if it is)."""
        with self._lock:
            if not self._event.is_set():
                self._subscribers.append(fn)
                return
        fn()

    def fileno(self):
        """An fd that is readable while the event is set."""
        fd = self._fd
        if fd is not None:
            return fd  # every wait of a busy queue asks: no lock then
        with self._lock:
            if self._fd is None:
                self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                if self._event.is_set():
                    os.eventfd_write(self._fd, 1)
            return self._fd

    def close(self):
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
