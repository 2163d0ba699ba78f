"""What ``python -m localcluster.run`` says when a run fails.

One ``error:`` line names what failed; the lines after it show where:

- an op that raised (`TaskFailedError`): where the user's code built the
  op, with its line, and the last frames of the node's traceback outside
  the library -- a Python op's own function -- (with ``--log-level
  DEBUG``, the whole traceback); a built-in op's kernel frames are the
  library's, never shown as if they were the line to fix;
- a node that died (`NodeFailedError`): its last log lines.

Only a failure that another try may not repeat -- a node that died, a run
past ``--timeout`` -- says how to resume, and mentions ``--max-restarts``,
which does that by itself.  An op that raises, a plan that cannot be sent
to a node or a bad checkpoint fail the same way on every run: no hint to
repeat it.
"""

import linecache
import os
import re
import shlex

from ..jobspec import first_line
from ...errors import NodeFailedError, RunTimeoutError, TaskFailedError
from ...job import restartable

__all__ = ["Failure", "describe", "resume_hint", "recurs"]

#: frames shown under a failed op's error line
FRAMES = 3
#: the library's files (its example job is user code)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))) + os.sep
_EXAMPLES = os.path.join(_PACKAGE, "examples") + os.sep
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), '
                    r'in (?P<func>.+)$')


class Failure:
    """``line`` (after ``error: ``), ``details`` (the lines after it) and
    whether it ``recurs`` (then there is no resume hint)."""

    def __init__(self, line, details=(), recurs=False):
        self.line, self.details, self.recurs = line, list(details), recurs


def recurs(exc):
    """Whether ``exc`` would fail a resumed run the same way: the failures
    a restart does not retry (`localcluster.job.restartable`)."""
    return not restartable(exc)


def describe(exc, max_restarts, timeout, debug):
    """The `Failure` of a run that raised ``exc``."""
    if isinstance(exc, TaskFailedError):
        return Failure(first_line(exc), _frames(exc, debug), recurs=True)
    if isinstance(exc, NodeFailedError):
        text = first_line(exc).removesuffix("; last log lines:")
        logs = [f"  [{exc.node}] {line}" for line in exc.last_log_lines]
        return Failure(text + _restarts(max_restarts, "restarts a dead "
                                        "node"), logs)
    if isinstance(exc, RunTimeoutError) and timeout is not None and \
            exc.starting:
        late = ", ".join(map(repr, exc.nodes))
        return Failure(
            f"node(s) {late} did not start within --timeout {timeout:g} s "
            "(stopped, or starved of CPU, before ready) and were killed" +
            _restarts(max_restarts, "restarts them"))
    if isinstance(exc, RunTimeoutError) and timeout is not None:
        late = ", ".join(map(repr, exc.nodes)) or "(none named)"
        killed = (f"; {', '.join(map(repr, exc.killed))} did not stop when "
                  "cancelled and were killed" if exc.killed else "")
        return Failure(
            f"a run took longer than --timeout {timeout:g} s: node(s) {late} "
            f"were still running{killed}" + _restarts(
                max_restarts, "restarts the late nodes"))
    return Failure(first_line(exc) + (_restarts(
        max_restarts, "restarts the late nodes")
        if isinstance(exc, RunTimeoutError) else ""), recurs=recurs(exc))


def _restarts(max_restarts, what):
    if max_restarts:
        return (f" (--max-restarts {max_restarts} used up; a higher one "
                f"{what} from the last checkpoint more times)")
    return f"; --max-restarts K {what} from the last checkpoint K times"


def _frames(exc, debug):
    """The lines showing where a failed op's node raised."""
    text = (exc.traceback_text or "").rstrip()
    if not text:
        return []
    if debug:
        return ["  " + line for line in text.splitlines()]
    # the last traceback of a chain is the one that ended the op
    last = text.split("Traceback (most recent call last):")[-1]
    lines = last.splitlines()
    frames = []
    for i, line in enumerate(lines):
        found = _FRAME.match(line)
        if found:
            code = lines[i + 1].strip() if i + 1 < len(lines) and \
                not _FRAME.match(lines[i + 1]) else ""
            frames.append((found["file"], found["line"], found["func"], code))
    theirs = [f for f in frames if _users(f[0])]
    built = _built(exc.built_at)
    shown = theirs[-FRAMES:] if theirs or built else frames[-FRAMES:]
    return built + [
        f"  at {file}:{line} in {func}" + (f": {code}" if code else "")
        for file, line, func, code in shown] + [
        "  (--log-level DEBUG shows the whole traceback)"]


def _users(file):
    """Whether ``file`` is the user's code, not the library's."""
    path = os.path.abspath(file)
    return not path.startswith(_PACKAGE) or path.startswith(_EXAMPLES)


def _built(built_at):
    """The line naming where the failed op was built (``built_at``: the
    error's ``"<file>:<line> in <function>"``), with its source."""
    if not built_at:
        return []
    place, _, func = built_at.rpartition(" in ")
    file, _, line = place.rpartition(":")
    code = linecache.getline(file, int(line)).strip() if line.isdigit() \
        else ""
    return [f"  op built at {built_at}" + (f": {code}" if code else "")]


def resume_hint(session, max_restarts, checkpoint_dir):
    """The command that resumes: the job's options come back from the
    checkpoint directory's run file, so only the run's own are repeated
    (``session``: the run's `SessionOptions`)."""
    parts = []
    if session.kind != "localhost":
        parts += ["--session", session.kind]
    if session.ray_address:
        parts += ["--ray-address", session.ray_address]
    if max_restarts:
        parts += ["--max-restarts", str(max_restarts)]
    if session.timeout is not None:
        parts += ["--timeout", f"{session.timeout:g}"]
    parts += ["--checkpoint-dir", checkpoint_dir, "--resume"]
    return "python -m localcluster.run " + " ".join(shlex.quote(p)
                                                   for p in parts)
