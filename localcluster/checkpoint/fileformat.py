"""The checkpoint file: one node's blobs of one epoch, on disk.

An uncompressed ``.npz`` -- ``np.load(path)`` opens it -- holding one
``<blob>.npy`` member per blob and a ``__manifest__.json`` member, written
last, with every blob's name, dtype, shape, size and CRC-32.  No pickle
anywhere: object arrays are runtime-only and never checkpointed.

``write_checkpoint`` writes to ``<path>.partial-<pid>``, fsyncs, renames
over ``path`` and fsyncs the directory, so a reader sees a whole file or
none.  ``read_checkpoint`` checks the structure, the manifest and every
member's CRC-32 before a blob reaches its caller (with a ``sink``, before
the first byte is written into the caller's memory): a torn or corrupted
file is a `CheckpointError` naming it, never half-read.  Data is read
straight from the file into the destination array (one copy; zipfile's
own member reader would buffer it).

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

import json
import os
import stat
import struct
import zipfile
import zlib

import numpy as np

from ..errors import CheckpointError
from .atomic import atomic_write
from .partials import PARTIAL, remove_partials, remove_partials_under

__all__ = ["BLOB_NAMES", "checkpointable", "write_checkpoint",
           "read_checkpoint", "verify_checkpoint", "read_manifest",
           "make_private_dirs", "remove_partials", "remove_partials_under",
           "PARTIAL"]

#: the blob (on every checkpointed node) listing what its checkpoint holds
BLOB_NAMES = "__checkpoint__/blob_names"
MANIFEST = "__manifest__.json"
FORMAT = "localcluster-checkpoint"
#: what marks a file being written (``<path><PARTIAL><pid>``)
_CHUNK = 1 << 20
#: a .npy header we read (a dtype of many fields makes a long one)
_MAX_HEADER = 1 << 24
#: modes of what the writer creates: the user's alone
FILE_MODE = 0o600
DIR_MODE = 0o700


def checkpointable(name, value):
    """Whether blob ``name`` holding ``value`` goes into checkpoints."""
    return (isinstance(value, np.ndarray) and not value.dtype.hasobject
            and name != BLOB_NAMES)


def write_checkpoint(path, blobs, meta=None):
    """Write ``{name: array}`` to ``path`` atomically (see the module
    docstring); returns the manifest.  Nothing is left at ``path`` or
    beside it if writing fails."""
    make_private_dirs(os.path.dirname(path) or ".")
    remove_partials(path, dead_only=True)

    def write(f):
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED,
                             allowZip64=True) as zf:
            entries = [_write_member(zf, name, value)
                       for name, value in blobs.items()]
            manifest = dict(meta or {}, format=FORMAT, version=1,
                            blobs=entries)
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


def _write_member(zf, name, value):
    # (not np.ascontiguousarray: it makes a 0-d array 1-d)
    array = value if value.flags.c_contiguous else value.copy(order="C")
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


def read_manifest(path, node=None, epoch=None):
    """The manifest alone (structure checked -- and, if given, ``node``
    and ``epoch`` -- data not read)."""
    try:
        with _open_regular(path) as raw, zipfile.ZipFile(raw) as zf:
            return _check_identity(_manifest(zf, path), path, node, epoch)
    except CheckpointError:
        raise
    except FileNotFoundError as exc:
        raise _missing(path) from exc
    except Exception as exc:  # noqa: BLE001 -- see _scan
        raise _corrupt(path, exc) from exc


def _open_regular(path):
    """``path`` opened for unbuffered binary reading, if it is a regular
    file (a symlink to one is followed); `CheckpointError` otherwise.

    ``O_NONBLOCK``: opening a FIFO for reading would wait for a writer,
    forever.  The type is checked on the open descriptor, so what is read
    is what was checked.  Reads of a regular file never block, so the flag
    is simply cleared again."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK |
                     getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:  # a socket cannot be opened at all (ENXIO)
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            raise
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


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
        with _open_regular(path) as raw, zipfile.ZipFile(raw) as zf:
            manifest = _check_identity(_manifest(zf, path), path, node,
                                       epoch)
            entries = [e for e in manifest["blobs"]
                       if wanted is None or e["name"] in wanted]
            places = [_locate(zf, raw, e, path) for e in entries]
            if out is None or sink is not None:
                # every checksum first: nothing reaches a sink unverified
                buffer = memoryview(bytearray(_CHUNK))
                for place in places:
                    _verify(raw, place, path, buffer)
            if out is not None:
                for place in places:
                    out[place.name] = _fill(raw, place, path, sink)
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


def _not_regular(path, mode):
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else
            "a directory" if stat.S_ISDIR(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "of an unknown kind")
    return CheckpointError(
        f"checkpoint {path} is {kind}, not a regular file; only regular "
        "files are read as checkpoints (nothing was read from it) -- "
        "remove it, or put the node's checkpoint file there",
        reason=f"{kind}, not a regular file")


def _corrupt(path, exc):
    return CheckpointError(
        f"checkpoint {path} is torn or corrupted ({type(exc).__name__}: "
        f"{exc}); it was not loaded -- resume from an earlier epoch "
        "(get_resume_from_epoch_id() skips broken ones)",
        reason=f"{type(exc).__name__}: {exc}")


def _bad(path, reason, consequence=None):
    """The error of a checkpoint whose contents are not as written."""
    tail = f"; {consequence}" if consequence else ""
    return CheckpointError(f"checkpoint {path}: {reason}{tail}",
                           reason=reason)


def _manifest(zf, path):
    manifest = json.loads(zf.read(MANIFEST))  # zipfile checks its CRC
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has no localcluster "
                              "manifest; it was not written by localcluster",
                              reason="has no localcluster manifest")
    members = {info.filename: info for info in zf.infolist()}
    for entry in manifest["blobs"]:
        info = members.get(entry["member"])
        if info is None or info.CRC != entry["crc32"]:
            raise _bad(path, f"blob {entry['name']!r} does not match the "
                       "manifest (torn or corrupted file)",
                       "it was not loaded")
    return manifest


class _Place:
    """Where a blob's bytes are in a checkpoint file, and what they are."""

    __slots__ = ("name", "start", "header", "shape", "dtype", "nbytes",
                 "crc")

    def __init__(self, name, start, header, shape, dtype, nbytes, crc):
        self.name, self.start, self.header = name, start, header
        self.shape, self.dtype, self.nbytes, self.crc = \
            shape, dtype, nbytes, crc


def _locate(zf, raw, entry, path):
    """The `_Place` of manifest ``entry``, its headers checked against the
    manifest (the data is read later, straight from the file)."""
    info = zf.getinfo(entry["member"])
    if info.compress_type != zipfile.ZIP_STORED or \
            info.compress_size != info.file_size:
        raise _bad(path, f"blob {entry['name']!r} is not stored as written")
    raw.seek(info.header_offset)
    local = raw.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise _bad(path, f"blob {entry['name']!r} has no valid local header")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    if raw.read(name_len).decode("utf-8", "replace") != info.filename:
        raise _bad(path, f"blob {entry['name']!r} has a local header of "
                   "another member")
    start = info.header_offset + 30 + name_len + extra_len
    raw.seek(start)
    reader = _Counted(raw)
    version = np.lib.format.read_magic(reader)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(reader, max_header_size=_MAX_HEADER)
    if dtype.hasobject or fortran or list(shape) != entry["shape"] or \
            dtype.str != entry["dtype"] or \
            reader.count + entry["nbytes"] != info.file_size:
        raise _bad(path, f"blob {entry['name']!r} has a header that does "
                   "not match the manifest", "it was not loaded")
    return _Place(entry["name"], start, reader.count, shape, dtype,
                  entry["nbytes"], info.CRC)


def _read_exactly(raw, view, place, path):
    got = 0
    while got < len(view):
        more = raw.readinto(view[got:])
        if not more:
            raise _bad(path, f"blob {place.name!r} is cut short")
        got += more


def _check(crc, place, path):
    if crc != place.crc:
        raise _bad(path, f"blob {place.name!r} fails its CRC-32 check "
                   "(corrupted)", "it was not loaded")


def _verify(raw, place, path, buffer):
    """Check ``place``'s CRC-32, reading through ``buffer``."""
    raw.seek(place.start)
    crc, left = 0, place.header + place.nbytes
    while left:
        chunk = buffer[:min(left, len(buffer))]
        _read_exactly(raw, chunk, place, path)
        crc = zlib.crc32(chunk, crc)
        left -= len(chunk)
    _check(crc, place, path)


def _fill(raw, place, path, sink):
    """Read ``place`` into ``sink(...)``'s array (verified already), or into
    a new array whose CRC-32 is checked here."""
    array = np.empty(place.shape, place.dtype) if sink is None else \
        sink(place.name, place.shape, place.dtype)
    raw.seek(place.start)
    crc = zlib.crc32(raw.read(place.header))
    if place.nbytes:
        data = memoryview(array.reshape(-1).view(np.uint8))
        _read_exactly(raw, data, place, path)
        crc = zlib.crc32(data, crc) if sink is None else place.crc
    _check(crc, place, path)
    return array


class _Counted:
    """A file's ``read``, counting the bytes it gave (the .npy header)."""

    def __init__(self, f):
        self._f, self.count = f, 0

    def read(self, n=-1):
        data = self._f.read(n)
        self.count += len(data)
        return data
