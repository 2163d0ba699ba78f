"""The public surface is exactly the intended one."""

import localcluster
from localcluster import errors

EXPECTED = {
    "BlobRef", "Net", "ExecutionStep", "execution_step", "to_execution_step",
    "NetBuilder", "ops", "register_op",
    "Cluster", "Node", "WorkspaceType", "TaskGroup", "Task", "TaskOutput",
    "final_output", "SetupNets",
    "Record", "Reader", "Writer", "Dataset", "ReaderWithLimit",
    "ReaderWithTimeLimit", "ReaderWithDelay", "CompositeReader",
    "CounterReader", "Queue", "pipe", "pipe_and_output", "Output",
    "Job", "JobRunner", "epoch_limiter", "EpochReport", "TrainResult",
    "CheckpointManager", "MultiNodeCheckpointManager",
    "UploadTaskGroupBuilder", "MetadataHandler",
    "Session", "LocalSession", "LocalHostScheduler", "Link", "Slowdown",
    "Partition",
    "LocalClusterError", "PlanError", "TaskFailedError", "NodeFailedError",
    "CheckpointError", "CheckpointWarning", "SessionClosedError", "RunTimeoutError",
    "BlobNotFoundError",
    "errors", "printer",
}


def test_public_names_are_exactly_the_intended_ones():
    assert set(localcluster.__all__) == EXPECTED
    for name in EXPECTED:
        assert hasattr(localcluster, name), name


def test_every_error_has_one_root_and_fitting_stdlib_bases():
    for name in errors.__all__:
        cls = getattr(errors, name)
        if name in ("RemoteTraceback", "CheckpointWarning"):
            continue
        assert issubclass(cls, errors.LocalClusterError), name
    assert issubclass(errors.PlanError, ValueError)
    assert issubclass(errors.RunTimeoutError, TimeoutError)
    assert issubclass(errors.BlobNotFoundError, KeyError)
    assert issubclass(errors.CheckpointWarning, Warning)


def test_the_testing_kit_exports_what_its_contract_names():
    import localcluster.testing as kit
    assert set(kit.__all__) == {
        "FaultPlan", "Kill", "Hang", "Delay", "FailCheckpoint", "Epoch",
        "Op", "Step", "Partition", "Link", "Slowdown", "Fired", "Schedule",
        "DeadlockError",
        "ScheduleDivergedError", "check_job", "sessions_agree",
        "resume_equals_uninterrupted", "restart_recovers",
        "schedule_independent", "ALL_CHECKS", "JobCheckFailed", "races",
        "Race", "CheckResult"}
    for name in kit.__all__:
        assert hasattr(kit, name), name
    assert issubclass(kit.JobCheckFailed, AssertionError)
    # check_job returns {check name: CheckResult}, in the order run
    assert [c.__name__ for c in kit.ALL_CHECKS] == [
        "races", "schedule_independent", "sessions_agree",
        "resume_equals_uninterrupted", "restart_recovers"]
    assert issubclass(kit.DeadlockError, errors.LocalClusterError)
    assert kit.DeadlockError is errors.DeadlockError
