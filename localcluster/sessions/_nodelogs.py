"""Per-node log files and the echo of node output, for every session.

Sessions take two options::

    log_dir=None    a directory: each node's output (stdout and stderr,
                    in the order received) is appended, line by line, to
                    <log_dir>/<file name of node>.log
    log_echo=True   True: every node's output on this process's terminal
                    (``[node] line``); False: none; a pattern or a list of
                    patterns (fnmatch, case-sensitive): only the nodes
                    whose name matches one

`LogOptions` checks them when the session is made -- a ``log_dir`` that
is a file or cannot be written is an error then, naming it and the fix --
and makes the directory (0700) if missing.  `NodeLog` is one node's
file (0600, opened once per session and node, written with one
``os.write`` per line: a line received is in the file even if the node
crashes or this process is SIGKILLed next; nothing is buffered beyond the
line) and its echo.  ``started(pid)`` appends the header every start of
the node's process writes first::

    --- trainer_0 started: pid 4242, 2024-05-01T12:00:00.123+02:00 ---

so a restarted node's log shows where the new process begins.

A node name that is not a safe file name -- empty, ``.`` or ``..``,
starting with ``.``, holding ``/``, NUL or another control character,
not encodable, or longer than 200 bytes -- is mapped to one that is
(`file_name`): each unsafe character (and a leading dot) becomes ``_``,
the result is cut to 100 bytes and ``~`` plus the first 10 hex digits of
the name's SHA-256 is appended, so two names do not share a file and no
name leaves the directory.
"""

import datetime
import fnmatch
import hashlib
import logging
import os
import sys
import threading

__all__ = ["LogOptions", "NodeLog", "NodeLogs", "ForkedCopy", "file_name", "header",
           "std_stream"]

log = logging.getLogger(__name__)

#: longest node name (UTF-8 bytes) used as a file name as it is
MAX_NAME_BYTES = 200


def file_name(node):
    """The file name (without ``.log``) of ``node``'s log; see the module
    docstring."""
    name = str(node)
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raw = None
    if raw is not None and _safe(name, raw):
        return name
    chars = ["_" if ord(c) < 32 or c in "/\x7f" or not _encodable(c) else c
             for c in name]
    if chars and chars[0] == ".":
        chars[0] = "_"
    kept = "".join(chars).encode("utf-8")[:100].decode("utf-8", "ignore")
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass"))
    return f"{kept}~{digest.hexdigest()[:10]}"


def _safe(name, raw):
    return (0 < len(raw) <= MAX_NAME_BYTES and not name.startswith(".")
            and not any(ord(c) < 32 or c in "/\x7f" for c in name))


def _encodable(char):
    try:
        char.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def header(node, pid):
    """The line every start of ``node``'s process (pid ``pid``) writes to
    its log first (no newline)."""
    now = datetime.datetime.now().astimezone().isoformat(
        timespec="milliseconds")
    return f"--- {node} started: pid {pid}, {now} ---"


class LogOptions:
    """A session's ``log_dir`` and ``log_echo``, checked (module
    docstring).  ``active``: False for the defaults (no files, every
    node echoed)."""

    def __init__(self, log_dir=None, log_echo=True):
        self.echo = _echo_patterns(log_echo)
        self.log_dir = None if log_dir is None else _make_dir(log_dir)
        self.active = self.log_dir is not None or self.echo is not True

    def __repr__(self):
        return f"LogOptions(log_dir={self.log_dir!r}, echo={self.echo!r})"

    def as_tuple(self):
        """``(log_dir, echo)``: what an actor on another process takes."""
        return (self.log_dir, self.echo)

    def echoes(self, node):
        """True if ``node``'s output is shown on the terminal."""
        if self.echo is True or self.echo is False:
            return self.echo
        return any(fnmatch.fnmatchcase(str(node), p) for p in self.echo)

    def path(self, node):
        """``node``'s log file, or None without a log_dir."""
        if self.log_dir is None:
            return None
        return os.path.join(self.log_dir, file_name(node) + ".log")

    def open(self, node, echo_to, prefix=True):
        """``node``'s `NodeLog`: its file opened (append, 0600) if there is
        a log_dir; ``echo_to(tag)`` gives the stream an echoed line of
        ``"out"``/``"err"`` goes to (None: nowhere); ``prefix``: echo as
        ``[node] line`` (else the bare line)."""
        return NodeLog(node, self.path(node),
                       echo_to if self.echoes(node) else None, prefix)


def _echo_patterns(echo):
    if echo is True or echo is False:
        return echo
    if isinstance(echo, str):
        return (echo,)
    try:
        patterns = tuple(echo)
    except TypeError:
        patterns = None
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        raise TypeError(
            f"log_echo must be True, False, a node-name pattern or a list of "
            f"patterns (fnmatch); got {echo!r}")
    return patterns


def _make_dir(log_dir):
    """The absolute ``log_dir``, made (0700) if missing; ValueError naming
    it and the fix if it is not a directory this process can write."""
    path = os.path.abspath(os.fspath(log_dir))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            f"log_dir {path!r} is not a directory; give a directory "
            "(it is made if missing) or remove that file")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"log_dir {path!r} cannot be made ({exc.strerror}); give a "
            "directory this process can create or write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(
            f"log_dir {path!r} is not writable by this process; give a "
            "directory you can write to, or fix its permissions")
    return path


class NodeLog:
    """One node's log file and echo (see the module docstring); used from
    any thread."""

    def __init__(self, node, path, echo_to=None, prefix=True):
        self.node = str(node)
        self.path = path
        self._echo_to = echo_to
        self._prefix = f"[{self.node}] " if prefix else ""
        self._lock = threading.Lock()
        self._failed = False
        self.fd = None
        if path is not None:
            try:
                self.fd = os.open(path, os.O_WRONLY | os.O_APPEND |
                                  os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                                  0o600)
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot open the log of node {self.node!r} "
                    f"at {path!r} ({exc.strerror}); check log_dir") from None

    def __repr__(self):
        return f"NodeLog({self.node!r}, {self.path!r})"

    @property
    def echoed(self):
        return self._echo_to is not None

    def started(self, pid):
        """Append the start header of the node's process ``pid``."""
        self._write(header(self.node, pid).encode("utf-8", "replace"))

    def line(self, tag, raw, text=None):
        """One line of output (``raw``: bytes without the newline; ``text``
        its decoded form) from stream ``tag`` (``"out"``/``"err"``)."""
        self._write(raw)
        if self._echo_to is None:
            return
        out = self._echo_to(tag)
        if out is None:
            return
        if text is None:
            text = raw.decode("utf-8", "replace")
        try:
            out.write(f"{self._prefix}{text}\n")
            out.flush()
        except (OSError, ValueError):
            pass  # the terminal is gone; the file still has the line

    def _write(self, raw):
        data = raw + b"\n"
        with self._lock:
            fd = self.fd
            if fd is None:
                return
            try:
                while data:
                    data = data[os.write(fd, data):]
            except OSError as exc:
                if not self._failed:
                    self._failed = True
                    log.warning("cannot write the log of node %r at %r: %s",
                                self.node, self.path, exc)

    def close(self):
        """Close the file; idempotent (later lines are only echoed)."""
        with self._lock:
            fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


class NodeLogs:
    """A session's `NodeLog` of each node: opened at the node's first
    start, kept across its restarts, closed by `close`.  ``echo_to`` and
    ``prefix`` as for `LogOptions.open`; ``fork_ends``: a set a forked
    child closes (the file's descriptor goes in while it is open)."""

    def __init__(self, options, echo_to, prefix=True, fork_ends=None):
        self.options = options
        self._echo_to = echo_to
        self._prefix = prefix
        self._fork_ends = fork_ends
        self._logs = {}      # node -> (NodeLog, its ForkedCopy or None)
        self._lock = threading.Lock()

    def get(self, node):
        """``node``'s `NodeLog` (opened now if it is the first time)."""
        with self._lock:
            found = self._logs.get(node)
            if found is None:
                sink = self.options.open(node, self._echo_to, self._prefix)
                copy = None
                if sink.fd is not None and self._fork_ends is not None:
                    copy = ForkedCopy(sink.fd)
                    self._fork_ends.add(copy)
                found = self._logs[node] = (sink, copy)
            return found[0]

    def close(self):
        """Close every node's file (idempotent)."""
        with self._lock:
            logs, self._logs = list(self._logs.values()), {}
        for sink, copy in logs:
            if copy is not None:
                self._fork_ends.discard(copy)
            sink.close()


class ForkedCopy:
    """A `NodeLog`'s descriptor as a forked child's copy, which the child
    closes (no lock: one may have been held at the fork)."""

    def __init__(self, fd):
        self.fd = fd

    def close(self):
        try:
            os.close(self.fd)
        except OSError:
            pass


def std_stream(tag):
    """This process's stdout or stderr, as it is now (None if unset)."""
    return sys.stdout if tag == "out" else sys.stderr
