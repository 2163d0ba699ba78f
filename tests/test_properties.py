"""The project's own properties, on the testing kit users get: drawn task
groups and jobs (`localcluster.testing.strategies`), fault plans and the
job checks.  Each test's name states its invariant; the autouse leak
fixture (conftest) asserts after every one that nothing is left behind.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from localcluster import (JobRunner, LocalSession,
                          MultiNodeCheckpointManager, Node, Task, TaskGroup,
                          WorkspaceType, ops)
from localcluster.testing import (Epoch, Kill, restart_recovers,
                                  resume_equals_uninterrupted, sessions_agree)
from localcluster.testing.strategies import jobs, schedules, task_groups

from conftest import SESSION_KINDS



def fresh(**kwargs):
    """Settings of a property that takes a fresh session per example from
    session_factory (what that fixture is for)."""
    return settings(suppress_health_check=[
        HealthCheck.function_scoped_fixture], deadline=None, **kwargs)


def assert_blobs(session, expected):
    for node, blobs in expected.items():
        for name, value in blobs.items():
            got = session.fetch_blob(name, node)
            assert got.dtype == value.dtype and got.shape == value.shape, \
                (node, name)
            np.testing.assert_array_equal(got, value, err_msg=f"{node}/{name}")


# -- isolation between nodes --------------------------------------------------

@fresh(max_examples=10)
@given(drawn=task_groups())
def test_each_node_holds_what_the_model_puts_there_and_none_of_another_nodes(
        session_factory, drawn):
    with session_factory() as session:   # one per example
        session.run(drawn.build())
        assert_blobs(session, drawn.expected)
        for node, blobs in drawn.expected.items():
            others = {b for n, bs in drawn.expected.items() if n != node
                      for b in bs} - set(blobs)
            assert not others & set(session.blobs(node)), node


@settings(max_examples=10, deadline=None)
@given(drawn=task_groups(), seed=schedules())
def test_every_schedule_gives_a_race_free_group_the_models_values(drawn,
                                                                   seed):
    with LocalSession(schedule=seed) as session:
        session.run(drawn.build())
        assert_blobs(session, drawn.expected)


# -- GLOBAL persistence, PRIVATE discard --------------------------------------

NODES = ["n0", "n1", "n2"]
persist_spec = st.fixed_dictionaries({
    "tasks": st.lists(st.fixed_dictionaries({
        "node": st.sampled_from(NODES), "instances": st.integers(1, 4),
        "iters": st.integers(0, 4), "step": st.integers(1, 3)}),
        min_size=1, max_size=5),
    "workspace_type": st.sampled_from([WorkspaceType.PRIVATE,
                                       WorkspaceType.GLOBAL]),
    "runs": st.integers(1, 2),
})


def build_persist(spec):
    """Each task: its instances count up the node's fed counter; each
    writes a task-level blob (task_init) and an instance-level one."""
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


@fresh()
@given(spec=persist_spec)
def test_global_groups_keep_task_blobs_private_groups_and_instances_drop_them(
        session_factory, spec):
    with session_factory() as session:   # one per example
        for node in NODES:
            session.feed_blob("count", np.array(0, dtype=np.int64), node=node)
        group = build_persist(spec)
        for _ in range(spec["runs"]):
            session.run(group)
        for node in NODES:
            mine = [(i, t) for i, t in enumerate(spec["tasks"])
                    if t["node"] == node]
            count = sum(t["instances"] * t["iters"] * t["step"]
                        for _, t in mine)
            assert session.fetch_blob("count", node) == count * spec["runs"]
            kept = {"count"}
            if spec["workspace_type"] is WorkspaceType.GLOBAL:
                kept |= {f"task_{i}" for i, _ in mine}
                # one instance runs in the task's own workspace
                kept |= {f"instance_{i}" for i, t in mine
                         if t["instances"] == 1}
            named = {b for b in session.blobs(node)
                     if b == "count" or b.startswith(("task_", "instance_"))}
            assert named == kept


# -- setup and exit nets: once per scope, in order ----------------------------

setup_spec = st.lists(st.fixed_dictionaries({
    "node": st.sampled_from(NODES[:2]), "instances": st.integers(1, 3),
    "iters": st.integers(0, 3)}), min_size=1, max_size=4)


def build_setup(spec):
    """Counters of how often each block ran, and copies of the counters of
    the phase before it, taken when it runs: in order, those copies show
    the phase before complete."""
    firsts = {}
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        for i, t in enumerate(spec):
            with Node(t["node"]), Task(num_instances=t["instances"]):
                if t["node"] not in firsts:
                    firsts[t["node"]] = i
                    with ops.local_init():
                        ops.CountUp(["n_local_init"])
                    with ops.local_exit():
                        for j, u in enumerate(spec):
                            if u["node"] == t["node"]:
                                ops.Copy([f"n_task_exit_{j}"],
                                         [f"task_exit_{j}_before_local_exit"])
                        ops.CountUp(["n_local_exit"])
                with ops.task_init():
                    ops.Copy(["n_local_init"],
                             [f"local_init_before_task_init_{i}"])
                    ops.CountUp([f"n_task_init_{i}"])
                with ops.task_instance_init():
                    ops.AtomicAdd([f"task_init_before_instances_{i}",
                                   f"n_task_init_{i}"], [])
                    ops.CountUp([f"n_instance_init_{i}"])
                with ops.loop(t["iters"]):
                    ops.CountUp([f"n_body_{i}"])
                with ops.task_instance_exit():
                    ops.CountUp([f"n_instance_exit_{i}"])
                with ops.task_exit():
                    ops.Copy([f"n_body_{i}"], [f"body_before_task_exit_{i}"])
                    ops.Copy([f"n_instance_exit_{i}"],
                             [f"instance_exits_before_task_exit_{i}"])
                    ops.CountUp([f"n_task_exit_{i}"])
    return tg


def setup_counters(spec):
    """{node: [counter blob, ...]} to feed as 0 before the run."""
    out = {n: ["n_local_init", "n_local_exit"] for n in
           {t["node"] for t in spec}}
    for i, t in enumerate(spec):
        out[t["node"]] += [f"n_task_init_{i}", f"n_instance_init_{i}",
                           f"n_body_{i}", f"n_instance_exit_{i}",
                           f"n_task_exit_{i}",
                           f"task_init_before_instances_{i}"]
    return out


@fresh(max_examples=15)
@given(spec=setup_spec)
def test_setup_and_exit_nets_run_once_per_scope_in_order(session_factory,
                                                         spec):
    with session_factory() as session:   # one per example
        for node, names in setup_counters(spec).items():
            for name in names:
                session.feed_blob(name, np.array(0, dtype=np.int64), node=node)
        session.run(build_setup(spec))

        def value(name, node):
            return int(session.fetch_blob(name, node))

        for node in {t["node"] for t in spec}:
            assert value("n_local_init", node) == 1
            assert value("n_local_exit", node) == 1
        for i, t in enumerate(spec):
            node, n = t["node"], t["instances"]
            assert value(f"n_task_init_{i}", node) == 1
            assert value(f"n_task_exit_{i}", node) == 1
            assert value(f"n_instance_init_{i}", node) == n
            assert value(f"n_instance_exit_{i}", node) == n
            assert value(f"n_body_{i}", node) == n * t["iters"]
            # order: local init < task init < instance inits < bodies <
            # instance exits < task exit < local exit
            assert value(f"local_init_before_task_init_{i}", node) == 1
            assert value(f"task_init_before_instances_{i}", node) == n
            assert value(f"body_before_task_exit_{i}", node) == n * t["iters"]
            assert value(f"instance_exits_before_task_exit_{i}", node) == n
            assert value(f"task_exit_{i}_before_local_exit", node) == 1


# -- report steps: at least once, after their tasks ---------------------------

@fresh(max_examples=10)
@given(iters=st.integers(0, 30), interval_ms=st.integers(1, 20))
def test_a_reporter_runs_at_least_once_after_its_task_and_sees_its_end(
        session_factory, iters, interval_ms):
    with session_factory() as session:   # one per example
        session.feed_blob("n", np.array(0, dtype=np.int64), node="r")
        session.feed_blob("reports", np.array(0, dtype=np.int64), node="r")
        with TaskGroup(WorkspaceType.GLOBAL) as group:
            with Node("r"), Task():
                with ops.loop(iters):
                    ops.CountUp(["n"])
                with ops.task_reporter(interval_ms=interval_ms):
                    ops.Copy(["n"], ["reported"])
                    ops.CountUp(["reports"])
        session.run(group)
        assert int(session.fetch_blob("reports", "r")) >= 1
        assert int(session.fetch_blob("reported", "r")) == iters


# -- jobs: stop conditions, sessions, resume, restarts ------------------------

@pytest.mark.parametrize("kind", sorted(SESSION_KINDS))
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=jobs())
def test_a_stop_condition_ends_training_after_exactly_its_epoch(
        tmp_path_factory, kind, drawn):
    directory = str(tmp_path_factory.mktemp("ckpt"))
    with SESSION_KINDS[kind]() as session:
        last = JobRunner(drawn.build(),
                         MultiNodeCheckpointManager(directory)).train(session)
        assert last == drawn.epochs
        assert_blobs(session, drawn.expected)


@settings(max_examples=6, deadline=None)
@given(drawn=jobs())
def test_both_sessions_end_a_job_with_the_same_blobs(drawn):
    sessions_agree(drawn.build)


@settings(max_examples=6, deadline=None)
@given(drawn=jobs(), data=st.data())
def test_resuming_from_any_saved_epoch_ends_as_the_uninterrupted_run(
        drawn, data):
    epoch = data.draw(st.integers(0, drawn.epochs), label="resume from")
    kind = data.draw(st.sampled_from(sorted(SESSION_KINDS)), label="session")
    resume_equals_uninterrupted(drawn.build, sessions=(kind,),
                                epochs=[epoch])


@settings(max_examples=6, deadline=None)
@given(drawn=jobs(), data=st.data())
def test_a_node_killed_at_a_drawn_epoch_fails_naming_it_or_restarts_exactly(
        drawn, data):
    """Without restarts the run raises NodeFailedError naming the node;
    with one restart it ends with the uninterrupted run's blobs."""
    runs = drawn.build().epoch_group.used_nodes()
    node = data.draw(st.sampled_from(sorted(runs)), label="node")
    epoch = data.draw(st.integers(1, drawn.epochs), label="epoch")
    how = data.draw(st.sampled_from(["sigkill", "exit"]), label="how")
    kind = data.draw(st.sampled_from(sorted(SESSION_KINDS)), label="session")
    restart_recovers(drawn.build, sessions=(kind,),
                     faults=[Kill(node, at=Epoch(epoch), how=how)])
