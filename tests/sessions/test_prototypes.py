"""Node prototypes under every session: ``Node(name, num_instances=N)``."""

import numpy as np
import pytest
from _protojob import build

from localcluster import (CheckpointError, Cluster, Dataset, JobRunner,
                          MultiNodeCheckpointManager, Node, PlanError, Queue,
                          Task, TaskGroup, WorkspaceType, ops, pipe,
                          printer)


def _indexed(count):
    """A group whose prototype instances each write ``10 * index + N``."""
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        with Node("trainer", num_instances=count), Task() as task:
            ops.Add([ops.Mul([ops.NodeIndex(), ops.Const(np.int64(10))]),
                     ops.NodeCount()], ["mine"])
            out = task.add_output("mine")
        with Node("ps"), Task() as task:
            plain = task.add_output(ops.Add([ops.NodeIndex(),
                                             ops.NodeCount()]))
    return tg, out, plain


def test_each_instance_runs_with_its_own_index_and_the_count(session):
    tg, out, plain = _indexed(4)
    session.run(tg)
    assert [int(v) for v in out.fetch()] == [4, 14, 24, 34]
    for index in range(4):
        assert session.fetch_blob("mine", f"trainer_{index}") == 10 * index + 4
    # a plain node is instance 0 of 1
    assert int(plain.fetch()) == 1
    assert not session.has_blob("mine", "trainer")


def test_a_queue_of_a_prototype_is_shared_by_its_instances(session):
    queue = Queue(2, name="to_ps")
    with TaskGroup() as tg:
        with Node("trainer", num_instances=5), Task():
            writer = queue.writer()
            writer.write_record(ops.net(), {"i": ops.NodeIndex()})
        with Node("ps"), Task() as task:
            ops.ConstantFill([], ["seen"], value=0, dtype="int64")
            ops.ConstantFill([], ["reads"], value=0, dtype="int64")
            with ops.loop(5):
                _, record = queue.reader().read_record(ops.net())
                ops.Add(["seen", ops.Mul([ops.Const(np.int64(10)),
                                          record["i"]])], ["seen"])
                ops.Add(["reads", ops.Const(np.int64(1))], ["reads"])
            seen, reads = task.add_outputs(["seen", "reads"])
    session.run(tg)
    # every instance's record read once: 10 * (0 + 1 + 2 + 3 + 4)
    assert int(seen.fetch()) == 100 and int(reads.fetch()) == 5


def test_a_prototype_reads_a_queue_whose_records_each_reach_one_instance(
        session):
    data = np.arange(40, dtype=np.int64)
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("source"), Task():
            source = Dataset({"v": data}, name="src")
        with Node("worker", num_instances=3), Task():
            ops.ConstantFill([], ["total"], value=0, dtype="int64")
            ops.ConstantFill([], ["count"], value=0, dtype="int64")
    session.run(init)

    def add(record):
        ops.AtomicAdd(["total", ops.ReduceSum([record["v"]])])
        ops.AtomicAdd(["count", ops.Size([record["v"]])])

    with TaskGroup() as tg:
        with Node("source"):
            queue = pipe(source.reader(batch_size=3), capacity=2)
        with Node("worker", num_instances=3):
            pipe(queue, processor=add)
    session.run(tg, timeout=120)
    totals = [int(session.fetch_blob("total", f"worker_{i}"))
              for i in range(3)]
    counts = [int(session.fetch_blob("count", f"worker_{i}"))
              for i in range(3)]
    assert sum(totals) == int(data.sum()) and sum(counts) == len(data)


def test_each_instance_checkpoints_its_own_file_and_resumes_from_it(
        session, tmp_path):
    JobRunner(build(3), MultiNodeCheckpointManager(str(tmp_path))).train(
        session)
    # instance i starts at i and adds 1 per epoch; the ps sums them all
    assert [float(session.fetch_blob("w", f"trainer_{i}"))
            for i in range(3)] == [2.0, 3.0, 4.0]
    assert float(session.fetch_blob("tot", "ps")) == (1 + 2 + 3) + (2 + 3 + 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{node}.{epoch}" for node in ("ps", "trainer_0", "trainer_1",
                                       "trainer_2") for epoch in range(3)]


def test_resuming_with_another_number_of_instances_is_refused(
        session, tmp_path):
    JobRunner(build(3), MultiNodeCheckpointManager(str(tmp_path))).train(
        session)
    for count in (2, 4):
        with pytest.raises(CheckpointError) as err:
            JobRunner(build(count), MultiNodeCheckpointManager(str(tmp_path)),
                      resume_from_epoch=1).train(session)
        message = str(err.value)
        assert "Node('trainer')" in message
        assert "3 instance(s)" in message
        assert f"num_instances={count}" in message


def test_a_prototype_is_built_once_and_printed_once_with_its_count():
    with Cluster() as cluster:
        job = build(1000)
        assert cluster.nodes() == ["trainer", "ps"]
        assert cluster.instances()[:2] == ["trainer_0", "trainer_1"]
        assert len(cluster.instances()) == 1001
    assert len(job.init_group.tasks()) == 3  # not one per instance
    text = printer.to_string(job)
    assert text.count("node trainer (prototype: 1000 instances "
                      "trainer_0..trainer_999)") == 2
    assert "trainer_5" not in text
    assert job.nodes()[:2] == ["trainer_0", "trainer_1"]
    assert len(job.nodes_to_checkpoint()) == 1001


def test_a_node_named_like_an_instance_of_a_prototype_is_refused(session):
    with TaskGroup() as tg:
        with Node("trainer", num_instances=2), Task():
            ops.Const(1, blob_out="x")
        with Node("trainer_1"), Task():
            ops.Const(2, blob_out="x")
    with pytest.raises(PlanError, match="'trainer_1'.*prototype"):
        session.run(tg)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_num_instances_must_be_a_positive_int(bad):
    with pytest.raises(PlanError, match="num_instances must be an int"):
        Node("trainer", num_instances=bad)


def test_cpus_as_lists_spread_over_the_instances():
    from localcluster.plan.instances import expand_plans
    with TaskGroup() as tg:
        with Node("t", num_instances=3, cpus=[[0], [0, 1]]), Task():
            ops.Const(1, blob_out="x")
    plans = expand_plans(tg.node_plans())
    assert [p.node_kwargs["cpus"] for p in plans] == [[0], [0, 1], [0]]
    assert all("num_instances" not in p.node_kwargs for p in plans)
    with pytest.raises(PlanError, match="list of such lists"):
        Node("u", num_instances=2, cpus=[[0], "x"])
    with pytest.raises(PlanError, match="cpus must be a non-empty list"):
        Node("v", cpus=[[0], [1]])   # lists of lists need a prototype


def test_fetching_from_the_prototype_itself_names_its_instances(session):
    tg, _, _ = _indexed(2)
    session.run(tg)
    with pytest.raises(KeyError, match="trainer_0 .. trainer_1"):
        session.fetch_blob("mine", "trainer")

