"""The watcher of a Ray that a RaySession started: Ray's processes die
with the process that started them.

::

    driver (`_rayoptions.connect`)              watcher (this file, a script)
      RayWatcher.start(): the watcher runs,       reads its stdin, the
        its stdin a pipe from the driver          driver's pipe, until EOF:
      with watcher.marking(): ray.init()          the driver closed it, or
        every process Ray starts -- head            died (a SIGKILL too)
        processes, raylet, its agents and     --> SIGKILL every process of
        workers, what those start -- inherits     that Ray, until none is
        LOCALCLUSTER_RAY=<token>                  left
      watcher.tell(session dir) ------------>   ("session <dir>" line)
      RayWatcher.stop() (after ray.shutdown()):
        "stop", close the pipe, wait for it

Ray ties its head processes to the driver that started them, but not the
processes its raylet starts: a SIGKILLed driver left
``ray::DashboardAgent``, ``ray::RuntimeEnvAgent`` and idle workers
running for a minute or two.  Once the driver is gone its process tree is
too (they are init's), so the watcher finds Ray's processes by what they
have from that Ray: an environment variable holding a token only this
Ray has -- which a process that sets its title may overwrite, as Ray's
agents and workers do -- or a log file of this Ray's session directory
open for writing: every process Ray starts writes its output there, or
holds the raylet's, which it inherited.  The watcher is a process of its
own session (a Ctrl-C at the terminal does not reach it) running this
file with the standard library alone, so it starts in a few milliseconds
and needs nothing that could be broken in the driver.  On a clean `stop`
it sweeps too, by the mark alone (the driver lives on, and so do the
processes it forked, holding its copies of the session's logs): whatever
marked process ``ray.shutdown()`` left is killed, and the watcher exits.

A Ray the session did not start (an address, or one already initialised
in the process) has no watcher, and none of its processes is touched.
The driver's side of the pipe is `_watcher.WatcherProcess`, as for the
node groups' watcher (`_groupwatch`).
"""

import contextlib
import os
import secrets
import select
import signal
import sys

try:  # the driver's side, in the package
    from ._watcher import WatcherProcess
except ImportError:  # run as the watcher script: its side needs none of it
    WatcherProcess = None

__all__ = ["RayWatcher", "MARK"]

#: the environment variable every process of a watched Ray inherits
MARK = "LOCALCLUSTER_RAY"
#: seconds `RayWatcher.stop` waits for the watcher's sweep
STOP_WAIT = 5.0
#: sweeps at most (a process found may have started another meanwhile)
ROUNDS = 10
#: seconds a sweep waits for the processes it killed to be gone
GONE_WAIT = 1.0


class RayWatcher:
    """The driver's side: starts the watcher, marks Ray's processes,
    stops the watcher."""

    def __init__(self):
        self.token = secrets.token_hex(8)
        self._watcher = WatcherProcess(__file__, self.token)

    def __repr__(self):
        return f"RayWatcher(pid={self._watcher.pid})"

    def start(self):
        self._watcher.start()
        return self

    @contextlib.contextmanager
    def marking(self):
        """Processes started meanwhile inherit the mark (and what they
        start, later, from them)."""
        old = os.environ.get(MARK)
        os.environ[MARK] = self.token
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(MARK, None)
            else:
                os.environ[MARK] = old

    def tell(self, session_dir):
        """Ray's session directory (known once ``ray.init`` returns): its
        processes' output goes to log files there."""
        self._watcher.say(f"session {session_dir}")

    def stop(self):
        """Let the watcher sweep and end (idempotent)."""
        self._watcher.stop("stop", STOP_WAIT)


# -- the watcher process ----------------------------------------------------------


def _marked(entry, logs, me):
    """Pids of the processes whose environment holds ``entry``, or that
    write to a file under the directory ``logs`` (None: no such look)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        if _has_mark(name, entry) or (logs and _logs_into(name, logs)):
            found.append(int(name))
    return found


def _has_mark(pid, entry):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False   # gone, or not ours to read


def _logs_into(pid, logs):
    """Whether process ``pid`` holds a file under ``logs`` open for
    writing (a reader -- ``tail -f`` -- is no process of Ray's)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith(logs):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                flags = next(int(line.split()[1], 8) for line in f
                             if line.startswith("flags:"))
        except (OSError, StopIteration, ValueError):
            continue
        if flags & os.O_ACCMODE != os.O_RDONLY:
            return True
    return False


def _kill_and_wait(pids):
    """SIGKILL ``pids``; wait (bounded) until they are gone."""
    handles = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue   # gone already
        except (AttributeError, OSError):
            _kill(pid)   # no pidfd here: killed, not waited for
            continue
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            os.close(fd)
            continue
        handles.append(fd)
    waiting = select.poll()
    for fd in handles:
        waiting.register(fd, select.POLLIN)
    left = set(handles)
    while left:
        ready = waiting.poll(GONE_WAIT * 1000)
        if not ready:
            break
        for fd, _ in ready:
            waiting.unregister(fd)
            left.discard(fd)
    for fd in handles:
        os.close(fd)


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def sweep(token, session_dir=None, spare=()):
    """Kill every process of the Ray marked with ``token`` whose session
    directory is ``session_dir`` (None: by the mark alone), but this one
    and ``spare`` (rounds, until none is found: one may have started
    another as it was killed)."""
    entry = f"{MARK}={token}".encode()
    logs = os.path.join(session_dir, "logs", "") if session_dir else None
    me = os.getpid()
    for _ in range(ROUNDS):
        pids = [p for p in _marked(entry, logs, me) if p not in spare]
        if not pids:
            return
        _kill_and_wait(pids)


def main(token):
    driver_pid = os.getppid()
    session_dir, stopped = None, False
    with os.fdopen(0, "rb") as driver:
        for line in driver:   # until the driver closes the pipe, or dies
            kind, _, value = line.decode().rstrip("\n").partition(" ")
            if kind == "session" and os.path.isabs(value):
                session_dir = value
            stopped = kind == "stop"
    # A driver that stopped its Ray lives on, with what it forked since
    # (holding its copies of the session's logs): only the marked go.
    sweep(token, None if stopped else session_dir, spare={driver_pid})


if __name__ == "__main__":
    main(sys.argv[1])
