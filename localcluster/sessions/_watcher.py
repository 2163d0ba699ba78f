"""A watcher process: what a process started dies with it.

The owner starts a small script of the standard library alone
(``python -I -S <script> <args>``: a few milliseconds, nothing of the
owner's state, a session of its own so a Ctrl-C at the terminal does not
reach it) whose stdin is a pipe from the owner.  The owner tells it what
to watch, a line at a time; the script reads until the pipe ends -- the
owner closed it after a goodbye line, or died (a SIGKILL too: the kernel
closes its end) -- and then does what it is for.  A process forked from
the owner closes its copy of the pipe at once (an at-fork hook), so that
only the owner's end keeps the pipe open.

`_groupwatch` (node process groups) and `_raywatch` (a Ray the session
started) are the two scripts; this is their owner's side.
"""

import os
import subprocess
import sys

__all__ = ["WatcherProcess", "reap"]


class WatcherProcess:
    """The owner's side of one watcher: ``script`` run with ``args``."""

    def __init__(self, script, *args):
        self._argv = [sys.executable, "-I", "-S", os.path.abspath(script),
                      *map(str, args)]
        self._process = None

    @property
    def pid(self):
        return self._process.pid if self._process is not None else None

    def start(self):
        self._process = subprocess.Popen(
            self._argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        _started.append(self)
        return self

    def say(self, line):
        """Tell the watcher ``line``; nothing if it is gone."""
        process = self._process
        if process is None:
            return
        try:
            process.stdin.write(line.encode() + b"\n")
            process.stdin.flush()
        except (OSError, ValueError):
            pass   # it is gone: nothing to tell

    def stop(self, goodbye, wait):
        """Say ``goodbye``, close the pipe and reap the watcher (killed if
        it is not gone within ``wait`` seconds); idempotent."""
        process = self._process
        if process is None:
            return
        self.say(goodbye)
        self._process = None
        if self in _started:
            _started.remove(self)
        reap(process, wait)

    def _forget(self):
        """In a forked child: close its copy of the pipe, which must end
        when the owner goes."""
        process, self._process = self._process, None
        if process is not None:
            try:
                process.stdin.close()
            except OSError:
                pass
            process.returncode = 0   # not this process's to wait for


#: watchers this process started, whose pipe a forked child closes
_started = []


def _forget_all():
    for watcher in list(_started):
        watcher._forget()
    _started.clear()


os.register_at_fork(after_in_child=_forget_all)


def reap(process, wait):
    """Close ``process``'s stdin -- its cue to end -- and reap it: killed
    if it is not gone within ``wait`` seconds."""
    try:
        process.stdin.close()
    except OSError:
        pass
    try:
        process.wait(wait)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(wait)
