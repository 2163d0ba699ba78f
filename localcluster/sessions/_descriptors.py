"""What a LocalHostScheduler run needs of the master's file descriptors,
counted before it starts anything.

::

    _run_plans(plans) / start_nodes / feed_blob
      make_room(new node processes, new queue channels)
        needed = open now + PER_NODE * nodes + PER_QUEUE * queues + SPARE
        needed <= soft RLIMIT_NOFILE       -> nothing to do
        needed <= hard RLIMIT_NOFILE       -> soft limit raised to the hard
        else                               -> DescriptorLimitError
      start the nodes, open the channels
        EMFILE all the same                -> `out_of_descriptors`

Node processes are started by a zygote per batch (`_zygote`), forked
with this process's descriptors and limits: it holds `PER_NODE`
descriptor for as long as a node process lives (its end of the node's
socket) besides what it inherited, while the master holds a few per
zygote (`PER_ZYGOTE`: its control socket, its nodes' output pipe and
reply pipe, its process sentinel) and none per node, and `PER_QUEUE` for each queue
between node processes (its channel's two doorbells); `SPARE` covers what
a fork holds for a moment and the files the master opens meanwhile (the
run's history, a trace, a log).  One count covers both processes.  Counted before anything starts, a run
that cannot fit fails at once -- naming the limit, the count and the
``ulimit -n`` that would do (`localcluster.runtime.fdlimit`, which also
holds the rule for raising the soft limit) -- and leaves no half-started
nodes behind.
"""

import errno
import logging

from ..runtime import fdlimit

__all__ = ["PER_NODE", "PER_ZYGOTE", "PER_QUEUE", "SPARE", "make_room", "is_emfile",
           "out_of_descriptors"]

log = logging.getLogger(__name__)

#: descriptors a zygote holds per node process it started
PER_NODE = 1
#: descriptors the master holds per zygote (and the zygote of its own)
PER_ZYGOTE = 10
#: descriptors the master holds per queue between node processes
PER_QUEUE = 2
#: descriptors kept free for what the master opens besides
SPARE = 32


def _needed(in_use, nodes, queues):
    return in_use + PER_NODE * nodes + (PER_ZYGOTE if nodes else 0) + \
        PER_QUEUE * queues + SPARE


def make_room(nodes, queues):
    """Make sure this process may open what ``nodes`` more node processes
    and ``queues`` more queue channels need: raise the soft limit if the
    hard one allows, else raise `DescriptorLimitError`."""
    if not nodes and not queues:
        return
    in_use = fdlimit.open_count()
    if in_use is None:
        return
    needed = _needed(in_use, nodes, queues)
    soft, _ = fdlimit.limits()
    if soft is None or needed <= soft:
        return
    log.debug("%d node process(es) and %d queue(s) need about %d "
              "descriptors; the soft limit is %d", nodes, queues, needed,
              soft)
    if fdlimit.raise_soft_limit() and needed <= fdlimit.limits()[0]:
        return
    raise fdlimit.limit_error(_doing(nodes, queues), needed, in_use)


def is_emfile(exc):
    """Whether ``exc`` is this process running out of descriptors."""
    return isinstance(exc, OSError) and exc.errno == errno.EMFILE


def out_of_descriptors(nodes, queues):
    """The `DescriptorLimitError` of an EMFILE met while starting
    ``nodes`` node processes and ``queues`` queue channels all the same
    (files opened meanwhile)."""
    in_use = fdlimit.open_count()
    needed = None if in_use is None else _needed(in_use, nodes, queues)
    return fdlimit.limit_error(_doing(nodes, queues), needed, in_use)


def _doing(nodes, queues):
    what = []
    if nodes:
        what.append(f"{nodes} node process(es)")
    if queues:
        what.append(f"{queues} queue(s) between node processes")
    return "starting " + " and ".join(what)
