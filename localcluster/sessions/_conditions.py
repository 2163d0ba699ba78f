"""The conditions a session's run is under, decided once for every session.

`RunConditions` gathers, for a session, what `resolve` needs for a run:
the links of the `Cluster` the group's tasks were built in, the session's
own ``conditions=``, the partitions of its fault plan, the run's epoch
and the run's cross-node queues (their writing and reading nodes).  It
checks each condition against the nodes of the job once per group (a
`PlanError` naming the condition and the rule), and gives each node of a
run its `NodeConditions` -- or None for a run under no conditions, which
costs nothing more than a dictionary lookup.
"""

import time
import weakref

from ..plan.conditions import (Link, check_patterns, in_force, resolve)
from ..plan.validate import shared_queues

__all__ = ["RunConditions", "timeout_note"]


class RunConditions:
    """One session's conditions (see the module docstring)."""

    def __init__(self, conditions, faults):
        self.conditions = tuple(conditions)
        self.partitions = faults.partitions() if faults is not None else []
        self._groups = weakref.WeakKeyDictionary()  # group -> its facts
        #: the partitions in force in the last run
        self.last_partitions = []

    def _facts(self, group, plans):
        """(conditions, cross-node queues, any slow node) of ``group``,
        checked once."""
        found = self._groups.get(group)
        if found is not None and found[0] is plans:
            return found[1]
        clusters, links = [], []
        for task in group.tasks():
            cluster = getattr(task, "cluster", None)
            if cluster is not None and all(c is not cluster
                                           for c in clusters):
                clusters.append(cluster)
                links.extend(cluster.links)
        known = {p.node for p in plans}
        for cluster in clusters:
            known.update(cluster.nodes())
        if links or self.conditions or self.partitions:
            check_patterns(links + list(self.conditions), [
                p for _, p in self.partitions], known)
        conditions = tuple(links) + self.conditions
        # the queues matter only to links and partitions: a session with
        # neither does not walk the group's nets for them
        queues = _cross_queues(plans) if self.partitions or any(
            isinstance(c, Link) for c in conditions) else {}
        facts = (conditions, queues,
                 any(p.node_kwargs.get("slowdown") for p in plans))
        self._groups[group] = (plans, facts)
        return facts

    def check(self, group, plans):
        """A `PlanError` for a condition of a run of ``plans`` that names
        no node of the job (checked once per group)."""
        self._facts(group, plans)

    def of_run(self, group, plans, epoch):
        """``{node: NodeConditions}`` of a run of ``plans``, or None."""
        conditions, queues, slow = self._facts(group, plans)
        self.last_partitions = in_force(self.partitions, epoch)
        if not (conditions or self.last_partitions or slow):
            return None
        return resolve(plans, conditions, self.last_partitions, epoch,
                       queues)

    def fired(self, faults, seen):
        """Note the partitions of this run that start for the first time
        in ``faults.fired()`` (``seen``: the indexes noted already)."""
        for index, _ in self.last_partitions:
            if index not in seen:
                seen.add(index)
                faults.record(index, time.time())


def _cross_queues(plans):
    """``{queue id: (writing nodes, reading nodes)}`` of the queues
    ``plans`` use across nodes."""
    return {q: (use.writer_nodes, use.reader_nodes)
            for q, use in shared_queues(plans).items()
            if use.writer_nodes and use.reader_nodes}


def timeout_note(partitions):
    """What a run's timeout message adds when partitions were in force."""
    if not partitions:
        return ""
    return ("; records between partitioned nodes were held: " +
            ", ".join(repr(p) for _, p in partitions) +
            " (a partition that heals after the run's timeout, or never, "
            "holds its readers past it)")
