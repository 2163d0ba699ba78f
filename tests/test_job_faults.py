"""Faults during training under LocalHostScheduler: a node killed mid-epoch
is recovered from the last checkpoint; a node killed while writing its
checkpoint leaves the previous epoch loadable and nothing half-written."""

import os
import signal
import threading
import time

import numpy as np
import pytest

from localcluster import (Job, JobRunner, LocalHostScheduler,
                          MultiNodeCheckpointManager, Node, NodeFailedError,
                          Task, epoch_limiter, ops)

NODES = ["trainer_0", "trainer_1"]


def die_once_in_epoch(epoch, marker, kill_epoch):
    """Kill this node process in epoch ``kill_epoch`` -- once: the marker
    file remembers it across the restart (marker "always": every time)."""
    path = str(marker)
    if int(epoch) == int(kill_epoch) and not os.path.exists(path):
        if path != "always":
            open(path, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def build_job(marker, kill_epoch, num_epochs=5, big=0):
    """Each node: w <- w * 1.5 + epoch, with a kill in the middle of the
    epoch's work on trainer_1."""
    with Job() as job:
        for i, node in enumerate(NODES):
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.full(4, float(i + 1)), name="w")
                    ops.Const(np.array(0), name="epoch_no")
                    ops.Const(np.array(str(marker)), name="marker")
                    ops.Const(np.array(kill_epoch), name="kill_epoch")
                    if big:
                        ops.ConstantFill([], ["big"], shape=[big], value=1.0)
                with Task():
                    ops.Add(["epoch_no", ops.Const(np.array(1))],
                            ["epoch_no"])
                    ops.Scale(["w"], ["w"], scale=1.5)
                    if node == "trainer_1":
                        ops.Python(die_once_in_epoch)(
                            ["epoch_no", "marker", "kill_epoch"], [])
                    ops.Add(["w", ops.Cast(["epoch_no"], to="float64")],
                            ["w"])
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
    marker.touch()  # present: nobody dies
    with LocalHostScheduler() as session:
        JobRunner(build_job(marker, 3),
                  MultiNodeCheckpointManager(str(tmp_path / "u"))).train(
            session)
        return final_state(session)


def test_a_node_killed_mid_epoch_is_recovered_exactly(tmp_path, uninterrupted):
    marker = tmp_path / "died"
    with LocalHostScheduler() as session:
        runner = JobRunner(build_job(marker, 3),
                           MultiNodeCheckpointManager(str(tmp_path / "r")),
                           max_restarts=1)
        assert runner.train(session) == 5
        assert marker.exists(), "the node never died: the test tested nothing"
        assert [epoch for epoch, _ in runner.result.restarts] == [2]
        assert "trainer_1" in runner.result.restarts[0][1]
        assert final_state(session) == uninterrupted


def test_without_restarts_the_node_failure_is_raised(tmp_path):
    with LocalHostScheduler() as session:
        runner = JobRunner(build_job(tmp_path / "died", 2),
                           MultiNodeCheckpointManager(str(tmp_path / "r")))
        with pytest.raises(NodeFailedError, match="trainer_1.*SIGKILL"):
            runner.train(session)


def test_recovery_gives_up_after_max_restarts(tmp_path):
    with LocalHostScheduler() as session:
        runner = JobRunner(build_job("always", 2),
                           MultiNodeCheckpointManager(str(tmp_path / "r")),
                           max_restarts=2)
        with pytest.raises(NodeFailedError, match="trainer_1"):
            runner.train(session)
    assert [epoch for epoch, _ in runner.result.restarts] == [1, 1]


def _kill_when_writing(session, directory, name, done, killed):
    """Kill the node writing ``<directory>/<name>`` while it writes."""
    node = name.split(".")[0]
    deadline = time.monotonic() + 60
    while not done.is_set() and time.monotonic() < deadline:
        if any(f.startswith(name + ".partial-")
               for f in os.listdir(directory)):
            os.kill(session.node_pids()[node], signal.SIGKILL)
            killed.set()
            return
        time.sleep(0.0005)


def test_a_node_killed_while_writing_its_checkpoint_tears_nothing(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    with LocalHostScheduler() as session:
        job = build_job(tmp_path / "never", 99, big=8 << 20)  # 64 MiB
        manager = MultiNodeCheckpointManager(str(directory))
        done, killed = threading.Event(), threading.Event()
        watcher = threading.Thread(target=_kill_when_writing, args=(
            session, str(directory), "trainer_0.2", done, killed))
        watcher.start()
        try:
            with pytest.raises(NodeFailedError, match="trainer_0"):
                JobRunner(job, manager).train(session)
        finally:
            done.set()
            watcher.join(10)
        assert killed.is_set()
    # the torn epoch is not there, and resuming skips it
    assert not os.path.exists(manager.get_ckpt_db_name("trainer_0", 2))
    assert manager.get_resume_from_epoch_id() == 1
    assert not [f for f in os.listdir(directory) if "partial" in f]
    # the previous epoch loads in a fresh session
    with LocalHostScheduler() as fresh:
        manager.init(NODES)
        fresh.run(manager.load(1))
        assert int(fresh.fetch_blob("epoch_no", "trainer_1")) == 1


# -- restarts: from what this run saved, and wherever a node dies -------------

def test_a_restart_ignores_checkpoints_an_earlier_run_left(tmp_path,
                                                          uninterrupted):
    shared = str(tmp_path / "shared")
    never = tmp_path / "never"
    never.touch()
    with LocalHostScheduler() as session:  # an earlier, longer run
        JobRunner(build_job(never, 99, num_epochs=8),
                  MultiNodeCheckpointManager(shared)).train(session)
    with LocalHostScheduler() as session:
        runner = JobRunner(build_job(tmp_path / "died", 3),
                           MultiNodeCheckpointManager(shared),
                           max_restarts=1)
        assert runner.train(session) == 5
        assert [epoch for epoch, _ in runner.result.restarts] == [2]
        assert final_state(session) == uninterrupted


def test_a_node_dead_while_idle_is_restarted_not_quietly_emptied(tmp_path):
    """B is only in the init group; it dies while A runs an epoch."""
    with Job() as job:
        with Node("A"):
            with job.init_group, Task():
                ops.Const(np.array(1.0), name="w")
            with Task():
                ops.Scale(["w"], ["w"], scale=2.0)
                ops.Sleep([], seconds=0.2)
            epoch_limiter(job, 3)
        with Node("B"), job.init_group, Task():
            ops.Const(np.array(5.0), name="b")
    with LocalHostScheduler() as session:
        def kill_b(report):
            if report.epoch == 1:
                os.kill(session.node_pids()["B"], signal.SIGKILL)

        runner = JobRunner(job, MultiNodeCheckpointManager(
            str(tmp_path)), max_restarts=1, on_epoch=kill_b)
        assert runner.train(session) == 3
        assert [epoch for epoch, _ in runner.result.restarts] == [1]
        assert "'B'" in runner.result.restarts[0][1]
        assert not runner.result.checkpoint_errors
        assert float(session.fetch_blob("b", "B")) == 5.0
        assert float(session.fetch_blob("w", "A")) == 8.0


def test_a_node_dying_in_the_download_group_is_restarted(tmp_path):
    marker = tmp_path / "died"
    with Job() as job:
        for i, node in enumerate(NODES):
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.full(4, float(i + 1)), name="w")
                with Task():
                    ops.Scale(["w"], ["w"], scale=1.5)
                with job.download_group, Task():
                    if node == "trainer_1":
                        ops.Python(die_once_in_epoch)(
                            [ops.Const(np.array(0)),
                             ops.Const(np.array(str(marker))),
                             ops.Const(np.array(0))], [])
                    ops.Copy(["w"], ["downloaded"])
        with Node(NODES[0]):
            epoch_limiter(job, 3)
    with LocalHostScheduler() as session:
        runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path)),
                           max_restarts=1)
        assert runner.train(session) == 3
        assert marker.exists()
        assert [epoch for epoch, _ in runner.result.restarts] == [3]
        assert session.fetch_blob("downloaded", "trainer_1").tolist() == \
            [2 * 1.5 ** 3] * 4
