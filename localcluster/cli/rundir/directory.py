"""The checkpoint directory of a ``python -m localcluster.run`` run.

One directory holds one run's checkpoints (``<node>.<epoch>``), the run
file (``localcluster-run.json``: the job and the value of every job option
its checkpoints were made with) and the runs' history (``metrics.jsonl``,
`cli.rundir.metrics`).  So that two runs never mix there:

- `DirLock`: a run holds an exclusive ``flock`` on
  ``localcluster-run.lock`` for its whole life (the kernel drops it when
  the run's master is gone, however it ends); a second run into the
  directory is refused while the first lives.
- `check_fresh`: a run without ``--resume`` refuses a directory that holds
  another run's checkpoints -- unless ``--overwrite``, which removes them
  first (`clear_run`).
- `restore_options`: a resumed run takes the job options of the run file
  and refuses different ones, except a higher ``--epochs``: that run
  trains further.

Under the lock, what interrupted writers left (partial checkpoints of
processes that are gone, a run file half written) is removed
(`sweep_leftovers`).
"""

import errno
import fcntl
import json
import logging
import os
import re
import stat
import weakref

from ..jobspec import DEFAULT_JOB, JOB_OPTIONS, RunFailure, UsageError
from .metrics import METRICS_FILE
from ...checkpoint.atomic import atomic_write
from ...checkpoint.names import parse_name
from ...checkpoint.partials import PARTIAL, remove_partials_under
from ...checkpoint.state import is_checkpoint

__all__ = ["RUN_FILE", "LOCK_FILE", "TEMP_PREFIX", "DirLock", "make_dir",
           "run_files", "check_fresh", "clear_run", "saved_options",
           "save_options", "restore_options", "sweep_leftovers",
           "is_run_file", "discard_if_unused", "read_pid", "in_use"]

log = logging.getLogger("localcluster.run")

RUN_FILE = "localcluster-run.json"
LOCK_FILE = "localcluster-run.lock"
#: the prefix of the temporary directories runs without --checkpoint-dir use
TEMP_PREFIX = "localcluster-ckpt-"
#: a run file being written: ``localcluster-run.json.<random>.tmp``
_RUN_FILE_TMP = re.compile(re.escape(RUN_FILE) + r"(\.[^.]+)?\.tmp$")


def is_run_file(name):
    """Whether ``name`` is one of the run's own files (not a checkpoint)."""
    return name in (RUN_FILE, LOCK_FILE, METRICS_FILE) or \
        bool(_RUN_FILE_TMP.match(name))


# -- making it ------------------------------------------------------------------

def make_dir(directory, resume):
    """Check ``--checkpoint-dir`` and make it (0700) if it is missing."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UsageError(f"--checkpoint-dir {directory} is not a directory; "
                         "give the path of a directory (or of none yet)")
    if resume is not None and not os.path.isdir(directory):
        raise UsageError(f"--checkpoint-dir {directory} does not exist: "
                         "there is nothing to resume; drop --resume to "
                         "start a run there")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--checkpoint-dir {directory} cannot be made: "
                         f"{exc.strerror}; pick a writable place") from exc
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"--checkpoint-dir {directory} is not writable by "
                         "this user; pick a writable place")


# -- one run at a time -----------------------------------------------------------

class DirLock:
    """An exclusive ``flock`` on the directory's lock file for a run's
    life, held by the master alone.

    A ``flock`` belongs to the open file, which a fork shares: a node
    forked from the master -- or a process a node forks -- would hold the
    directory locked for as long as it lives, and one that outlived a
    killed master would have ``--resume`` refused "in use by" a pid that
    is gone.  So a forked child closes its copy at once (an at-fork hook;
    the descriptor is also close-on-exec, for the programs it runs): the
    lock goes with the master.  The master's nodes go with it too, within
    a moment, and a node writing a checkpoint then leaves a partial file
    that the next run removes (`sweep_leftovers`)."""

    def __init__(self, directory):
        self.path = os.path.join(directory, LOCK_FILE)
        self.directory = directory
        self._fd = None
        #: whether the lock file was made by this acquire (else a run
        #: that was killed left it)
        self.created = False

    def _forget(self):
        """In a forked child: close this process's copy of the lock's
        descriptor (the lock stays the parent's)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def acquire(self):
        self.created = not os.path.lexists(self.path)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = read_pid(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise RunFailure(
                        f"--checkpoint-dir {self.directory}: its lock file "
                        f"cannot be locked ({exc.strerror}); pick a local "
                        "directory") from exc
                raise RunFailure(
                    f"--checkpoint-dir {self.directory} is in use by another "
                    f"run{f' (pid {holder})' if holder else ''}: two runs in "
                    "one directory would mix their checkpoints; wait for it "
                    "to end, or pick another directory") from exc
            # The last holder may have removed the file between our open
            # and our lock: then we hold a lock nobody else will see.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        _HELD.add(self)
        return self

    def release(self, remove=True):
        """Remove the lock file (while still holding it; not if
        ``remove`` is false) and unlock."""
        if self._fd is None:
            return
        try:
            if remove and _same_file(self._fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        _HELD.discard(self)
        os.close(self._fd)
        self._fd = None


#: the locks this process holds, which a forked child lets go of
_HELD = weakref.WeakSet()


def _forget_held_locks():
    for lock in list(_HELD):
        lock._forget()
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_held_locks)


def _same_file(fd, path):
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


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


def read_pid(fd):
    """The pid a run wrote into its lock file ``fd``, or None."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


# -- another run's files ---------------------------------------------------------

def run_files(directory):
    """The names of the checkpoint files (whole or partial) under
    ``directory`` -- a file named ``<node>.<epoch>`` counts if its
    manifest says localcluster wrote it."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        if PARTIAL in name:
            found.append(name)
        elif parse_name(name) is not None and \
                is_checkpoint(os.path.join(directory, name)):
            found.append(name)
    return found


def check_fresh(directory, overwrite):
    """A run that does not resume starts in a directory without another
    run's checkpoints: refuse one (or, with ``overwrite``, empty it)."""
    found = run_files(directory)
    if not found:
        return
    if overwrite:
        clear_run(directory, found)
        return
    shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
    raise UsageError(
        f"--checkpoint-dir {directory} holds another run's checkpoints "
        f"({len(found)} file(s): {shown}); a new run there would mix with "
        "them: add --resume to continue that run, --overwrite to delete "
        "them and start over, or pick an empty directory")


def clear_run(directory, names):
    """Remove another run's files (``--overwrite``)."""
    for name in list(names) + [RUN_FILE, METRICS_FILE]:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
    log.info("--overwrite: removed %d file(s) of the run that was in %s",
             len(names), directory)


def discard_if_unused(directory):
    """Remove a temporary checkpoint directory no checkpoint was written
    to (the run failed or was stopped first): only its run file is there.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return
    if all(is_run_file(name) for name in names):
        for name in names:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        try:
            os.rmdir(directory)
        except OSError:
            pass


def sweep_leftovers(directory):
    """Under the lock: remove the partial checkpoints of writers that are
    gone and run files half written; their names."""
    removed = remove_partials_under(directory, dead_only=True)
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    for name in names:
        if _RUN_FILE_TMP.match(name):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    if removed:
        log.info("removed %d file(s) that interrupted runs left in %s: %s",
                 len(removed), directory, ", ".join(removed))
    return removed


# -- the options the checkpoints were made with ---------------------------------

def saved_options(directory):
    """The run file's ``{"job": spec, option: value}``, or None."""
    try:
        with open(os.path.join(directory, RUN_FILE)) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def save_options(directory, job, values):
    """Record the job and its option values, atomically: a run interrupted
    while writing leaves the old file, and no temporary one."""
    saved = {"job": job, **{k: values.get(k) for k in JOB_OPTIONS}}
    atomic_write(os.path.join(directory, RUN_FILE),
                 lambda f: json.dump(saved, f, indent=1), binary=False)


def restore_options(chosen, saved, directory):
    """Fill the job options (`JobOptions` ``chosen``) the resumed run was
    not given from ``saved``;
    a different value is a usage error (the checkpoints hold that job) --
    but for a higher ``--epochs``, which trains further."""
    given_job = chosen.spec
    if chosen.job is not None and saved.get("job") not in (None, given_job):
        raise UsageError(
            f"--job {chosen.job} is not the job the checkpoints under "
            f"{directory} were made by ({saved['job']}); drop --job to "
            "resume it, or start over in a new --checkpoint-dir")
    if chosen.job is None and saved.get("job") not in (None, DEFAULT_JOB):
        chosen.job = saved.get("job")
    for key in JOB_OPTIONS:
        given, then = getattr(chosen, key), saved.get(key)
        if given is None:
            setattr(chosen, key, then)
        elif then is None or given == then:
            continue
        elif key == "epochs" and isinstance(then, int) and given > then:
            log.info("--epochs %d: training on past the %d epochs the "
                     "checkpoints were made for", given, then)
        else:
            rule = (" (a resumed run may train more epochs, not fewer)"
                    if key == "epochs" else "")
            raise UsageError(
                f"--{key} {given} differs from the --{key} {then} the "
                f"checkpoints under {directory} were made with{rule}; drop "
                f"it to resume, or start over in a new --checkpoint-dir")
