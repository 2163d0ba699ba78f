"""A watcher process per LocalHostScheduler: its nodes die with the master,
whatever the nodes are doing.

A node ends its own process group when it sees its master go (the
parent-death signal, pipe EOF: `_plumbing.end_own_group`) -- but that is
Python code in the node, and a node inside native code that holds the
interpreter (a long C call of a user's op) runs none of it until the call
returns: it, and what it started, would outlive a SIGKILLed master by as
long.  The watcher does not depend on the node: a `_watcher` script
started with the scheduler's first node.  The master tells it ``+<pid>``
when a node starts -- a node leads its own group -- and ``-<pid>`` when it
is reaped; when the pipe ends without ``bye`` (the master died), the
watcher SIGKILLs every node group it was told of and removes the master's
shared-memory entries (``<prefix>...``, ``sem.<prefix>...``), then exits.
`GroupWatcher.close` says goodbye and reaps it.

Run as a script (the watcher's side) this file uses the standard library
alone.
"""

import os
import signal
import sys

try:  # the master's side, in the package
    from ._watcher import WatcherProcess
except ImportError:  # run as the watcher script: its side needs none of it
    WatcherProcess = None

__all__ = ["GroupWatcher"]

#: seconds `GroupWatcher.close` waits for the watcher to exit
REAP_WAIT = 2.0

_BYE = "bye"


class GroupWatcher:
    """The master's side of one scheduler's watcher (see the module
    docstring); started with the first node."""

    def __init__(self, prefix, shm_dir):
        self._watcher = WatcherProcess(__file__, prefix, shm_dir)
        self._started = False

    def add(self, pid):
        """Node ``pid`` (the leader of its group) started."""
        if not self._started:
            self._watcher.start()
            self._started = True
        self._watcher.say(f"+{pid}")

    def remove(self, pid):
        """Node ``pid`` was reaped: its group id may be reused."""
        self._watcher.say(f"-{pid}")

    def close(self):
        """Goodbye: the watcher exits without killing anything."""
        self._watcher.stop(_BYE, REAP_WAIT)


def main(prefix, shm_dir):
    """The watcher: read the master's lines until the pipe ends."""
    groups = set()
    with os.fdopen(0, "rb") as master:
        for line in master:   # until the master closes the pipe, or dies
            line = line.decode().strip()
            if line == _BYE:
                return
            if line[:1] == "+":
                groups.add(int(line[1:]))
            elif line[:1] == "-":
                groups.discard(int(line[1:]))
    # the master is gone without a goodbye
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix) or name.startswith("sem." + prefix):
            try:
                os.unlink(os.path.join(shm_dir, name))
            except OSError:
                pass


if __name__ == "__main__":
    main(*sys.argv[1:3])
