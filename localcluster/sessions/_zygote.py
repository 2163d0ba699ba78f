"""The zygote: the parent of a batch of node processes, and their relay.

::

    master                                zygote                  nodes
    ------------------------------------  ----------------------  ---------
    ZygoteLink (`_handle`), per batch  -- forks each node of --->  node_main
      one control socket                  the batch at start
        ("send", ids, bytes) ----------> written to each node's  -> requests
        ("sends", None, [(ids, bytes),   socket, unchanged
          ...]): a run too big for the
          board, one command
        <---- [("m", id, reply bytes),   read from the nodes'    <- replies
               ("x", id, exit code)]     sockets; deaths reaped
        ("signal"/"kill", ids, sig) ---> kill(2) / killpg(2)
      one output pipe (the LogPump)   <------------------------- every node's
        frames <= PIPE_BUF: atomic    <-- "x" once a node is      output
                                          reaped: nothing follows
      one reply pipe                  <-- inherited by each --- answers to
        (id, length, reply bytes):        node                   runs read
        one write each, <= PIPE_BUF                              from the
                                                                 run board

The master starts one zygote per batch of nodes it starts together (a
run's missing nodes, all the instances of a prototype among them): forked
from the master at that moment under ``fork`` -- so the nodes see the
master as a fork of it would, its modules, ``__main__`` and patches --
or started by ``spawn``/``forkserver``, which then import only what a node
needs.  The zygote freezes what it inherited (``gc.freeze``), then forks
every node of its batch from its one thread, and relays: the master holds
two descriptors per zygote (its control socket and the output pipe's read
end; a third, the process sentinel, multiprocessing's), not four per
node, and waits on one socket per batch, not on one pipe and sentinel
per node.  A run does not go through the zygote: the master posts it on
its run board and wakes the run's nodes (`_bell`), and each answers on
the batch's reply pipe, which the zygote hands each node it forks (a
request too big for the board, and every other request, still comes
through the zygote, and the node is woken for it too).  Plans the
master gives a batch (a prototype's, packed once) are inherited by its
nodes, which load them at their first run: the master then sends only
the plan's id.

The zygote never blocks on a node or on the master: every socket of its
is non-blocking, and what cannot be written yet waits in a buffer.  It is
the parent of its nodes, so it alone may signal them without racing a
reused pid (the master's ``signal``/``kill`` go through it), it reaps
them (SIGCHLD through a wake-up pipe), kills what a dead node left in its
process group, forwards what the node wrote before it died, writes the
node's last output frame, then reports the exit code.  A node's socket
end is the only descriptor per node the zygote holds (numbered from
`_Zygote.base` up, so a forked node closes all of its siblings' ends
with one ``close_range``); the zygote raises its soft RLIMIT_NOFILE to
the hard limit.

No node outlives the master: the zygote ends every node's group and
exits when the master's end of the control socket closes (EOF: the
master died or said ``bye``) or, forked from the master's main thread,
at its parent-death signal; its nodes' parent-death signal fires when the
zygote goes; and the master's group watcher knows the zygote and every
node.  The zygote exits by itself once its last node is reaped and
reported; the master then reaps it.
"""

import collections
import fcntl
import gc
import importlib
import os
import pickle
import resource
import select
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection

from . import _protocol as P
from ._plumbing import (MASTER_GONE_SIGNAL, FrameWriter, close_master_ends,
                        death_frame, raise_open_files,
                        reset_signal_handlers, set_nonblocking,
                        set_parent_death_signal)
from ._title import set_zygote_title

__all__ = ["Batch", "zygote_main", "preload", "SEND", "SENDS", "SIGNAL",
           "KILL", "BYE"]

#: modules a node's code commonly imports at its first use of them (numpy
#: loads these submodules lazily, at ``np.random``...): imported once,
#: before the nodes are forked, not once in each of a thousand nodes
PRELOAD = ("numpy.random", "numpy.linalg", "numpy.fft")


def preload():
    """Import `PRELOAD` here (a no-op once imported), so that the nodes
    forked from this process find them in ``sys.modules``."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a node imports it, or says why
            pass

#: commands of the master
SEND, SIGNAL, KILL, BYE = "send", "signal", "kill", "bye"
#: several sends in one command: what a run sends the zygote's nodes (one
#: write of the master, one wake-up of the zygote, however many messages)
SENDS = "sends"
#: events of the zygote
MESSAGE, EXITED = "m", "x"

#: seconds the zygote waits for its SIGKILLed nodes before it exits
END_WAIT = 5.0

_SIZE = P._SIZE
_BIG_SIZE = P._BIG_SIZE


class Batch:
    """What a zygote is started with (inherited under fork, else pickled
    once): the node ``specs`` (a node's id is its index), the ``target``
    each node process runs (``target(spec, conn, output)``), ``plans``
    ``{plan id: packed plan}`` the nodes inherit."""

    def __init__(self, master_pid, pdeathsig, forked, target, specs,
                 plans=None):
        self.master_pid = master_pid
        self.pdeathsig = pdeathsig
        self.forked = forked
        self.target = target
        self.specs = specs
        self.plans = plans or {}


def zygote_main(batch, control, out_w, replies=None):
    """Entry point of a zygote (``control``: its end of the control
    socket; ``out_w``: the write end of the batch's output pipe;
    ``replies``: the write end of the batch's reply pipe, or None)."""
    zygote = _Zygote(batch, control.fileno(), out_w.fileno(),
                     None if replies is None else replies.fileno())
    try:
        zygote.main()
    finally:
        zygote.end_all()
        os._exit(0)


class _Child:
    __slots__ = ("id", "pid", "fd", "inbuf", "outbuf", "eof")

    def __init__(self, node_id, pid, fd):
        self.id, self.pid, self.fd = node_id, pid, fd
        self.inbuf = bytearray()
        # what waits to be written to the node: views on the master's
        # messages, shared by every node a message went to (not copied)
        self.outbuf = collections.deque()
        self.eof = False


class _Zygote:
    def __init__(self, batch, control, out_w, replies=None):
        self.batch = batch
        self.pid = os.getpid()
        self.control, self.out_w = control, out_w
        self.replies = replies   # inherited by every node
        set_zygote_title(batch.master_pid)
        try:
            os.setpgid(0, 0)   # a Ctrl-C at the terminal is the master's
        except OSError:
            pass
        reset_signal_handlers()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if batch.pdeathsig:
            signal.signal(MASTER_GONE_SIGNAL, self._master_gone)
            set_parent_death_signal(MASTER_GONE_SIGNAL)
            if os.getppid() != batch.master_pid:
                os._exit(1)   # the master died before the signal was armed
        preload()   # started fresh (not forked): what nodes would import
        if batch.forked:
            gc.freeze()   # the master's heap: never collected (copied) here
            close_master_ends()
        raise_open_files()
        self.children = {}        # id -> _Child, until reaped
        self.by_fd = {}
        self.by_pid = {}
        self.to_master = bytearray()
        self.events = []
        self.control_in = bytearray()
        self.master_gone = False
        set_nonblocking(control)
        self.wake_r, self.wake_w = os.pipe()
        set_nonblocking(self.wake_r)
        set_nonblocking(self.wake_w)
        self.epoll = select.epoll()
        self.epoll.register(control, select.EPOLLIN)
        self.epoll.register(self.wake_r, select.EPOLLIN)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _noop)
        # the zygote's own way into the output pipe, which never blocks it
        # (a master that reads no output must not stop it relaying): a new
        # open file of the pipe, non-blocking without making the nodes' so
        try:
            self.out_nb = os.open(f"/proc/self/fd/{out_w}",
                                  os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self.out_nb = os.dup(out_w)   # no /proc: it may block, then
        self.last_frames = bytearray()    # node ends not written yet
        # the slot a node's socket takes in the node (dup2 onto it)
        self.slot = os.open(os.devnull, os.O_RDONLY)
        self.own = (control, self.wake_r, self.wake_w, self.epoll.fileno(),
                    self.out_nb, self.slot)
        #: every node socket end of the zygote is numbered from here up
        self.base = max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1

    # -- starting the nodes ---------------------------------------------------

    def main(self):
        for node_id, spec in enumerate(self.batch.specs):
            if self.master_gone:
                return
            self._fork(node_id, spec)
        self.batch.specs = None
        while self.children and not self.master_gone:
            self._flush_master()
            try:
                ready = self.epoll.poll()
            except InterruptedError:
                continue
            for fd, events in ready:
                if fd == self.control:
                    if events & select.EPOLLOUT:
                        self._flush_master()
                    if events & (select.EPOLLIN | select.EPOLLHUP |
                                 select.EPOLLERR):
                        self._read_master()
                elif fd == self.wake_r:
                    _drain(self.wake_r)
                    self._reap()
                else:
                    child = self.by_fd.get(fd)
                    if child is None:
                        continue
                    if events & select.EPOLLOUT:
                        self._flush_child(child)
                    if events & (select.EPOLLIN | select.EPOLLHUP |
                                 select.EPOLLERR):
                        self._read_child(child)
            self._reap()   # a SIGCHLD may have come while we read
            if self.last_frames:
                self._write_last_frames()
        if not self.master_gone:
            self._flush_master(block=True)

    def _fork(self, node_id, spec):
        ours, theirs = socket.socketpair()
        try:
            fd = _move_up(ours.detach(), self.base)
            node_fd = theirs.detach()
        finally:
            ours.close()
            theirs.close()
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        pid = os.fork()
        if pid == 0:
            self._in_node(node_id, spec, node_fd)
        os.close(node_fd)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass   # the node did it first
        set_nonblocking(fd)
        child = _Child(node_id, pid, fd)
        self.children[node_id] = self.by_fd[fd] = self.by_pid[pid] = child
        self.epoll.register(fd, select.EPOLLIN)

    def _in_node(self, node_id, spec, node_fd):
        """The forked node: nothing of the zygote's, then its main."""
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.dup2(node_fd, self.slot)
            for fd in self.own[:-1]:
                os.close(fd)
            os.closerange(self.base, _fd_ceiling())  # siblings' sockets
            if node_fd != self.slot and node_fd < self.base:
                os.close(node_fd)
            spec.parent_pid = self.pid
            spec.pdeathsig = True   # forked from the zygote's one thread
            spec.forked = True
            spec.replies = None if self.replies is None else \
                (self.replies, node_id)
            spec.plans = {i: self.batch.plans[i] for i in
                          getattr(spec, "plan_ids", ()) if i in
                          self.batch.plans}
            output = FrameWriter(self.out_w, node_id)
            output.started(os.getpid())
            target, self.batch = self.batch.target, None
            target(spec, Connection(self.slot), output)
        except BaseException:   # noqa: BLE001 - the exit code says it too
            try:
                traceback.print_exc()
            except BaseException:   # noqa: BLE001
                pass
        finally:
            os._exit(1)

    # -- the master's side -----------------------------------------------------

    def _read_master(self):
        if _read_into(self.control, self.control_in):
            self.master_gone = True
            return
        for msg in _frames(self.control_in):
            self._command(pickle.loads(msg))

    def _command(self, msg):
        kind = msg[0]
        if kind == SEND:
            self._send(msg[1], msg[2])
        elif kind == SENDS:
            for ids, raw in msg[2]:
                self._send(ids, raw)
        elif kind in (SIGNAL, KILL):
            _, ids, sig = msg
            for node_id in ids:
                child = self.children.get(node_id)
                if child is not None:
                    _signal(child.pid, sig, group=kind == KILL)
        elif kind == BYE:
            self.master_gone = True

    def _send(self, ids, raw):
        for node_id in ids:
            child = self.children.get(node_id)
            if child is not None and not child.eof:
                child.outbuf.append(memoryview(raw))
                self._flush_child(child)

    def _flush_master(self, block=False):
        if self.events:
            data = pickle.dumps(self.events, pickle.HIGHEST_PROTOCOL)
            self.events = []
            self.to_master += _frame(data)
        while self.to_master:
            try:
                sent = os.write(self.control, self.to_master)
            except BlockingIOError:
                if not block:
                    break
                waiting = select.poll()   # (the fd may be past 1023)
                waiting.register(self.control, select.POLLOUT)
                if not waiting.poll(1000):
                    break   # the master reads nothing: it is as good as gone
                continue
            except OSError:
                self.to_master.clear()   # the master is gone
                self.master_gone = True
                break
            del self.to_master[:sent]
        mask = select.EPOLLIN | (select.EPOLLOUT if self.to_master else 0)
        try:
            self.epoll.modify(self.control, mask)
        except (OSError, ValueError):
            pass

    # -- the nodes' side ---------------------------------------------------------

    def _flush_child(self, child):
        out = child.outbuf
        while out:
            try:
                sent = os.write(child.fd, out[0])
            except BlockingIOError:
                break
            except OSError:
                out.clear()   # it is gone: its death follows
                break
            if sent < len(out[0]):
                out[0] = out[0][sent:]
            else:
                out.popleft()
        if not child.eof:
            mask = select.EPOLLIN | (select.EPOLLOUT if child.outbuf else 0)
            self.epoll.modify(child.fd, mask)

    def _read_child(self, child):
        if _read_into(child.fd, child.inbuf):
            self._close_child(child)
        for msg in _frames(child.inbuf):
            self.events.append((MESSAGE, child.id, msg))

    def _close_child(self, child):
        if child.eof:
            return
        child.eof = True
        child.outbuf.clear()
        self.epoll.unregister(child.fd)
        del self.by_fd[child.fd]
        os.close(child.fd)

    def _reap(self):
        while self.by_pid:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.by_pid.pop(pid, None)
            if child is None:
                continue
            # What the node started shares its group: it goes with it
            # (the group id stays taken while any of it lives).
            _signal(pid, signal.SIGKILL, group=True, alone=False)
            if not child.eof:
                self._read_child(child)   # what it wrote before it died
                self._close_child(child)
            del self.children[child.id]
            self.last_frames += death_frame(child.id)
            self._write_last_frames()
            self.events.append((EXITED, child.id,
                                os.waitstatus_to_exitcode(status)))

    def _write_last_frames(self):
        """Write the frames that end dead nodes' output, as far as the
        pipe takes them now (each is smaller than PIPE_BUF: written whole
        or not at all); the rest at the next turn of the loop."""
        frames = self.last_frames
        size = len(death_frame(0))
        while frames:
            try:
                os.write(self.out_nb, frames[:size])
            except BlockingIOError:
                return
            except OSError:
                frames.clear()   # nobody reads output any more
                return
            del frames[:size]

    # -- the end ------------------------------------------------------------------

    def _master_gone(self, signum, frame):
        if os.getpid() != self.pid:   # a node not yet its own
            os.kill(os.getpid(), signal.SIGKILL)
        self.master_gone = True
        self.end_all()
        os._exit(0)

    def end_all(self):
        """Kill every node's group that was not reaped, and reap them."""
        children = getattr(self, "by_pid", None)
        if not children:
            return
        for pid in list(children):
            _signal(pid, signal.SIGKILL, group=True)
        deadline = time.monotonic() + END_WAIT
        while children and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
                continue
            children.pop(pid, None)


def _noop(signum, frame):
    pass


def _drain(fd):
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass


def _signal(pid, sig, group, alone=True):
    """Send ``sig`` to ``pid``'s group (``group``) or ``pid`` (and to
    ``pid`` if its group is gone, unless not ``alone``)."""
    if group:
        try:
            os.killpg(pid, sig)
            return
        except (ProcessLookupError, PermissionError):
            if not alone:
                return
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _move_up(fd, base):
    """``fd`` renumbered to ``base`` or above (close-on-exec)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base)
    os.close(fd)
    return moved


def _fd_ceiling():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _frame(data):
    if len(data) > 0x7fffffff:
        return _SIZE.pack(-1) + _BIG_SIZE.pack(len(data)) + data
    return _SIZE.pack(len(data)) + data


def _read_into(fd, buffer):
    """Append what non-blocking ``fd`` holds now to ``buffer`` (a
    bytearray); True once it reached end of file (or failed)."""
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if not data:
            return True
        buffer += data


def _frames(buffer):
    """The complete messages (pickled bytes) at the start of ``buffer``
    (`_protocol`'s framing), taken out of it."""
    out, at, size = [], 0, len(buffer)
    while size - at >= 4:
        length, = _SIZE.unpack_from(buffer, at)
        head = 4
        if length == -1:
            if size - at < 12:
                break
            length, = _BIG_SIZE.unpack_from(buffer, at + 4)
            head = 12
        if size - at < head + length:
            break
        out.append(bytes(buffer[at + head:at + head + length]))
        at += head + length
    del buffer[:at]
    return out


def frame(data):
    """``data`` (pickled bytes) framed as `_protocol` frames a message."""
    return _frame(data)

