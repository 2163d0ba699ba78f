"""The limit on a process's open file descriptors: one rule for raising
it, and the error that names it.

A localcluster master holds a few descriptors per queue between node
processes, the zygote that starts a batch of node processes one per node
(`localcluster.sessions._descriptors` counts them), a node a few per queue
end; a thousand nodes need more than the soft RLIMIT_NOFILE most systems
start a process with (1024).

Decided: localcluster raises the soft limit to the hard one when it needs
more -- before a run starts nodes that would not fit, and when a shared-
memory open comes near the limit or meets it (`localcluster.runtime.
shm_map`) -- and logs it; the processes it starts later inherit the
higher limit.  The soft limit is a default for programs to raise when
they need more: it stays at 1024 for old code that hands descriptors to
``select()``, which cannot take one numbered past 1023, and localcluster
waits with ``poll``.  Past the hard limit only the user (or root) can help,
and `limit_error` says how: it names the soft and hard limits, how many
descriptors are open, how many are needed when that is known, and the
``ulimit -n`` that would do.
"""

import logging
import os
import resource

from ..errors import DescriptorLimitError

__all__ = ["limits", "open_count", "raise_soft_limit", "limit_error"]

log = logging.getLogger(__name__)

#: where the hard limit is unlimited, the soft limit is raised this far
UNLIMITED_TARGET = 1 << 20


def limits():
    """``(soft, hard)`` RLIMIT_NOFILE of this process, None for
    unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    return (None if soft == unlimited else soft,
            None if hard == unlimited else hard)


def open_count():
    """How many descriptors this process has open (None where ``/proc``
    does not say)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1   # less listdir's own
    except OSError:
        return None


def raise_soft_limit():
    """Raise the soft limit to the hard one (logged); False if there is
    no headroom, or the system refuses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(
        soft, UNLIMITED_TARGET)
    if soft != resource.RLIM_INFINITY and soft >= target:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return False
    log.info("raised this process's open-file limit (soft RLIMIT_NOFILE) "
             "from %d to %d", soft, target)
    return True


def limit_error(doing, needed=None, in_use=None):
    """The `DescriptorLimitError` of this process out of descriptors
    while ``doing`` (words: "starting 450 node processes"); ``needed``:
    about how many it needs in all, if known; ``in_use``: how many were
    open (default: counted now)."""
    soft, hard = limits()
    if in_use is None:
        in_use = open_count()
    wanted = max(needed or 0, 2 * (soft or 0), 1)
    fix = 1 << (wanted - 1).bit_length()
    counts = (f"this process may have {soft} open (soft RLIMIT_NOFILE; "
              f"hard limit {'unlimited' if hard is None else hard})")
    if in_use is not None:
        counts += f", has {in_use} open"
    if needed is not None:
        counts += f" and needs about {needed}"
    return DescriptorLimitError(
        f"out of file descriptors {doing}: {counts}; raise the "
        f"limit before starting -- ulimit -n {fix} (past the hard limit, "
        "as root) -- or run fewer nodes and queues",
        limit=soft, hard=hard, in_use=in_use, needed=needed)
