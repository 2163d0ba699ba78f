"""The checkpoint file name rule: ``<node>.<epoch>``, defined once.

A node's checkpoint of an epoch is the file ``<db_prefix>/<node>.<epoch>``
(the epoch in decimal, as ``str(epoch)`` writes it), and while it is being
written, ``<node>.<epoch>.partial-<pid>-<random>`` (`partials`).  Whoever
names or reads such a file -- the managers, the command line's directory
scan, its prune and its lock -- asks this module, so that the rule has one
spelling.
"""

import os
import re

from .partials import PARTIAL

__all__ = ["checkpoint_name", "checkpoint_path", "Named", "parse_name",
           "partial_of"]

_NAME = re.compile(r"^(?P<node>.+)\.(?P<epoch>\d+)$")


def checkpoint_name(node, epoch):
    """The file name of ``node``'s checkpoint of ``epoch``."""
    return f"{node}.{epoch}"


def checkpoint_path(db_prefix, node, epoch):
    """Where ``node``'s checkpoint of ``epoch`` under ``db_prefix`` is."""
    return os.path.join(db_prefix, checkpoint_name(node, epoch))


class Named:
    """What a file's name says: ``node``, ``epoch`` and whether the name
    is ``exact`` -- the one `checkpoint_name` gives (``a.7``), not another
    spelling of that epoch (``a.07``), which is never taken for it."""

    __slots__ = ("node", "epoch", "exact")

    def __init__(self, node, epoch, exact):
        self.node, self.epoch, self.exact = node, epoch, exact

    def __repr__(self):
        return f"Named({self.node!r}, {self.epoch}, exact={self.exact})"


def parse_name(name):
    """The `Named` of a file named like a checkpoint (``<x>.<digits>``, not
    a partial file), else None."""
    if PARTIAL in name:
        return None
    match = _NAME.match(name)
    if match is None:
        return None
    epoch = int(match["epoch"])
    return Named(match["node"], epoch, str(epoch) == match["epoch"])


def partial_of(name):
    """The `Named` of the checkpoint a partial file ``name`` was being
    written as, else None (not a partial file of a checkpoint)."""
    if PARTIAL not in name:
        return None
    return parse_name(name.split(PARTIAL, 1)[0])
