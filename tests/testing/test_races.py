"""races(): the static race analysis finds what concurrent branches of a
node share unordered -- and nothing where a job keeps its branches apart
or orders them.

Each racy plan below is a bug a user writes: the lost update of two
instances, two tasks doing a read-modify-write of one blob, a report step
or an exit net reading what another branch still writes, a dataset made
beside the pipe that reads it, concurrent substeps (pipe threads) adding
to one blob.  Each clean plan is a way of sharing that is correct: tasks
on different nodes, queues, atomic ops, setup and exit nets, private
instance blobs.  The last tests are the error a run of the dataset trap
raises: it names the concurrent writer, under a deterministic schedule
where the pipe reads first.
"""

import pickle

import numpy as np
import pytest

from localcluster import (BlobNotFoundError, CounterReader, Dataset, Job,
                          LocalSession, Net, Node, PlanError, Queue,
                          ReaderWithLimit, Task, TaskFailedError, TaskGroup,
                          WorkspaceType, epoch_limiter, execution_step, ops,
                          pipe)
from localcluster.examples import regression
from localcluster.testing import Race, races
from localcluster.testing._races import allowed_races

pytestmark = pytest.mark.timeout(60)


# -- plans with a race ----------------------------------------------------------

def lost_update_job():
    """Two task instances count epochs by ``seen = copy(seen) + 1``."""
    with Job() as job, Node("worker_0"):
        with job.init_group, Task():
            ops.Const(np.array(0.0), name="seen")
        with Task(name="count", num_instances=2):
            one = ops.Const(np.array(1.0))
            last = ops.Copy(["seen"])
            ops.Add([last, one], ["seen"])
        epoch_limiter(job, 3)
    return job


def test_the_lost_update_of_two_instances_names_the_blob_and_both_ops():
    found = races(lost_update_job())
    assert len(found) == 1
    race = found[0]
    assert (race.blob, race.node) == ("seen", "worker_0")
    assert (race.first.task, race.first.op_type, race.first.op_index,
            race.first.mode) == ("worker_0/count", "Add", 2, "writes")
    assert (race.second.task, race.second.op_type, race.second.op_index,
            race.second.mode) == ("worker_0/count", "Copy", 1, "reads")
    assert race.first.net == race.second.net == "worker_0/count"
    assert race.first.step == "worker_0/count"
    assert {race.first.branch, race.second.branch} == {
        "instance 0 of task 'worker_0/count'",
        "instance 1 of task 'worker_0/count'"}


def test_two_tasks_of_one_node_doing_a_read_modify_write_race():
    with TaskGroup() as group, Node("n"):
        for name in ("left", "right"):
            with Task(name=name):
                ops.Add(["x", ops.Const(1.0)], ["x"])
    [race] = races(group)
    assert (race.blob, race.node) == ("x", "n")
    assert (race.first.task, race.second.task) == ("n/left", "n/right")
    assert race.first.mode == race.second.mode == "reads and writes"
    assert (race.first.branch, race.second.branch) == ("task 'n/left'",
                                                       "task 'n/right'")


def _body_with_task_reporter():
    with TaskGroup() as group, Node("n"), Task(name="work"):
        ops.Const(0.0, blob_out="progress")
        with ops.loop(5):
            ops.Add(["progress", ops.Const(1.0)], ["progress"])
        with ops.task_reporter(interval_ms=10, name="report"):
            ops.Print(["progress"], [])
    return group


def _group_report_step():
    with TaskGroup() as group, Node("n"):
        with Task(name="work"):
            with ops.loop(5):
                ops.Add(["progress", ops.Const(1.0)], ["progress"])
        report = Net("report")
        report.Copy(["progress"], ["shown"])
        group.report_step(report, interval_ms=10)
    return group


@pytest.mark.parametrize("build", [_body_with_task_reporter,
                                   _group_report_step],
                         ids=["task_reporter", "group_report_step"])
def test_a_report_step_reading_what_the_body_writes_races(build):
    [race] = races(build())
    assert race.blob == "progress"
    assert race.first.task == "n/work" and race.first.mode != "reads"
    assert race.second.mode == "reads"
    assert race.second.branch.startswith("report step ")
    assert race.second.branch.endswith("(every 10 ms)")


def test_an_exit_net_reading_what_another_task_still_writes_races():
    """A task's exit nets run after its own body, not after the other
    tasks of its node: they run concurrently with them."""
    with TaskGroup() as group, Node("n"):
        with Task(name="writer"):
            with ops.loop(5):
                ops.Add(["acc", ops.Const(1.0)], ["acc"])
        with Task(name="summary"):
            ops.Const(0.0)
            with ops.task_exit():
                ops.Copy(["acc"], ["total"])
    [race] = races(group)
    assert race.blob == "acc"
    assert (race.first.task, race.first.op_type) == ("n/writer", "Add")
    assert (race.second.task, race.second.op_type,
            race.second.step) == ("n/summary", "Copy",
                                  "n/summary/task_exit")


def _dataset_beside_its_pipe(workspace_type=None):
    """The trap: the dataset's blobs are made by the task that builds the
    pipe -- which runs beside the pipe's own task, not before it."""
    with TaskGroup(workspace_type) as group:
        queue = Queue(4)
        with Node("src"), Task(name="make"):
            dataset = Dataset({"v": np.arange(3.0)}, name="ds")
            pipe(dataset.reader(), queue, name="feed")
    return group


def test_a_dataset_made_beside_the_pipe_that_reads_it_races():
    [race] = races(_dataset_beside_its_pipe())
    assert (race.blob, race.node) == ("ds/v", "src")
    assert (race.first.task, race.first.op_type, race.first.mode) == (
        "src/make", "GivenTensorFill", "writes")
    assert (race.second.task, race.second.op_type, race.second.mode) == (
        "src/feed", "ReadDataset", "reads")
    # its cursor is made and moved by atomic ops only: no race there
    assert not any("cursor" in r.blob for r in races(
        _dataset_beside_its_pipe()))


def test_a_reader_cursor_reset_beside_its_readers_races():
    """A cursor two pipes share is safe (it moves atomically) -- until
    another task of the group writes it with a plain op."""
    with TaskGroup(WorkspaceType.GLOBAL) as init, Node("a"), Task():
        reader = Dataset({"v": np.arange(6.0)}, name="data").reader()
    with TaskGroup() as group, Node("a"):
        pipe(reader, name="first")
        pipe(reader, name="second")
    assert races(init) == [] and races(group) == []
    with Task(name="rewind", group=group, node="a"):
        ops.ConstantFill([], [reader.cursor], value=0, dtype="int64")
    found = races(group)
    assert [r.blob for r in found] == [str(reader.cursor)] * 2
    assert {frozenset((r.first.task, r.second.task)) for r in found} == {
        frozenset(("a/first", "a/rewind")),
        frozenset(("a/second", "a/rewind"))}


def test_concurrent_substeps_writing_one_blob_race():
    with TaskGroup() as group, Node("n"):
        make, use = Net("make"), Net("use")
        make.Const(1.0, blob_out="shared")
        use.Copy(["shared"], ["copied"])
        Task(step=execution_step("both", [make, use],
                                 concurrent_substeps=True), name="t")
    [race] = races(group)
    assert (race.blob, race.first.net, race.second.net) == ("shared",
                                                            "make", "use")
    assert (race.first.branch, race.second.branch) == (
        "concurrent step 'make'", "concurrent step 'use'")


def _add_to_total(record):
    ops.Add(["total", record["v"]], ["total"])


@pytest.mark.parametrize("threads", [dict(num_threads=2),
                                     dict(num_runtime_threads=2)],
                         ids=["num_threads", "num_runtime_threads"])
def test_pipe_threads_adding_to_one_blob_race(threads):
    with TaskGroup(WorkspaceType.GLOBAL) as init, Node("a"), Task():
        reader = Dataset({"v": np.arange(6.0)}, name="data").reader()
        ops.Const(0.0, blob_out="total")
    with TaskGroup() as group, Node("a"):
        pipe(reader, processor=_add_to_total, name="adder", **threads)
    assert races(init) == []
    [race] = races(group)
    assert race.blob == "total"
    assert race.first.mode == race.second.mode == "reads and writes"
    assert race.first.task == race.second.task == "a/adder"


def test_a_blob_an_instance_makes_that_another_task_writes_is_shared():
    """An instance's new blob is its own only if nothing outside it made
    the name first: where its write goes then depends on timing."""
    with TaskGroup() as group, Node("n"):
        with Task(name="outside"):
            ops.Const(1.0, blob_out="y")
        with Task(name="inside", num_instances=2):
            ops.Const(2.0, blob_out="y")
            ops.Copy(["y"], ["z"])
    found = races(group)
    assert {r.blob for r in found} == {"y"}
    assert {(r.first.task, r.second.task) for r in found} == {
        ("n/outside", "n/inside"), ("n/inside", "n/inside")}


# -- plans without a race ---------------------------------------------------------

def two_workers_job():
    """The README's job: two workers add ones to their weights."""
    with Job() as job:
        for i, node in enumerate(["worker_0", "worker_1"]):
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.full(4, float(i)), name="w")
                with Task():
                    ops.Add(["w", ops.Const(np.ones(4))], ["w"])
        with Node("worker_0"):
            epoch_limiter(job, 3)
    return job


def test_tasks_on_different_nodes_never_race():
    assert races(two_workers_job()) == []


def test_producer_and_consumer_sharing_only_a_queue_do_not_race():
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("a"), Task():
            source = Dataset({"v": np.arange(5.0)}, name="source")
        with Node("b"), Task():
            sink = Dataset({"v": np.zeros(0)}, name="sink")
        with Node("a"), Task():
            near = Dataset({"v": np.zeros(0)}, name="near")
    with TaskGroup() as group:
        far, here = Queue(4, name="far"), Queue(4, name="here")
        with Node("a"):
            pipe(source.reader(), far, name="produce",
                 processor=lambda r: {"v": ops.Scale([r["v"]], scale=2.0)})
            pipe(CounterReader(), here, name="count")
            pipe(ReaderWithLimit(here.reader(), 3), near.writer(),
                 name="keep", processor=lambda r: {"v": ops.Cast(
                     [r["iter"]], to="float64")})
        with Node("b"):
            pipe(far, sink.writer(), name="consume")
    assert races(init) == [] and races(group) == []


def test_a_blob_handed_over_through_queues_is_ordered():
    """A trainer writes ``w``, sends it to a ps and takes the ps's answer
    back into ``w`` in another task: the queues order the two writes."""
    to_ps, from_ps = Queue(1, name="to_ps"), Queue(1, name="from_ps")
    with TaskGroup() as group:
        with Node("trainer"), Task(name="train"):
            ops.Scale(["w"], ["w"], scale=0.5)
            writer = to_ps.writer()
            writer.write_record(ops.net(), {"w": "w"})
            writer.commit(ops.net())
        with Node("ps"), Task(name="average"):
            _, record = to_ps.reader().read_record(ops.net())
            ops.Scale([record["w"]], ["w"], scale=2.0)
            writer = from_ps.writer()
            writer.write_record(ops.net(), {"w": "w"})
            writer.commit(ops.net())
        with Node("trainer"), Task(name="receive"):
            _, record = from_ps.reader().read_record(ops.net())
            ops.Copy([record["w"]], ["w"])
    assert races(group) == []


def test_a_queue_read_does_not_order_what_its_writer_does_after_writing():
    queue = Queue(1, name="q")
    with TaskGroup() as group, Node("n"):
        with Task(name="send"):
            writer = queue.writer()
            writer.write_record(ops.net(), {"v": ops.Const(1.0)})
            writer.commit(ops.net())
            ops.Const(2.0, blob_out="late")
        with Task(name="take"):
            _, record = queue.reader().read_record(ops.net())
            ops.Copy(["late"], ["seen"])
    [race] = races(group)
    assert (race.blob, race.first.task, race.second.task) == (
        "late", "n/send", "n/take")


def test_sharing_only_through_atomic_ops_does_not_race():
    with TaskGroup() as group, Node("n"):
        with Task(name="setup"):
            with ops.local_init():
                ops.CreateCounter([], ["count"])
                ops.Const(0.0, blob_out="acc")
        for name in ("left", "right"):
            with Task(name=name, num_instances=3):
                ops.CountUp(["count"])
                ops.AtomicAdd(["acc", ops.Const(1.0)], [])
                ops.RetrieveCount(["count"])
    assert races(group) == []


def test_setup_and_exit_nets_order_what_the_instances_share():
    with TaskGroup() as group, Node("n"), Task(name="t", num_instances=4):
        with ops.task_init():
            ops.Const(0.0, blob_out="acc")
            ops.Const(2.0, blob_out="step")
        ops.AtomicAdd(["acc", "step"], [])
        with ops.task_exit():
            ops.Scale(["acc"], ["acc"], scale=0.5)
    assert races(group) == []


def test_blobs_an_instance_makes_are_its_own():
    with TaskGroup() as group, Node("n"), Task(name="t", num_instances=4):
        x = ops.Const(1.0)
        with ops.loop(3):
            ops.Add([x, x], [x])
        with ops.If(ops.GT([x, ops.Const(0.0)])):
            ops.Copy([x], ["temp"])
    assert races(group) == []


def test_read_only_sharing_does_not_race():
    with TaskGroup() as group, Node("n"):
        with Task(name="setup"), ops.local_init():
            ops.Const(3.0, blob_out="lr")
        for name in ("left", "right"):
            with Task(name=name, num_instances=2):
                ops.Scale(["lr"], scale=2.0)
    assert races(group) == []


def test_drawn_plans_are_race_free_as_the_strategies_promise():
    """The strategies draw plans race-free by construction (tasks share
    only through atomic ops and queues): races() agrees on every one."""
    hypothesis = pytest.importorskip("hypothesis")
    from localcluster.testing import strategies

    @hypothesis.settings(max_examples=25, deadline=None, database=None,
                         suppress_health_check=list(
                             hypothesis.HealthCheck))
    @hypothesis.given(group=strategies.task_groups(),
                      job=strategies.jobs())
    def check(group, job):
        assert races(group.build()) == []
        assert races(job.build()) == []

    check()


# -- the embedded job -------------------------------------------------------------

@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_the_embedded_job_races_only_where_it_says_it_does(nodes):
    job, options = regression.build(nodes=nodes, samples=64 * nodes)
    assert options["allow_races"] == ("w",)
    assert races(job, allow=options["allow_races"]) == []
    assert races((job, options)) == []
    # its hogwild trainers, and only they, race on their weights: one
    # prototype, analysed once for all its instances
    found = races(job)
    assert {(r.node, r.blob) for r in found} == {("trainer", "w")}
    assert all(r.first.task == r.second.task == "trainer/sgd"
               for r in found)


def test_the_embedded_job_with_one_thread_per_trainer_has_no_race():
    job, _ = regression.build(nodes=2, threads=1, samples=128)
    assert races(job) == []


# -- allow_races, and the Race value ------------------------------------------------

def test_allowed_races_are_left_out_and_unknown_names_are_fine():
    job = lost_update_job()
    assert races(job, allow=("seen",)) == []
    assert races(job, allow=["nothing", "seen"]) == []
    assert len(races(job, allow=("nothing",))) == 1
    assert races((job, {"allow_races": ["seen"]})) == []
    assert len(races((job, {"metrics": {}}))) == 1


@pytest.mark.parametrize("allow", ["seen", 3, ("seen", 1), ("",), None])
def test_allow_races_must_be_a_list_of_blob_names(allow):
    with pytest.raises(PlanError, match="allow_races must be a tuple or "
                       "list of blob names|must hold blob names"):
        allowed_races({"allow_races": allow})
    with pytest.raises(PlanError, match="allow"):
        races(lost_update_job(), allow=allow)


def test_a_race_is_a_small_immutable_picklable_value_that_reads_as_one_line():
    [race] = races(lost_update_job())
    assert isinstance(race, Race)
    assert pickle.loads(pickle.dumps(race)) == race
    with pytest.raises(AttributeError):
        race.blob = "other"
    text = str(race)
    assert "\n" not in text
    assert text.startswith("blob 'seen' on node 'worker_0': op Add #2 of "
                           "net 'worker_0/count' (task 'worker_0/count', "
                           "step 'worker_0/count') writes it in instance 0 "
                           "of task 'worker_0/count' while op Copy #1 of "
                           "net 'worker_0/count'")
    assert "reads it in instance 1 of task 'worker_0/count'" in text


def test_races_are_sorted_and_the_analysis_changes_nothing():
    with TaskGroup() as group:
        for node in ("b", "a"):
            with Node(node):
                for name in ("left", "right"):
                    with Task(name=name):
                        ops.Add(["y", ops.Const(1.0)], ["y"])
                        ops.Add(["x", ops.Const(1.0)], ["x"])
    found = races(group)
    assert [(r.node, r.blob) for r in found] == [
        ("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")]
    assert races(group) == found
    with Node("a"), Task(name="later", group=group):   # still open
        ops.Const(1.0)


def test_a_task_alone_runs_as_a_group_of_just_it():
    with Node("n"):
        task = Task(name="alone", num_instances=2)
        with task:
            ops.Add(["k", ops.Const(1.0)], ["k"])
    [race] = races(task)
    assert race.blob == "k" and race.first.task == "n/alone"


def test_the_atomic_table_names_ops_that_take_the_node_lock():
    """`ATOMIC` mirrors the kernels: each op it names is registered, takes
    the node's context (its lock) and has the input it names."""
    from localcluster.kernels import registry
    from localcluster.plan.races import ATOMIC
    for op_type, inputs in ATOMIC.items():
        schema = registry.lookup(op_type)
        assert schema is not None and schema.context, op_type
        assert max(inputs) < schema.inputs[0], op_type
    for op_type in ("CreateCursor", "AppendDataset"):
        assert registry.lookup(op_type).atomic


def test_races_of_something_else_is_a_type_error():
    with pytest.raises(TypeError, match="races needs a Job, a TaskGroup or "
                                        "a Task"):
        races(Net("net"))


# -- the missing blob's error ---------------------------------------------------------

@pytest.mark.parametrize("workspace_type", [WorkspaceType.PRIVATE,
                                            WorkspaceType.GLOBAL])
def test_reading_a_blob_only_a_concurrent_task_writes_says_so(
        workspace_type):
    """Under this schedule the pipe reads before the dataset exists: the
    error names the task that makes it and says nothing orders the two,
    instead of telling the user to check the order of their ops."""
    with LocalSession(schedule=1) as session:
        with pytest.raises(TaskFailedError) as info:
            session.run(_dataset_beside_its_pipe(workspace_type), timeout=10)
    error = info.value
    assert (error.node, error.task, error.op_type) == ("src", "src/feed",
                                                       "ReadDataset")
    cause = error.__cause__
    assert isinstance(cause, BlobNotFoundError) and cause.blob == "ds/v"
    assert str(cause) == (
        "blob 'ds/v' not found on node 'src'; it is written only by op "
        "GivenTensorFill #0 of net 'src/make' (task 'src/make', step "
        "'src/make'), in task 'src/make', which runs concurrently with this "
        "op, in task 'src/feed', and nothing orders the two: write it "
        "before they start -- in a setup net (ops.task_init, "
        "ops.local_init), an earlier step or an earlier group -- or send "
        "it through a queue")
    assert "in task 'src/make', which runs concurrently" in str(error)


def test_a_blob_nothing_writes_still_says_to_check_the_order():
    with TaskGroup() as group, Node("n"):
        with Task(name="reads"):
            ops.Copy(["ghost"], ["copy"])
        with Task(name="other"):
            ops.Const(1.0, blob_out="unrelated")
    with LocalSession(schedule=0) as session:
        with pytest.raises(TaskFailedError) as info:
            session.run(group, timeout=10)
    assert str(info.value.__cause__) == (
        "blob 'ghost' not found on node 'n'; nothing wrote it before it was "
        "read: check the order of your ops, or feed it with "
        "session.feed_blob")


def test_a_node_process_names_the_concurrent_writer_too(localhost_scheduler):
    """The hint is worked out where the op fails -- in the node's own
    process, from the plan it was sent."""
    with TaskGroup() as group, Node("src"), Task(name="make"):
        ops.Sleep([], [], seconds=5.0)    # the pipe reads long before
        dataset = Dataset({"v": np.arange(3.0)}, name="ds")
        pipe(dataset.reader(), Queue(4), name="feed")
    with pytest.raises(TaskFailedError) as info:
        localhost_scheduler.run(group, timeout=30)
    assert info.value.task == "src/feed"
    assert ("blob 'ds/v' not found on node 'src'; it is written only by op "
            "GivenTensorFill #1 of net 'src/make' (task 'src/make', step "
            "'src/make'), in task 'src/make', which runs concurrently with "
            "this op, in task 'src/feed'") in str(info.value)
