"""What a run's checkpoint directory holds, and pruning it.

`scan` reads one run's directory (``python -m localcluster.run
--checkpoint-dir DIR``, or a temporary ``localcluster-ckpt-*`` one) into a
`RunDir`: the job (its run file), whether a live run holds it (its lock),
how the last run ended (``metrics.jsonl``), and every epoch -- which of
the job's nodes have a checkpoint of it and what is wrong with the others.
An epoch is ``complete`` when every node's checkpoint of it verifies:
exactly what ``--resume`` accepts (`MultiNodeCheckpointManager`), so the
latest complete epoch is the one ``--resume`` picks.  Otherwise it is
``torn``, and each node's problem is named: ``missing``, ``partial write``
(the writer died mid-write; ``being written`` if it lives), ``corrupt``
(the `CheckpointError`'s reason), or ``not its checkpoint`` (a file named
like one that is not: another node's or epoch's, or not localcluster's).

A full scan reads every byte (CRC-32); ``quick`` reads the manifests
alone: an epoch it calls complete has every node's file, of the right
node and epoch, with its structure intact -- but a flipped bit in the
data would go unseen.

`prune` keeps the newest complete epochs and removes every other
checkpoint of the run, torn epochs and the partial files of dead writers
(`prune_plan` says what, without removing).  What is not one of the
run's checkpoints always stays: the run file, the lock, ``metrics.jsonl``,
and any file named ``<x>.<n>`` that is not a checkpoint of the job's node
``x`` and epoch ``n`` -- a file counts as the run's when its manifest
names that node and epoch, or, unreadable, when it is the start of a
localcluster checkpoint (a torn one).  An epoch a live writer is still
writing is left alone.
"""

import errno
import fcntl
import json
import logging
import os
import re
import stat
import struct
import zipfile

from .directory import (LOCK_FILE, RUN_FILE, is_run_file, read_pid,
                        saved_options)
from .metrics import METRICS_FILE, read_metrics
from ...checkpoint.manager import MultiNodeCheckpointManager
from ...checkpoint.fileformat import (FORMAT, MANIFEST, read_manifest,
                                      verify_checkpoint)
from ...checkpoint.partials import PARTIAL, partials_under
from ...errors import CheckpointError

__all__ = ["RunDir", "Epoch", "scan", "is_run_dir", "run_dirs", "in_use",
           "last_run_status", "prune_plan", "remove", "prune"]

log = logging.getLogger("localcluster.ckpt")

#: a checkpoint's file name, ``<node>.<epoch>``
_EPOCH_FILE = re.compile(r"^(?P<node>.+)\.(?P<epoch>\d+)$")


# -- the directory as a whole ------------------------------------------------------

def in_use(directory):
    """``(held, pid)``: whether a live run holds the directory's lock, and
    its pid if the lock file says.  Tested with a shared lock on a fresh
    descriptor, released at once: the holder is not disturbed (a run
    starting in that instant is refused, as by any other holder)."""
    try:
        fd = os.open(os.path.join(directory, LOCK_FILE),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |
                     os.O_CLOEXEC)
    except OSError:
        return False, None  # no lock file: no run holds it
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False, None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True, read_pid(fd)
            return False, None  # a filesystem without flock: no run either
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False, None
    finally:
        os.close(fd)



def last_run_status(directory):
    """How the last run recorded in ``metrics.jsonl`` ended: ``ok``,
    ``error``, ``interrupted``, ``did not end`` (killed, or still
    running), or None without a record of a run."""
    path = os.path.join(directory, METRICS_FILE)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        records = read_metrics(path)
    except OSError:
        return None
    runs = [r.get("run") for r in records if r["kind"] == "run"]
    if not runs:
        return None
    ends = [r for r in records if r["kind"] == "end" and
            r.get("run") == runs[-1]]
    return str(ends[-1].get("status")) if ends else "did not end"


def is_run_dir(directory):
    """Whether ``directory`` is a run's checkpoint directory: it holds a
    run file, or a file named ``<node>.<epoch>`` with a localcluster
    manifest."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    if RUN_FILE in names:
        return True
    for name in names:
        if PARTIAL not in name and _EPOCH_FILE.match(name):
            try:
                read_manifest(os.path.join(directory, name))
                return True
            except CheckpointError:
                continue
    return False


def run_dirs(directory):
    """``[directory]`` if it is a run's directory; else the run
    directories right inside it (not through symlinks), by name."""
    if is_run_dir(directory):
        return [directory]
    found = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False) and is_run_dir(entry.path):
                found.append(entry.path)
        except OSError:
            continue  # another user's, or gone
    return found


# -- one epoch ---------------------------------------------------------------------

class Epoch:
    """One epoch of a run directory: its nodes' files and their problems.
    """

    def __init__(self, epoch, expected):
        self.epoch, self.expected = epoch, list(expected)
        self.present = []      # nodes whose checkpoint of it is sound
        self.files = []        # the run's files of it (sound or not)
        self.problems = {}     # node -> what is wrong
        self.size = 0          # bytes of self.files
        self.writing = False   # a live writer has a partial file of it

    @property
    def complete(self):
        return bool(self.expected) and not self.problems and \
            sorted(self.present) == sorted(self.expected)

    @property
    def state(self):
        return "complete" if self.complete else "torn"

    def as_json(self):
        return {"epoch": self.epoch, "state": self.state,
                "nodes_present": sorted(self.present),
                "nodes_expected": sorted(self.expected),
                "problems": dict(sorted(self.problems.items())),
                "files": sorted(self.files), "bytes": self.size,
                "being_written": self.writing}


class RunDir:
    """What `scan` found in one run's directory."""

    def __init__(self, path, quick):
        self.path, self.quick = path, quick
        self.job = None
        self.in_use, self.pid = False, None
        self.last_run = None
        self.size = 0
        self.nodes = []
        self.epochs = {}       # epoch -> Epoch
        self.partials = []     # [(name, writer alive)]
        self.foreign = []      # names like <node>.<n> that are not ours

    def epoch(self, number):
        """The `Epoch` ``number``, made on first use."""
        if number not in self.epochs:
            self.epochs[number] = Epoch(number, self.nodes)
        return self.epochs[number]

    @property
    def resume_epoch(self):
        """The epoch ``--resume`` picks: the latest complete one."""
        done = [e for e, state in self.epochs.items() if state.complete]
        return max(done) if done else None

    def complete_epochs(self):
        return sorted(e for e, s in self.epochs.items() if s.complete)

    def as_json(self):
        return {"path": self.path, "job": self.job, "in_use": self.in_use,
                "pid": self.pid, "last_run": self.last_run,
                "bytes": self.size, "nodes": self.nodes,
                "verified": "manifests" if self.quick else "full",
                "resume_epoch": self.resume_epoch,
                "epochs": [self.epochs[e].as_json()
                           for e in sorted(self.epochs)],
                "partial_files": [{"name": n, "writer_alive": alive}
                                  for n, alive in self.partials],
                "foreign_files": sorted(self.foreign)}


def scan(directory, quick=False, nodes=None, about_run=True):
    """The `RunDir` of ``directory``.  ``nodes``: the job's checkpointed
    nodes, if known (else what the checkpoints there say, as ``--resume``
    reads them); ``quick``: read manifests only (see the module);
    ``about_run``: also read the job, the lock and how the last run
    ended (else only the checkpoints)."""
    found = RunDir(directory, quick)
    if about_run:
        saved = saved_options(directory)
        found.job = saved.get("job") if saved else None
        found.in_use, found.pid = in_use(directory)
        found.last_run = last_run_status(directory)
    found.nodes = sorted(map(str, nodes)) if nodes is not None else \
        list(MultiNodeCheckpointManager(directory)._nodes_for_files())
    named = _named(found)
    foreign = {}  # (node, epoch) -> why a file named so is not ours
    for (node, number), name in sorted(named.items()):
        problem = _check(os.path.join(directory, name), node, number, quick)
        if problem is not None and problem.startswith("not its"):
            found.foreign.append(name)
            foreign[node, number] = problem
            continue
        state = found.epoch(number)
        state.files.append(name)
        state.size += _size_of(os.path.join(directory, name))
        if problem is None:
            state.present.append(node)
        else:
            state.problems[node] = problem
    _add_partials(found, named)
    for state in found.epochs.values():
        for node in state.expected:
            if node not in state.present and node not in state.problems:
                state.problems[node] = foreign.get((node, state.epoch),
                                                   "missing")
    return found


def _named(found):
    """``{(node, epoch): name}`` of the files named as the job's nodes'
    checkpoints are (``<node>.<epoch>``, the epoch as the manager writes
    it); other names like ``<x>.<n>`` go to ``found.foreign``.  Adds up
    ``found.size``."""
    try:
        entries = sorted(os.scandir(found.path), key=lambda e: e.name)
    except OSError:
        entries = []
    named = {}
    for entry in entries:
        found.size += _size(entry)
        match = _EPOCH_FILE.match(entry.name)
        if PARTIAL in entry.name or not match:
            continue
        if match["node"] in found.nodes and \
                str(int(match["epoch"])) == match["epoch"]:
            named[match["node"], int(match["epoch"])] = entry.name
        else:
            found.foreign.append(entry.name)  # no checkpoint of this job's
    return named


def _add_partials(found, named):
    """The partial files under ``found.path``: each makes its epoch torn
    where its node has no file (``partial write``, or ``being written``
    while its writer lives)."""
    found.partials = partials_under(found.path)
    for name, alive in found.partials:
        base = _EPOCH_FILE.match(name.split(PARTIAL, 1)[0])
        if not base or base["node"] not in found.nodes:
            continue
        node, number = base["node"], int(base["epoch"])
        state = found.epoch(number)
        state.writing = state.writing or alive
        if (node, number) not in named:
            state.problems[node] = "being written" if alive else \
                "partial write"


def _size(entry):
    try:
        return entry.stat(follow_symlinks=False).st_size
    except OSError:
        return 0


def _size_of(path):
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _check(path, node, epoch, quick):
    """None if ``path`` is a sound checkpoint of ``node`` and ``epoch``;
    else what is wrong, ``not its checkpoint (...)`` if it is not one of
    this run's at all."""
    try:
        manifest = read_manifest(path)
    except CheckpointError as exc:
        if _torn_checkpoint(path):
            return f"corrupt ({_reason(exc, path)})"
        return "not its checkpoint (not a localcluster checkpoint)"
    wrong_node = "node" in manifest and manifest["node"] != node
    wrong_epoch = "epoch" in manifest and manifest["epoch"] != epoch
    if wrong_node or wrong_epoch:
        return (f"not its checkpoint (of node {manifest.get('node')!r}, "
                f"epoch {manifest.get('epoch')!r})")
    if quick:
        return None
    try:
        verify_checkpoint(path, node=node, epoch=epoch)
    except CheckpointError as exc:
        return f"corrupt ({_reason(exc, path)})"
    return None


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


def _reason(exc, path):
    """A `CheckpointError`'s reason without the path and the advice."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    prefix = f"checkpoint {path}"
    if text.startswith(prefix):
        text = text[len(prefix):].lstrip(":").strip()
        if text.startswith("is "):
            text = text[3:]
    text = text.split("; ")[0].split(" -- ")[0]
    torn = "torn or corrupted ("
    if text.startswith(torn) and text.endswith(")"):
        text = text[len(torn):-1]  # the parser's own words
    return text


# -- pruning -------------------------------------------------------------------------

def prune_plan(found, keep):
    """``(kept epochs, [(name, why)])``: what pruning ``found`` (a
    `RunDir`) to its ``keep`` newest complete epochs removes -- every
    other epoch's files of the run (an epoch being written excepted) and
    the partial checkpoint files of dead writers.  Without a complete
    epoch no epoch is removed: nothing would be gained by judging which
    are torn (maybe wrongly: the nodes are what the files say)."""
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep={keep!r}: keep at least the newest complete "
                         "epoch (to drop a whole run, remove its directory)")
    kept = found.complete_epochs()[-keep:]
    plan = []
    for number in sorted(found.epochs):
        state = found.epochs[number]
        # no complete epoch at all: the nodes may be judged wrongly, and
        # nothing is gained -- torn epochs stay until one is complete
        if number in kept or state.writing or not kept:
            continue
        why = (f"epoch {number} (complete, older than those kept)"
               if state.complete else f"epoch {number} (torn)")
        plan += [(name, why) for name in sorted(state.files)]
    for name, alive in found.partials:
        if not alive and _EPOCH_FILE.match(name.split(PARTIAL, 1)[0]):
            plan.append((name, "partial files of writers that are gone"))
    # never the run's own files, whatever a name looks like
    plan = [(n, why) for n, why in plan
            if not is_run_file(n) and n != METRICS_FILE]
    return kept, plan


def remove(directory, names):
    """Unlink ``names`` (entries of ``directory``; a symlink itself, never
    what it points to): ``(removed, bytes freed, [errors])``."""
    removed, freed, errors = [], 0, []
    for name in names:
        path = os.path.join(directory, name)
        size = _size_of(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror}")
            continue
        removed.append(name)
        freed += size
    return removed, freed, errors


def prune(directory, keep, nodes=None):
    """Keep the ``keep`` newest complete epochs under ``directory`` and
    remove the rest of the run's checkpoints (see `prune_plan`); the names
    removed.  For a run's ``--keep-last``, after each epoch's checkpoint:
    the caller holds the directory's lock (none is taken here), and
    ``nodes`` are its job's checkpointed nodes.

    Cheap: epochs are judged by their manifests (`scan` ``quick``), not
    by reading every byte -- the run has just written the newest epoch
    itself, and a full check of every kept epoch after every epoch would
    cost as much as writing it.  So a checkpoint whose data rotted on
    disk counts as complete here; ``python -m localcluster.ckpt prune``
    verifies fully by default.  The newest complete epoch -- the one a
    restart or a ``--resume`` takes -- is never removed (``keep`` >= 1),
    nor an epoch a live writer is still writing.  A file that cannot be
    removed stays (a warning), and is tried again the next time."""
    found = scan(directory, quick=True, nodes=nodes, about_run=False)
    _, plan = prune_plan(found, keep)
    removed, _, errors = remove(directory, [name for name, _ in plan])
    for error in errors:
        log.warning("pruning checkpoints: %s is kept (cannot be removed)",
                    error)
    return removed
