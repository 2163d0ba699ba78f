"""``python -m localcluster.run --cleanup``: remove what runs that are
gone left behind, and say what.

- Shared-memory segments of masters that are gone (`runtime.shm`).
- Partial checkpoint files of writers that are gone, in
  ``--checkpoint-dir DIR`` -- or, without one, in the temporary
  directories (``localcluster-ckpt-*``) of this user's runs.
- Without ``--checkpoint-dir``: whole temporary run directories whose run
  is gone (no live run holds their lock) and either finished (its last
  run ended ``ok`` in ``metrics.jsonl``: nothing was left to resume) or
  hold no complete epoch (nothing to resume from).  One whose run stopped
  short with a complete epoch stays -- its resume command was printed
  (counted: ``python -m localcluster.ckpt prune`` or ``rm -r`` removes
  it).

A temporary directory is removed only if it is a real directory (not a
symlink) owned by this user, holds nothing but files (a subdirectory
keeps it), and under its lock, taken as a run takes it: a run cannot
start in it meanwhile, and one that holds it keeps it.  Its files are
removed through a descriptor of the directory, opened without following
symlinks; a symlink in it is removed, never followed.  An empty one is
left: a run may have just made it and be about to lock it.
"""

import glob
import json
import os
import stat
import sys
import tempfile

from .rundir.scan import last_run_status, scan
from .rundir.directory import LOCK_FILE, TEMP_PREFIX, DirLock
from .jobspec import RunFailure, UsageError
from ..checkpoint.fileformat import remove_partials_under
from ..runtime import shm

__all__ = ["cleanup", "temp_run_dirs", "remove_gone_temp_dirs"]


def cleanup(checkpoint_dir, as_json, out):
    """``--cleanup`` (see the module) of ``checkpoint_dir`` (None: the
    temporary run directories); its exit status.  ``out``: where the
    report goes (``as_json``: the JSON summary goes to stdout)."""
    removed_dirs, kept = [], []
    if checkpoint_dir is not None:
        if not os.path.isdir(checkpoint_dir):
            raise UsageError(f"--checkpoint-dir {checkpoint_dir} is not "
                             "a directory: nothing there to clean up")
        directories = [checkpoint_dir]
    else:
        directories = temp_run_dirs()
        removed_dirs, kept = remove_gone_temp_dirs(directories)
        gone = {d["path"] for d in removed_dirs}
        directories = [d for d in directories if d not in gone]
    removed = shm.sweep_stale()
    partials = [os.path.join(d, name) for d in directories
                for name in remove_partials_under(d, dead_only=True)]
    if as_json:
        json.dump({"removed": [f"/dev/shm/{n}" for n in removed],
                   "partial_checkpoints": partials,
                   "removed_directories": removed_dirs,
                   "kept_directories": kept}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return 0
    _report_segments(out, removed)
    _report_partials(out, partials, directories)
    if checkpoint_dir is None:
        _report_dirs(out, removed_dirs, kept)
    return 0


def _report_segments(out, removed):
    if removed:
        out.write(f"removed {len(removed)} stale shared-memory segment(s) "
                  "of runs that are gone:\n")
        out.writelines(f"  /dev/shm/{name}\n" for name in removed)
    else:
        out.write("no stale shared-memory segments\n")


def _report_partials(out, partials, directories):
    if partials:
        out.write(f"removed {len(partials)} partial checkpoint file(s) of "
                  "writers that are gone:\n")
        out.writelines(f"  {path}\n" for path in partials)
    else:
        out.write(f"no partial checkpoint files of writers that are gone in "
                  f"{len(directories)} checkpoint director"
                  f"{'y' if len(directories) == 1 else 'ies'}\n")


def _report_dirs(out, removed_dirs, kept):
    if removed_dirs:
        freed = sum(d["bytes"] for d in removed_dirs)
        out.write(f"removed {len(removed_dirs)} temporary run "
                  f"director{'y' if len(removed_dirs) == 1 else 'ies'} "
                  f"of runs that are gone -- finished, or with no complete "
                  f"epoch to resume from ({_mib(freed)} freed):\n")
        out.writelines(f"  {d['path']} ({d['why']}, {_mib(d['bytes'])})\n"
                       for d in removed_dirs)
    else:
        out.write("no temporary run directories of finished runs or "
                  "without a complete epoch\n")
    if kept:
        one = len(kept) == 1
        out.write(f"{len(kept)} temporary run "
                  f"director{'y' if one else 'ies'} of runs that stopped "
                  f"short {'stays: it holds' if one else 'stay: they hold'} "
                  "a complete epoch to resume from (python -m "
                  "localcluster.ckpt prune DIR --keep N thins one, rm -r DIR "
                  "removes it)\n")


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def temp_run_dirs():
    """The temporary run directories of this user (real directories, not
    symlinks), by name."""
    found = []
    for path in sorted(glob.glob(os.path.join(tempfile.gettempdir(),
                                              TEMP_PREFIX + "*"))):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            found.append(path)
    return found


def remove_gone_temp_dirs(directories):
    """Remove those of ``directories`` whose run is gone and that either
    finished or hold no complete epoch: ``([{"path", "bytes", "why"}],
    [paths kept: a complete epoch of a run that stopped short])``.
    Directories in use, or not removable, are in neither list."""
    removed, kept = [], []
    for path in directories:
        if not _has_entries(path):
            continue
        try:
            lock = DirLock(path).acquire()
        except (RunFailure, OSError):
            continue  # a live run holds it (or it cannot be locked)
        freed = None
        try:
            found = scan(path, quick=True, about_run=False)
            writing = any(e.writing for e in found.epochs.values())
            finished = last_run_status(path) == "ok"
            if found.resume_epoch is not None and not finished:
                kept.append(path)
            elif not writing:
                freed = _remove_files(path)
        finally:
            lock.release(remove=freed is not None or lock.created)
        if freed is not None:
            try:
                os.rmdir(path)
            except OSError:
                continue  # something came in after all: it stays
            removed.append({"path": path, "bytes": freed,
                            "why": "finished" if finished else
                            "nothing to resume"})
    return removed, kept


def _has_entries(path):
    try:
        with os.scandir(path) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def _remove_files(path):
    """Remove every file of the directory ``path`` but its lock file (the
    caller holds it); the bytes freed, or None -- removing nothing -- if
    the directory is not this user's or holds a subdirectory.  Symlinks
    are removed, never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                     os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return None
        with os.scandir(fd) as listing:
            entries = [(e.name, e.stat(follow_symlinks=False))
                       for e in listing]  # (an entry gone: OSError below)
        if any(stat.S_ISDIR(st.st_mode) for _, st in entries):
            return None
        freed = 0
        for name, st in entries:
            if name == LOCK_FILE:
                continue
            try:
                os.unlink(name, dir_fd=fd)
                freed += st.st_size
            except OSError:
                pass  # gone already, or not ours to remove: rmdir fails
        return freed
    except OSError:
        return None
    finally:
        os.close(fd)
