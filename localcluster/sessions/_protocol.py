"""Messages between the LocalHostScheduler master and its node processes.

One socket per node -- to the zygote that started it, which relays each
message unchanged to and from the master (`_zygote`) -- carries pickled
tuples; every request carries a
request id (``rid``) that its reply repeats, so a late reply to a cancelled
request is recognised and dropped::

    master -> node                         node -> master
    ("run", rid, plan_id, plan_bytes,      ("ready", pid, problem)
     channels, options)
                                           ("ok", rid, payload)
    ("fetch", rid, name)                   ("error", rid, error_info)
    ("feed", rid, name, segment, shape, dtype)
    ("blobs", rid)  ("has", rid, name)
    ("shutdown", rid)                      ("bye", rid)

A node keeps the last PLAN_CACHE plans it was sent; the master mirrors that
cache and sends ``plan_bytes=None`` for a plan the node has.  Every reply
ends with the number of output bytes the node had sent by then (see
`_logpump`).  A run message ends with options: ``{"trace": bool}``, and
``"release": [channel prefix, ...]`` when queue channels the node used
are no longer named by any plan the master keeps (the node closes them
before the run; see `_prepare.QueueChannels`); a
run's payload is ``{"outputs": {name: descriptor}, "seconds": s, "trace":
spans or None}``; a
descriptor is a dict: ``{"segment", "offset", "shape", "dtype"}`` locates a
value in shared memory (a fetched blob has no offset), ``{"inline":
array}`` carries one that lives in no segment.  Errors travel as plain data (`error_info`) -- class kind, message,
attributes and the formatted traceback -- and are rebuilt in the master
(`rebuild_error`) with the node's traceback as ``__cause__``.

A run is cancelled out of band (the node is busy running it): the master
writes the run id into the node's shared control word and sends SIGUSR1.

The node's stdout/stderr go as frames on a pipe the nodes of its zygote
share (`_plumbing.FrameWriter`).
"""

import os
import pickle
import struct
import traceback

from ..runtime import host
from ..errors import (BlobNotFoundError, LocalClusterError, PlanError,
                      RemoteTraceback, TaskFailedError)
from ..errors import Cancelled

#: plans a node keeps (first in, first out)
PLAN_CACHE = host.PLAN_CACHE

RUN, FETCH, FEED, BLOBS, HAS, SHUTDOWN = (
    "run", "fetch", "feed", "blobs", "has", "shutdown")
READY, OK, ERROR, BYE = "ready", "ok", "error", "bye"

#: Framing of `multiprocessing.connection.Connection` (a big-endian int32
#: length; -1 and an uint64 length past 2 GiB), written and read here with
#: plain os.write/os.read on the connection's descriptor: a run costs a
#: few such messages, and Connection's layers (a BytesIO per read, checks
#: and copies per call) were a tenth of a no-op run's dispatch.  Either
#: side may still use the Connection methods.
_SIZE, _BIG_SIZE = struct.Struct("!i"), struct.Struct("!Q")
#: messages up to this size go out in one write, header included
_ONE_WRITE = 16384


def send(conn, msg):
    """Send ``msg`` (plain data: no fds or connections) over ``conn``."""
    data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
    if len(data) > _ONE_WRITE:
        conn.send_bytes(data)
        return
    fd = conn.fileno()   # OSError once the connection is closed
    data = _SIZE.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def recv(conn):
    """The next message on ``conn``; EOFError when the other end is gone
    (OSError if it went in the middle of a message)."""
    fd = conn.fileno()
    size, = _SIZE.unpack(_read(fd, 4, True))
    if size == -1:
        size, = _BIG_SIZE.unpack(_read(fd, 8))
    return pickle.loads(_read(fd, size))


class Reader:
    """`recv` for the one reader of a connection that nothing else reads
    or polls for data (a node's requests): a message and what follows it
    come in one read, kept for the next call, so a request costs one
    system call instead of two (header, then body)."""

    CHUNK = 65536

    def __init__(self, conn):
        self.fd = conn.fileno()
        self.buffer = bytearray()

    def recv(self):
        buffer = self.buffer
        while True:
            if len(buffer) >= 4:
                size, = _SIZE.unpack_from(buffer)
                head = 4
                if size == -1 and len(buffer) >= 12:
                    size, = _BIG_SIZE.unpack_from(buffer, 4)
                    head = 12
                if size != -1 and len(buffer) >= head + size:
                    data = bytes(buffer[head:head + size])
                    del buffer[:head + size]
                    return pickle.loads(data)
                wanted = max(self.CHUNK, head + size - len(buffer))
            else:
                wanted = self.CHUNK
            chunk = os.read(self.fd, wanted)
            if not chunk:
                if buffer:
                    raise OSError("got end of file during message")
                raise EOFError
            buffer += chunk


def _read(fd, size, first=False):
    """Exactly ``size`` bytes of ``fd``."""
    data = os.read(fd, size)
    if len(data) == size:
        return data
    parts, got = [data], len(data)
    while got < size:
        if not data:
            if first and got == 0:
                raise EOFError
            raise OSError("got end of file during message")
        data = os.read(fd, size - got)
        parts.append(data)
        got += len(data)
    return b"".join(parts)


# error kinds
TASK, PLAN, BLOB, MEMORY, CANCELLED, OTHER = (
    "task", "plan", "blob", "memory", "cancelled", "other")

_TASK_ATTRS = ("node", "task", "step", "net", "op_type", "op_index",
               "cause_type", "cause_message", "built_at")


def format_tb(exc):
    return "".join(traceback.format_exception(type(exc), exc,
                                              exc.__traceback__))


def error_info(exc, kind=None):
    """Plain, picklable data describing ``exc``."""
    if kind is None:
        kind = (CANCELLED if isinstance(exc, Cancelled) else
                TASK if isinstance(exc, TaskFailedError) else
                BLOB if isinstance(exc, BlobNotFoundError) else OTHER)
    info = {"kind": kind, "type": type(exc).__name__, "message": str(exc),
            "traceback": format_tb(exc)}
    if isinstance(exc, TaskFailedError):
        info["attrs"] = {a: getattr(exc, a) for a in _TASK_ATTRS}
        cause = exc.__cause__
        info["traceback"] = (format_tb(cause) if cause is not None
                             else exc.traceback_text)
    if isinstance(exc, BlobNotFoundError):
        info["attrs"] = {"blob": exc.blob}
    return info


def rebuild_error(node, info):
    """The exception the master raises for a node's ``error_info``."""
    kind, message = info["kind"], info["message"]
    cause = RemoteTraceback(info["traceback"])
    if kind == TASK:
        err = TaskFailedError(message, traceback_text=info["traceback"],
                              **info["attrs"])
    elif kind == BLOB:
        err = BlobNotFoundError(info["attrs"]["blob"], node)
        err.args = (message,)
    elif kind == PLAN:
        err = PlanError(
            f"the plan sent to node {node!r} could not be loaded there: "
            f"{info['type']}: {message}; everything a plan references (Python"
            " op functions, registered ops) must be importable in the node "
            "process")
    elif kind == CANCELLED:
        err = Cancelled(message)
    else:
        err = LocalClusterError(
            f"node {node!r} failed outside any op: {info['type']}: {message}")
    err.__cause__ = cause
    return err
