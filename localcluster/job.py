"""Jobs: init / epoch / download / exit groups, and the runner that trains
them epoch by epoch with a checkpoint of every node after every epoch.

::

    with Job() as job:                     # enters job.epoch_group
        with Node("trainer_0"):
            ...the work of one epoch...
    with job.init_group, Node("trainer_0"):
        ...what the epochs start from...
    epoch_limiter(job, 10)

    runner = JobRunner(job, MultiNodeCheckpointManager("/ckpt"))
    last_epoch = runner.train(session)

`JobRunner.train` first validates every group of the job and the
session's fault plan (`Session.validate`, `plan.preflight`): a bad epoch
group is refused before the init group runs.  Then it runs the init group
(unless resuming), checkpoints epoch 0 (or loads the resume epoch), then
per epoch: the epoch group, the stop conditions, a checkpoint; then the
upload builder's group, the download group and the exit group.  What a
checkpoint holds is each node's global
workspace right after the init group, so a run resumed from epoch k --
with a fresh session and a rebuilt job -- ends exactly where an
uninterrupted one does.  A checkpoint also records whether training
stopped after its epoch: resuming from the epoch a run stopped at runs no
further epoch (only the upload, download and exit steps).
"""

import logging
import os
import re
import time
import warnings

import numpy as np

from .context import Managed
from .errors import (CheckpointError, CheckpointWarning, NodeFailedError,
                     PlanError, RunTimeoutError, TaskFailedError)
from .plan.instances import expand_nodes
from .plan.net import BlobRef, Net
from .plan.preflight import check_fault_nodes
from .plan.validate import check_seconds
from .task import Task, TaskGroup, TaskOutput, WorkspaceType

__all__ = ["Job", "JobRunner", "epoch_limiter", "EpochReport", "TrainResult",
           "RESTARTABLE", "restartable"]

log = logging.getLogger(__name__)

#: the failures a restart retries: a node that died, and a run past its
#: timeout (its late nodes are cancelled, or killed, anyway) -- another try
#: may succeed.  An op that raises, a bad plan or checkpoint would fail
#: the same way again.
RESTARTABLE = (NodeFailedError, RunTimeoutError)


def restartable(exc):
    """Whether a restart retries the failure ``exc`` (see `RESTARTABLE`)."""
    return isinstance(exc, RESTARTABLE)


class Job(Managed):
    """``Job(init_group=None, epoch_group=None, download_group=None,
    exit_group=None, stop_conditions=None, nodes_to_checkpoint=None)``.

    The init, download and exit groups run in the nodes' global workspaces;
    the epoch group is PRIVATE unless given otherwise (its tasks read and
    write the global blobs the init group made, and keep what they create
    to the epoch).  ``with Job() as job:`` makes the job current
    (`Job.current()`) and enters its epoch group.
    """

    def __init__(self, init_group=None, epoch_group=None, download_group=None,
                 exit_group=None, stop_conditions=None,
                 nodes_to_checkpoint=None):
        self.init_group = _global_group(init_group, "init_group")
        self.epoch_group = epoch_group or TaskGroup()
        self.download_group = _global_group(download_group, "download_group")
        self.exit_group = _global_group(exit_group, "exit_group")
        self.stop_conditions = []
        for condition in stop_conditions or ():
            self.add_stop_condition(condition)
        self._nodes_to_checkpoint = (None if nodes_to_checkpoint is None
                                     else [str(n) for n in
                                           nodes_to_checkpoint])

    def __repr__(self):
        return (f"Job(init={self.init_group.num_registered_tasks()} tasks, "
                f"epoch={self.epoch_group.num_registered_tasks()} tasks, "
                f"{len(self.stop_conditions)} stop condition(s))")

    def __enter__(self):
        super().__enter__()
        self.epoch_group.__enter__()
        return self

    def __exit__(self, *exc):
        self.epoch_group.__exit__(*exc)
        super().__exit__(*exc)

    def nodes_to_checkpoint(self):
        """The nodes given to the constructor, else the init group's (a
        prototype's instances in its place: each checkpoints its own
        file)."""
        if self._nodes_to_checkpoint is not None:
            counts = self.prototypes()
            return list(expand_nodes(
                self._nodes_to_checkpoint,
                lambda n: {"num_instances": counts[n]} if n in counts
                else None))
        return self.init_group.used_nodes()

    def prototypes(self):
        """``{name: number of instances}`` of the job's node prototypes."""
        found = {}
        for _, group in self.printable_groups():
            for task in group._all_tasks():
                count = (task.node_kwargs or {}).get("num_instances")
                if count is not None:
                    found[task.node] = count
        return found

    def add_stop_condition(self, output):
        """Stop after the epoch in which ``output`` (a TaskOutput, or a blob
        of the current node, fetched after every epoch) is true."""
        if isinstance(output, (BlobRef, str)):
            output = Task(outputs=[output], group=self.epoch_group,
                          name="stop_condition").outputs()[0]
        if not isinstance(output, TaskOutput):
            raise PlanError(
                f"a stop condition is a blob or a TaskOutput, got {output!r}")
        self.stop_conditions.append(output)
        return output

    def printable_groups(self):
        return [("init", self.init_group), ("epoch", self.epoch_group),
                ("download", self.download_group), ("exit", self.exit_group)]

    def nodes(self):
        """Every node a group of the job uses, in order of first use."""
        nodes = {}
        for _, group in self.printable_groups():
            nodes.update(dict.fromkeys(group.used_nodes()))
        return list(nodes)


def _global_group(group, what):
    """``group`` (or a new one) running in the nodes' global workspaces:
    what an init group makes must outlive it."""
    if group is None:
        return TaskGroup(workspace_type=WorkspaceType.GLOBAL)
    if group.settle_workspace_type(WorkspaceType.GLOBAL) is not \
            WorkspaceType.GLOBAL:
        raise PlanError(
            f"a Job's {what} runs in the nodes' global workspaces, but this "
            f"TaskGroup is {group.workspace_type()}; make it with "
            "TaskGroup(workspace_type=WorkspaceType.GLOBAL)")
    return group


def epoch_limiter(job, num_epochs):
    """Stop ``job`` after exactly ``num_epochs`` epochs.

    The counter lives on the current Node, created by the init group -- so
    it is checkpointed, and a job resumed from epoch k runs only the
    epochs left."""
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or \
            num_epochs < 1:
        raise PlanError(f"epoch_limiter needs num_epochs >= 1, got "
                        f"{num_epochs!r}")
    with job.init_group:
        init_net = Net("epoch_counter_init")
        counter = init_net.CreateCounter([], init_count=num_epochs - 1)
        Task(step=init_net, name="epoch_limiter")
    with job.epoch_group:
        epoch_net = Net("epoch_countdown")
        finished = epoch_net.CountDown([counter])
        output = Task(step=epoch_net, outputs=finished,
                      name="epoch_limiter").outputs()[0]
    job.add_stop_condition(output)
    return output


class EpochReport:
    """What the runner reports of one epoch."""

    __slots__ = ("epoch", "seconds", "node_seconds", "checkpoint_seconds",
                 "stopped", "checkpoint_error", "started", "trace",
                 "simulated_seconds")

    def __init__(self, epoch, seconds, node_seconds, checkpoint_seconds,
                 stopped, checkpoint_error=None, started=None, trace=None,
                 simulated_seconds=None):
        self.epoch = epoch
        self.seconds = seconds              # the epoch group's run
        self.node_seconds = node_seconds    # {node: s until it finished}
        self.checkpoint_seconds = checkpoint_seconds
        self.stopped = stopped              # a stop condition was true
        self.checkpoint_error = checkpoint_error  # message, or None
        self.started = started              # time.time() at the start
        self.trace = trace  # session.last_run_trace of the epoch, if traced
        #: the epoch group's run in virtual seconds, under a deterministic
        #: schedule (what it would take with a machine per node), else None
        self.simulated_seconds = simulated_seconds

    def __repr__(self):
        return (f"EpochReport(epoch={self.epoch}, seconds={self.seconds:.3f}"
                f", stopped={self.stopped})")

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}


class TrainResult:
    """`JobRunner.result`: what the last ``train`` did."""

    def __init__(self):
        self.epochs = []             # EpochReport per epoch run
        self.last_epoch = None
        self.checkpoint_errors = []  # (epoch, message) of unwritten ones
        self.restarts = []           # (epoch resumed from, error message)
        self.resumed_from = None
        #: the EpochReport of the epoch whose group ran and whose
        #: ``on_epoch`` has not returned yet (None: there is none) -- while
        #: its checkpoint is written its ``checkpoint_seconds`` is None.  A
        #: caller stopped in that window (a Ctrl-C) reads the epoch here:
        #: its checkpoint may be complete, and then so should its record be.
        self.unreported = None

    def __repr__(self):
        return (f"TrainResult(last_epoch={self.last_epoch}, "
                f"{len(self.epochs)} epoch(s), "
                f"{len(self.checkpoint_errors)} checkpoint error(s), "
                f"{len(self.restarts)} restart(s))")


class JobRunner:
    """``JobRunner(job, checkpoint_manager=None, resume_from_epoch=None,
    upload_task_group_builder=None, max_restarts=0,
    on_checkpoint_error='warn', on_epoch=None)``.

    ``on_epoch(report)`` is called after every epoch with its
    `EpochReport`; ``result`` holds the `TrainResult` of the last train.
    ``timeout`` bounds every run the runner makes (an epoch, a checkpoint,
    the init group ...) in seconds: a run past it raises `RunTimeoutError`
    -- and with ``max_restarts`` it is recovered like a node death, since
    the late nodes are cancelled, or killed, anyway.
    """

    def __init__(self, job, checkpoint_manager=None, resume_from_epoch=None,
                 upload_task_group_builder=None, max_restarts=0,
                 on_checkpoint_error="warn", on_epoch=None, timeout=None):
        if not isinstance(job, Job):
            raise PlanError(f"JobRunner needs a Job, got {job!r}")
        if on_checkpoint_error not in ("warn", "raise"):
            raise PlanError(f"on_checkpoint_error must be 'warn' or 'raise', "
                            f"got {on_checkpoint_error!r}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts,
                                                            int) \
                or max_restarts < 0:
            raise PlanError(f"max_restarts must be an int >= 0, got "
                            f"{max_restarts!r}")
        check_seconds(timeout, error=PlanError)
        if checkpoint_manager is None and (resume_from_epoch is not None or
                                           max_restarts):
            raise PlanError(
                "resume_from_epoch and max_restarts need a checkpoint_manager"
                " (MultiNodeCheckpointManager(db_prefix)) to load from")
        if resume_from_epoch is not None and (
                isinstance(resume_from_epoch, bool) or
                not isinstance(resume_from_epoch, (int, np.integer)) or
                resume_from_epoch < 0):
            raise PlanError(f"resume_from_epoch must be an epoch number >= 0,"
                            f" got {resume_from_epoch!r}")
        self.job = job
        self.checkpoint_manager = checkpoint_manager
        self.resume_from_epoch = resume_from_epoch
        self.upload_task_group_builder = upload_task_group_builder
        self.max_restarts = max_restarts
        self.on_checkpoint_error = on_checkpoint_error
        self.on_epoch = on_epoch
        self.timeout = timeout
        self.result = TrainResult()

    # -- training -----------------------------------------------------------------

    def _run(self, session, runnable):
        session.run(runnable, timeout=self.timeout)

    def train(self, session):
        """Train to the end; returns the number of the last epoch run."""
        if not self.job.stop_conditions:
            raise PlanError(
                "the job has no stop condition, so training would never end;"
                " add epoch_limiter(job, num_epochs) or "
                "job.add_stop_condition(blob)")
        self._validate(session)
        self.result = result = TrainResult()
        resume = self.resume_from_epoch
        result.resumed_from = resume
        # the last epoch this train() checkpointed: a restart goes back
        # there, never to files another run left in the same directory
        self._saved = resume
        while True:
            try:
                epoch = self._start(session, resume)
                if resume is None or not \
                        self.checkpoint_manager.epoch_is_final(resume):
                    epoch = self._epochs(session, epoch)
                result.last_epoch = epoch
                self._finish(session, epoch)
                return epoch
            except RESTARTABLE as exc:
                if len(result.restarts) >= self.max_restarts:
                    raise
                resume = self._saved
                # the epoch a node died in is run again, reported then
                result.unreported = None
                result.restarts.append((resume, str(exc)))
                log.warning(
                    "%s; restart %d of %d from %s", _what_failed(exc),
                    len(result.restarts), self.max_restarts,
                    "scratch" if resume is None else f"epoch {resume}")

    def _validate(self, session):
        """Refuse, before anything runs or is checkpointed, what would
        fail a run of the job later: each group as the session checks it
        before running it (`Session.validate`), and a fault of the
        session's plan that names a node the job lacks."""
        for name, group in self.job.printable_groups():
            if group.num_registered_tasks():
                try:
                    session.validate(group)
                except PlanError as exc:
                    raise PlanError(f"the job's {name} group: {exc}") \
                        from exc
        check_fault_nodes(session.faults, set(self.job.nodes()) |
                          set(self.job.nodes_to_checkpoint()))

    def _finish(self, session, epoch):
        """After the last epoch: upload, download and exit groups."""
        if self.upload_task_group_builder is not None:
            self._run(session, self.upload_task_group_builder.build(
                epoch, self.checkpoint_manager))
        for group in (self.job.download_group, self.job.exit_group):
            if group.num_registered_tasks():
                self._run(session, group)

    def _start(self, session, resume):
        """Init (or load) and checkpoint epoch 0; the epoch reached."""
        cm = self.checkpoint_manager
        nodes = self.job.nodes_to_checkpoint()
        if resume is None:
            if self.job.init_group.num_registered_tasks():
                self._run(session, self.job.init_group)
            if cm is not None:
                self._run(session, cm.init(nodes))
                self._save(session, 0)
            return 0
        log.info("resuming from epoch %d", resume)
        _check_same_instances(cm, resume, self.job.prototypes())
        missing = cm.nodes_without(resume, nodes)
        if missing:
            raise CheckpointError(
                f"cannot resume from epoch {resume}: node(s) {missing} have "
                f"no checkpoint of it under {cm.db_prefix}; the latest "
                f"complete epoch there is {cm.latest_epoch_on_disk()}"
                f"{getattr(session, 'CHECKPOINT_REACH', '')}")
        _check_same_nodes(cm, resume, nodes)
        try:
            self._run(session, cm.init(nodes, retrieve_from_epoch=resume))
            self._run(session, cm.load(resume))
        except TaskFailedError as exc:
            if exc.op_type not in ("CheckpointBlobNames", "LoadCheckpoint"):
                raise
            # the node found its checkpoint torn or corrupted
            raise CheckpointError(
                f"cannot resume from epoch {resume}: {exc.cause_message}") from exc
        return resume

    def _epochs(self, session, epoch):
        while True:
            epoch += 1
            log.info("epoch %d starting", epoch)
            started, start = time.time(), time.monotonic()
            session.current_epoch = epoch   # for the fault plan's Epoch(k)
            try:
                self._run(session, self.job.epoch_group)
            finally:
                session.current_epoch = None
            seconds = time.monotonic() - start
            node_seconds = dict(session.last_run_seconds)
            simulated = getattr(session, "last_run_simulated_seconds", None)
            trace = dict(session.last_run_trace) if session.trace_steps \
                else None
            stop = any(_truthy(o.fetch()) for o in self.job.stop_conditions)
            report = EpochReport(epoch, seconds, node_seconds, None, stop,
                                 None, started, trace, simulated)
            self.result.unreported = report
            start = time.monotonic()
            report.checkpoint_error = self._save(session, epoch, final=stop)
            report.checkpoint_seconds = time.monotonic() - start
            self.result.epochs.append(report)
            log.info("epoch %d done in %.3f s (%s)%s", epoch, seconds,
                     ", ".join(f"{n} {s:.3f} s" for n, s in
                               sorted(node_seconds.items())),
                     "; stopping" if stop else "")
            if self.on_epoch is not None:
                self.on_epoch(report)
            self.result.unreported = None
            if stop:
                return epoch

    def _save(self, session, epoch, final=False):
        """Checkpoint ``epoch``; the error message if it was not written
        (and training goes on), None if it was."""
        cm = self.checkpoint_manager
        if cm is None:
            return None
        try:
            self._run(session, cm.save(epoch, final=final))
        except TaskFailedError as exc:
            cm.remove_partials(epoch)
            cm.check_directory(epoch)   # moved under the run: say that
            return self._not_saved(epoch, f"node {exc.node!r}: {exc.reason}",
                                   exc)
        except BaseException:
            cm.remove_partials(epoch)  # a node killed while writing
            raise
        unseen = cm.nodes_without(epoch, self.job.nodes_to_checkpoint())
        if unseen:
            return self._not_saved(
                epoch, f"node(s) {unseen} wrote it where this process does "
                f"not see it under {cm.db_prefix!r}"
                f"{getattr(session, 'CHECKPOINT_REACH', '')}")
        cm.report_saved(epoch)
        self._saved = epoch
        return None


    def _not_saved(self, epoch, why, cause=None):
        """A checkpoint of ``epoch`` that is not there: CheckpointError, or
        a warning and its message (``on_checkpoint_error``)."""
        message = f"checkpoint of epoch {epoch} was not written ({why})"
        if self.on_checkpoint_error == "raise":
            raise CheckpointError(message) from cause
        # a warning (training goes on): to the log, and to the caller's code
        log.warning("%s; training goes on", message)
        warnings.warn(f"{message}; training goes on", CheckpointWarning,
                      stacklevel=4)
        self.result.checkpoint_errors.append((epoch, message))
        return message


def _truthy(value):
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return any(_truthy(v) for v in value)
    return bool(np.asarray(value).any())


def _check_same_nodes(cm, epoch, nodes):
    """A `CheckpointError` when the checkpoints of ``epoch`` were written
    by a job with other checkpointed nodes than ``nodes``: resuming would
    train a mix of two jobs (a 2-trainer run's weights, one trainer)."""
    differ = cm.other_job_nodes(epoch, nodes)
    if differ is None:
        return
    written, ours = differ
    gone = sorted(set(written) - set(ours))
    new = sorted(set(ours) - set(written))
    raise CheckpointError(
        f"cannot resume from epoch {epoch}: its checkpoints under "
        f"{cm.db_prefix} are of a job whose nodes are {written}, not this "
        f"job's {ours}"
        + (f" (not in this job: {gone})" if gone else "")
        + (f" (new in this job: {new})" if new else "")
        + "; resume the job that wrote them (the same nodes), or start "
        "over in another directory")


def _check_same_instances(cm, epoch, prototypes):
    """A `CheckpointError` when the checkpoints of ``epoch`` hold another
    number of instances of a prototype of the job than it has now."""
    try:
        names = os.listdir(cm.db_prefix)
    except OSError:
        return   # what is missing is the next check's to say
    for name, count in sorted(prototypes.items()):
        found = {m.group(1) for m in map(re.compile(
            rf"{re.escape(name)}_(\d+)\.{int(epoch)}$").match, names) if m}
        if found and len(found) != count:
            raise CheckpointError(
                f"cannot resume from epoch {epoch}: its checkpoints under "
                f"{cm.db_prefix} hold {len(found)} instance(s) of prototype "
                f"Node({name!r}), but this job has num_instances={count}; "
                f"resume with num_instances={len(found)}, or start over in "
                "another directory")


def _what_failed(exc):
    """One phrase for the log line of a restart."""
    if isinstance(exc, RunTimeoutError):
        return f"node(s) {list(exc.nodes)} timed out"
    return (f"node {exc.node!r} failed "
            f"({exc.signal_name or f'exit {exc.exitcode}'})")

