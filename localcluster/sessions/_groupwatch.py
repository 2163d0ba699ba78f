"""A watcher process per LocalHostScheduler: its nodes die with the master,
whatever the nodes are doing.

A node ends its own process group when it sees its master go (the
parent-death signal, pipe EOF: `_plumbing.end_own_group`) -- but that is
Python code in the node, and a node inside native code that holds the
interpreter (a long C call of a user's op) runs none of it until the call
returns: it, and what it started, would outlive a SIGKILLed master by as
long.  The watcher does not depend on the node: a small process forked
from the master when the scheduler starts its first node, in a process
group of its own (a Ctrl-C at the terminal is not for it), holding only
the read end of a pipe from the master.  The master writes ``+<pid>``
when a node starts -- a node leads its own group -- and ``-<pid>`` when it
is reaped; when the pipe ends without a goodbye (the master died, by
SIGKILL too: the kernel closes its end), the watcher SIGKILLs every node
group it was told of and removes the master's shared-memory segments,
then exits.  `close` says goodbye and reaps it.

The pipe's write end is the master's alone: a forked node closes it with
the master's other ends (`MASTER_ENDS`), a process forked from the master
otherwise closes it at once (an at-fork hook), so that only the master's
death ends the pipe.  The watcher itself runs nothing but system calls
after the fork (no logging, no locks another thread could have held).
"""

import os
import signal
import time
import weakref

from ..runtime import shm
from ._plumbing import MASTER_ENDS
from ._title import _spt

__all__ = ["GroupWatcher"]

#: seconds `close` waits for the watcher to exit after the goodbye
REAP_WAIT = 2.0

_BYE = b"bye\n"

#: write ends of this process's watchers, closed in any forked child
_WRITE_ENDS = weakref.WeakSet()


class _End:
    """The pipe's write end, as `MASTER_ENDS` holds ends (``close``)."""

    def __init__(self, fd):
        self.fd = fd

    def fileno(self):
        return self.fd

    def close(self):
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _close_in_child():
    for end in list(_WRITE_ENDS):
        end.close()


os.register_at_fork(after_in_child=_close_in_child)


class GroupWatcher:
    """The master's side of one scheduler's watcher (see the module
    docstring)."""

    def __init__(self, prefix):
        self._prefix = prefix
        self._end = None
        self._pid = None

    def add(self, pid):
        """Node ``pid`` (the leader of its group) started."""
        if self._end is None:
            self._start()
        self._say(b"+%d\n" % pid)

    def remove(self, pid):
        """Node ``pid`` was reaped: its group id may be reused."""
        if self._end is not None:
            self._say(b"-%d\n" % pid)

    def close(self):
        """Goodbye: the watcher exits without killing anything; reaped
        (SIGKILLed if it does not go within `REAP_WAIT`)."""
        end, pid = self._end, self._pid
        if end is None:
            return
        self._say(_BYE)
        MASTER_ENDS.discard(end)
        _WRITE_ENDS.discard(end)
        end.close()
        self._end = self._pid = None
        deadline = time.monotonic() + REAP_WAIT
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return
            if done:
                return
            if time.monotonic() > deadline:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
                return
            time.sleep(0.005)

    def _say(self, line):
        try:
            os.write(self._end.fd, line)
        except (OSError, AttributeError, TypeError):
            pass   # the watcher is gone: nothing to tell

    def _start(self):
        master = os.getpid()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the watcher
            try:
                _watch(r, self._prefix, master)
            finally:
                os._exit(0)
        os.close(r)
        self._pid = pid
        self._end = _End(w)
        MASTER_ENDS.add(self._end)
        _WRITE_ENDS.add(self._end)


def _watch(r, prefix, master):
    """The watcher's life: read the master's lines until the pipe ends."""
    os.setpgid(0, 0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                signal.SIGUSR1, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != r:
            os.dup2(null, fd)
    keep = sorted({0, 1, 2, r})
    for low, high in zip(keep, keep[1:] + [os.sysconf("SC_OPEN_MAX")]):
        os.closerange(low + 1, high)
    if _spt is not None:
        try:
            _spt.setproctitle(f"localcluster: node watcher ({master})")
        except Exception:  # noqa: BLE001 - a title is not worth dying for
            pass
    groups, pending = set(), b""
    while True:
        try:
            chunk = os.read(r, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line == _BYE.strip():
                return
            if line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))
    # the master is gone without a goodbye
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    try:
        for name in os.listdir(shm.SHM_DIR):
            if name.startswith(prefix) or \
                    name.startswith(shm.SEMAPHORE + prefix):
                try:
                    os.unlink(os.path.join(shm.SHM_DIR, name))
                except OSError:
                    pass
    except OSError:
        pass
