"""Property tests: random task groups against a simple model."""

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from localcluster import Node, Task, TaskGroup, WorkspaceType, ops

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
