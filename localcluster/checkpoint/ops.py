"""The ops that save and load a checkpoint inside a node: what a manager's
TaskGroups run (``SaveCheckpoint``, ``LoadCheckpoint``,
``CheckpointBlobNames``, ``LoadBlobsFromCheckpoint``...), each against
the node's own workspace -- under `LocalHostScheduler` in the node's
process, so every node writes its own file, all in parallel.

Each node also keeps, in its runtime's resources, a `reuse.SavedBlobs`:
where its big blobs were last saved or loaded from, so that its next
save refers to those that did not change instead of writing them again.
"""

import os

import numpy as np

from .fileformat import (BLOB_NAMES, checkpointable, read_checkpoint,
                         read_manifest, write_checkpoint)
from .names import checkpoint_path, parse_name
from .reuse import SavedBlobs
from ..errors import CheckpointError
from ..kernels.registry import register_op

#: the key of a node's `SavedBlobs` in its runtime resources
_SAVED = "checkpoint_saved_blobs"


def _workspace(ctx):
    ws = ctx.resources.get("workspace")
    if ws is None:
        raise RuntimeError(f"node {ctx.node!r} gives its ops no workspace; "
                           "this session cannot checkpoint")
    return ws


def _saved(ctx):
    """The node's `SavedBlobs` (made on first use; kept while the node
    lives -- a restarted node starts with none)."""
    return ctx.resources.setdefault(_SAVED, SavedBlobs())


def _path(ctx, path, directory, epoch):
    """The file an op works on: ``path``, or -- given ``directory``
    instead (a net a prototype's instances share) -- the running node's
    own checkpoint of ``epoch`` there."""
    if path or not directory:
        return path
    return checkpoint_path(directory, ctx.node, epoch)


def _expected(ctx, path, epoch):
    """``(node, epoch)`` a checkpoint loaded from ``path`` must be of: the
    node loading it, and ``epoch`` -- or, if none was given (< 0), the
    epoch its name ``<node>.<epoch>`` says, if it says one."""
    if epoch < 0:
        named = parse_name(os.path.basename(path))
        epoch = named.epoch if named is not None else None
    return ctx.node, epoch


@register_op("CheckpointBlobNames", context=True)
def checkpoint_blob_names(ctx, path="", epoch=-1, directory=""):
    """The names of what this node checkpoints: its global workspace's
    array blobs now, or -- given ``path`` (or ``directory``: this node's
    file there) -- the blobs of that checkpoint (of this node and
    ``epoch``)."""
    path = _path(ctx, path, directory, epoch)
    if path:
        node, epoch = _expected(ctx, path, epoch)
        names = [e["name"] for e in
                 read_manifest(path, node=node, epoch=epoch)["blobs"]]
    else:
        ws = _workspace(ctx)
        with ws.lock:
            names = sorted(n for n in ws.names()
                           if checkpointable(n, ws.get_or_none(n)))
    return np.array(names, dtype=str) if names else np.zeros(0, "<U1")


@register_op("SaveCheckpoint", num_outputs=0, context=True)
def save_checkpoint(ctx, names, path="", epoch=0, final=False,
                    job_nodes=(), create_dir=True, directory=""):
    """Write the blobs listed in ``names`` to ``path`` (see the module);
    ``final`` marks the epoch training stopped after, ``job_nodes`` are
    every node checkpointing it (so a reader knows who else must have);
    ``create_dir`` False: the directory was made by an earlier save, and
    one that is gone now (moved or removed under the run) is an error,
    not made again at the old path; ``directory`` instead of ``path``:
    this node's file of ``epoch`` there."""
    path = _path(ctx, path, directory, epoch)
    ws = _workspace(ctx)
    blobs = {}
    for name in names.tolist():
        value = ws.get_or_none(name)
        if value is None:
            raise CheckpointError(
                f"blob {name!r} of node {ctx.node!r} was in its workspace "
                "after the init group but is gone; a checkpoint needs every "
                "blob the init group left")
        blobs[name] = value
    saved = _saved(ctx)
    manifest = write_checkpoint(
        path, blobs, {"node": ctx.node, "epoch": int(epoch),
                      "final": bool(final),
                      "job_nodes": [n if isinstance(n, str) else
                                    [str(n[0]), int(n[1])]
                                    for n in job_nodes]},
        reuse=saved.candidates(path), create=create_dir)
    saved.record(path, manifest)


@register_op("LoadCheckpoint", num_outputs=0, context=True)
def load_checkpoint(ctx, path="", names=None, epoch=-1, directory=""):
    """Put the blobs of the checkpoint at ``path`` (only ``names``, if
    given) into this node's global workspace, after verifying all of them
    and that it is this node's checkpoint of ``epoch``; a full load also
    resets the node's list of checkpointed blobs.  ``directory`` instead
    of ``path``: this node's file of ``epoch`` there."""
    path = _path(ctx, path, directory, epoch)
    ws = _workspace(ctx)
    node, epoch = _expected(ctx, path, epoch)
    with ws.lock:
        # every blob verified, then read straight into the memory the
        # node's store gives it (its shared-memory segment, say)
        manifest, _ = read_checkpoint(path, names, ws.store.reserve,
                                      node=node, epoch=epoch)
        _saved(ctx).record(path, manifest,
                           None if names is None else set(map(str, names)))
        if names is None:
            ws.set(BLOB_NAMES, np.array([e["name"] for e in
                                         manifest["blobs"]], dtype=str)
                   if manifest["blobs"] else np.zeros(0, "<U1"))
