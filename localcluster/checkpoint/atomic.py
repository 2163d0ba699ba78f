"""Writing a file whole or not at all -- the one atomic write of the
package: checkpoints, and the command line's run file, report and trace.

``write(f)`` fills a new temporary file beside ``path`` (created with
``O_EXCL``, so a name that exists -- a symlink included -- is never
written through), which is flushed, fsynced and renamed over ``path``;
then the directory is fsynced, so the rename survives a crash.  If
anything fails on the way -- ``write``, the disk, a signal -- the
temporary file is removed and ``path`` is as it was: a reader sees the
old file or the whole new one, never a part.
"""

import os

__all__ = ["atomic_write", "fsync_dir", "unlink_quietly"]


def atomic_write(path, write, *, temp=None, mode=0o600, binary=True,
                 before_replace=None):
    """Write ``path`` atomically; what ``write(f)`` returns.

    ``temp``: the temporary file's path (beside ``path``; default
    ``<path>.<pid>-<random>.tmp``); ``mode``: the file's permission bits
    (set exactly, whatever the umask); ``binary``: ``f`` takes bytes, else
    UTF-8 text; ``before_replace()``: a last check before the rename (an
    exception there leaves ``path`` untouched)."""
    if temp is None:
        temp = f"{path}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                 mode)
    try:
        os.fchmod(fd, mode)
        with (os.fdopen(fd, "wb") if binary else
              os.fdopen(fd, "w", encoding="utf-8")) as f:
            fd = None  # the file object owns it now
            result = write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(temp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        unlink_quietly(temp)
        raise
    fsync_dir(os.path.dirname(path) or ".")
    return result


def fsync_dir(directory):
    """Make a rename in ``directory`` durable (best effort: a filesystem
    that cannot fsync a directory is left as it is)."""
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


def unlink_quietly(path):
    """Remove ``path`` if it is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
