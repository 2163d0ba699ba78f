"""Node output in the master: one thread for every node of a scheduler.

Each node process sends ``(stream, bytes)`` chunks of its stdout/stderr
over a one-way pipe.  The pump waits on all of them in one epoll set,
which `add` extends while the pump waits (so starting a node costs the
pump nothing: no wake-up, no rebuilt wait list -- with hundreds of nodes
that rebuild made start-up quadratic), splits chunks into lines and hands
each to the node's `NodeLog` (`_nodelogs`): its log file, if the session
has a ``log_dir``, and -- if the node is echoed -- the master's stdout or
stderr as ``[node] line``.  A partial last line is written at EOF.  It keeps
the last lines of every node for `NodeFailedError`, and tells whoever waits
(``wait_closed``) when a node's pipe reached EOF -- which, for a dead node,
means every line it wrote has been seen.

The nodes a zygote started share one pipe (`add_shared`): each writes
frames of at most PIPE_BUF bytes tagged with its place in the batch
(`_plumbing.FrameWriter`): its pid first (the log's start header), then
its output; the zygote writes a node's last frame once it reaped it,
which closes that node's stream as EOF closes a pipe of its own.
"""

import collections
import os
import select
import threading
from multiprocessing import connection

from ._nodelogs import NodeLog, std_stream
from ._plumbing import MASTER_ENDS, FrameReader

__all__ = ["LogPump"]

LAST_LINES = 20


class _Stream:
    def __init__(self, node, sink):
        self.node = node
        self.sink = sink
        self.partial = {"out": b"", "err": b""}
        self.last = collections.deque(maxlen=LAST_LINES)
        self.closed = threading.Event()
        self.received = 0
        self.progress = threading.Condition()

    def wait_for(self, mark, timeout):
        """Wait until ``mark`` bytes of output were shown (or EOF)."""
        if self.received >= mark:
            return True
        with self.progress:
            return self.progress.wait_for(
                lambda: self.received >= mark or self.closed.is_set(),
                timeout)


class LogPump:
    def __init__(self, name="lc:logs"):
        self._lock = threading.Lock()
        self._streams = {}            # fd -> (conn, _Stream)
        self._shared = {}     # fd -> (conn, FrameReader, [_Stream by id])
        self._wake_r, self._wake_w = connection.Pipe(duplex=False)
        self._epoll = select.epoll()
        self._epoll.register(self._wake_r.fileno(), select.EPOLLIN)
        # a forked node closes these (and each node's log pipe end)
        MASTER_ENDS.update((self._wake_r, self._wake_w, self._epoll))
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=name)
        self._stopping = False
        self._thread.start()

    def add(self, conn, node, sink=None):
        """Show ``conn``'s output as ``node``'s through ``sink`` (a
        `NodeLog`; None: echo every line as ``[node] line``); the pump
        sees it at once (epoll takes a new fd while another thread waits
        on it)."""
        if sink is None:
            sink = NodeLog(node, None, std_stream)
        stream = _Stream(node, sink)
        with self._lock:
            self._streams[conn.fileno()] = (conn, stream)
            MASTER_ENDS.add(conn)
            self._epoll.register(conn.fileno(), select.EPOLLIN)
        return stream

    def add_shared(self, conn, nodes):
        """Show the output of the nodes that share ``conn`` (``nodes``:
        ``(node, sink)`` by their id in its frames); their streams."""
        streams = [_Stream(node, sink if sink is not None else
                           NodeLog(node, None, std_stream))
                   for node, sink in nodes]
        with self._lock:
            self._shared[conn.fileno()] = (conn, FrameReader(), streams)
            MASTER_ENDS.add(conn)
            self._epoll.register(conn.fileno(), select.EPOLLIN)
        return streams

    def last_lines(self, stream):
        return list(stream.last)

    def stop(self, timeout=2.0):
        self._stopping = True
        try:
            self._wake_w.send(b"")
        except OSError:
            pass
        self._thread.join(timeout)
        with self._lock:
            for conn, _ in self._streams.values():
                MASTER_ENDS.discard(conn)
                conn.close()
            self._streams.clear()
            for conn, _, _ in self._shared.values():
                MASTER_ENDS.discard(conn)
                conn.close()
            self._shared.clear()
            for end in (self._wake_w, self._wake_r, self._epoll):
                MASTER_ENDS.discard(end)
                end.close()

    def _loop(self):
        wake = self._wake_r.fileno()
        while not self._stopping:
            try:
                ready = self._epoll.poll()
            except InterruptedError:
                continue
            for fd, _ in ready:
                if fd == wake:
                    try:
                        self._wake_r.recv_bytes()
                    except (EOFError, OSError):
                        return
                    continue
                self._read(fd)

    def _read(self, fd):
        found = self._streams.get(fd)
        if found is None:
            if fd in self._shared:
                self._read_shared(fd)
            return
        conn, stream = found
        try:
            tag, data = conn.recv()
        except (EOFError, OSError):
            self._close(fd, conn, stream)
            return
        self._emit(stream, tag, data)
        with stream.progress:
            stream.received += len(data)
            stream.progress.notify_all()

    def _read_shared(self, fd):
        conn, reader, streams = self._shared[fd]
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        if not data:   # the zygote and all its nodes are gone
            for stream in streams:
                if stream is not None:
                    self._end(stream)
            with self._lock:
                self._shared.pop(fd, None)
                self._epoll.unregister(fd)
                MASTER_ENDS.discard(conn)
                conn.close()
            return
        for node_id, kind, chunk in reader.feed(data):
            stream = streams[node_id]
            if stream is None:
                continue
            if kind == b"o" or kind == b"e":
                self._emit(stream, "out" if kind == b"o" else "err", chunk)
                with stream.progress:
                    stream.received += len(chunk)
                    stream.progress.notify_all()
            elif kind == b"s":
                stream.sink.started(int(chunk))
            elif kind == b"x":
                self._end(stream)
                streams[node_id] = None

    def _end(self, stream):
        """A node's last frame: its partial lines, then it is closed."""
        for tag in ("out", "err"):
            if stream.partial[tag]:
                self._emit(stream, tag, b"", final=True)
        with stream.progress:
            stream.closed.set()
            stream.progress.notify_all()

    def _emit(self, stream, tag, data, final=False):
        text = stream.partial[tag] + data
        lines = text.split(b"\n")
        stream.partial[tag] = b"" if final else lines.pop()
        for line in lines:
            if final and not line:
                continue
            decoded = line.decode("utf-8", "replace")
            stream.last.append(decoded)
            stream.sink.line(tag, line, decoded)

    def _close(self, fd, conn, stream):
        for tag in ("out", "err"):
            if stream.partial[tag]:
                self._emit(stream, tag, b"", final=True)
        with self._lock:
            # out of the wait set before the fd number can be reused
            self._streams.pop(fd, None)
            self._epoll.unregister(fd)
            MASTER_ENDS.discard(conn)
            conn.close()
        with stream.progress:
            stream.closed.set()
            stream.progress.notify_all()
