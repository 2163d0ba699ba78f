"""Node prototypes and the options that name nodes: ``--cpus`` patterns
and CPU lists, fault plans, conditions and logs take instance names."""

import os

import numpy as np
import psutil
import pytest
from _protojob import build

from localcluster import (Cluster, JobRunner, Link, LocalHostScheduler,
                          MultiNodeCheckpointManager)
from localcluster.cli.cpus import apply_cpus
from localcluster.testing import Epoch, FaultPlan, Kill

CPUS = sorted(os.sched_getaffinity(0))


def _affinity(session, node):
    return sorted(psutil.Process(session.node_pids()[node]).cpu_affinity())


@pytest.mark.skipif(len(CPUS) < 2, reason="two CPU sets need two CPUs")
def test_cpus_patterns_pin_each_instance_of_a_prototype(tmp_path):
    first, last = CPUS[0], CPUS[-1]
    with Cluster():   # its CPU lists stay out of the other tests' jobs
        job = build()
        chosen = apply_cpus(job, [("trainer_*", [first]),
                                  ("trainer_2", [last])])
    assert chosen == {"trainer_0": [first], "trainer_1": [first],
                      "trainer_2": [last]}
    with LocalHostScheduler() as session:
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path))).train(
            session)
        assert [_affinity(session, f"trainer_{i}") for i in range(3)] == [
            [first], [first], [last]]
        assert _affinity(session, "ps") == CPUS


@pytest.mark.skipif(len(CPUS) < 2, reason="two CPU sets need two CPUs")
def test_cpus_as_a_list_of_lists_spreads_the_instances(tmp_path):
    first, last = CPUS[0], CPUS[-1]
    with Cluster():   # its CPU lists stay out of the other tests' jobs
        job = build(count=3, cpus=[[first], [last]])
    with LocalHostScheduler() as session:
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path))).train(
            session)
        assert [_affinity(session, f"trainer_{i}") for i in range(3)] == [
            [first], [last], [first]]


def test_a_killed_instance_is_restarted_and_the_job_ends_as_uninterrupted(
        tmp_path, session_factory):
    with session_factory() as session:
        JobRunner(build(epochs=3), MultiNodeCheckpointManager(
            str(tmp_path / "a"))).train(session)
        expected = float(session.fetch_blob("tot", "ps"))
    faults = FaultPlan(Kill("trainer_1", at=Epoch(2)))
    with session_factory(faults=faults) as session:
        JobRunner(build(epochs=3), MultiNodeCheckpointManager(
            str(tmp_path / "b")), max_restarts=1).train(session)
        assert float(session.fetch_blob("tot", "ps")) == expected
        assert [f.node for f in faults.fired()] == ["trainer_1"]


def test_conditions_and_logs_name_the_instances(tmp_path):
    job = build()
    links = [Link("trainer_*", "ps", latency=0.001)]
    with LocalHostScheduler(conditions=links, log_dir=tmp_path / "logs",
                            log_echo=False) as session:
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path / "c"))).train(
            session)
        assert float(session.fetch_blob("tot", "ps")) == 15.0
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["ps.log", "trainer_0.log", "trainer_1.log",
                    "trainer_2.log"]


def test_a_fault_naming_the_prototype_rather_than_an_instance_is_refused(
        tmp_path):
    faults = FaultPlan(Kill("trainer", at=Epoch(1)))
    with LocalHostScheduler(faults=faults) as session:
        with pytest.raises(Exception, match="trainer_0"):
            JobRunner(build(), MultiNodeCheckpointManager(
                str(tmp_path))).train(session)


def test_a_checkpoint_lists_a_prototypes_instances_in_one_entry(tmp_path):
    from localcluster import LocalSession
    from localcluster.checkpoint.fileformat import read_manifest
    manager = MultiNodeCheckpointManager(str(tmp_path))
    with LocalSession() as session:
        JobRunner(build(count=200, epochs=1), manager).train(session)
    manifest = read_manifest(str(tmp_path / "trainer_7.1"), node="trainer_7",
                             epoch=1)
    assert sorted(manifest["job_nodes"], key=str) == [["trainer", 200], "ps"]
    # and a manager that reads them back knows every node of the job
    fresh = MultiNodeCheckpointManager(str(tmp_path))
    assert fresh.get_resume_from_epoch_id() == 1
    assert len(fresh._nodes_for_files()) == 201
    (tmp_path / "trainer_150.1").unlink()
    assert MultiNodeCheckpointManager(
        str(tmp_path)).get_resume_from_epoch_id() == 0


def test_a_manager_given_the_prototype_checkpoints_each_instance(tmp_path):
    from localcluster import Cluster, LocalSession
    with Cluster() as cluster:
        job = build(count=3, epochs=1, env={"A": "1"})
        manager = MultiNodeCheckpointManager(str(tmp_path))
        with LocalSession() as session:
            JobRunner(job, manager).train(session)
            session.run(manager.init(["trainer", "ps"]))
            session.run(manager.save(5))
        assert sorted(p.name for p in tmp_path.glob("*.5")) == [
            "ps.5", "trainer_0.5", "trainer_1.5", "trainer_2.5"]
        # the checkpoint tasks on the instances did not make them nodes of
        # their own: the cluster knows the prototype, and each instance's
        # options are the prototype's
        assert cluster.nodes() == ["trainer", "ps"]
        assert cluster.kwargs_of("trainer_2") == {"env": {"A": "1"}}


def _env_value():
    return np.array(float(os.environ.get("LC_PROTO_TEST", "0")))


def test_an_instance_fed_before_it_ran_starts_with_its_prototypes_options():
    from localcluster import Cluster, Node, Task, TaskGroup, ops
    with Cluster(), LocalHostScheduler() as session:
        Node("trainer", num_instances=2, env={"LC_PROTO_TEST": "7"})
        session.feed_blob("x", [1, 2], node="trainer_1")
        pid = session.node_pids()["trainer_1"]
        with TaskGroup() as tg, Node("trainer_1"), Task() as task:
            ops.Python(_env_value)([], ["env"])
            out = task.add_output("env")
        session.run(tg)
        assert float(out.fetch()) == 7.0
        assert session.node_pids()["trainer_1"] == pid   # not restarted
