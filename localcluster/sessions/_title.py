"""Process titles of node processes: ``localcluster: <node> (<master pid>)``.

``ps -o args``, ``top -c`` and ``psutil.Process(pid).cmdline()`` show a
node's process by its node and the pid of the process that runs the
session, so a stuck or busy node is found by name.  The `setproctitle`
package sets the title (its first 15 bytes also become the kernel's
``comm`` name); without it the comm name alone is set, to
``lc:<node>`` (15 bytes at most: ``prctl(PR_SET_NAME)``), and that is
logged at debug level.

A Ray worker has Ray's own copy of setproctitle, which rewrites the
title around every actor call (``ray::NodeActor.run``, then
``ray::NodeActor``): `set_ray_title` uses that copy (two copies of the
code must not both move the process's argument memory) and makes Ray's
per-call change keep the node's title.
"""

import contextlib
import ctypes
import logging
import os

try:
    import setproctitle as _spt
except ImportError:  # pragma: no cover - it is a dependency
    _spt = None

__all__ = ["node_title", "set_title", "set_ray_title", "zygote_title",
           "set_zygote_title"]

log = logging.getLogger(__name__)

_PR_SET_NAME = 15


def node_title(node, master_pid):
    """The title of node ``node``'s process, started by ``master_pid``
    (a control character of the name shown as ``?``)."""
    shown = "".join("?" if ord(c) < 32 or c == "\x7f" else c
                    for c in str(node))
    return f"localcluster: {shown} ({master_pid})"


def set_title(node, master_pid):
    """Title this process as node ``node`` of master ``master_pid``."""
    title = node_title(node, master_pid)
    if _spt is not None:
        try:
            _spt.setproctitle(title)
            return
        except Exception:  # noqa: BLE001 - a title is not worth failing
            log.debug("setproctitle failed", exc_info=True)
    _set_comm(node)


def zygote_title(master_pid):
    """The title of a zygote, the parent of a batch of node processes
    (no colon: no node's title looks like it)."""
    return f"localcluster zygote ({master_pid})"


def set_zygote_title(master_pid):
    if _spt is not None:
        try:
            _spt.setproctitle(zygote_title(master_pid))
            return
        except Exception:  # noqa: BLE001 - a title is not worth failing
            log.debug("setproctitle failed", exc_info=True)
    _set_comm("zygote")


def _set_comm(node):
    """Fallback: the comm name ``lc:<node>`` (the main thread's, from
    whichever thread: through /proc, else prctl)."""
    name = f"lc:{node}".encode("utf-8", "replace")[:15]
    log.debug("no setproctitle: only the comm name is set, to %r", name)
    try:
        with open(f"/proc/self/task/{os.getpid()}/comm", "wb") as f:
            f.write(name)
        return
    except OSError:
        pass
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: no title


def set_ray_title(node, master_pid):
    """In a Ray actor: title the process as ``node`` with Ray's own
    setproctitle, and keep that title through Ray's per-call changes."""
    title = node_title(node, master_pid)
    try:
        import ray
        raylet_set = ray._raylet.setproctitle
        worker = ray._private.worker
    except (ImportError, AttributeError):
        _set_comm(node)
        return
    raylet_set(title)
    if hasattr(worker, "_changeproctitle"):
        worker._changeproctitle = _keeping(title, raylet_set)


def _keeping(title, raylet_set):
    """Ray's ``_changeproctitle(title, next_title)`` made to set the
    node's title instead, before and after each call."""
    @contextlib.contextmanager
    def changeproctitle(_title, _next_title):
        raylet_set(title)
        try:
            yield
        finally:
            raylet_set(title)
    return changeproctitle
