"""Unchanged blobs are saved once: a checkpoint refers to the earlier
checkpoint file of its node that holds their bytes.

Much of what a node holds does not change from one epoch to the next (a
reader's dataset, a frozen table), and writing it again every epoch costs
its size on disk and in time.  So when a node writes ``<node>.<k>``, a
blob of `MIN_BYTES` or more whose bytes are exactly those of a member of
an earlier checkpoint of the node, in the same directory, is recorded as
a reference to that member instead of its bytes::

    {"name": "shard_0/x", "dtype": "<f8", "shape": [32768, 32],
     "nbytes": 8388608, "crc32": <the member's>,
     "ref": {"file": "reader.0", "epoch": 0, "id": "<that file's id>",
             "member": "shard_0/x.npy"}}

- Where to look (write side): `SavedBlobs`, which each node keeps in
  memory -- where each big blob's bytes went at its last save, or came
  from at its last load.  It is only a hint: `Unchanged` compares the
  blob with that member on disk byte for byte (and checks the member's
  CRC-32 on the way) before it refers to it -- no digest that could
  collide, nothing trusted from memory.  A blob that changed almost
  always differs in its first chunk, so the comparison costs little
  then; one that did not costs a read instead of a write and an fsync.
  A node that starts afresh (a restart) remembers nothing and writes
  everything once.
- What is referred to: always the file that holds the bytes, never one
  that refers on; of the same node; in the same directory, by name (a
  directory moved or copied whole stays readable); never the file being
  written.  ``id``, random in every manifest, names one writing of a
  file: a file written again since is not taken for the one referred to.
- Reading (`Referenced`) follows a reference: the file must be there, be
  that node's checkpoint of that epoch with that ``id``, and list the
  member as it was; else a `CheckpointError` naming both files.
- Pruning keeps every epoch whose files a kept checkpoint refers to
  (`localcluster.cli.rundir.prune`); nothing rewrites or moves a file a
  reference names.  A checkpoint is still written whole or not at all
  (`atomic`): a reference only ever names a file that was whole when the
  reference was written.
"""

import contextlib
import logging
import os
import threading
import zipfile

import numpy as np

from ..errors import CheckpointError
from .members import (chunk_buffer, compare, locate, manifest_of,
                      open_regular)
from .names import parse_name

__all__ = ["MIN_BYTES", "Source", "SavedBlobs", "Unchanged", "Referenced",
           "references"]

log = logging.getLogger(__name__)

#: blobs smaller than this are always written: a reference would save
#: little, and looking for the earlier copy costs a file's open
MIN_BYTES = 64 << 10


class Source:
    """Where a blob's bytes were saved: the member ``member`` of the file
    ``file`` in ``directory`` -- that node's checkpoint of ``epoch``,
    written as ``id`` -- with the CRC-32 ``crc32``."""

    __slots__ = ("directory", "file", "epoch", "id", "member", "crc32")

    def __init__(self, directory, file, epoch, id, member, crc32):
        self.directory, self.file, self.epoch = directory, file, epoch
        self.id, self.member, self.crc32 = id, member, crc32

    def __repr__(self):
        return f"Source({self.file!r}, {self.member!r})"

    def ref(self):
        """The ``ref`` of a manifest entry naming this member."""
        return {"file": self.file, "epoch": self.epoch, "id": self.id,
                "member": self.member}


def _directory(path):
    return os.path.dirname(os.path.abspath(path))


class SavedBlobs:
    """One node's memory of where each of its big blobs' bytes were last
    saved (or loaded from): where its next save looks for them unchanged.
    The node's checkpoint ops keep one, across runs."""

    def __init__(self):
        self._sources = {}
        self._lock = threading.Lock()

    def candidates(self, path):
        """``{blob: Source}`` that a checkpoint written to ``path`` may
        refer to: those in its directory, and not ``path`` itself (a file
        being replaced is no place for the bytes of its successor)."""
        directory, file = _directory(path), os.path.basename(path)
        with self._lock:
            return {name: source for name, source in self._sources.items()
                    if source.directory == directory and source.file != file}

    def record(self, path, manifest, names=None):
        """The checkpoint at ``path`` with ``manifest`` was just written,
        or loaded: its blobs' bytes are where it says.  ``names``: only
        these were loaded (None: all of them, and nothing else is the
        node's any more)."""
        found = {}
        for entry in manifest.get("blobs", ()):
            if names is not None and entry["name"] not in names:
                continue
            source = _source_of(path, manifest, entry)
            if source is not None:
                found[entry["name"]] = source
        with self._lock:
            if names is None:
                self._sources = found
            else:
                for name in names:
                    self._sources.pop(name, None)
                self._sources.update(found)


def _source_of(path, manifest, entry):
    """Where ``entry`` of the checkpoint at ``path`` has its bytes (None:
    too small to refer to, or a file that cannot be referred to)."""
    if not isinstance(entry.get("nbytes"), int) or \
            entry["nbytes"] < MIN_BYTES:
        return None
    directory = _directory(path)
    ref = entry.get("ref")
    if ref is not None:  # (read and checked, or just written)
        return Source(directory, ref["file"], ref["epoch"], ref["id"],
                      ref["member"], entry["crc32"])
    if not isinstance(manifest.get("id"), str) or \
            not isinstance(manifest.get("epoch"), int):
        return None  # written before checkpoints had ids
    return Source(directory, os.path.basename(path), manifest["epoch"],
                  manifest["id"], entry["member"], entry["crc32"])


class Unchanged:
    """The write side, for one checkpoint of ``node`` written to ``path``:
    `reference` says whether a blob is saved already, byte for byte, in
    one of the ``candidates`` (`SavedBlobs.candidates`).  A context
    manager: the earlier files it opened are closed on exit."""

    def __init__(self, path, node, candidates):
        self.node, self.candidates = node, candidates
        self._directory = os.path.dirname(path)
        self._stack = contextlib.ExitStack()
        self._holders = {}   # file -> (zf, raw, {member: entry}) or None
        self._buffer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def reference(self, name, array):
        """The manifest entry referring to the member that holds exactly
        ``array`` (C-contiguous) as blob ``name``; None: write it."""
        source = self.candidates.get(name)
        if source is None or array.nbytes < MIN_BYTES:
            return None
        holder = self._holder(source)
        if holder is None:
            return None
        zf, raw, members, path = holder
        entry = members.get(source.member)
        if entry is None or "ref" in entry or \
                entry.get("crc32") != source.crc32 or \
                entry.get("dtype") != array.dtype.str or \
                entry.get("shape") != list(array.shape):
            return None
        if self._buffer is None:
            self._buffer = chunk_buffer()
        try:
            same = compare(locate(zf, raw, entry, path),
                           memoryview(array.reshape(-1).view(np.uint8)),
                           self._buffer)
        except Exception:  # noqa: BLE001 -- a damaged file: write instead
            log.debug("%s cannot be compared with blob %r; it is written",
                      path, name, exc_info=True)
            return None
        if not same:
            return None
        return {"name": name, "dtype": entry["dtype"],
                "shape": entry["shape"], "nbytes": entry["nbytes"],
                "crc32": entry["crc32"], "ref": source.ref()}

    def _holder(self, source):
        """The open earlier checkpoint ``source`` names, if it is still the
        file that was written then; else None (its blobs are written)."""
        if source.file in self._holders:
            return self._holders[source.file]
        path = os.path.join(self._directory, source.file)
        found = None
        try:
            raw = self._stack.enter_context(open_regular(path))
            zf = self._stack.enter_context(zipfile.ZipFile(raw))
            manifest = manifest_of(zf, path)
            if manifest.get("node") == self.node and \
                    manifest.get("epoch") == source.epoch and \
                    manifest.get("id") == source.id:
                found = (zf, raw, {e.get("member"): e
                                   for e in manifest["blobs"]}, path)
        except Exception:  # noqa: BLE001 -- gone or damaged: write instead
            log.debug("%s cannot be referred to; its blobs are written",
                      path, exc_info=True)
        self._holders[source.file] = found
        return found


def references(manifest):
    """The names of the files a checkpoint's ``manifest`` refers to."""
    found = set()
    for entry in manifest.get("blobs", ()):
        ref = entry.get("ref") if isinstance(entry, dict) else None
        if isinstance(ref, dict) and isinstance(ref.get("file"), str):
            found.add(ref["file"])
    return sorted(found)


class Referenced:
    """The read side, for one checkpoint at ``path`` with ``manifest``:
    the earlier files its references name, each opened once (on
    ``stack``, an `contextlib.ExitStack` the caller closes) and checked
    to be what the reference says."""

    def __init__(self, path, manifest, stack):
        self.path, self.node = path, manifest.get("node")
        self._directory = os.path.dirname(path)
        self._stack = stack
        self._holders = {}   # file -> (zf, raw, {member: entry}, path)
        self._refs = {}      # blob name -> its ref (for messages)

    def place(self, entry):
        """The `members.Place` of the bytes ``entry`` refers to, the file
        and its headers checked; `CheckpointError` naming both files."""
        ref = self._valid(entry)
        zf, raw, members, path = self._holder(entry, ref)
        held = members.get(ref["member"])
        if held is None or "ref" in held or any(
                held.get(key) != entry[key]
                for key in ("crc32", "dtype", "shape", "nbytes")):
            raise self._error(entry, ref, "that file does not hold it as "
                              "this checkpoint recorded", "which does not "
                              "hold it as recorded")
        self._refs[entry["name"]] = ref
        with self._damaged(entry, ref):
            return locate(zf, raw, held, path, name=entry["name"])

    @contextlib.contextmanager
    def reading(self, place):
        """Around reading ``place``'s bytes: a damaged referred-to file is
        a `CheckpointError` of this checkpoint, naming both."""
        ref = self._refs.get(place.name) if place.path != self.path \
            else None
        if ref is None:
            yield
            return
        with self._damaged({"name": place.name}, ref):
            yield

    @contextlib.contextmanager
    def _damaged(self, entry, ref):
        try:
            yield
        except CheckpointError as exc:
            raise self._error(entry, ref, f"that file is damaged: "
                              f"{exc.reason}", f"which is damaged "
                              f"({exc.reason})") from exc

    def _valid(self, entry):
        """``entry``'s ref, if it can name an earlier checkpoint of this
        node in this directory: a bare file name ``<node>.<epoch>``."""
        ref = entry["ref"]
        named = parse_name(ref["file"]) if isinstance(ref, dict) and \
            isinstance(ref.get("file"), str) else None
        if named is None or not named.exact or \
                os.path.basename(ref["file"]) != ref["file"] or \
                ref["file"] == os.path.basename(self.path) or \
                named.epoch != ref.get("epoch") or \
                (self.node is not None and named.node != self.node) or \
                not isinstance(ref.get("id"), str) or \
                not isinstance(ref.get("member"), str):
            reason = (f"blob {entry['name']!r} refers to {ref!r}, which is "
                      "no earlier checkpoint of this node")
            raise CheckpointError(f"checkpoint {self.path}: {reason}; it was"
                                  " not loaded (an edited manifest?)",
                                  reason=reason)
        return ref

    def _holder(self, entry, ref):
        file = ref["file"]
        if file not in self._holders:
            self._holders[file] = self._open(entry, ref)
        return self._holders[file]

    def _open(self, entry, ref):
        path = os.path.join(self._directory, ref["file"])
        try:
            raw = self._stack.enter_context(open_regular(path))
            zf = self._stack.enter_context(zipfile.ZipFile(raw))
            manifest = manifest_of(zf, path)
        except FileNotFoundError:
            raise self._error(entry, ref, "that file does not exist "
                              "(removed or renamed)",
                              "which does not exist") from None
        except CheckpointError as exc:
            raise self._error(entry, ref, f"that file is unreadable: "
                              f"{exc.reason}", f"which is unreadable "
                              f"({exc.reason})") from exc
        except Exception as exc:  # noqa: BLE001 -- whatever a damaged
            why = f"{type(exc).__name__}: {exc}"  # file makes zipfile raise
            raise self._error(entry, ref, f"that file is torn or corrupted "
                              f"({why})", f"which is torn or corrupted "
                              f"({why})") from exc
        if (self.node is not None and manifest.get("node") != self.node) or \
                manifest.get("epoch") != ref["epoch"] or \
                manifest.get("id") != ref["id"]:
            raise self._error(entry, ref, "that file is another checkpoint "
                              "now (written again since, or another node's "
                              "or epoch's)", "which is another checkpoint "
                              "now")
        return zf, raw, {e.get("member"): e for e in manifest["blobs"]}, path

    def _error(self, entry, ref, what, reason):
        path = os.path.join(self._directory, str(ref.get("file")))
        return CheckpointError(
            f"checkpoint {self.path}: blob {entry['name']!r} had not changed "
            f"since epoch {ref.get('epoch')}, so this checkpoint refers to "
            f"its bytes in {path} instead of holding them, but {what}; it "
            "was not loaded -- put that file back, or resume from another "
            "epoch (python -m localcluster.ckpt ls DIR shows which are "
            "complete)", reason=f"refers to {ref.get('file')}, {reason}")
