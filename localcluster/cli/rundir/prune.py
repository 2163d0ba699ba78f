"""Pruning a run's checkpoint directory (``--keep-last``, ``python -m
localcluster.ckpt prune``).

`prune` keeps the newest complete epochs and removes every other
checkpoint of the run, torn epochs and the partial files of dead writers
(`prune_plan` says what, without removing).  What is not one of the
run's checkpoints always stays: the run file, the lock, ``metrics.jsonl``,
and any file named ``<x>.<n>`` that is not a checkpoint of the job's node
``x`` and epoch ``n`` (`scan` tells them apart).  An epoch a live writer
is still writing is left alone.

A checkpoint that refers to an earlier epoch's file for its unchanged
blobs (`localcluster.checkpoint.reuse`) needs that file: an epoch that a
kept one refers to is kept, whole -- still complete, still resumable --
for as long as a kept epoch refers to it.
"""

import logging
import os

from .directory import is_run_file
from .metrics import METRICS_FILE
from .scan import scan, size_of
from ...checkpoint.names import partial_of

__all__ = ["PrunePlan", "prune_plan", "remove", "prune"]

log = logging.getLogger("localcluster.ckpt")


class PrunePlan:
    """What pruning a run directory keeps and removes: ``kept``, every
    epoch that stays (the newest complete ones asked for, and those they
    refer to); ``referred``, those of them kept because a kept epoch
    refers to their files; ``remove``, ``[(name, why)]``."""

    __slots__ = ("kept", "referred", "remove")

    def __init__(self, kept, referred, remove):
        self.kept, self.referred, self.remove = kept, referred, remove


def prune_plan(found, keep):
    """The `PrunePlan` of pruning ``found`` (a `RunDir`) to its ``keep``
    newest complete epochs: every other epoch's files of the run go (an
    epoch being written, and one a staying epoch refers to, excepted),
    and the partial checkpoint files of dead writers.  Without a complete
    epoch no epoch is removed: nothing would be gained by judging which
    are torn (maybe wrongly: the nodes are what the files say)."""
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep={keep!r}: keep at least the newest complete "
                         "epoch (to drop a whole run, remove its directory)")
    newest = found.complete_epochs()[-keep:]
    # no complete epoch at all: the nodes may be judged wrongly, and
    # nothing is gained -- torn epochs stay until one is complete
    staying = set(found.epochs) if not newest else set(newest) | {
        number for number, state in found.epochs.items() if state.writing}
    referred = found.referred(staying)
    plan = []
    for number in sorted(found.epochs):
        state = found.epochs[number]
        if number in staying or number in referred:
            continue
        why = (f"epoch {number} (complete, older than those kept)"
               if state.complete else f"epoch {number} (torn)")
        plan += [(name, why) for name in sorted(state.files)]
    for name, alive in found.partials:
        if not alive and partial_of(name) is not None:
            plan.append((name, "partial files of writers that are gone"))
    # never the run's own files, whatever a name looks like
    plan = [(n, why) for n, why in plan
            if not is_run_file(n) and n != METRICS_FILE]
    kept = sorted(set(newest) | {n for n in referred if n in found.epochs})
    return PrunePlan(kept, sorted(n for n in referred if n in kept), plan)


def remove(directory, names):
    """Unlink ``names`` (entries of ``directory``; a symlink itself, never
    what it points to): ``(removed, bytes freed, [errors])``."""
    removed, freed, errors = [], 0, []
    for name in names:
        path = os.path.join(directory, name)
        size = size_of(path)
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


def prune(directory, keep, nodes=None, verdicts=None):
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
    nor an epoch a live writer is still writing, nor one a kept epoch
    refers to.  A file that cannot be
    removed stays (a warning), and is tried again the next time.
    ``verdicts``: a `Verdicts` the run keeps, so that each prune reads
    the manifests of the files written since the last one only."""
    found = scan(directory, quick=True, nodes=nodes, about_run=False,
                 verdicts=verdicts)
    plan = prune_plan(found, keep)
    removed, _, errors = remove(directory, [name for name, _ in plan.remove])
    for error in errors:
        log.warning("pruning checkpoints: %s is kept (cannot be removed)",
                    error)
    return removed
