"""The task model: Cluster, Node, Task, TaskGroup,
outputs, setup blocks, reporters and the workspace semantics every session
must honour.

Everything that runs goes through the ``session`` fixture, so the same
tests pin the semantics of every session kind.  Facts about a run are read
back from blobs: counters fed into a node's global workspace before the run
persist even from a PRIVATE group, which is what lets a test count how
often, and in which order, a block ran.
"""

import threading
import time

import numpy as np
import pytest

from localcluster import (Cluster, ExecutionStep, Net, NetBuilder, Node,
                          PlanError, LocalClusterError, SetupNets, Task,
                          TaskGroup, TaskOutput, WorkspaceType,
                          execution_step, final_output, ops,
                          to_execution_step)

RUN_TIMEOUT = 3.0


# -- helpers ------------------------------------------------------------------

def sleep_100ms():
    time.sleep(0.1)


def feed_ints(session, node, *names, value=0):
    """Feed int64 scalars (counters, placeholders) into ``node``."""
    for name in names:
        session.feed_blob(name, np.array(value, dtype=np.int64), node=node)


def fetch_int(session, name, node):
    return int(session.fetch_blob(name, node))


def wait_for_count(counter, target):
    """Plan a loop that spins until ``counter`` reaches ``target``."""
    with ops.loop():
        ops.stop_if(ops.GE([ops.RetrieveCount([counter]), ops.Const(target)]))


def sleep_net(name):
    net = Net(name)
    net.Python(sleep_100ms)([], [])
    return net


def count_net(name, counter):
    net = Net(name)
    net.CountUp([counter])
    return net


# -- Cluster and Node ---------------------------------------------------------

def test_nodes_register_with_the_current_cluster_in_first_seen_order():
    with Cluster() as cluster:
        Node("b")
        Node("a")
        Node("b")
    assert cluster.nodes() == ["b", "a"]


def test_node_outside_a_cluster_context_registers_with_the_default_cluster():
    Node("default_cluster_node")
    assert "default_cluster_node" in Cluster.current().nodes()


def test_node_kwargs_of_a_node_declared_twice_are_merged():
    with Cluster() as cluster:
        Node("a", cpus=[0], memory_limit=1 << 30)
        Node("a", env={"K": "V"}, cpus=[1])
        Node("b")
    kwargs = cluster.node_kwargs()
    assert kwargs["a"] == {"cpus": [1], "memory_limit": 1 << 30,
                           "env": {"K": "V"}}
    assert kwargs["b"] == {}


def test_engine_options_are_kept_and_sessions_here_run_with_them(local):
    # where an engine's scheduler puts a node: one place on this machine
    with Cluster() as cluster, TaskGroup() as group:
        with Node("a", resources={"GPU": 1, "CPU": 0.5},
                  placement={"zone": "a"}), Task():
            ops.Const(1.0, name="x")
    assert cluster.node_kwargs()["a"] == {
        "resources": {"GPU": 1, "CPU": 0.5}, "placement": {"zone": "a"}}
    local().run(group)


@pytest.mark.parametrize("kwargs, option", [
    ({"cpus": "0,1"}, "cpus"),
    ({"cpus": [0.5]}, "cpus"),
    ({"cpus": ["0"]}, "cpus"),
    ({"memory_limit": 0}, "memory_limit"),
    ({"memory_limit": -1}, "memory_limit"),
    ({"memory_limit": 1.5}, "memory_limit"),
    ({"memory_limit": "1G"}, "memory_limit"),
    ({"env": ["A=1"]}, "env"),
    ({"env": {"A": 1}}, "env"),
    ({"env": {1: "A"}}, "env"),
    ({"gpus": [0]}, "gpus"),
    ({"resources": "GPU"}, "resources"),
    ({"resources": {"GPU": -1}}, "resources"),
    ({"resources": {"GPU": True}}, "resources"),
    ({"placement": ""}, "placement"),
    ({"placement": {"zone": 1}}, "placement"),
    ({"placement": ["a"]}, "placement"),
])
def test_bad_node_option_is_a_plan_error_naming_it(kwargs, option):
    with Cluster():
        with pytest.raises(PlanError, match=option):
            Node("bad", **kwargs)


# -- contexts -----------------------------------------------------------------

def test_contexts_are_per_thread():
    seen = {}

    def other_thread():
        seen["node"] = str(Node.current())
        seen["group"] = TaskGroup.current(required=False)
        seen["builder"] = NetBuilder.current(required=False)
        seen["cluster"] = Cluster.current()

    with Cluster() as cluster, TaskGroup(), Node("main_thread_node"), \
            NetBuilder():
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=5)
        assert str(Node.current()) == "main_thread_node"
    assert seen["node"] == "local"
    assert seen["group"] is None
    assert seen["builder"] is None
    assert seen["cluster"] is not cluster


def test_current_sees_subclass_instances():
    with NetBuilder() as nb:
        with ops.loop(2) as loop:
            assert NetBuilder.current() is loop
        assert NetBuilder.current() is nb
    assert NetBuilder.current(required=False) is None


def test_current_with_a_value_returns_it():
    group = TaskGroup()
    assert TaskGroup.current(group) is group


# -- Task naming and node -----------------------------------------------------

def test_task_names_are_node_slash_name_with_suffixes_when_taken():
    with TaskGroup() as tg, Node("n"):
        names = [Task().name, Task().name, Task(name="x").name,
                 Task().name, Task(name="x").name, Task(node="m").name]
    assert names == ["n/task", "n/task:1", "n/x", "n/task:2", "n/x:1",
                     "m/task"]
    assert [t.name for t in tg.tasks()] == names


def test_same_task_name_in_another_group_gets_no_suffix():
    with Node("n"):
        with TaskGroup():
            first = Task(name="train")
        with TaskGroup():
            second = Task(name="train")
    assert first.name == second.name == "n/train"


@pytest.mark.parametrize("make, node", [
    (lambda: Task(), "local"),
    (lambda: Task(node="trainer"), "trainer"),
    (lambda: Task(node=Node("ps")), "ps"),
])
def test_task_node(make, node):
    with TaskGroup():
        task = make()
    assert task.node == node
    assert task.name == f"{node}/task"


def test_task_node_defaults_to_the_current_node():
    with TaskGroup(), Node("worker"):
        task = Task()
    assert task.node == "worker"


# -- with Task(), outputs -----------------------------------------------------

def test_with_task_opens_a_builder_whose_ops_become_the_task_step(session):
    with TaskGroup() as tg, Node("n"):
        with Task() as task:
            assert NetBuilder.current(required=False) is not None
            ops.CountUp(["ran"])
        assert NetBuilder.current(required=False) is None
    assert isinstance(task.get_step(), ExecutionStep)
    feed_ints(session, "n", "ran")
    session.run(tg, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "ran", "n") == 1


def test_add_output_outputs_and_output_list():
    with TaskGroup(), Node("n"):
        with Task() as task:
            x = ops.Const(3)
            y = ops.Const([1, 2])
    single = task.add_output(x)
    record = task.add_output({"a": x, "b": y})
    listed = task.add_output([x, y])
    pair = task.add_outputs([y, x])
    assert all(isinstance(o, TaskOutput) for o in [single, record, listed])
    assert len(pair) == 2
    assert task.outputs() == [single, record, listed] + pair
    assert task.output_list() == [x, x, y, x, y, y, x]


def test_task_output_get_returns_the_blob_refs():
    with TaskGroup(), Node("n"):
        with Task() as task:
            x = ops.Const(3)
            y = ops.Const([1, 2])
    assert task.add_output(x).get() == x
    assert task.add_output({"a": x, "b": y}).get() == {"a": x, "b": y}
    assert task.add_output([x, y]).get() == [x, y]


@pytest.mark.parametrize("run_what", ["group", "task"])
def test_task_output_fetch_returns_values_after_a_run(session, run_what):
    with TaskGroup() as tg, Node("n"):
        with Task() as task:
            x = ops.Const(3)
            y = ops.Const([1.5, 2.5])
    single = task.add_output(x)
    record = task.add_output({"a": x, "b": y})
    listed = task.add_output([x, y])
    session.run(tg if run_what == "group" else task, timeout=RUN_TIMEOUT)
    assert single.fetch() == 3
    fetched = record.fetch()
    assert isinstance(fetched, dict) and list(fetched) == ["a", "b"]
    assert fetched["a"] == 3
    np.testing.assert_array_equal(fetched["b"], [1.5, 2.5])
    values = listed.fetch()
    assert isinstance(values, list) and len(values) == 2
    np.testing.assert_array_equal(values[1], [1.5, 2.5])


def test_task_outputs_given_to_the_constructor(session):
    with TaskGroup() as tg, Node("n"):
        net = Net("out_net")
        blob = net.Const(11)
        task = Task(step=net, outputs=blob)
    session.run(tg, timeout=RUN_TIMEOUT)
    assert [o.fetch() for o in task.outputs()] == [11]


def test_fetch_before_a_run_is_a_clear_error():
    with TaskGroup(), Node("n"):
        with Task() as task:
            out = task.add_output(ops.Const(1))
    with pytest.raises(LocalClusterError, match="run"):
        out.fetch()


def test_final_output_inside_a_task_adds_to_it(session):
    with TaskGroup() as tg, Node("n"):
        with Task() as task:
            out = final_output(ops.Const(5))
    assert task.outputs() == [out]
    session.run(tg, timeout=RUN_TIMEOUT)
    assert out.fetch() == 5


def test_final_output_outside_a_task_adds_a_new_task(session):
    session.feed_blob("fed", np.array([4, 2]), node="n")
    with TaskGroup() as tg, Node("n"):
        out = final_output("fed")
    assert tg.num_registered_tasks() == 1
    (task,) = tg.tasks()
    assert task.node == "n"
    assert task.outputs() == [out]
    session.run(tg, timeout=RUN_TIMEOUT)
    np.testing.assert_array_equal(out.fetch(), [4, 2])


# -- TaskGroup ----------------------------------------------------------------

def test_task_group_add_tasks_and_used_nodes():
    outside = Task(node="c", name="outside")
    with TaskGroup() as tg:
        a = Task(node="b")
        b = Task(node="a")
        c = Task(node="b", name="other")
    assert tg.num_registered_tasks() == 3
    assert tg.add(outside) is outside
    assert outside.group is tg
    assert tg.tasks() == [a, b, c, outside]
    assert tg.num_registered_tasks() == 4
    assert tg.used_nodes() == ["b", "a", "c"]


def test_task_group_defaults_to_private():
    with TaskGroup() as tg:
        task = Task()
    assert tg.workspace_type() is WorkspaceType.PRIVATE
    assert task.workspace_type() is WorkspaceType.PRIVATE
    assert TaskGroup().workspace_type() is WorkspaceType.PRIVATE


def test_global_task_in_a_private_group_is_a_plan_error():
    with TaskGroup(workspace_type=WorkspaceType.PRIVATE):
        with pytest.raises(PlanError, match="GLOBAL"):
            Task(workspace_type=WorkspaceType.GLOBAL)


def test_report_step_runs_on_its_node_every_interval(session):
    with TaskGroup() as tg:
        with Node("a"):
            with Task():
                ops.Python(sleep_100ms)([], [])
        with Node("b"):
            Task(step=sleep_net("sleep_on_b"))
        tg.report_step(count_net("tick", "reports"), node="b", interval_ms=10)
    for node in "ab":
        feed_ints(session, node, "reports")
    session.run(tg, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "reports", "a") == 0
    assert fetch_int(session, "reports", "b") >= 3


def test_report_step_runs_once_more_after_the_tasks_end(session):
    with TaskGroup() as tg, Node("n"):
        with Task():
            ops.Const(42, blob_out="x")
        report = Net("report")
        report.CountUp(["reports"])
        report.Copy(["x"], ["x_seen"])
        tg.report_step(report, interval_ms=60_000)
    feed_ints(session, "n", "reports", "x", "x_seen")
    started = time.monotonic()
    session.run(tg, timeout=RUN_TIMEOUT)
    assert time.monotonic() - started < 2
    assert fetch_int(session, "reports", "n") == 1
    assert fetch_int(session, "x_seen", "n") == 42


def test_report_net_runs_at_least_once_and_is_one_per_node(session):
    with TaskGroup() as tg, Node("n"):
        Task(step=sleep_net("work"))
        net = tg.report_net(count_net("reporter", "reports"),
                            report_interval=60)
        assert tg.report_net() is net
        with pytest.raises(PlanError, match="n"):
            tg.report_net(Net("another"))
    feed_ints(session, "n", "reports")
    session.run(tg, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "reports", "n") == 1


def test_remote_nets():
    tg = TaskGroup()
    first, second = Net("remote_a"), Net("remote_b")
    tg.add_remote_net(first)
    tg.add_remote_net(second)
    assert tg.remote_nets() == [first, second]


def test_tasks_by_node_gives_one_grouped_task_per_node():
    with TaskGroup() as tg:
        Task(node="a")
        Task(node="b")
        Task(node="a", name="second")
    grouped = tg.tasks_by_node()
    assert [(t.name, t.node) for t in grouped.tasks()] == [
        ("a/grouped_by_node", "a"), ("b/grouped_by_node", "b")]
    assert tg.tasks_by_node() is grouped


def test_tasks_by_node_remap_merges_nodes(session):
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        with Task(node="a"):
            ops.Const(1, blob_out="from_a")
        with Task(node="b"):
            ops.Const(2, blob_out="from_b")
    grouped = tg.tasks_by_node(lambda node: "merged")
    assert [t.name for t in grouped.tasks()] == ["merged/grouped_by_node"]
    session.run(grouped, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "from_a", "merged") == 1
    assert fetch_int(session, "from_b", "merged") == 2


def test_tasks_by_node_again_with_another_remap_is_a_plan_error():
    with TaskGroup() as tg:
        Task(node="a")
        Task(node="b")
    tg.tasks_by_node(lambda node: "x")
    tg.tasks_by_node(lambda node: "x")
    with pytest.raises(PlanError, match="node_remap"):
        tg.tasks_by_node(lambda node: "y")


def test_to_task_runs_the_whole_group_on_one_node(session):
    with TaskGroup() as tg:
        Task(node="a", step=count_net("count_a", "runs"))
        Task(node="b", step=count_net("count_b", "runs"))
    task = tg.to_task("only")
    assert task.node == "only"
    feed_ints(session, "only", "runs")
    session.run(task, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "runs", "only") == 2


def test_task_group_runs_many_times_but_cannot_change_after_a_run(session):
    with TaskGroup() as tg, Node("n"):
        Task(step=count_net("count", "runs"))
    feed_ints(session, "n", "runs")
    for _ in range(3):
        session.run(tg, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "runs", "n") == 3
    with pytest.raises(PlanError, match="run"):
        tg.add(Task(node="n", name="late"))
    with pytest.raises(PlanError):
        with tg:
            Task(node="n", name="late_in_context")


# -- setup blocks -------------------------------------------------------------

TASK_SETUP_COUNTERS = ("task_inits", "inst_inits", "inst_exits", "task_exits",
                       "id_sum", "inst_inits_at_task_init",
                       "inst_exits_at_task_exit", "id_sum_at_task_exit")


def test_task_and_instance_setup_order_and_counts(session):
    instances = 3
    with TaskGroup() as tg, Node("n"):
        with Task(num_instances=instances):
            with ops.task_init():
                ops.CountUp(["task_inits"])
                ops.RetrieveCount(["inst_inits"], ["inst_inits_at_task_init"])
            with ops.task_instance_init():
                # my_id is new, so it lives in the instance's workspace.
                ops.CountUp(["inst_inits"], ["my_id"])
            # Every instance waits for all to start: a shared my_id would
            # then hold the last id in every instance.
            wait_for_count("inst_inits", instances)
            with ops.task_instance_exit():
                ops.AtomicAdd(["id_sum", "my_id"])
                ops.CountUp(["inst_exits"])
            with ops.task_exit():
                ops.CountUp(["task_exits"])
                ops.RetrieveCount(["inst_exits"], ["inst_exits_at_task_exit"])
                ops.Copy(["id_sum"], ["id_sum_at_task_exit"])
    feed_ints(session, "n", *TASK_SETUP_COUNTERS)
    session.run(tg, timeout=RUN_TIMEOUT)
    got = {name: fetch_int(session, name, "n") for name in TASK_SETUP_COUNTERS}
    assert got == {
        "task_inits": 1, "inst_inits": 3, "inst_exits": 3, "task_exits": 1,
        "id_sum": 0 + 1 + 2, "inst_inits_at_task_init": 0,
        "inst_exits_at_task_exit": 3, "id_sum_at_task_exit": 3}
    assert not session.has_blob("my_id", "n")


LOCAL_SETUP_COUNTERS = ("local_inits", "local_exits", "body_runs",
                        "body_runs_at_local_init", "body_runs_at_local_exit")


def test_local_setup_runs_once_per_node_per_run_around_its_tasks(session):
    with TaskGroup() as tg:
        with Node("n"):
            with Task(num_instances=2):
                with ops.local_init():
                    ops.CountUp(["local_inits"])
                    ops.RetrieveCount(["body_runs"],
                                      ["body_runs_at_local_init"])
                ops.Python(sleep_100ms)([], [])
                ops.CountUp(["body_runs"])
                with ops.local_exit():
                    ops.CountUp(["local_exits"])
                    ops.RetrieveCount(["body_runs"],
                                      ["body_runs_at_local_exit"])
            with Task(name="plain"):
                ops.CountUp(["body_runs"])
        with Node("m"):
            with Task():
                with ops.local_init():
                    ops.CountUp(["local_inits"])
    for node in "nm":
        feed_ints(session, node, *LOCAL_SETUP_COUNTERS)

    def counters(node):
        return [fetch_int(session, name, node)
                for name in LOCAL_SETUP_COUNTERS]

    session.run(tg, timeout=RUN_TIMEOUT)
    assert counters("n") == [1, 1, 3, 0, 3]
    assert counters("m") == [1, 0, 0, 0, 0]
    session.run(tg, timeout=RUN_TIMEOUT)
    assert counters("n") == [2, 2, 6, 3, 6]
    assert counters("m") == [2, 0, 0, 0, 0]


@pytest.mark.parametrize("key, runs", [
    (Task.TASK_SETUP, 1),
    (Task.TASK_INSTANCE_SETUP, 2),     # once per instance
    (TaskGroup.LOCAL_SETUP, 1),
])
def test_setup_nets_attached_to_several_nets_run_once(session, key, runs):
    with TaskGroup() as tg, Node("n"):
        setup = SetupNets(init_nets=[count_net("setup_init", "inits")],
                          exit_nets=[count_net("setup_exit", "exits")])
        body = [count_net("body_1", "body"), count_net("body_2", "body")]
        for net in body:
            net.add_attribute(key, setup)
        Task(step=body, num_instances=2)
    feed_ints(session, "n", "inits", "exits", "body")
    session.run(tg, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "body", "n") == 4
    assert fetch_int(session, "inits", "n") == runs
    assert fetch_int(session, "exits", "n") == runs


def test_local_setup_shared_by_two_tasks_runs_once_per_node(session):
    with TaskGroup() as tg, Node("n"):
        setup = SetupNets(init_nets=[count_net("shared_init", "inits")])
        for name in ("one", "two"):
            net = count_net(f"body_{name}", "body")
            net.add_attribute(TaskGroup.LOCAL_SETUP, setup)
            Task(step=net, name=name)
    feed_ints(session, "n", "inits", "body")
    session.run(tg, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "body", "n") == 2
    assert fetch_int(session, "inits", "n") == 1


def _task_reporter(body):
    with ops.task_reporter(interval_ms=10):
        body()


def _local_reporter(body):
    with ops.local_reporter(interval_ms=10):
        body()


@pytest.mark.parametrize("reporter", [_task_reporter, _local_reporter],
                         ids=["task_reporter", "local_reporter"])
def test_reporters_run_during_and_once_after_the_task(session, reporter):
    def report():
        ops.CountUp(["reports"])
        ops.Copy(["x"], ["x_seen"])

    with TaskGroup() as tg, Node("n"):
        with Task():
            ops.Python(sleep_100ms)([], [])
            ops.Const(42, blob_out="x")
            reporter(report)
    feed_ints(session, "n", "reports", "x", "x_seen")
    session.run(tg, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "reports", "n") >= 2
    assert fetch_int(session, "x_seen", "n") == 42


# -- workspace semantics ------------------------------------------------------

def test_private_group_writes_to_existing_blobs_persist_new_shape(session):
    session.feed_blob("w", np.zeros(2, dtype=np.float32), node="n")
    with TaskGroup() as tg, Node("n"):
        with Task():
            ops.Const([1, 2, 3], blob_out="w")
    session.run(tg, timeout=RUN_TIMEOUT)
    w = session.fetch_blob("w", "n")
    assert w.dtype == np.int64
    np.testing.assert_array_equal(w, [1, 2, 3])


def test_private_group_new_blobs_vanish_after_the_run(session):
    with TaskGroup() as tg, Node("n"):
        with Task() as task:
            out = task.add_output(ops.Const(7, blob_out="temp"))
    session.run(tg, timeout=RUN_TIMEOUT)
    assert out.fetch() == 7
    assert not session.has_blob("temp", "n")
    assert "temp" not in session.blobs("n")


def test_global_group_blobs_persist_across_runs(session):
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as init:
        with Task(node="n"):
            ops.Const(10, blob_out="weights")
    with TaskGroup() as epoch:
        with Task(node="n"):
            ops.Add(["weights", ops.Const(1)], ["weights"])
    session.run(init, timeout=RUN_TIMEOUT)
    assert session.has_blob("weights", "n")
    session.run(epoch, timeout=RUN_TIMEOUT)
    session.run(epoch, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "weights", "n") == 12


@pytest.mark.parametrize("workspace_type, persists", [
    (None, True),
    (WorkspaceType.GLOBAL, True),
    (WorkspaceType.PRIVATE, False),
])
@pytest.mark.parametrize("kind", ["net", "list", "step", "task"])
def test_runnable_that_is_not_a_group_runs_global_by_default(
        session, kind, workspace_type, persists):
    net = Net(f"make_{kind}")
    net.Const(1, blob_out="made")
    runnable = {"net": net, "list": [net],
                "step": execution_step("step", [net]),
                "task": Task(step=net, node="local")}[kind]
    session.run(runnable, workspace_type=workspace_type, timeout=RUN_TIMEOUT)
    assert session.has_blob("made", "local") is persists


def test_tasks_on_different_nodes_share_nothing(session):
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        with Task(node="a"):
            ops.Const(1, blob_out="only_on_a")
        Task(node="b", step=count_net("noop", "noop_counter"))
    feed_ints(session, "b", "noop_counter")
    session.run(tg, timeout=RUN_TIMEOUT)
    assert session.has_blob("only_on_a", "a")
    assert not session.has_blob("only_on_a", "b")


def test_private_group_tasks_on_one_node_share_one_child_workspace(session):
    with TaskGroup() as tg, Node("n"):
        with Task(name="writer"):
            ops.Const(99, blob_out="group_temp")
            ops.CountUp(["written"])
        with Task(name="reader"):
            wait_for_count("written", 1)
            ops.Copy(["group_temp"], ["seen"])
    feed_ints(session, "n", "written", "seen")
    session.run(tg, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "seen", "n") == 99
    assert not session.has_blob("group_temp", "n")


@pytest.mark.parametrize("workspace_type", list(WorkspaceType))
def test_instances_keep_their_new_blobs_private(session, workspace_type):
    instances = 4
    with TaskGroup(workspace_type=workspace_type) as tg, Node("n"):
        with Task(num_instances=instances):
            ops.CountUp(["started"], ["my_id"])
            wait_for_count("started", instances)
            ops.AtomicAdd(["id_sum", "my_id"])
    feed_ints(session, "n", "started", "id_sum")
    session.run(tg, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "id_sum", "n") == sum(range(instances))
    assert not session.has_blob("my_id", "n")


def test_create_workspace_step_keeps_its_new_blobs_private(session):
    outer = Net("outer")
    outer.Const(5, blob_out="outer_blob")
    inner = Net("inner")
    inner.Const(1, blob_out="inner_temp")
    inner.Add(["outer_blob", "inner_temp"], ["outer_blob"])
    step = execution_step("root", [
        outer, execution_step("private", [inner], create_workspace=True)])
    session.run(step, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "outer_blob", "local") == 6
    assert not session.has_blob("inner_temp", "local")


# -- execution steps ----------------------------------------------------------

def _rendezvous(name):
    """A step that arrives, then waits for the other side to arrive."""
    with NetBuilder(name=name) as nb:
        ops.CountUp(["arrived"])
        wait_for_count("arrived", 2)
    return to_execution_step(nb)


def test_concurrent_substeps_really_run_concurrently(session):
    # Run in sequence, the first substep would wait for the second forever.
    step = execution_step("both", [_rendezvous("left"), _rendezvous("right")],
                          concurrent_substeps=True)
    feed_ints(session, "local", "arrived")
    session.run(step, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "arrived", "local") == 2


def test_run_every_ms_substep_repeats_while_siblings_run_and_once_after(
        session):
    ticker = execution_step("ticker", [count_net("tick", "ticks")],
                            run_every_ms=10)
    work = Net("work")
    work.Python(sleep_100ms)([], [])
    work.Python(sleep_100ms)([], [])
    work.RetrieveCount(["ticks"], ["ticks_during"])
    step = execution_step("root", [ticker, execution_step("work", [work])])
    feed_ints(session, "local", "ticks", "ticks_during")
    session.run(step, timeout=RUN_TIMEOUT)
    during = fetch_int(session, "ticks_during", "local")
    assert during >= 2
    assert fetch_int(session, "ticks", "local") >= during + 1


def test_run_every_ms_substep_with_a_long_interval_runs_once_after(session):
    ticker = execution_step("ticker", [count_net("tick", "ticks")],
                            run_every_ms=60_000)
    step = execution_step("root", [ticker, count_net("work", "work_done")])
    feed_ints(session, "local", "ticks", "work_done")
    started = time.monotonic()
    session.run(step, timeout=RUN_TIMEOUT)
    assert time.monotonic() - started < 2
    assert fetch_int(session, "ticks", "local") == 1
    assert fetch_int(session, "work_done", "local") == 1


def test_only_once_with_a_stop_blob_runs_one_pass(session):
    session.feed_blob("never", np.array(False), node="local")
    step = execution_step("once", [count_net("count", "passes")],
                          should_stop_blob="never", only_once=True)
    feed_ints(session, "local", "passes")
    session.run(step, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "passes", "local") == 1


def test_stop_blob_repeats_the_step_until_it_is_true(session):
    net = Net("count_to_3")
    net.GE([net.CountUp(["passes"]), net.Const(2)], ["done"])
    step = execution_step("loop", [net], should_stop_blob="done")
    feed_ints(session, "local", "passes")
    session.run(step, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "passes", "local") == 3


def test_stop_blob_is_checked_after_every_net(session):
    first = Net("first")
    first.CountUp(["first_runs"])
    first.Const(True, blob_out="stop")
    rest = [count_net("second", "later_runs"),
            count_net("third", "later_runs")]
    step = execution_step("three_nets", [first] + rest,
                          should_stop_blob="stop")
    feed_ints(session, "local", "first_runs", "later_runs")
    session.run(step, timeout=RUN_TIMEOUT)
    assert fetch_int(session, "first_runs", "local") == 1
    assert fetch_int(session, "later_runs", "local") == 0
