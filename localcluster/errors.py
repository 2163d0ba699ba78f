"""Every exception localcluster raises, under one root.

Classes are named by *who* caused the problem: the plan you built
(`PlanError`), an op that raised inside a node (`TaskFailedError`), a node
process that died (`NodeFailedError`), a run that took too long
(`RunTimeoutError`), a session you closed (`SessionClosedError`), a
checkpoint on disk (`CheckpointError`), a run under a deterministic
schedule whose branches all wait for each other (`DeadlockError`) or
that strays from the decisions it replays (`ScheduleDivergedError`).
Where a stdlib base fits, it is a second base, so ``except ValueError``
still catches a bad plan.

Remote failures keep their meaning: a node's traceback travels back as
text and becomes the ``__cause__`` of the error raised in the master
(`RemoteTraceback`), the way ``concurrent.futures`` does it.
"""

import errno

__all__ = [
    "LocalClusterError",
    "PlanError",
    "TaskFailedError",
    "NodeFailedError",
    "CheckpointError",
    "CheckpointWarning",
    "SessionClosedError",
    "RunTimeoutError",
    "InjectedFault",
    "BlobNotFoundError",
    "SharedMemoryFullError",
    "DescriptorLimitError",
    "RemoteTraceback",
    "Cancelled",
    "DeadlockError",
    "ScheduleDivergedError",
]


class LocalClusterError(Exception):
    """Root of every error raised by localcluster."""


class PlanError(LocalClusterError, ValueError):
    """The plan is invalid; raised when it is built or analyzed, not run."""


class BlobNotFoundError(LocalClusterError, KeyError):
    """A blob was asked for on a node whose workspace does not have it."""

    def __init__(self, name, node, hint=""):
        self.blob = str(name)
        self.node = str(node)
        message = f"blob {self.blob!r} not found on node {self.node!r}"
        if hint:
            message += f"; {hint}"
        super().__init__(message)

    def __str__(self):
        # KeyError would repr() the message and wrap it in quotes.
        return self.args[0]


class SharedMemoryFullError(LocalClusterError, OSError):
    """/dev/shm has no room for a blob's segment (``errno`` ENOSPC).

    Raised where the segment is made -- the master's ``feed_blob``, or an
    op's output in a node, which fails as that op's `TaskFailedError` --
    instead of the SIGBUS a write to memory that tmpfs cannot back would
    be.  ``blob`` names what needed the room, ``nbytes`` how much, and
    ``free`` what /dev/shm had left (bytes)."""

    def __init__(self, message, *, blob=None, nbytes=None, free=None):
        super().__init__(message)
        self.errno = errno.ENOSPC
        self.blob = blob
        self.nbytes = nbytes
        self.free = free

    def __reduce__(self):
        return (_rebuild_shm_full, (self.args[0], self.__dict__.copy()))


def _rebuild_shm_full(message, state):
    err = SharedMemoryFullError(message)
    err.__dict__.update(state)
    return err


class DescriptorLimitError(LocalClusterError, OSError):
    """The master may not open the file descriptors a run's node processes
    and queues need (``errno`` EMFILE): raised before the run starts
    them, naming the limit and the fix, instead of a bare "Too many open
    files" halfway through.  ``limit`` is the soft RLIMIT_NOFILE, ``hard``
    the hard one (None: unlimited), ``in_use`` how many were open and
    ``needed`` about how many the run needs."""

    def __init__(self, message, *, limit=None, hard=None, in_use=None,
                 needed=None):
        super().__init__(message)
        self.errno = errno.EMFILE
        self.limit = limit
        self.hard = hard
        self.in_use = in_use
        self.needed = needed


class RemoteTraceback(Exception):
    """The traceback text of an exception raised in another process."""

    def __init__(self, tb_text):
        self.tb = tb_text
        super().__init__(tb_text)

    def __str__(self):
        return self.tb


class TaskFailedError(LocalClusterError):
    """An op raised while a node ran its plan.

    Attributes name where: ``node``, ``task``, ``step``, ``op_type``,
    ``op_index`` (index of the op in its net), ``net`` and ``built_at``
    (``"<file>:<line> in <function>"`` of the user's code that built the
    op, or None); what the op
    raised is ``cause_type`` (``"ValueError"``) and ``cause_message``, the
    two together ``reason``; ``traceback_text`` is the
    formatted traceback of the original exception, which is also the
    ``__cause__`` (the exception itself in-process, a `RemoteTraceback`
    across processes).
    """

    def __init__(self, message, *, node=None, task=None, step=None, net=None,
                 op_type=None, op_index=None, traceback_text="",
                 cause_type=None, cause_message=None, built_at=None):
        super().__init__(message)
        self.built_at = built_at
        self.cause_type = cause_type
        self.cause_message = message if cause_message is None \
            else cause_message
        self.node = node
        self.task = task
        self.step = step
        self.net = net
        self.op_type = op_type
        self.op_index = op_index
        self.traceback_text = traceback_text

    @property
    def reason(self):
        """What the op raised, as ``"ValueError: message"``."""
        if self.cause_type is None:
            return self.cause_message
        return f"{self.cause_type}: {self.cause_message}"

    def __reduce__(self):
        return (_rebuild_task_failed, (self.args[0], self.__dict__.copy()))


def _rebuild_task_failed(message, state):
    err = TaskFailedError(message)
    err.__dict__.update(state)
    return err


class NodeFailedError(LocalClusterError):
    """A node process died, or was killed, while the master needed it."""

    def __init__(self, message, *, node=None, exitcode=None, signal_name=None,
                 last_log_lines=()):
        super().__init__(message)
        self.node = node
        self.exitcode = exitcode
        self.signal_name = signal_name
        self.last_log_lines = tuple(last_log_lines)


class CheckpointError(LocalClusterError):
    """A checkpoint could not be written, or failed verification on load.

    ``reason``: what is wrong with the file in a few words (``blob 'w'
    fails its CRC-32 check (corrupted)``), without its path or the advice
    -- what a listing of a checkpoint directory shows."""

    def __init__(self, message, reason=None):
        super().__init__(message)
        self.reason = reason if reason is not None else message

    def __reduce__(self):  # the reason crosses a pipe too
        return type(self), (str(self), self.reason)


class CheckpointWarning(UserWarning):
    """A checkpoint could not be written; training went on."""


class SessionClosedError(LocalClusterError, RuntimeError):
    """The session was closed (by you, or because it broke) and cannot run."""


class RunTimeoutError(LocalClusterError, TimeoutError):
    """A run did not finish within its timeout; its work was cancelled.

    ``nodes`` were still running at the deadline; ``killed`` are those of
    them that did not stop when cancelled and were killed (a node process;
    an in-process session breaks instead).  ``starting`` is true when
    what took too long was the start of ``nodes``' processes: they never
    said they were ready, and were killed."""

    def __init__(self, message, *, nodes=(), killed=(), starting=False):
        super().__init__(message)
        self.nodes = tuple(nodes)
        self.killed = tuple(killed)
        self.starting = bool(starting)


class InjectedFault(LocalClusterError):
    """The error a fault plan's ``Kill(how="raise")`` or `FailCheckpoint`
    raises inside a node (see `localcluster.testing`)."""


class DeadlockError(LocalClusterError):
    """Under a deterministic schedule, every branch of a run waits and no
    timer is pending: nothing could ever go on.  ``waiting`` is
    ``((branch, what it waits for), ...)``, sorted by branch."""

    def __init__(self, message, *, waiting=()):
        super().__init__(message)
        self.waiting = tuple(waiting)

    def __reduce__(self):
        return (_rebuild_deadlock, (self.args[0], self.waiting))


def _rebuild_deadlock(message, waiting):
    return DeadlockError(message, waiting=waiting)


class ScheduleDivergedError(LocalClusterError):
    """A replayed schedule (``Schedule.replay``) does not fit the run: a
    decision names a branch that cannot go on there, or the decisions run
    out or are left over -- the plan or the session's state differ from
    the run that was recorded."""


class Cancelled(LocalClusterError):
    """Raised inside a run that was cancelled (by a failure elsewhere, a
    timeout or an interrupt); a run never raises it when something else
    went wrong first -- that error wins."""


def first_error(errors):
    """The error that speaks for ``errors`` (in the order they came): the
    first that is not a `Cancelled` -- a cancellation is what another
    failure caused -- else the first; None for none.  The one rule for
    the branches of a node's run and for the nodes of a session's run."""
    for error in errors:
        if not isinstance(error, Cancelled):
            return error
    return errors[0] if errors else None

