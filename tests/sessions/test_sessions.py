"""Session semantics every session kind must honour."""

import numpy as np
import pytest

from localcluster import (BlobNotFoundError, Net, Node, PlanError, Task,
                          TaskGroup, WorkspaceType, final_output, ops)


def _group(workspace_type=None, **writes):
    """A group writing ``{node: (blob, value)}`` on each node."""
    with TaskGroup(workspace_type) as tg:
        for node, (blob, value) in writes.items():
            with Node(node), Task():
                ops.Const(value, blob_out=blob)
    return tg


def test_a_blob_written_on_one_node_is_not_visible_on_another(session):
    session.run(_group(WorkspaceType.GLOBAL, a=("x", 1), b=("y", 2)))
    assert session.has_blob("x", "a") and not session.has_blob("x", "b")
    assert session.has_blob("y", "b") and not session.has_blob("y", "a")
    with pytest.raises(KeyError, match="'x'.*'b'|'b'.*'x'"):
        session.fetch_blob("x", "b")


def test_same_blob_name_on_two_nodes_holds_two_values(session):
    session.run(_group(WorkspaceType.GLOBAL, a=("w", 1.5), b=("w", -2.0)))
    assert session.fetch_blob("w", "a") == 1.5
    assert session.fetch_blob("w", "b") == -2.0


def test_global_blobs_persist_across_runs(session):
    session.run(_group(WorkspaceType.GLOBAL, n=("kept", 3)))
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        with Node("n"), Task():
            ops.Add(["kept", ops.Const(1)], ["kept"])
    session.run(tg)
    session.run(tg)
    assert session.fetch_blob("kept", "n") == 5


def test_private_group_drops_new_blobs_and_keeps_writes_to_existing(session):
    session.feed_blob("weights", np.zeros(3, dtype=np.float32), node="n")
    with TaskGroup(WorkspaceType.PRIVATE) as tg:
        with Node("n"), Task():
            tmp = ops.Const(np.arange(4.0), blob_out="scratch")
            # a write that changes shape and dtype still replaces the blob
            ops.Copy(tmp, ["weights"])
    session.run(tg)
    assert not session.has_blob("scratch", "n")
    np.testing.assert_array_equal(session.fetch_blob("weights", "n"),
                                  np.arange(4.0))
    assert session.fetch_blob("weights", "n").dtype == np.float64


def test_outputs_of_a_private_group_are_captured_before_its_blobs_go(session):
    with TaskGroup() as tg:
        with Node("n"), Task():
            out = final_output(ops.Const(42))
    session.run(tg)
    assert out.fetch() == 42
    assert session.blobs("n") == []


def test_a_group_can_run_many_times(session):
    session.feed_blob("count", np.array(0), node="n")
    with TaskGroup() as tg:
        with Node("n"), Task():
            ops.Add(["count", ops.Const(1)], ["count"])
    for _ in range(5):
        session.run(tg)
    assert session.fetch_blob("count", "n") == 5


def test_runnables_other_than_groups_run_global(session):
    net = Net("init")
    net.ConstantFill([], ["from_net"], value=1.0)
    session.run(net)
    session.run([net])
    with Node("local"):
        task = Task(step=net)
    session.run(task)
    assert session.has_blob("from_net")


def test_workspace_type_argument_makes_a_net_private(session):
    net = Net("scratch")
    net.ConstantFill([], ["temp"], value=1.0)
    session.run(net, workspace_type=WorkspaceType.PRIVATE)
    assert not session.has_blob("temp")


def test_a_group_rejects_a_conflicting_workspace_type(session):
    tg = _group(WorkspaceType.GLOBAL, n=("x", 1))
    with pytest.raises(PlanError, match="GLOBAL"):
        session.run(tg, workspace_type=WorkspaceType.PRIVATE)


def test_feed_then_fetch_round_trips_and_fetch_copies(session):
    value = np.arange(6, dtype=np.int32).reshape(2, 3)
    session.feed_blob("m", value, node="n")
    value[0, 0] = 99  # the session kept its own copy
    got = session.fetch_blob("m", "n")
    np.testing.assert_array_equal(got, np.arange(6).reshape(2, 3))
    assert got.dtype == np.int32
    got[0, 0] = 77  # and handed out a copy
    assert session.fetch_blob("m", "n")[0, 0] == 0


def test_blobs_lists_the_global_workspace_of_a_node(session):
    session.run(_group(WorkspaceType.GLOBAL, n=("b", 1)))
    session.feed_blob("a", 1, node="n")
    assert session.blobs("n") == ["a", "b"]
    assert session.blobs("never_used") == []


def test_has_blob_on_a_node_that_never_ran_is_false(session):
    assert session.has_blob("anything", "nowhere") is False


def test_fetch_of_a_missing_blob_names_node_and_blob(session):
    session.run(_group(WorkspaceType.GLOBAL, n=("b", 1)))
    with pytest.raises(BlobNotFoundError) as err:
        session.fetch_blob("missing", "n")
    assert isinstance(err.value, KeyError)
    assert "missing" in str(err.value) and "'n'" in str(err.value)


def test_tasks_on_one_node_share_its_workspace(session):
    session.feed_blob("hits", np.array(0, dtype=np.int64), node="n")
    session.feed_blob("hits", np.array(0, dtype=np.int64), node="m")
    with TaskGroup() as tg:
        for node in ("n", "n", "n", "m"):
            with Node(node), Task():
                ops.CountUp(["hits"])
    session.run(tg)
    assert session.fetch_blob("hits", "n") == 3
    assert session.fetch_blob("hits", "m") == 1


@pytest.mark.parametrize("value", [
    np.array(7),                                  # 0-d
    np.array(True),
    np.arange(6, dtype=np.int32).reshape(2, 3),
    np.zeros((0, 4), dtype=np.float32),           # empty
    np.linspace(0, 1, 5)[::2],                    # not contiguous
])
def test_outputs_and_fetches_keep_shape_and_dtype(session, value):
    session.feed_blob("v", value, node="n")
    with TaskGroup() as tg:
        with Node("n"), Task():
            out = final_output(ops.Copy("v"))
    session.run(tg)
    for got in (out.fetch(), session.fetch_blob("v", "n")):
        assert got.shape == value.shape and got.dtype == value.dtype
        np.testing.assert_array_equal(got, value)


def test_zero_copy_fetch_is_read_only(session):
    session.feed_blob("w", np.arange(3.0), node="n")
    view = session.fetch_blob("w", "n", copy=False)
    np.testing.assert_array_equal(view, np.arange(3.0))
    with pytest.raises(ValueError):
        view[0] = 5.0


def test_a_finished_net_builder_runs_like_its_step(session):
    from localcluster import NetBuilder
    with NetBuilder() as nb:
        ops.ConstantFill([], ["built"], value=2.0)
    session.run(nb)
    assert session.fetch_blob("built") == 2.0


def test_a_traced_run_records_a_span_per_step_and_node(session):
    from localcluster import Node, Task, TaskGroup, ops
    with TaskGroup() as group:
        for node in ("a", "b"):
            with Node(node), Task(num_instances=2):
                with ops.loop(3):
                    ops.Const(1)
    session.run(group)
    assert session.last_run_trace == {}
    session.trace_steps = True
    session.run(group)
    assert set(session.last_run_trace) == {"a", "b"}
    for node, spans in session.last_run_trace.items():
        names = {name for name, *_ in spans}
        assert any(name.startswith(f"{node}/task") for name in names), names
        assert all(end >= start for *_, start, end in spans)
        threads = {thread for _, _, thread, _, _ in spans}
        assert len(threads) >= 2  # the two instances ran on two threads
    assert set(session.last_run_seconds) == {"a", "b"}
