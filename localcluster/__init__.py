"""localcluster: run a distributed, epoch-based job on one machine.

Describe the job with the job model (Nodes, TaskGroups of Tasks whose
steps are nets of numpy operators) and run it with `LocalSession`
(in-process) or `LocalHostScheduler` (one OS process per node, workspaces
in shared memory) -- see README.md and the public API below.
"""

import sys as _sys

if _sys.argv[:1] == ["-m"] and "localcluster.run" in _sys.orig_argv:
    # python -m localcluster.run: a signal while the package imports is
    # noted for the command line (which stops with its exit status), not
    # a traceback from inside an import
    from .cli.signals import STOP as _STOP
    _STOP.install()

from . import errors, printer  # noqa: E402 - after the guard above
from .errors import (BlobNotFoundError, CheckpointError, CheckpointWarning,
                     LocalClusterError,
                     NodeFailedError, PlanError, RunTimeoutError,
                     SessionClosedError, TaskFailedError)
from .checkpoint.manager import (CheckpointManager, MetadataHandler,
                                 MultiNodeCheckpointManager,
                                 UploadTaskGroupBuilder)
from .dataio import (CompositeReader, CounterReader, Dataset, Reader,
                     ReaderWithDelay, ReaderWithLimit, ReaderWithTimeLimit,
                     Record, Writer)
from .job import EpochReport, Job, JobRunner, TrainResult, epoch_limiter
from .kernels import register_op
from .pipeline import Output, pipe, pipe_and_output
from .queues import Queue
from .plan.conditions import Link, Slowdown
from .plan.faults import Partition
from .plan import (BlobRef, ExecutionStep, Net, NetBuilder, SetupNets,
                   execution_step, ops, to_execution_step)
from .sessions import LocalHostScheduler, LocalSession, Session
from .task import (Cluster, Node, Task, TaskGroup, TaskOutput, WorkspaceType,
                   final_output)

__version__ = "0.1.0"

__all__ = [
    # plans
    "BlobRef", "Net", "ExecutionStep", "execution_step", "to_execution_step",
    "NetBuilder", "ops", "register_op",
    # task model
    "Cluster", "Node", "WorkspaceType", "TaskGroup", "Task", "TaskOutput",
    "final_output", "SetupNets",
    # data pipelines
    "Record", "Reader", "Writer", "Dataset", "ReaderWithLimit",
    "ReaderWithTimeLimit", "ReaderWithDelay", "CompositeReader",
    "CounterReader", "Queue", "pipe", "pipe_and_output", "Output",
    # jobs and checkpoints
    "Job", "JobRunner", "epoch_limiter", "EpochReport", "TrainResult",
    "CheckpointManager", "MultiNodeCheckpointManager",
    "UploadTaskGroupBuilder", "MetadataHandler",
    # sessions and cluster conditions
    "Session", "LocalSession", "LocalHostScheduler", "Link", "Slowdown",
    "Partition",
    # errors
    "LocalClusterError", "PlanError", "TaskFailedError", "NodeFailedError",
    "CheckpointError", "CheckpointWarning", "SessionClosedError", "RunTimeoutError",
    "BlobNotFoundError",
    # modules
    "errors", "printer",
]


def __getattr__(name):
    """``localcluster.RaySession`` imports Ray only when asked for (an
    ImportError naming ``pip install 'localcluster[ray]'`` without it)."""
    if name == "RaySession":
        from .sessions.ray import RaySession
        return RaySession
    raise AttributeError(f"module 'localcluster' has no attribute {name!r}")
