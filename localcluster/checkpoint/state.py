"""What a file named like a checkpoint is: `classify` says whether it is
the checkpoint its name promises (``whole``), the torn or corrupted rest
of one (``torn``, with the reason), a whole one that refers to an earlier
file that is not there as it recorded (``dangling``), or another
program's or another node's or epoch's file (``foreign``) -- so that a listing or a prune of a
checkpoint directory never parses zip headers or error texts itself, and
never takes (or removes) a file that is not the run's.  It also says which
earlier files a checkpoint refers to for its unchanged blobs (`reuse`):
a checkpoint is whole only if they are there as it recorded, and a prune
must keep them.
"""

import json
import os
import stat
import struct
import zipfile

from ..errors import CheckpointError
from .fileformat import FORMAT, MANIFEST, read_manifest, verify_checkpoint
from .reuse import references

__all__ = ["WHOLE", "TORN", "DANGLING", "FOREIGN", "Verdict", "classify",
           "Verdicts", "is_checkpoint"]

WHOLE, TORN, DANGLING, FOREIGN = "whole", "torn", "dangling", "foreign"


class Verdict:
    """``kind`` (`WHOLE`, `TORN`, `DANGLING` or `FOREIGN`) and ``reason`` (None when
    whole): what is wrong, in a few words; ``references``: the names of
    the earlier files of its node it refers to (as far as its manifest
    can be read)."""

    __slots__ = ("kind", "reason", "references")

    def __init__(self, kind, reason=None, references=()):
        self.kind, self.reason = kind, reason
        self.references = list(references)

    def __repr__(self):
        return f"Verdict({self.kind!r}, {self.reason!r})"


def classify(path, node, epoch, quick=False):
    """The `Verdict` of ``path`` as ``node``'s checkpoint of ``epoch``.
    ``quick``: read the manifest only, and the headers of what it refers
    to (a flipped bit in the data goes unseen); else every byte is
    checked (CRC-32), those it refers to included."""
    try:
        manifest = read_manifest(path)
    except CheckpointError as exc:
        if _torn_checkpoint(path):
            return Verdict(TORN, exc.reason)
        return Verdict(FOREIGN, "not a localcluster checkpoint")
    wrong_node = "node" in manifest and manifest["node"] != node
    wrong_epoch = "epoch" in manifest and manifest["epoch"] != epoch
    if wrong_node or wrong_epoch:
        return Verdict(FOREIGN, f"of node {manifest.get('node')!r}, "
                                f"epoch {manifest.get('epoch')!r}")
    refers = references(manifest)
    if refers:
        try:
            read_manifest(path, node=node, epoch=epoch, references=True)
        except CheckpointError as exc:
            return Verdict(DANGLING, exc.reason, refers)
    if not quick:
        try:
            verify_checkpoint(path, node=node, epoch=epoch)
        except CheckpointError as exc:
            return Verdict(TORN, exc.reason, refers)
    return Verdict(WHOLE, references=refers)


class Verdicts:
    """Quick verdicts (`classify` ``quick``) kept while they hold: a
    file's verdict is used again while the file and every file it refers
    to are the same files as when it was given (inode, size, modification
    and change times), so a run that prunes its directory after every
    epoch reads the manifests of the new files only -- not of every file
    kept (at 1000 nodes, 2000-3000 manifests an epoch).  A file written
    again, replaced, truncated or touched, or one it refers to that is
    gone or changed, is read again."""

    def __init__(self):
        self._known = {}   # (path, node, epoch) -> (stat, verdict, refs)

    def classify(self, path, node, epoch):
        key = (path, node, epoch)
        seen = _identity(path)
        known = self._known.get(key)
        if known is not None and seen is not None and known[0] == seen \
                and all(_identity(p) == s for p, s in known[2]):
            return known[1]
        verdict = classify(path, node, epoch, quick=True)
        directory = os.path.dirname(path)
        refs = [(p, _identity(p)) for p in
                (os.path.join(directory, name) for name in
                 verdict.references)]
        if seen is None or any(s is None for _, s in refs):
            self._known.pop(key, None)
        else:
            self._known[key] = (seen, verdict, refs)
        return verdict

    def retain(self, paths):
        """Forget the verdicts of every file but ``paths`` (what the last
        scan found: a pruned file's verdict is not kept for ever)."""
        paths = set(paths)
        for key in [k for k in self._known if k[0] not in paths]:
            del self._known[key]

    def __len__(self):
        return len(self._known)


def _identity(path):
    """What tells one file at ``path`` from another written there, or
    None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns)


def is_checkpoint(path):
    """Whether ``path`` holds a localcluster manifest (of any node)."""
    try:
        read_manifest(path)
    except CheckpointError:
        return False
    return True


def _torn_checkpoint(path):
    """Whether ``path``, unreadable as a checkpoint, is the rest of one:
    a zip that holds a localcluster manifest member, or -- its end cut
    off -- one that starts with a blob (``.npy``) or manifest member."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            try:
                with zipfile.ZipFile(f) as zf:
                    return MANIFEST in zf.namelist() and \
                        _manifest_format(zf) in (None, FORMAT)
            except (zipfile.BadZipFile, ValueError, OSError, EOFError):
                pass
            f.seek(0)
            head = f.read(30)
            if len(head) < 30 or head[:4] != b"PK\x03\x04":
                return False
            length = struct.unpack("<H", head[26:28])[0]
            first = f.read(length).decode("utf-8", "replace")
    except OSError:
        return False
    return first.endswith(".npy") or first == MANIFEST


def _manifest_format(zf):
    """The ``format`` a zip's manifest names; None if it cannot be read
    (a damaged one, which does not say it is another program's)."""
    try:
        manifest = json.loads(zf.read(MANIFEST))
    except Exception:  # noqa: BLE001 -- whatever a damaged member raises
        return None
    return manifest.get("format") if isinstance(manifest, dict) else ""
