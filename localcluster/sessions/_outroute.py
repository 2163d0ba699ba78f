"""Node output of nodes that share this process: sys.stdout/sys.stderr
routed by the writing thread's node.

LocalSession runs every node on threads of this process, so a node's
``print`` (the ``Print`` op, a Python op's print, a branch thread's) goes
to the process's one ``sys.stdout``.  With log options, the session
installs a `_Router` as ``sys.stdout`` and ``sys.stderr`` (one for the
process, shared by every such session: `install`/`uninstall` count them)
and `attach`-es each node's runtime to a `LineSink`.  A write asks
`localcluster.runtime.current` which runtime the writing thread works for:
that runtime's sink gets the text (split into lines for the node's
`NodeLog`: its file and echo); a thread working for no attached runtime
writes through unchanged.  The last session to uninstall puts the
original streams back -- unless something replaced ours meanwhile, in
which case ours stays in that chain, writing everything through.

A Ray actor (one node per process) installs the router with a
``default`` sink: every write of the process is the node's.
"""

import sys
import threading

from ..runtime.current import current_runtime

__all__ = ["LineSink", "install", "uninstall", "attach", "detach", "flush",
           "set_default", "flush_default", "original_stream"]

_LOCK = threading.Lock()
_STATE = {"users": 0, "out": None, "err": None, "default": None}
_SINKS = {}      # NodeRuntime -> LineSink


class LineSink:
    """Text written for one node, cut into lines for its `NodeLog`."""

    def __init__(self, node_log):
        self.log = node_log
        self._partial = {"out": "", "err": ""}
        self._lock = threading.Lock()

    def write(self, tag, text):
        with self._lock:
            lines = (self._partial[tag] + text).split("\n")
            self._partial[tag] = lines.pop()
        for line in lines:
            self.log.line(tag, line.encode("utf-8", "replace"), line)

    def flush_partial(self):
        """Write what is left of a line (the node ended, or its run)."""
        with self._lock:
            left = [(t, p) for t, p in self._partial.items() if p]
            self._partial = {"out": "", "err": ""}
        for tag, line in left:
            self.log.line(tag, line.encode("utf-8", "replace"), line)


class _Router:
    """A ``sys.stdout``/``sys.stderr`` that hands a node thread's text to
    the node's sink (module docstring)."""

    def __init__(self, tag, original):
        self._tag = tag
        self.original = original

    def write(self, text):
        sink = _SINKS.get(current_runtime()) if _SINKS else None
        if sink is None:
            sink = _STATE["default"]
        if sink is None:
            if self.original is None:
                return len(text)
            return self.original.write(text)
        sink.write(self._tag, text)
        return len(text)

    def flush(self):
        if self.original is not None:
            self.original.flush()

    def __getattr__(self, name):   # fileno, isatty, encoding, buffer...
        return getattr(self.original, name)


def original_stream(tag):
    """The stream ``tag`` (``"out"``/``"err"``) had before `install`."""
    router = _STATE[tag]
    return router.original if router is not None else None


def install(default=None):
    """Route this process's sys.stdout/sys.stderr (counted: each call
    wants one `uninstall`); ``default``: the sink of every write not
    made for an attached runtime (a one-node process)."""
    with _LOCK:
        if _STATE["users"] == 0 or not isinstance(sys.stdout, _Router):
            _STATE["out"] = sys.stdout = _Router("out", sys.stdout)
            _STATE["err"] = sys.stderr = _Router("err", sys.stderr)
        _STATE["users"] += 1
        if default is not None:
            _STATE["default"] = default


def uninstall():
    """One `install` less; the last puts the original streams back."""
    with _LOCK:
        _STATE["users"] = max(0, _STATE["users"] - 1)
        if _STATE["users"]:
            return
        _STATE["default"] = None
        for tag, name in (("out", "stdout"), ("err", "stderr")):
            router = _STATE[tag]
            if router is not None and getattr(sys, name) is router:
                setattr(sys, name, router.original)
            _STATE[tag] = None


def set_default(sink):
    """The sink of writes not made for an attached runtime (None: they
    write through)."""
    _STATE["default"] = sink


def attach(runtime, sink):
    """Writes by threads working for ``runtime`` go to ``sink``."""
    with _LOCK:
        _SINKS[runtime] = sink


def flush(runtime):
    """Write ``runtime``'s partial lines (at the end of its run)."""
    sink = _SINKS.get(runtime)
    if sink is not None:
        sink.flush_partial()


def flush_default():
    """Write the default sink's partial lines."""
    sink = _STATE["default"]
    if sink is not None:
        sink.flush_partial()


def detach(runtime):
    """``runtime``'s writes pass through again; its sink's partial line
    is written."""
    with _LOCK:
        sink = _SINKS.pop(runtime, None)
    if sink is not None:
        sink.flush_partial()
