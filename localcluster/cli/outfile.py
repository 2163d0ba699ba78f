"""A file an option of ``python -m localcluster.run`` writes when the run
ends (``--trace FILE``, ``--report FILE``): checked before anything runs,
so a run never trains for an hour to fail at its last step.

Only a regular file is written: a device, a FIFO, a directory or a symlink
at FILE is refused (writing through a symlink, or renaming over a device,
is how an output would destroy what it was never meant to touch), and so
is a place where no file can be made.  The file is written to a new
temporary file beside FILE (created exclusively, never followed) and
renamed over it (`localcluster.checkpoint.atomic`), so a reader sees the
old file or the whole new one, and a failed write leaves nothing behind.
"""

import os
import stat
import tempfile

from .jobspec import UsageError
from ..checkpoint.atomic import atomic_write, unlink_quietly

__all__ = ["OutputFile"]


class OutputFile:
    """The file ``option`` (``--trace``, ``--report``) names: checked when
    made (a `UsageError` naming the option, the path and the fix)."""

    def __init__(self, option, path):
        self.option = option
        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))
        self.check_kind()
        self._probe()

    def check_kind(self):
        """A `UsageError` unless the path holds a regular file or none."""
        try:
            found = os.lstat(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise UsageError(f"{self.option} {self.path} cannot be examined "
                             f"({exc.strerror}); give the path of a regular "
                             "file") from exc
        if not stat.S_ISREG(found.st_mode):
            raise UsageError(
                f"{self.option} {self.path} cannot be written: it is "
                f"{_kind(found.st_mode)}, not a regular file, and the file "
                "written replaces what is at its path; give the path of a "
                "regular file (or of none yet)")

    def _probe(self):
        """A file can be made where the output goes (made and removed)."""
        try:
            fd, tmp = tempfile.mkstemp(
                dir=self.directory,
                prefix="." + os.path.basename(self.path) + ".",
                suffix=".tmp")
        except OSError as exc:
            raise UsageError(
                f"{self.option} {self.path} cannot be written: no file can "
                f"be made in {self.directory} ({exc.strerror}); give a path "
                "in a writable directory") from exc
        os.close(fd)
        unlink_quietly(tmp)

    def write_with(self, write, mode=0o600):
        """Write the file with ``write(f)`` (text); `OSError` (its message
        one line naming the option and the file) if it cannot be."""
        try:
            atomic_write(self.path, write, binary=False, mode=mode,
                         before_replace=self.check_kind)
        except UsageError as exc:  # no longer a regular file, or none
            raise OSError(str(exc)) from None
        except OSError as exc:
            raise OSError(f"{self.option} {self.path} could not be written: "
                          f"{exc.strerror or exc}") from exc


def _kind(mode):
    for test, name in ((stat.S_ISLNK, "a symlink"),
                       (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"
