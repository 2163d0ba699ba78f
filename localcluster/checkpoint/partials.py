"""Partial checkpoint files: what an interrupted writer leaves behind.

A node writes its checkpoint to ``<db_prefix>/<node>.<epoch>.partial-<pid>-
<random>`` and renames it when it is whole (`checkpoint.fileformat`).  A writer
killed on the way -- or whose master was killed -- leaves the partial file;
these functions remove such files, by default all of a checkpoint's, and
with ``dead_only`` only those whose writer can no longer write them: no
process with its pid, a zombie, or a process that started after the file
was last written (its pid was reused).  A run removes its own failed
save's files; the next run in a directory, and ``--cleanup``, the dead
writers' ones.
"""

import os
import time

__all__ = ["PARTIAL", "remove_partials", "remove_partials_under",
           "partials_under", "sweep_before_write"]

PARTIAL = ".partial-"

#: ``(pid, directory, node)`` whose dead writers' partial files this
#: process removed before a write (`sweep_before_write`)
_swept = set()


def remove_partials(path, dead_only=False):
    """Remove what interrupted writers of ``path`` left; their names.
    ``dead_only``: only files of writer processes that are gone."""
    directory, base = os.path.split(path)
    try:
        found = os.listdir(directory or ".")
    except OSError:
        return []
    return _remove(directory, found, (base + PARTIAL,), dead_only)


def _remove(directory, found, starts, dead_only):
    """Remove the partial files among the names ``found`` in ``directory``
    that start with one of ``starts``; their names."""
    removed = []
    for name in found:
        start = next((s for s in starts if name.startswith(s)), None)
        if start is None:
            continue
        partial = os.path.join(directory, name)
        if dead_only and _writer_alive(name[len(start):], partial):
            continue
        try:
            os.unlink(partial)
        except FileNotFoundError:
            pass  # another cleaner was first
        removed.append(name)
    return removed


def sweep_before_write(path):
    """Before ``path`` (``<node>.<epoch>``) is written: remove the partial
    files its node's dead writers left, of every epoch -- once per node
    and directory in a process, not at every write.  A writer killed
    mid-write leaves its partial file to the node's next incarnation,
    which is a new process (a restart) and sweeps at its first save; an
    epoch's writers do not each list a directory that holds every other
    node's files (which made a save of N nodes cost N directory
    listings of N files).  A path not named like a checkpoint is swept
    at every write, as before."""
    directory, base = os.path.split(path)
    node, dot, epoch = base.rpartition(".")
    if not (dot and node and epoch.isdigit()):
        return remove_partials(path, dead_only=True)
    key = (os.getpid(), directory, node)
    if key in _swept:
        return []
    try:
        found = os.listdir(directory or ".")
    except OSError:
        return []
    _swept.add(key)
    heads = set()
    for name in found:
        head, partial, _ = name.partition(PARTIAL)
        owner, dot, number = head.rpartition(".")
        if partial and owner == node and number.isdigit():
            heads.add(head)
    if not heads:
        return []
    return _remove(directory, found,
                   tuple(head + PARTIAL for head in heads), True)


def remove_partials_under(directory, dead_only=False):
    """`remove_partials` of every checkpoint under ``directory``.
    ``dead_only``: only files whose writer process is gone (what a run
    cleans up before it starts, or ``--cleanup``, where another run may be
    writing)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    bases = {name.split(PARTIAL)[0] for name in names if PARTIAL in name}
    return [removed for base in sorted(bases)
            for removed in remove_partials(os.path.join(directory, base),
                                           dead_only=dead_only)]


def partials_under(directory):
    """``[(name, writer alive)]`` of the partial files under ``directory``,
    by name; nothing is removed (what a listing, or a dry run, shows)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [(name, _writer_alive(name.split(PARTIAL, 1)[1],
                                 os.path.join(directory, name)))
            for name in names if PARTIAL in name]


#: seconds a process must have started after a partial file was last
#: written to be sure it is not that file's writer (clock resolution: the
#: kernel counts process start times in ticks of 10 ms)
_REUSE_MARGIN = 1.0


def _writer_alive(suffix, partial=None):
    """Whether the process that named a partial file ``...-<suffix>`` (its
    pid first) may still write it.  Not if no process has that pid, nor if
    it is a zombie (it ends without writing again), nor if the process
    with that pid started after ``partial`` was last written (the pid was
    reused: a writer starts before it writes).  A process of another user
    counts as alive."""
    try:
        pid = int(suffix.split("-", 1)[0])
    except ValueError:
        return False
    state, started = _process_state(pid)
    if state is None:
        return False
    if state in ("Z", "X", "x"):
        return False
    if partial is not None and started is not None:
        try:
            written = os.stat(partial, follow_symlinks=False).st_mtime
        except OSError:
            return False  # gone already
        if started > written + _REUSE_MARGIN:
            return False
    return True


def _process_state(pid):
    """``(state letter, start time on the time.time() clock)`` of ``pid``
    from /proc; ``(None, None)`` if there is no such process; the start
    time is None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return None, None
    except OSError:
        try:  # no /proc: ask the kernel
            os.kill(pid, 0)
        except ProcessLookupError:
            return None, None
        except PermissionError:
            pass
        return "?", None
    # "pid (comm) state ... starttime" -- comm may hold spaces and parens
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        ticks = int(fields[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (IndexError, ValueError, OSError):
        return fields[0] if fields else "?", None
    booted = time.time() - uptime
    return fields[0], booted + ticks / os.sysconf("SC_CLK_TCK")
