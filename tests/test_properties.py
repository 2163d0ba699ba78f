"""Property tests: random task groups against a simple model."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from localcluster import Node, Task, TaskGroup, WorkspaceType, ops

from conftest import SESSION_KINDS

NODES = ["n0", "n1", "n2"]

task_spec = st.fixed_dictionaries({
    "node": st.sampled_from(NODES),
    "instances": st.integers(1, 4),
    "iters": st.integers(0, 4),
    "step": st.integers(1, 3),
})
group_spec = st.fixed_dictionaries({
    "tasks": st.lists(task_spec, min_size=1, max_size=5),
    "workspace_type": st.sampled_from([WorkspaceType.PRIVATE,
                                       WorkspaceType.GLOBAL]),
    "runs": st.integers(1, 2),
})


def build(spec):
    """Each task: its instances loop ``iters`` times adding ``step`` to the
    node's fed counter, and each writes a private and a task-level blob."""
    with TaskGroup(spec["workspace_type"]) as tg:
        for i, t in enumerate(spec["tasks"]):
            with Node(t["node"]), Task(num_instances=t["instances"]):
                with ops.task_init():
                    ops.Const(i, blob_out=f"task_{i}")
                with ops.loop(t["iters"]):
                    for _ in range(t["step"]):
                        ops.CountUp(["count"])
                ops.Const(i, blob_out=f"instance_{i}")
    return tg


def model(spec):
    """Final counter per node, and the blobs each node keeps."""
    counts = {n: 0 for n in NODES}
    kept = {n: {"count"} for n in NODES}
    for i, t in enumerate(spec["tasks"]):
        counts[t["node"]] += t["instances"] * t["iters"] * t["step"]
        if spec["workspace_type"] is WorkspaceType.GLOBAL:
            kept[t["node"]].add(f"task_{i}")
            if t["instances"] == 1:  # one instance runs in the task's space
                kept[t["node"]].add(f"instance_{i}")
    return ({n: c * spec["runs"] for n, c in counts.items()}, kept)


# session_factory makes a fresh session per example; that is its purpose.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(group_spec)
def test_random_groups_count_like_the_model_and_keep_only_global_blobs(
        session_factory, spec):
    session = session_factory()
    for node in NODES:
        session.feed_blob("count", np.array(0, dtype=np.int64), node=node)
    tg = build(spec)
    for _ in range(spec["runs"]):
        session.run(tg)
    counts, kept = model(spec)
    for node in NODES:
        assert session.fetch_blob("count", node) == counts[node]
        # instance blobs never outlive their instance; task blobs persist
        # only in a GLOBAL group; nothing crosses nodes
        named = {b for b in session.blobs(node)
                 if b == "count" or b.startswith(("task_", "instance_"))}
        assert named == kept[node]
    session.close()


def run_and_dump(session, spec):
    for node in NODES:
        session.feed_blob("count", np.array(0, dtype=np.int64), node=node)
    tg = build(spec)
    for _ in range(spec["runs"]):
        session.run(tg)
    # The blobs whose value does not depend on how threads interleave (a
    # CountUp's output, the count *before* it, does).
    return {node: {b: session.fetch_blob(b, node) for b in session.blobs(node)
                   if b == "count" or b.startswith(("task_", "instance_"))}
            for node in NODES}


@settings(max_examples=10)
@given(group_spec)
def test_random_groups_give_identical_blobs_under_both_sessions(spec):
    from localcluster import LocalHostScheduler, LocalSession
    with LocalSession() as local:
        expected = run_and_dump(local, spec)
    with LocalHostScheduler() as localhost:
        got = run_and_dump(localhost, spec)
    assert got.keys() == expected.keys()
    for node in NODES:
        assert got[node].keys() == expected[node].keys()
        for name, value in expected[node].items():
            assert got[node][name].dtype == value.dtype, name
            np.testing.assert_array_equal(got[node][name], value)


# -- jobs: a resumed job ends exactly where an uninterrupted one does ---------

job_node_spec = st.fixed_dictionaries({
    "init": st.lists(st.integers(-5, 5), min_size=1, max_size=4),
    # per epoch, in order: w <- w * scale + shift (+ the epoch number)
    "ops": st.lists(st.tuples(st.sampled_from([1, 2, -1]),
                              st.integers(-3, 3), st.booleans()),
                    min_size=1, max_size=3),
    # a dataset of these values read a few records per epoch into `total`
    "data": st.lists(st.integers(0, 9), max_size=12),
    "per_epoch": st.integers(1, 4),
})
job_spec = st.fixed_dictionaries({
    "nodes": st.lists(job_node_spec, min_size=1, max_size=3),
    "epochs": st.integers(1, 4),
})


def _add_to_total(rec):
    ops.Add(["total", rec["v"]], ["total"])


def build_job(spec):
    """The same spec builds the same job, with the same blob names."""
    from localcluster import (Dataset, Job, ReaderWithLimit, epoch_limiter,
                              pipe)
    with Job() as job:
        for i, node_spec in enumerate(spec["nodes"]):
            with Node(f"node_{i}"):
                with job.init_group, Task():
                    ops.Const(np.array(node_spec["init"], dtype=np.int64),
                              name="w")
                    ops.Const(np.array(0), name="epoch_no")
                    ops.Const(np.array([0]), name="total")
                    reader = Dataset(
                        {"v": np.array(node_spec["data"], dtype=np.int64)},
                        name="data").reader()
                with Task():
                    ops.Add(["epoch_no", ops.Const(np.array(1))],
                            ["epoch_no"])
                    for scale, shift, add_epoch in node_spec["ops"]:
                        ops.Scale(["w"], ["w"], scale=scale)
                        ops.Add(["w", ops.Const(np.array(shift))], ["w"])
                        if add_epoch:
                            ops.Add(["w", "epoch_no"], ["w"])
                pipe(ReaderWithLimit(reader, num_iter=node_spec["per_epoch"]),
                     processor=_add_to_total)
        with Node("node_0"):
            epoch_limiter(job, spec["epochs"])
    return job


def job_state(session, spec):
    return [(session.fetch_blob("w", f"node_{i}").tolist(),
             int(session.fetch_blob("epoch_no", f"node_{i}")),
             session.fetch_blob("total", f"node_{i}").tolist())
            for i in range(len(spec["nodes"]))]


@pytest.mark.parametrize("kind", sorted(SESSION_KINDS))
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=job_spec, data=st.data())
def test_a_resumed_job_ends_exactly_where_an_uninterrupted_one_does(
        tmp_path_factory, kind, spec, data):
    from localcluster import JobRunner, MultiNodeCheckpointManager
    prefix = str(tmp_path_factory.mktemp("ckpt"))
    with SESSION_KINDS[kind]() as session:
        last = JobRunner(build_job(spec), MultiNodeCheckpointManager(
            prefix)).train(session)
        expected = job_state(session, spec)
    assert last == spec["epochs"]
    resume = data.draw(st.integers(0, last), label="resume_from_epoch")
    with SESSION_KINDS[kind]() as session:
        assert JobRunner(build_job(spec), MultiNodeCheckpointManager(prefix),
                         resume_from_epoch=resume).train(session) == last
        assert job_state(session, spec) == expected
