"""Checks that decide whether a run is valid, made once for every session.

A session calls these before it starts anything, so LocalSession refuses
exactly what LocalHostScheduler (or any later session) would:

- `shared_queues(plans)`: the queues used on more than one node, with
  what their channel between processes needs to know (`SharedQueue`):
  any number of writer and reader nodes share one;
- `queue_writers(plan)`: how many writers of each queue end in a run of
  the plan (the queue closes when the last of them ends);
- `feedable(name, value)`: the array ``session.feed_blob`` stores -- a
  numeric copy; an object array cannot live in a node's workspace.
"""

import collections

import numpy as np


__all__ = ["queues_of", "queue_writers", "SharedQueue", "shared_queues",
           "feedable", "check_feedable", "check_seconds"]

_QUEUE_ROLES = {"EnqueueRecord": "writes", "DequeueRecords": "reads",
                "DrainRecords": "reads"}


def queues_of(plan):
    """``{queue id: (capacity, roles)}`` of the queue ops in ``plan``."""
    found = {}
    for net in plan.step.walk_nets():
        for op in net.ops:
            if "queue" in op.args:
                capacity, roles = found.get(op.args["queue"],
                                            (op.args["capacity"], set()))
                if op.type in _QUEUE_ROLES:
                    roles.add(_QUEUE_ROLES[op.type])
                found[op.args["queue"]] = (capacity, roles)
    return found


def queue_writers(plan):
    """``{queue id: writers}``: how many writers of each queue end in a
    run of ``plan`` -- its ``CloseQueue(writer=True)`` ops, one per
    writing task (a pipe's, after all its instances).  A queue closes when
    the last of them ends, so no writer's records are dropped because
    another writer finished first."""
    found = {}
    for net in plan.step.walk_nets():
        for op in net.ops:
            if op.type == "CloseQueue" and op.args.get("writer"):
                queue = op.args["queue"]
                found[queue] = found.get(queue, 0) + 1
    return found


#: a queue used on more than one node of a run: its ``capacity``, how many
#: ``writers`` end in the run on all its nodes (the last closes it: see
#: `queue_writers`), and the nodes that write it and that read it
SharedQueue = collections.namedtuple(
    "SharedQueue", "capacity writers writer_nodes reader_nodes")


def shared_queues(plans, queues=None, writers=None):
    """``{queue id: SharedQueue}`` of the queues ``plans`` use on more than
    one node.  Any number of nodes may write and read one: each record is
    read once, and the queue closes when the last writer of the run ends,
    on whichever node.

    ``queues`` and ``writers`` may give `queues_of` and `queue_writers` of
    each plan by node, when the caller keeps them."""
    users = {}
    for plan in plans:
        found = queues[plan.node] if queues is not None else queues_of(plan)
        for queue, (capacity, roles) in found.items():
            users.setdefault(queue, (capacity, {}))[1][plan.node] = roles
    shared = {}
    for queue, (capacity, by_node) in users.items():
        if len(by_node) < 2:
            continue
        ends = 0
        for plan in plans:
            if plan.node in by_node:
                counts = writers[plan.node] if writers is not None \
                    else queue_writers(plan)
                ends += counts.get(queue, 0)
        shared[queue] = SharedQueue(
            capacity, ends,
            tuple(sorted(n for n, r in by_node.items() if "writes" in r)),
            tuple(sorted(n for n, r in by_node.items() if "reads" in r)))
    return shared


#: what a fed blob may hold: booleans and numbers (dtype kinds)
_NUMERIC = frozenset("biufc")


def check_feedable(name, value, array):
    """A TypeError unless ``array`` (``np.asarray(value)``) holds booleans
    or numbers: text (``feed_blob("w", "hello")``), bytes and objects are
    no blob an op computes with, and a node's workspace keeps none."""
    if array.dtype.kind not in _NUMERIC:
        got = type(value).__name__
        if array.dtype.kind in "USV" and not array.dtype.hasobject:
            got += f" of dtype {array.dtype}"
        raise TypeError(
            f"feed_blob({name!r}): value must be numeric array-like, got "
            f"{got}; feed numbers (np.asarray(value, dtype=float), say)")


def feedable(name, value):
    """``value`` as the numeric array a node's workspace stores."""
    array = np.array(value, copy=True)
    check_feedable(name, value, array)
    return array


def check_seconds(value, what="timeout", error=ValueError):
    """``error`` naming ``what`` unless ``value`` is None or a positive
    number of seconds (not a bool)."""
    if value is not None and (isinstance(value, bool) or
                              not isinstance(value, (int, float)) or
                              not value > 0):
        raise error(f"{what} must be a positive number of seconds, got "
                    f"{value!r}")
