"""Per-node checkpoints: the on-disk format, the ops that write and read
them inside a node, and the managers a `JobRunner` drives.

A checkpoint is one file per node and epoch, ``<db_prefix>/<node>.<epoch>``,
written by the node itself (under `LocalHostScheduler`: in its own process,
all nodes in parallel).  It is an uncompressed ``.npz`` -- ``np.load(path)``
opens it -- holding one ``<blob>.npy`` member per blob and a
``__manifest__.json`` member, written last, with every blob's name, dtype,
shape, size and CRC-32.  No pickle anywhere: object arrays are runtime-only
and never checkpointed.

Writing goes to ``<path>.partial-<pid>``, is fsynced, then renamed over
``path`` (and the directory fsynced), so a reader sees a whole checkpoint
or none.  Reading verifies the structure, the manifest and every member's
CRC before a single blob reaches the workspace: a torn or corrupted file is
a `CheckpointError` naming it, never half-loaded.

The blobs a node checkpoints are its global workspace right after the init
group: ``init()`` records their names in a blob on the node
(``__checkpoint__/blob_names``), ``save`` writes those blobs, ``load`` puts
back every blob of the file.  The managers only build TaskGroups (for
``session.run``) and look at files; they hold no session.
"""

import json
import os
import re
import struct
import zipfile
import zlib

import numpy as np

from .errors import CheckpointError, PlanError
from .kernels.registry import register_op
from .plan.net import Net
from .task import Node, Task, TaskGroup, WorkspaceType

__all__ = ["CheckpointManager", "MultiNodeCheckpointManager",
           "UploadTaskGroupBuilder", "write_checkpoint", "read_checkpoint",
           "verify_checkpoint", "BLOB_NAMES"]

#: the blob (on every checkpointed node) listing what its checkpoint holds
BLOB_NAMES = "__checkpoint__/blob_names"
MANIFEST = "__manifest__.json"
FORMAT = "localcluster-checkpoint"
_PARTIAL = ".partial-"
_CHUNK = 1 << 20


# -- the file format ------------------------------------------------------------

def checkpointable(name, value):
    """Whether blob ``name`` holding ``value`` goes into checkpoints."""
    return (isinstance(value, np.ndarray) and not value.dtype.hasobject
            and name != BLOB_NAMES)


def write_checkpoint(path, blobs, meta=None):
    """Write ``{name: array}`` to ``path`` atomically (see the module
    docstring); returns the manifest.  Nothing is left at ``path`` or
    beside it if writing fails."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    remove_partials(path)
    tmp = f"{path}{_PARTIAL}{os.getpid()}"
    entries = []
    try:
        with open(tmp, "wb") as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED,
                                 allowZip64=True) as zf:
                for name, value in blobs.items():
                    entries.append(_write_member(zf, name, value))
                manifest = dict(meta or {}, format=FORMAT, version=1,
                                blobs=entries)
                zf.writestr(MANIFEST, json.dumps(manifest, indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    _fsync_dir(directory)
    return manifest


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


def read_checkpoint(path, names=None, sink=None):
    """``(manifest, {name: array})`` of the checkpoint at ``path``, every
    member verified first; only ``names`` if given (names it lacks are
    skipped).  Raises `CheckpointError` naming the file if it is missing,
    torn or corrupted.

    ``sink(name, shape, dtype)``, if given, returns the array each blob is
    read into (a workspace's own memory, say): then every member is
    verified before the first byte is written there."""
    blobs = {}
    manifest = _scan(path, names, blobs, sink)
    return manifest, blobs


def verify_checkpoint(path):
    """The manifest of the checkpoint at ``path`` after reading every byte
    of it and checking every checksum; `CheckpointError` if it fails."""
    return _scan(path, None, None, None)


def read_manifest(path):
    """The manifest alone (structure checked, data not read)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return _manifest(zf, path)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 -- see _scan
        raise _corrupt(path, exc) from exc


def _scan(path, names, out, sink):
    wanted = None if names is None else set(map(str, names))
    try:
        with zipfile.ZipFile(path) as zf, open(path, "rb",
                                               buffering=0) as raw:
            manifest = _manifest(zf, path)
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
        raise CheckpointError(
            f"checkpoint {path} does not exist: check the db_prefix and the "
            "epoch (get_resume_from_epoch_id() gives the latest complete "
            "one)") from exc
    except Exception as exc:  # noqa: BLE001 -- whatever a damaged file
        raise _corrupt(path, exc) from exc  # makes the parsers raise


def _corrupt(path, exc):
    return CheckpointError(
        f"checkpoint {path} is torn or corrupted ({type(exc).__name__}: "
        f"{exc}); it was not loaded -- resume from an earlier epoch "
        "(get_resume_from_epoch_id() skips broken ones)")


def _manifest(zf, path):
    manifest = json.loads(zf.read(MANIFEST))  # zipfile checks its CRC
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has no localcluster "
                              "manifest; it was not written by localcluster")
    members = {info.filename: info for info in zf.infolist()}
    for entry in manifest["blobs"]:
        info = members.get(entry["member"])
        if info is None or info.CRC != entry["crc32"]:
            raise CheckpointError(
                f"checkpoint {path}: blob {entry['name']!r} does not match "
                "the manifest (torn or corrupted file); it was not loaded")
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
        raise CheckpointError(f"checkpoint {path}: blob {entry['name']!r} "
                              "is not stored as written")
    raw.seek(info.header_offset)
    local = raw.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise CheckpointError(f"checkpoint {path}: blob {entry['name']!r} "
                              "has no valid local header")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    if raw.read(name_len).decode("utf-8", "replace") != info.filename:
        raise CheckpointError(f"checkpoint {path}: blob {entry['name']!r} "
                              "has a local header of another member")
    start = info.header_offset + 30 + name_len + extra_len
    raw.seek(start)
    reader = _Counted(raw)
    version = np.lib.format.read_magic(reader)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(reader, max_header_size=100000)
    if dtype.hasobject or fortran or list(shape) != entry["shape"] or \
            dtype.str != entry["dtype"] or \
            reader.count + entry["nbytes"] != info.file_size:
        raise CheckpointError(
            f"checkpoint {path}: blob {entry['name']!r} has a header that "
            "does not match the manifest; it was not loaded")
    return _Place(entry["name"], start, reader.count, shape, dtype,
                  entry["nbytes"], info.CRC)


def _read_exactly(raw, view, place, path):
    got = 0
    while got < len(view):
        more = raw.readinto(view[got:])
        if not more:
            raise CheckpointError(
                f"checkpoint {path}: blob {place.name!r} is cut short")
        got += more


def _check(crc, place, path):
    if crc != place.crc:
        raise CheckpointError(
            f"checkpoint {path}: blob {place.name!r} fails its CRC-32 check "
            "(corrupted); it was not loaded")


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


def remove_partials(path):
    """Remove what interrupted writers of ``path`` left; their names."""
    directory, base = os.path.split(path)
    try:
        found = os.listdir(directory or ".")
    except OSError:
        return []
    removed = []
    for name in found:
        if name.startswith(base + _PARTIAL):
            _unlink(os.path.join(directory, name))
            removed.append(name)
    return removed


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- the ops a node runs ----------------------------------------------------------

def _workspace(ctx):
    ws = ctx.resources.get("workspace")
    if ws is None:
        raise RuntimeError(f"node {ctx.node!r} gives its ops no workspace; "
                           "this session cannot checkpoint")
    return ws


@register_op("CheckpointBlobNames", context=True)
def checkpoint_blob_names(ctx, path=""):
    """The names of what this node checkpoints: its global workspace's
    array blobs now, or -- given ``path`` -- the blobs of that checkpoint."""
    if path:
        names = [e["name"] for e in read_manifest(path)["blobs"]]
    else:
        ws = _workspace(ctx)
        with ws.lock:
            names = sorted(n for n in ws.names()
                           if checkpointable(n, ws.get_or_none(n)))
    return np.array(names, dtype=str) if names else np.zeros(0, "<U1")


@register_op("SaveCheckpoint", num_outputs=0, context=True)
def save_checkpoint(ctx, names, path="", epoch=0, final=False):
    """Write the blobs listed in ``names`` to ``path`` (see the module);
    ``final`` marks the epoch training stopped after."""
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
    write_checkpoint(path, blobs, {"node": ctx.node, "epoch": int(epoch),
                                   "final": bool(final)})


@register_op("LoadCheckpoint", num_outputs=0, context=True)
def load_checkpoint(ctx, path="", names=None):
    """Put the blobs of the checkpoint at ``path`` (only ``names``, if
    given) into this node's global workspace, after verifying all of them;
    a full load also resets the node's list of checkpointed blobs."""
    ws = _workspace(ctx)
    reserve = getattr(ws._blobs, "reserve", None)
    with ws.lock:
        # into the shared-memory store's own segments (verified first), or
        # into new arrays the workspace then keeps
        manifest, blobs = read_checkpoint(path, names, reserve)
        if reserve is None:
            for name, value in blobs.items():
                ws.set(name, value)
        if names is None:
            ws.set(BLOB_NAMES, np.array([e["name"] for e in
                                         manifest["blobs"]], dtype=str)
                   if manifest["blobs"] else np.zeros(0, "<U1"))


# -- managers -----------------------------------------------------------------------

_EPOCH_FILE = re.compile(r"^(?P<node>.+)\.(?P<epoch>\d+)$")


class _Manager:
    """What both managers share: files, epochs and the groups they run."""

    def __init__(self, db_prefix, db_type="npz", metadata_handler=None):
        if db_type != "npz":
            raise PlanError(f"checkpoint db_type {db_type!r} is not "
                            "supported; use 'npz'")
        if not isinstance(db_prefix, (str, os.PathLike)) or not \
                str(db_prefix):
            raise PlanError(f"db_prefix must be a directory path, got "
                            f"{db_prefix!r}")
        self._db_prefix = os.fspath(db_prefix)
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._nodes = None

    def __repr__(self):
        return (f"{type(self).__name__}({self._db_prefix!r}, "
                f"nodes={self._nodes})")

    @property
    def db_prefix(self):
        return self._db_prefix

    def get_ckpt_db_name(self, node_name, epoch):
        return os.path.join(self._db_prefix, f"{node_name}.{epoch}")

    def _checkpointed(self):
        if self._nodes is None:
            raise PlanError(f"{self!r} has no nodes yet: run init(nodes) "
                            "first")
        return self._nodes

    def _group(self, net_of):
        """A GLOBAL TaskGroup with one task per checkpointed node running
        ``net_of(node)``."""
        group = TaskGroup(workspace_type=WorkspaceType.GLOBAL)
        for node in self._checkpointed():
            with Node(node):
                Task(step=net_of(node), group=group, name="checkpoint")
        return group

    # -- runnables --------------------------------------------------------------

    def init(self, nodes=None, retrieve_from_epoch=None):
        """A TaskGroup recording, on every node, the blobs its checkpoints
        hold: its global workspace now, or the blobs of its checkpoint of
        ``retrieve_from_epoch``.  No file I/O here."""
        self._nodes = self._init_nodes(nodes)
        if self._metadata_handler is not None and \
                hasattr(self._metadata_handler, "init"):
            self._metadata_handler.init(
                db_prefix=self._db_prefix, db_type=self._db_type,
                node_names=list(self._nodes),
                retrieve_from_epoch=retrieve_from_epoch)

        def net(node):
            n = Net("checkpoint_init")
            path = "" if retrieve_from_epoch is None else \
                self.get_ckpt_db_name(node, retrieve_from_epoch)
            n.CheckpointBlobNames([], [BLOB_NAMES], path=path)
            return n
        return self._group(net)

    def save(self, epoch, final=False):
        """A TaskGroup in which every node writes its checkpoint of
        ``epoch`` (creating ``db_prefix`` if needed); ``final`` records
        that training stopped after this epoch, so a run resumed from it
        runs no more epochs."""
        def net(node):
            n = Net("checkpoint_save")
            n.SaveCheckpoint([BLOB_NAMES], [],
                             path=self.get_ckpt_db_name(node, epoch),
                             epoch=int(epoch), final=bool(final))
            return n
        return self._group(net)

    def epoch_is_final(self, epoch):
        """Whether training stopped after ``epoch`` (its checkpoints say so).
        """
        return any(read_manifest(self.get_ckpt_db_name(node, epoch))
                   .get("final", False) for node in self._nodes_for_files())

    def load(self, epoch):
        """A TaskGroup in which every node loads its checkpoint of
        ``epoch`` (verified first; `CheckpointError` if it fails)."""
        return self._load_group(epoch, None)

    def load_blobs_from_checkpoint(self, names, epoch):
        """Like `load`, but only ``names`` (names a checkpoint lacks are
        skipped)."""
        return self._load_group(epoch, [str(n) for n in names])

    def _load_group(self, epoch, names):
        def net(node):
            n = Net("checkpoint_load")
            n.LoadCheckpoint([], [], path=self.get_ckpt_db_name(node, epoch),
                             names=names)
            return n
        return self._group(net)

    def report_saved(self, epoch):
        """Tell the metadata handler that ``epoch`` was saved (the runner
        calls this after every successful save)."""
        if self._metadata_handler is not None and \
                hasattr(self._metadata_handler, "save"):
            self._metadata_handler.save(
                db_prefix=self._db_prefix, db_type=self._db_type,
                node_names=list(self._checkpointed()), epoch=epoch)

    def remove_partials(self, epoch):
        """Remove what writers of ``epoch`` killed mid-write left behind."""
        removed = []
        for node in self._nodes or ():
            removed += remove_partials(self.get_ckpt_db_name(node, epoch))
        return removed

    # -- files ----------------------------------------------------------------------

    def _nodes_for_files(self):
        """The checkpointed nodes; before init, the nodes with a checkpoint
        file under ``db_prefix``."""
        if self._nodes is not None:
            return self._nodes
        return sorted({m["node"] for m in self._files()})

    def _files(self):
        try:
            names = os.listdir(self._db_prefix)
        except OSError:
            return []
        found = (_EPOCH_FILE.match(n) for n in names if _PARTIAL not in n)
        return [{"node": m["node"], "epoch": int(m["epoch"])}
                for m in found if m]

    def _epoch_valid(self, epoch):
        nodes = self._nodes_for_files()
        if not nodes:
            return False
        for node in nodes:
            try:
                verify_checkpoint(self.get_ckpt_db_name(node, epoch))
            except CheckpointError:
                return False
        return True

    def get_resume_from_epoch_id(self, user_epoch=None):
        """``user_epoch`` if given and valid; else the latest epoch whose
        checkpoint exists and verifies on every node; None if there is
        none.  A metadata handler with its own answer decides instead."""
        handler = self._metadata_handler
        if handler is not None and hasattr(handler,
                                           "get_resume_from_epoch_id"):
            return handler.get_resume_from_epoch_id(user_epoch)
        if user_epoch is not None:
            if self._epoch_valid(user_epoch):
                return user_epoch
            raise CheckpointError(
                f"epoch {user_epoch} has no complete, valid checkpoint under "
                f"{self._db_prefix} for nodes {self._nodes_for_files()}")
        nodes = set(self._nodes_for_files())
        by_epoch = {}
        for found in self._files():
            if found["node"] in nodes:
                by_epoch.setdefault(found["epoch"], set()).add(found["node"])
        for epoch in sorted(by_epoch, reverse=True):
            if by_epoch[epoch] == nodes and self._epoch_valid(epoch):
                return epoch
        return None

    def nodes_without(self, epoch, nodes=None):
        """Which of the nodes ``init(nodes)`` would checkpoint have no
        checkpoint file of ``epoch``."""
        return [n for n in self._init_nodes(nodes)
                if not os.path.isfile(self.get_ckpt_db_name(n, epoch))]

    def cp_accessible(self, epoch=None):
        """Whether ``db_prefix`` is a readable directory -- and, with
        ``epoch``, whether every node's checkpoint of it exists."""
        if not os.path.isdir(self._db_prefix) or \
                not os.access(self._db_prefix, os.R_OK | os.X_OK):
            return False
        if epoch is None:
            return True
        nodes = self._nodes_for_files()
        return bool(nodes) and all(
            os.path.isfile(self.get_ckpt_db_name(n, epoch)) for n in nodes)


class CheckpointManager(_Manager):
    """``CheckpointManager(db_prefix, node_name, db_type='npz',
    metadata_handler=None)``: checkpoints of the one node ``node_name``."""

    def __init__(self, db_prefix, node_name, db_type="npz",
                 metadata_handler=None):
        super().__init__(db_prefix, db_type, metadata_handler)
        self._node_name = str(node_name)
        self._nodes = [self._node_name]

    def _init_nodes(self, nodes):
        return [self._node_name]


class MultiNodeCheckpointManager(_Manager):
    """``MultiNodeCheckpointManager(db_prefix, db_type='npz',
    metadata_handler=None)``: checkpoints of every node given to
    ``init(nodes)``, each node writing its own."""

    def _init_nodes(self, nodes):
        if not nodes:
            raise PlanError("MultiNodeCheckpointManager.init needs the nodes "
                            "to checkpoint (job.nodes_to_checkpoint())")
        return [str(n) for n in nodes]

    def load_blobs_locally(self, nodes, blob_names, epoch, session):
        """Load ``blob_names`` from each listed node's checkpoint of
        ``epoch`` into that node's workspace in ``session``; False --
        loading nothing more -- at the first node whose checkpoint is
        missing, True once all are loaded."""
        names = [str(n) for n in blob_names]
        for node in nodes:
            node = str(node)
            if not os.path.isfile(self.get_ckpt_db_name(node, epoch)):
                return False
            group = TaskGroup(workspace_type=WorkspaceType.GLOBAL)
            with Node(node):
                net = Net("checkpoint_load_blobs")
                net.LoadCheckpoint([], [],
                                   path=self.get_ckpt_db_name(node, epoch),
                                   names=names)
                Task(step=net, group=group, name="checkpoint")
            session.run(group)
        return True


class UploadTaskGroupBuilder:
    """Builds the TaskGroup a `JobRunner` runs after training to upload
    checkpoints somewhere; subclass and override `build`."""

    def build(self, epoch, checkpoint_manager):
        raise NotImplementedError(
            f"{type(self).__name__}.build(epoch, checkpoint_manager) must "
            "return a TaskGroup")
