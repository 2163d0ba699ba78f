"""What a run's checkpoint directory holds.

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
(the `CheckpointError`'s reason), ``refers to <file>, which ...`` (an
earlier file it refers to is gone or not as it recorded), or ``not its
checkpoint`` (a file named like one that is not: another node's or
epoch's, or not localcluster's).

A full scan reads every byte (CRC-32); ``quick`` reads the manifests
alone: an epoch it calls complete has every node's file, of the right
node and epoch, with its structure intact -- but a flipped bit in the
data would go unseen.

A checkpoint may refer to an earlier one of its node for the blobs that
did not change since (`localcluster.checkpoint.reuse`): its epoch
``refers`` to that one, which a prune keeps as long as it is kept
(`RunDir.referred`), and it is complete only if what it refers to is
there as it recorded.

A file named ``<x>.<n>`` counts as the run's when its manifest names
that node and epoch, or, unreadable, when it is the start of a
localcluster checkpoint (a torn one): `localcluster.checkpoint.state`
judges, the file name rule is `localcluster.checkpoint.names`'.  Pruning
on this scan: `prune`.
"""

import os
import stat

from .directory import RUN_FILE, in_use, saved_options
from .metrics import METRICS_FILE, read_metrics
from ...checkpoint.manager import MultiNodeCheckpointManager
from ...checkpoint.names import parse_name, partial_of
from ...checkpoint.partials import partials_under
from ...checkpoint.state import (DANGLING, FOREIGN, TORN, WHOLE, classify,
                                 is_checkpoint)

__all__ = ["RunDir", "Epoch", "scan", "is_run_dir", "run_dirs",
           "last_run_status", "size_of"]


# -- the directory as a whole ------------------------------------------------------

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
    return any(parse_name(name) is not None and
               is_checkpoint(os.path.join(directory, name)) for name in names)


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
        self.refers = set()    # earlier epochs its files refer to

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
                "being_written": self.writing,
                "refers_to": sorted(self.refers)}


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

    def referred(self, epochs):
        """The other epochs whose files those of ``epochs`` refer to for
        their unchanged blobs -- directly, or through each other."""
        seen, todo = set(epochs), list(epochs)
        while todo:
            state = self.epochs.get(todo.pop())
            for number in sorted(state.refers) if state else ():
                if number not in seen:
                    seen.add(number)
                    todo.append(number)
        return seen - set(epochs)

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


def scan(directory, quick=False, nodes=None, about_run=True,
         verdicts=None):
    """The `RunDir` of ``directory``.  ``nodes``: the job's checkpointed
    nodes, if known (else what the checkpoints there say, as ``--resume``
    reads them); ``quick``: read manifests only (see the module);
    ``about_run``: also read the job, the lock and how the last run
    ended (else only the checkpoints); ``verdicts``: a `Verdicts` that
    keeps quick verdicts from one scan to the next."""
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
        path = os.path.join(directory, name)
        verdict = verdicts.classify(path, node, number) if \
            verdicts is not None and quick else \
            classify(path, node, number, quick)
        problem = _problem(verdict)
        if verdict.kind == FOREIGN:
            found.foreign.append(name)
            foreign[node, number] = problem
            continue
        state = found.epoch(number)
        state.refers.update(_epochs_of(verdict.references, node))
        state.files.append(name)
        state.size += size_of(os.path.join(directory, name))
        if problem is None:
            state.present.append(node)
        else:
            state.problems[node] = problem
    if verdicts is not None:
        verdicts.retain(os.path.join(directory, name)
                        for name in named.values())
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
        named_as = parse_name(entry.name)
        if named_as is None:
            continue
        if named_as.node in found.nodes and named_as.exact:
            named[named_as.node, named_as.epoch] = entry.name
        else:
            found.foreign.append(entry.name)  # no checkpoint of this job's
    return named


def _add_partials(found, named):
    """The partial files under ``found.path``: each makes its epoch torn
    where its node has no file (``partial write``, or ``being written``
    while its writer lives)."""
    found.partials = partials_under(found.path)
    for name, alive in found.partials:
        base = partial_of(name)
        if base is None or base.node not in found.nodes:
            continue
        node, number = base.node, base.epoch
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


def size_of(path):
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _epochs_of(files, node):
    """The epochs of those of ``files`` that are ``node``'s checkpoints."""
    named = (parse_name(name) for name in files)
    return {n.epoch for n in named if n is not None and n.node == node}


def _problem(verdict):
    """None if the file judged is a sound checkpoint of its node and
    epoch; else what is wrong, ``not its checkpoint (...)`` if it is not
    one of this run's at all (`localcluster.checkpoint.state` judges)."""
    if verdict.kind == WHOLE:
        return None
    if verdict.kind == TORN:
        return f"corrupt ({verdict.reason})"
    if verdict.kind == DANGLING:
        return verdict.reason  # "refers to <file>, which ..."
    return f"not its checkpoint ({verdict.reason})"
