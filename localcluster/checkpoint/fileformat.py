"""The checkpoint file: one node's blobs of one epoch, on disk.

An uncompressed ``.npz`` -- ``np.load(path)`` opens it -- holding one
``<blob>.npy`` member per blob and a ``__manifest__.json`` member, written
last, with every blob's name, dtype, shape, size and CRC-32.  No pickle
anywhere: object arrays are runtime-only and never checkpointed.

A blob of 64 KiB or more that has not changed since the node's earlier
checkpoint in the same directory is not written again: the manifest
refers to that file's member instead (`reuse`), and reading follows the
reference.  Every manifest has an ``id``, random, naming that writing of
the file (what a reference names).

``write_checkpoint`` writes to ``<path>.partial-<pid>``, fsyncs, renames
over ``path`` and fsyncs the directory, so a reader sees a whole file or
none.  ``read_checkpoint`` checks the structure, the manifest and every
member's CRC-32 before a blob reaches its caller (with a ``sink``, before
the first byte is written into the caller's memory): a torn or corrupted
file is a `CheckpointError` naming it, never half-read.  Data is read
straight from the file into the destination array (one copy; zipfile's
own member reader would buffer it: `members`).

Checkpoints are private to the user who trains: files are created 0600
and the directories the writer creates 0700 (a checkpoint holds the
model; the shared-memory segments are 0600 for the same reason).

Identity.  The manifest names the node and epoch a checkpoint is of
(``meta``), and every reader may say which it expects (``node=``,
``epoch=``): a checkpoint of another node or epoch -- a file copied,
renamed, linked or its manifest edited -- is a `CheckpointError` naming
both, never loaded as the one asked for.  A manifest that names no node
(or no epoch) -- one written without that ``meta`` -- cannot be checked
for it and is read as before: a missing name is no evidence of a wrong
one, and the CRCs still guard the data.

Only regular files are read.  A path is opened with ``O_NONBLOCK`` -- so
a FIFO (or a symlink to one) never blocks the open -- and its type is
checked on the open descriptor (``fstat``), so nothing can be swapped in
between the check and the read.  A symlink to a regular file is followed:
links are a legitimate way to keep checkpoints elsewhere, and the
identity check refuses one that points at another node's or epoch's file.

Pure file I/O: the ops and managers of `localcluster.checkpoint` call it,
in whichever process runs them.
"""

import contextlib
import errno
import json
import os
import zipfile

import numpy as np

from ..errors import CheckpointError
from .atomic import atomic_write
from .members import (FORMAT, MANIFEST, chunk_buffer, fill, locate,
                      manifest_of, open_regular, verify)
from .partials import (PARTIAL, remove_partials, remove_partials_under,
                       sweep_before_write)
from .reuse import Referenced, Unchanged

__all__ = ["BLOB_NAMES", "FORMAT", "MANIFEST", "checkpointable",
           "write_checkpoint", "read_checkpoint", "verify_checkpoint",
           "read_manifest", "make_private_dirs", "remove_partials",
           "remove_partials_under", "PARTIAL"]

#: the blob (on every checkpointed node) listing what its checkpoint holds
BLOB_NAMES = "__checkpoint__/blob_names"
#: modes of what the writer creates: the user's alone
FILE_MODE = 0o600
DIR_MODE = 0o700


def checkpointable(name, value):
    """Whether blob ``name`` holding ``value`` goes into checkpoints."""
    return (isinstance(value, np.ndarray) and not value.dtype.hasobject
            and name != BLOB_NAMES)


def write_checkpoint(path, blobs, meta=None, reuse=None, create=True):
    """Write ``{name: array}`` to ``path`` atomically (see the module
    docstring); returns the manifest.  Nothing is left at ``path`` or
    beside it if writing fails.  ``reuse``: ``{name: reuse.Source}``,
    where an earlier checkpoint of this node (``meta["node"]``) saved
    each blob: a blob whose bytes are still exactly those is referred to
    there, not written again.  ``create``: make the directory if it is
    missing (else a missing one is FileNotFoundError)."""
    directory = os.path.dirname(path) or "."
    if create:
        make_private_dirs(directory)
    elif not os.path.isdir(directory):
        raise FileNotFoundError(
            errno.ENOENT, "the checkpoint directory is gone (moved or "
            "removed after an earlier save)", directory)
    sweep_before_write(path)
    meta = dict(meta or {})
    file_id = os.urandom(8).hex()

    def write(f):
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED,
                             allowZip64=True) as zf, \
                Unchanged(path, meta.get("node"), reuse or {}) as unchanged:
            entries = []
            for name, value in blobs.items():
                # (not np.ascontiguousarray: it makes a 0-d array 1-d)
                array = value if value.flags.c_contiguous else \
                    value.copy(order="C")
                entries.append(unchanged.reference(name, array) or
                               _write_member(zf, name, array))
            refers = any("ref" in entry for entry in entries)
            manifest = dict(meta, format=FORMAT, version=2 if refers else 1,
                            id=file_id, blobs=entries)
            zf.writestr(MANIFEST, json.dumps(manifest, indent=1))
        return manifest

    # unique per writer: two writers of one path never share a temp file
    return atomic_write(
        path, write, mode=FILE_MODE,
        temp=f"{path}{PARTIAL}{os.getpid()}-{os.urandom(4).hex()}")


def make_private_dirs(directory):
    """Create ``directory`` and its missing parents, each 0700 (unlike
    ``os.makedirs``, whose parents get the umask's mode); one that exists
    is left as it is.  Safe when several writers race to create it."""
    if os.path.isdir(directory):
        return
    head, tail = os.path.split(directory)
    if not tail:  # "a/b/"
        head, tail = os.path.split(head)
    if head and tail and not os.path.isdir(head):
        make_private_dirs(head)
    try:
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(directory):
            raise


def _write_member(zf, name, array):
    header = np.lib.format.header_data_from_array_1_0(array)
    with zf.open(name + ".npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_2_0(member, header)
        if array.nbytes:
            member.write(memoryview(array.reshape(-1).view(np.uint8)))
    info = zf.getinfo(name + ".npy")
    return {"name": name, "member": info.filename, "dtype": array.dtype.str,
            "shape": list(array.shape), "nbytes": int(array.nbytes),
            "crc32": info.CRC}


def read_checkpoint(path, names=None, sink=None, node=None, epoch=None):
    """``(manifest, {name: array})`` of the checkpoint at ``path``, every
    member verified first; only ``names`` if given (names it lacks are
    skipped).  Raises `CheckpointError` naming the file if it is missing,
    not a regular file, torn or corrupted -- or, given ``node`` or
    ``epoch``, the checkpoint of another node or epoch (see the module).

    ``sink(name, shape, dtype)``, if given, returns the array each blob is
    read into (a workspace's own memory, say): then every member is
    verified before the first byte is written there."""
    blobs = {}
    manifest = _scan(path, names, blobs, sink, node, epoch)
    return manifest, blobs


def verify_checkpoint(path, node=None, epoch=None):
    """The manifest of the checkpoint at ``path`` after reading every byte
    of it and checking every checksum (and, if given, that it is of
    ``node`` and ``epoch``); `CheckpointError` if it fails."""
    return _scan(path, None, None, None, node, epoch)


def read_manifest(path, node=None, epoch=None, references=False):
    """The manifest alone (structure checked -- and, if given, ``node``
    and ``epoch`` -- data not read).  ``references``: also check that
    every blob it refers to is where it says (the earlier files and
    their headers; their data is not read)."""
    try:
        with contextlib.ExitStack() as files:
            raw = files.enter_context(open_regular(path))
            zf = files.enter_context(zipfile.ZipFile(raw))
            manifest = _check_identity(manifest_of(zf, path), path, node,
                                       epoch)
            if references:
                referred = Referenced(path, manifest, files)
                for entry in manifest["blobs"]:
                    if "ref" in entry:
                        referred.place(entry)
            return manifest
    except CheckpointError:
        raise
    except FileNotFoundError as exc:
        raise _missing(path) from exc
    except Exception as exc:  # noqa: BLE001 -- see _scan
        raise _corrupt(path, exc) from exc


def _check_identity(manifest, path, node, epoch):
    """``manifest`` if it is of ``node`` and ``epoch`` (each checked if
    given and if the manifest names it); `CheckpointError` naming both
    otherwise."""
    wrong_node = node is not None and "node" in manifest and \
        manifest["node"] != node
    wrong_epoch = epoch is not None and "epoch" in manifest and (
        type(manifest["epoch"]) is not int or
        manifest["epoch"] != int(epoch))
    if wrong_node or wrong_epoch:
        found = _identity(manifest.get("node"), manifest.get("epoch"))
        raise CheckpointError(
            f"checkpoint {path} is of {found} (its manifest says so), not "
            f"of {_identity(node, epoch)} that was to be loaded; it was not "
            "loaded -- a file copied, renamed or linked from another node or"
            " epoch, or an edited manifest: put that node's own checkpoint "
            "of that epoch there, or resume from another epoch "
            "(get_resume_from_epoch_id() skips such files)",
            reason=f"of {found}, not of {_identity(node, epoch)}")
    return manifest


def _identity(node, epoch):
    return " ".join(part for part in (
        None if node is None else f"node {node!r}",
        None if epoch is None else f"epoch {epoch!r}" if
        isinstance(epoch, str) else f"epoch {epoch}") if part) or \
        "no node or epoch"


def _scan(path, names, out, sink, node=None, epoch=None):
    wanted = None if names is None else set(map(str, names))
    try:
        # one descriptor for zipfile and our own reads: zipfile seeks
        # before each of its reads, and ours seek first too
        with contextlib.ExitStack() as files:
            raw = files.enter_context(open_regular(path))
            zf = files.enter_context(zipfile.ZipFile(raw))
            manifest = _check_identity(manifest_of(zf, path), path, node,
                                       epoch)
            entries = [e for e in manifest["blobs"]
                       if wanted is None or e["name"] in wanted]
            referred = Referenced(path, manifest, files)
            places = [referred.place(e) if "ref" in e else
                      locate(zf, raw, e, path) for e in entries]
            if out is None or sink is not None:
                # every checksum first: nothing reaches a sink unverified
                buffer = chunk_buffer()
                for place in places:
                    with referred.reading(place):
                        verify(place, buffer)
            if out is not None:
                for place in places:
                    with referred.reading(place):
                        out[place.name] = fill(place, sink)
            return manifest
    except CheckpointError:
        raise
    except FileNotFoundError as exc:
        raise _missing(path) from exc
    except Exception as exc:  # noqa: BLE001 -- whatever a damaged file
        raise _corrupt(path, exc) from exc  # makes the parsers raise


def _missing(path):
    return CheckpointError(
        f"checkpoint {path} does not exist: check the db_prefix and the "
        "epoch (get_resume_from_epoch_id() gives the latest complete one)",
        reason="does not exist")


def _corrupt(path, exc):
    return CheckpointError(
        f"checkpoint {path} is torn or corrupted ({type(exc).__name__}: "
        f"{exc}); it was not loaded -- resume from an earlier epoch "
        "(get_resume_from_epoch_id() skips broken ones)",
        reason=f"{type(exc).__name__}: {exc}")
