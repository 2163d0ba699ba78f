"""A blob's member inside a checkpoint file: where its bytes are, and
reading them checked, straight from the file.

A checkpoint is an uncompressed zip (`fileformat`): each blob a
``<blob>.npy`` member, and the ``__manifest__.json`` member listing them.
`manifest_of` reads the manifest and checks it against the zip's own
directory; `locate` finds where a member's data starts in the file (its
headers checked against the manifest); `verify`, `fill` and `compare`
then read those bytes with our own reads -- zipfile's member reader would
buffer them -- checking the member's CRC-32 on the way.

`fileformat` reads a checkpoint with these, and `reuse` both compares a
blob with an earlier checkpoint's member and reads the members a
checkpoint refers to.  Pure file I/O.
"""

import json
import os
import stat
import struct
import zipfile
import zlib

import numpy as np

from ..errors import CheckpointError

__all__ = ["MANIFEST", "FORMAT", "open_regular", "manifest_of", "Place",
           "locate", "verify", "fill", "compare", "bad", "chunk_buffer"]

MANIFEST = "__manifest__.json"
FORMAT = "localcluster-checkpoint"
_CHUNK = 1 << 20
#: a .npy header we read (a dtype of many fields makes a long one)
_MAX_HEADER = 1 << 24


def chunk_buffer():
    """A buffer for `verify` and `compare` to read through."""
    return memoryview(bytearray(_CHUNK))


def open_regular(path):
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


def bad(path, reason, consequence=None):
    """The error of a checkpoint whose contents are not as written."""
    tail = f"; {consequence}" if consequence else ""
    return CheckpointError(f"checkpoint {path}: {reason}{tail}",
                           reason=reason)


def manifest_of(zf, path):
    """The manifest of the checkpoint zip ``zf`` (at ``path``), every blob
    it lists as a member of the zip checked against the zip's directory;
    a blob it lists as a reference (``ref``: `reuse`) is checked there."""
    manifest = json.loads(zf.read(MANIFEST))  # zipfile checks its CRC
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has no localcluster "
                              "manifest; it was not written by localcluster",
                              reason="has no localcluster manifest")
    members = {info.filename: info for info in zf.infolist()}
    for entry in manifest["blobs"]:
        if "ref" in entry:
            continue
        info = members.get(entry["member"])
        if info is None or info.CRC != entry["crc32"]:
            raise bad(path, f"blob {entry['name']!r} does not match the "
                      "manifest (torn or corrupted file)",
                      "it was not loaded")
    return manifest


class Place:
    """Where a blob's bytes are in a checkpoint file, and what they are:
    ``raw`` is the open file, ``path`` its name (the file that holds the
    bytes, which for a reference is not the checkpoint read)."""

    __slots__ = ("name", "start", "header", "shape", "dtype", "nbytes",
                 "crc", "raw", "path")

    def __init__(self, name, start, header, shape, dtype, nbytes, crc, raw,
                 path):
        self.name, self.start, self.header = name, start, header
        self.shape, self.dtype, self.nbytes, self.crc = \
            shape, dtype, nbytes, crc
        self.raw, self.path = raw, path


def locate(zf, raw, entry, path, name=None):
    """The `Place` of manifest ``entry`` in the zip ``zf`` read through
    ``raw`` (the file at ``path``), its headers checked against the entry
    (the data is read later, straight from the file).  ``name``: the blob
    the bytes are read as (default the entry's)."""
    name = entry["name"] if name is None else name
    info = zf.getinfo(entry["member"])
    if info.compress_type != zipfile.ZIP_STORED or \
            info.compress_size != info.file_size:
        raise bad(path, f"blob {entry['name']!r} is not stored as written")
    raw.seek(info.header_offset)
    local = raw.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise bad(path, f"blob {entry['name']!r} has no valid local header")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    if raw.read(name_len).decode("utf-8", "replace") != info.filename:
        raise bad(path, f"blob {entry['name']!r} has a local header of "
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
        raise bad(path, f"blob {entry['name']!r} has a header that does "
                  "not match the manifest", "it was not loaded")
    return Place(name, start, reader.count, shape, dtype, entry["nbytes"],
                 info.CRC, raw, path)


def _read_exactly(place, view):
    got = 0
    while got < len(view):
        more = place.raw.readinto(view[got:])
        if not more:
            raise bad(place.path, f"blob {place.name!r} is cut short")
        got += more


def _check(crc, place):
    if crc != place.crc:
        raise bad(place.path, f"blob {place.name!r} fails its CRC-32 check "
                  "(corrupted)", "it was not loaded")


def verify(place, buffer):
    """Check ``place``'s CRC-32, reading through ``buffer``."""
    place.raw.seek(place.start)
    crc, left = 0, place.header + place.nbytes
    while left:
        chunk = buffer[:min(left, len(buffer))]
        _read_exactly(place, chunk)
        crc = zlib.crc32(chunk, crc)
        left -= len(chunk)
    _check(crc, place)


def fill(place, sink):
    """Read ``place`` into ``sink(...)``'s array (verified already), or into
    a new array whose CRC-32 is checked here."""
    array = np.empty(place.shape, place.dtype) if sink is None else \
        sink(place.name, place.shape, place.dtype)
    place.raw.seek(place.start)
    crc = zlib.crc32(place.raw.read(place.header))
    if place.nbytes:
        data = memoryview(array.reshape(-1).view(np.uint8))
        _read_exactly(place, data)
        crc = zlib.crc32(data, crc) if sink is None else place.crc
    _check(crc, place)
    return array


def compare(place, data, buffer):
    """Whether the member at ``place`` holds exactly the bytes ``data`` (a
    flat ``uint8`` memoryview) and passes its CRC-32 check; reading stops
    at the first chunk that differs (a blob that changed differs early)."""
    if place.nbytes != len(data):
        return False
    place.raw.seek(place.start)
    header = place.raw.read(place.header)
    if len(header) != place.header:
        return False
    crc, done = zlib.crc32(header), 0
    while done < len(data):
        chunk = buffer[:min(len(data) - done, len(buffer))]
        got = place.raw.readinto(chunk)
        if not got or not _same(chunk[:got], data[done:done + got]):
            return False
        crc = zlib.crc32(chunk[:got], crc)
        done += got
    return crc == place.crc


def _same(a, b):
    # numpy compares buffers some 20x faster than memoryview's ==
    kind = np.uint64 if len(a) % 8 == 0 else np.uint8
    return np.array_equal(np.frombuffer(a, kind), np.frombuffer(b, kind))


class _Counted:
    """A file's ``read``, counting the bytes it gave (the .npy header)."""

    def __init__(self, f):
        self._f, self.count = f, 0

    def read(self, n=-1):
        data = self._f.read(n)
        self.count += len(data)
        return data
