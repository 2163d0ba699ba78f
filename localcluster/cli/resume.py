"""Where a ``--resume`` starts, and how a resumed job trains on.

`resume_epoch` turns ``--resume [EPOCH|latest]`` into an epoch every node
of the job has a checkpoint of, or one line saying which node lacks it and
what to resume from instead.

`checkpoint_manager` gives the manager of a run: a `RunManager`, which
stops the run with one line when its directory is moved or removed under
it, instead of re-creating it (the run's epochs split over two
directories, its lock left in the moved one).  When the job stops by
`epoch_limiter` its counter is in every checkpoint -- the number of epochs
left, as the run that wrote it was told -- so a resumed run would stop
where the first one was told to.  `LimiterManager` sets the counter, after
every load, to what the job being run says (its ``init_count`` minus the
epoch loaded), and does not take a checkpoint's "training stopped here"
for the end while epochs are left: ``--resume --epochs 8`` after a
5-epoch run trains epochs 6 to 8, and a run resumed with the same epochs
is exactly what it was.
"""

import os

from ..checkpoint.manager import MultiNodeCheckpointManager
from .jobspec import RunFailure, limiter_counters
from ..errors import CheckpointError, LocalClusterError
from ..plan import execution_step
from ..plan.net import Net
from ..task import Node, Task, TaskGroup, WorkspaceType

__all__ = ["checkpoint_manager", "resume_epoch", "RunManager",
           "LimiterManager"]


class RunManager(MultiNodeCheckpointManager):
    """The manager of a command-line run: it stops the run when its
    directory is moved or removed under it (a save would re-create the
    old path and split the run's epochs over two directories)."""

    def __init__(self, db_prefix):
        super().__init__(db_prefix)
        self._identity = _identity(db_prefix)

    def save(self, epoch, final=False):
        self.check_directory(epoch)
        return super().save(epoch, final=final)

    def check_directory(self, epoch):
        """The run's error if its directory is not the one it started in:
        before a save, and when a save failed (moved while it wrote: that
        is one line, the move, not a failed write and then the move)."""
        now = _identity(self.db_prefix)
        if self._identity is not None and now != self._identity:
            raise CheckpointError(
                f"the checkpoint directory {self.db_prefix} was "
                f"{'removed' if now is None else 'replaced'} while the run "
                f"went on{_moved_to(self._identity)}; the run stops rather "
                f"than write epoch {epoch} somewhere else -- resume where "
                "the checkpoints are now (--checkpoint-dir DIR --resume)")


def _identity(directory):
    """``(device, inode)`` of ``directory``, None if it is not there."""
    try:
        found = os.stat(directory)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _moved_to(identity):
    """`` (it is now at X)`` when this process still holds a file in the
    directory ``identity`` names (its lock) and can see where it went."""
    for fd in _own_fds():
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            here = os.stat(os.path.dirname(path))
        except OSError:
            continue
        if (here.st_dev, here.st_ino) == identity and os.path.isabs(path):
            return f" (it is now at {os.path.dirname(path)})"
    return ""


def _own_fds():
    try:
        return [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return []


class LimiterManager(RunManager):
    """A `RunManager` that re-bases the job's epoch-limiter counters on
    every load (see the module docstring)."""

    def __init__(self, db_prefix, counters, epochs, only_limiters):
        super().__init__(db_prefix)
        self._counters = counters          # {node: [(blob, init_count)]}
        self._epochs = epochs              # the run's number of epochs
        self._only_limiters = only_limiters

    def epoch_is_final(self, epoch):
        if self._only_limiters and epoch < self._epochs:
            return False  # stopped by a limiter told fewer epochs
        return super().epoch_is_final(epoch)

    def load(self, epoch):
        group = super().load(epoch)
        rebased = TaskGroup(workspace_type=WorkspaceType.GLOBAL)
        for task in group.tasks():
            step = task.planned_step()
            counters = self._counters.get(task.node)
            if counters:
                net = Net("epoch_limiter_rebase")
                for blob, init_count in counters:
                    net.ResetCounter([blob], [],
                                     init_count=max(0, init_count - epoch))
                step = execution_step(f"{task.name}_rebased", [step, net])
            with Node(task.node):
                Task(step=step, group=rebased, name=task.name)
        return rebased


def checkpoint_manager(directory, job):
    """The manager of a run of ``job`` checkpointing under ``directory``."""
    counters, only = limiter_counters(job)
    if not counters:
        return RunManager(directory)
    epochs = min(init + 1 for found in counters.values()
                 for _, init in found)
    return LimiterManager(directory, counters, epochs, only)


def resume_epoch(manager, resume, job):
    """The epoch ``--resume`` names (``"latest"``: the latest complete
    one), checked to have a checkpoint of every node of ``job``."""
    directory = manager.db_prefix
    nodes = job.nodes_to_checkpoint()
    try:
        latest = manager.get_resume_from_epoch_id()
        if resume == "latest":
            if latest is None:
                raise RunFailure(
                    f"--resume: no complete checkpoint under {directory} to "
                    "resume from (an epoch every node wrote); run without "
                    "--resume to start over")
            resume = latest
        missing = manager.nodes_without(resume, nodes)
        if missing:
            # never the epoch just refused (the latest of other nodes)
            instead = (f"--resume {latest} (the latest epoch every node "
                       "has), or --resume alone"
                       if latest is not None and latest != resume else
                       "run without --resume to start over: no epoch is "
                       "complete there for every node of this job")
            raise RunFailure(
                f"--resume {resume}: node(s) {', '.join(missing)} have no "
                f"checkpoint of epoch {resume} under {directory}; use "
                f"{instead}")
        manager.epoch_is_final(resume)  # reads every node's manifest
    except LocalClusterError as exc:
        raise RunFailure(f"--resume {resume}: {exc}") from exc
    return resume
