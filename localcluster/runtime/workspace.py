"""Workspaces: blob name -> numpy array, with child workspaces.

A node has one global `Workspace`.  A child workspace (one per node per run
of a PRIVATE group, one per task instance, one per ``create_workspace``
step) reads *and writes* the blobs its ancestors already have -- a write
replaces the ancestor's blob, even with another shape or dtype -- and keeps
the blobs it creates to itself; dropping the child drops them.

Where an array lives is the business of the root's *store*: a dict here,
shared memory under LocalHostScheduler (`put` may copy into an existing
segment instead of keeping the array).  Child workspaces always keep their
private blobs in a dict: they are temporaries.

All workspaces of a node share one lock, which counter ops hold to be
atomic across the node's threads.
"""

import threading

import numpy as np

from ..errors import BlobNotFoundError

__all__ = ["Workspace", "DictStore"]


class DictStore(dict):
    """The default store: arrays kept as they are, in a dict."""

    #: `put` keeps the array it is given (the shared-memory store copies)
    copies = False
    put = dict.__setitem__

    def reserve(self, name, shape, dtype):
        """A new array of ``shape``/``dtype`` held as ``name``, for the
        caller to fill."""
        array = np.empty(shape, dtype)
        self[name] = array
        return array


class Workspace:
    """Blobs of one node (or of one private scope of it)."""

    def __init__(self, node="local", parent=None, store=None):
        self.node = str(node)
        self.parent = parent
        self._blobs = store if store is not None else DictStore()
        self.lock = parent.lock if parent is not None else threading.RLock()

    def __repr__(self):
        kind = "child of " + repr(self.parent) if self.parent else "global"
        return f"Workspace({self.node!r}, {len(self._blobs)} blobs, {kind})"

    @property
    def store(self):
        """Where the root workspace keeps its arrays (`DictStore`, or the
        node's shared-memory `ShmStore`)."""
        ws = self
        while ws.parent is not None:
            ws = ws.parent
        return ws._blobs

    @property
    def own(self):
        """The mapping of the blobs this workspace itself holds (its
        store, for a node's global workspace): the executor's fast path
        reads it directly."""
        return self._blobs

    def child(self):
        return Workspace(self.node, parent=self)

    def _owner(self, name):
        ws = self
        while ws is not None:
            if name in ws._blobs:
                return ws
            ws = ws.parent
        return None

    def has(self, name):
        return self._owner(name) is not None

    def get(self, name):
        try:
            return self._blobs[name]
        except KeyError:
            pass
        owner = self._owner(name)
        if owner is None:
            raise BlobNotFoundError(
                name, self.node,
                "nothing wrote it before it was read: check the order of "
                "your ops, or feed it with session.feed_blob")
        return owner._blobs[name]

    def get_or_none(self, name):
        owner = self._owner(name)
        return None if owner is None else owner._blobs[name]

    def set(self, name, value):
        """Write ``value`` where ``name`` lives, or here if it is new."""
        if name in self._blobs:
            self._blobs.put(name, value)
            return
        owner = self._owner(name) or self
        owner._blobs.put(name, value)

    def local_names(self):
        """Names of the blobs this workspace itself holds."""
        return list(self._blobs)

    def names(self):
        """Names of every blob visible from here."""
        seen = dict.fromkeys(self._blobs)
        if self.parent is not None:
            seen.update(dict.fromkeys(self.parent.names()))
        return list(seen)

    def delete(self, name):
        self._blobs.pop(name, None)
