"""A node that hangs, or is killed by any signal, is recovered like a dead
one: `JobRunner(timeout=...)` bounds every run, and with ``max_restarts``
a timed-out run (its hung node killed) restarts from the last checkpoint;
a node ends on a signal's default action, whatever handlers its master
installed, so the master sees a `NodeFailedError` it can recover from."""

import os
import signal
import time

import numpy as np
import pytest

from localcluster import (Job, JobRunner, LocalHostScheduler,
                          MultiNodeCheckpointManager, Node, NodeFailedError,
                          RunTimeoutError, Task, epoch_limiter, ops)

NODES = ["trainer_0", "trainer_1"]


def misbehave_once(epoch, marker, bad_epoch, how):
    """In epoch ``bad_epoch``, once (the marker file remembers), hang or
    send this node process a signal."""
    path = str(marker)
    if int(epoch) != int(bad_epoch) or os.path.exists(path):
        return
    open(path, "w").close()
    if str(how) == "hang":
        time.sleep(3600)
    else:
        os.kill(os.getpid(), getattr(signal, str(how)))
        time.sleep(5)  # the signal ends the process before this does


def build_job(marker, bad_epoch, how, num_epochs=4):
    with Job() as job:
        for i, node in enumerate(NODES):
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.full(3, float(i + 1)), name="w")
                    ops.Const(np.array(0), name="epoch_no")
                with Task():
                    ops.Add(["epoch_no", ops.Const(np.array(1))],
                            ["epoch_no"])
                    ops.Scale(["w"], ["w"], scale=1.5)
                    if node == "trainer_1":
                        ops.Python(misbehave_once)(
                            ["epoch_no", ops.Const(np.array(str(marker))),
                             ops.Const(np.array(bad_epoch)),
                             ops.Const(np.array(how))], [])
        with Node(NODES[0]):
            epoch_limiter(job, num_epochs)
    return job


def final_state(session):
    return {node: (session.fetch_blob("w", node).tolist(),
                   int(session.fetch_blob("epoch_no", node)))
            for node in NODES}


@pytest.fixture
def uninterrupted(tmp_path):
    marker = tmp_path / "never"
    marker.touch()
    with LocalHostScheduler() as session:
        JobRunner(build_job(marker, 2, "hang"),
                  MultiNodeCheckpointManager(str(tmp_path / "u"))).train(
            session)
        return final_state(session)


def test_a_hung_node_is_killed_and_recovered_with_max_restarts(
        tmp_path, uninterrupted):
    marker = tmp_path / "hung"
    with LocalHostScheduler() as session:
        runner = JobRunner(build_job(marker, 2, "hang"),
                           MultiNodeCheckpointManager(str(tmp_path / "r")),
                           max_restarts=1, timeout=2)
        assert runner.train(session) == 4
        assert marker.exists(), "the node never hung: the test tested nothing"
        assert [epoch for epoch, _ in runner.result.restarts] == [1]
        assert "trainer_1" in runner.result.restarts[0][1]
        assert final_state(session) == uninterrupted


def test_without_restarts_a_hung_node_is_a_timeout_naming_it(tmp_path):
    with LocalHostScheduler() as session:
        runner = JobRunner(build_job(tmp_path / "hung", 2, "hang"),
                           MultiNodeCheckpointManager(str(tmp_path / "r")),
                           timeout=2)
        with pytest.raises(RunTimeoutError) as info:
            runner.train(session)
    assert info.value.nodes == ("trainer_1",)
    assert info.value.killed == ("trainer_1",)


def raise_in_master(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "SIGUSR2"])
def test_a_node_killed_by_any_signal_is_a_node_failure_restarts_recover(
        tmp_path, uninterrupted, how):
    # the command line's handlers, installed in the master before nodes fork
    previous = {s: signal.signal(s, raise_in_master)
                for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with LocalHostScheduler() as session:
            job = build_job(tmp_path / "signalled", 2, how)
            with pytest.raises(NodeFailedError, match=f"trainer_1.*{how}"):
                JobRunner(job, MultiNodeCheckpointManager(
                    str(tmp_path / "a"))).train(session)
        (tmp_path / "signalled").unlink()
        with LocalHostScheduler() as session:
            runner = JobRunner(build_job(tmp_path / "signalled", 2, how),
                               MultiNodeCheckpointManager(
                                   str(tmp_path / "b")), max_restarts=1)
            assert runner.train(session) == 4
            assert final_state(session) == uninterrupted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
