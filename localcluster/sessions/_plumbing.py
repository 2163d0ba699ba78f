"""Process plumbing of a node process: what makes a forked process a node.

`_node` (the pipe loop around one `NodeRuntime`) calls these once at
start-up: the parent-death signal, so no node outlives its master -- nor
does what the node started: the signal is one the node handles by ending
its whole process group (`end_own_group`), not SIGKILL, which would end
the node alone and leave its children to init; the
redirection of fds 1 and 2 into a pipe the master reads (`Output`), so
node output reaches the master's terminal tagged with the node's name
and before the reply of the run that wrote it (the nodes of a zygote
share one pipe, written in frames: `FrameWriter`); and the Node options that
are process limits (``env``, ``cpus``, ``memory_limit``).  Nothing here
knows of plans or runs.
"""

import ctypes
import fcntl
import io
import logging
import multiprocessing
import os
import resource
import select
import selectors
import signal
import struct
import sys
import threading

import psutil

from ..errors import PlanError
from ..plan.validate import check_seconds

__all__ = ["set_parent_death_signal", "MASTER_GONE_SIGNAL", "end_own_group",
           "reset_signal_handlers", "Output",
           "apply_node_options", "check_cpus", "check_arguments",
           "MASTER_ENDS", "close_master_ends", "FrameWriter",
           "FrameReader", "death_frame", "raise_open_files"]

_PR_SET_PDEATHSIG = 1

#: the parent-death signal of a node: handled (`end_own_group`), so the
#: processes the node started die with it -- a real-time signal nobody
#: sends a node otherwise (a test's or a user's SIGUSR2 still kills it as
#: the kernel would)
MASTER_GONE_SIGNAL = signal.SIGRTMAX

#: The master-side pipe ends of every scheduler of this process (each
#: zygote's control socket and its nodes' output pipe, the log pump's
#: own, the log files): a forked zygote closes its copies so that EOF
#: reaches the zygotes and nodes that need it.  Kept up
#: to date as ends are made and closed -- an end is discarded before it is
#: closed -- so starting a node does not gather them anew (with hundreds
#: of nodes, gathering them at every start made start-up quadratic).
MASTER_ENDS = set()


def close_master_ends(ends=MASTER_ENDS):
    """In a forked node: close the inherited master-side ends (the set as
    it was at the fork)."""
    for end in list(ends):
        try:
            end.close()
        except OSError:
            pass
    ends.clear()


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: pipe EOF still ends the node


#: looked up once, in the master: a forked node inherits it instead of
#: loading the C library's symbols again at every start
_PRCTL = _prctl()


def set_parent_death_signal(sig):
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def end_own_group():
    """SIGKILL this process's group -- this process and every process it
    started, which share its group unless they left it -- when this
    process leads the group (a node does: it never ends its master's
    group); else this process alone."""
    me = os.getpid()
    try:
        if os.getpgrp() == me:
            os.killpg(me, signal.SIGKILL)
    finally:
        os.kill(me, signal.SIGKILL)


def reset_signal_handlers():
    """Give every signal the master handles in Python (a command line's
    SIGTERM/SIGHUP handlers, inherited by a fork) its default action
    again: a node a signal is sent to ends as the kernel ends it, which the
    master sees as a death it can recover from -- not an exception inside
    whatever op the node was running."""
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            pass  # SIGKILL/SIGSTOP and the like cannot be handled anyway


#: Output frames on a pipe many node processes share: ``(data length,
#: node id, kind)`` then the data; a frame is at most PIPE_BUF bytes, so
#: each ``write`` of one is atomic and frames of different nodes never
#: interleave.  Kinds: ``s`` the node started (data: its pid), ``o``/``e``
#: stdout/stderr bytes, ``x`` the node is gone (written by its zygote
#: once it reaped it: nothing of that node follows).
_FRAME = struct.Struct("!HIc")
_FRAME_DATA = select.PIPE_BUF - _FRAME.size
_TAG_KINDS = {"out": b"o", "err": b"e"}


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


class FrameWriter:
    """A node's end of its zygote's shared output pipe: ``send((tag,
    data))`` as `Output` calls it on a connection, written as frames."""

    def __init__(self, fd, node_id):
        self.fd = fd
        self.node_id = node_id

    def send(self, msg):
        tag, data = msg
        kind = _TAG_KINDS[tag]
        for at in range(0, len(data), _FRAME_DATA):
            chunk = data[at:at + _FRAME_DATA]
            _write_all(self.fd, _FRAME.pack(len(chunk), self.node_id, kind)
                       + chunk)

    def started(self, pid):
        """The first frame of a node: its pid (the log's start header)."""
        data = str(pid).encode()
        _write_all(self.fd, _FRAME.pack(len(data), self.node_id, b"s") +
                   data)


def death_frame(node_id):
    """The frame a zygote writes once node ``node_id`` was reaped."""
    return _FRAME.pack(0, node_id, b"x")


class FrameReader:
    """Splits what a shared output pipe gives into ``(node id, kind,
    data)`` frames (a read may end inside one: kept for the next)."""

    def __init__(self):
        self.buffer = bytearray()

    def feed(self, data):
        buffer = self.buffer
        buffer += data
        frames, at, size = [], 0, len(buffer)
        while size - at >= _FRAME.size:
            length, node_id, kind = _FRAME.unpack_from(buffer, at)
            end = at + _FRAME.size + length
            if end > size:
                break
            frames.append((node_id, kind, bytes(buffer[at + _FRAME.size:
                                                       end])))
            at = end
        del buffer[:at]
        return frames


def raise_open_files():
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (a
    zygote holds one descriptor per node it started)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = max(soft, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass


def set_nonblocking(fd):
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)


class Output:
    """Sends everything written to fds 1 and 2 to the master, tagged.

    A thread forwards output as it comes; `drain` (called before a reply)
    forwards what is left and returns how many bytes were sent in all, so
    the master can wait until it has shown a run's output before the run
    returns.
    """

    def __init__(self, log_conn):
        self.conn = log_conn
        self.lock = threading.Lock()
        self.sent = 0
        self.pipes = {}
        for fd, tag in ((1, "out"), (2, "err")):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            os.set_blocking(r, False)
            self.pipes[r] = tag
        self._waiting = select.poll()   # drain's look: one call, no list
        for r in self.pipes:
            self._waiting.register(r, select.POLLIN)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False),
                                      line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False),
                                      line_buffering=True)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and \
                    not isinstance(handler, logging.FileHandler):
                handler.setStream(sys.stderr)
        threading.Thread(target=self._pump, daemon=True,
                         name="lc:output").start()

    def _forward(self, fd):
        """Forward what fd has now; False at EOF."""
        with self.lock:
            while True:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    return True
                if not data:
                    return False
                try:
                    self.conn.send((self.pipes[fd], data))
                except (OSError, EOFError):
                    return False
                self.sent += len(data)

    def _pump(self):
        sel = selectors.DefaultSelector()
        for fd in self.pipes:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                if not self._forward(key.fd):
                    sel.unregister(key.fd)

    def drain(self):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for fd, _ in self._waiting.poll(0):
            self._forward(fd)
        return self.sent


def apply_node_options(kwargs):
    """Apply env, cpus and memory_limit; returns a problem text or None."""
    env = kwargs.get("env")
    if env:
        os.environ.update(env)
    cpus = kwargs.get("cpus")
    if cpus:
        try:
            psutil.Process().cpu_affinity(list(cpus))
        except (OSError, ValueError, psutil.Error) as exc:
            return f"cannot pin to cpus {list(cpus)}: {exc}"
    limit = kwargs.get("memory_limit")
    if limit:
        # RLIMIT_DATA counts heap and private mappings (numpy's buffers),
        # not the shared-memory blobs; the limit is on top of what the
        # idle node process already uses.
        baseline = _data_size()
        try:
            resource.setrlimit(resource.RLIMIT_DATA,
                               (baseline + int(limit), baseline + int(limit)))
        except (ValueError, OSError) as exc:
            return f"cannot set memory_limit={limit}: {exc}"
    return None


def _data_size():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def check_cpus(name, kwargs):
    """A PlanError if ``Node(name, cpus=...)`` names cpus this process may
    not use (the node would start and fail to pin itself)."""
    cpus = kwargs.get("cpus")
    if cpus:
        available = sorted(os.sched_getaffinity(0))
        missing = sorted(set(cpus) - set(available))
        if missing:
            raise PlanError(
                f"Node({name!r}) asks for cpus {missing} but this process "
                f"may only use cpus {available}; pick from those")


def check_arguments(start_method, timeout, schedule):
    """LocalHostScheduler's arguments, or the error naming the bad one."""
    if schedule is not None:
        raise TypeError("LocalHostScheduler does not take schedule=; use "
                        "LocalSession(schedule=...) for one")
    if start_method not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"start_method {start_method!r} is not available here; use one "
            f"of {multiprocessing.get_all_start_methods()}")
    check_seconds(timeout)
