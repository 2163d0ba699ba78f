"""The hypothesis strategies of the testing kit: drawn plans run to the
values their model predicts on every session, shrink to small readable
examples, and draw quickly; fault plans and seeds stay in their bounds."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import (HealthCheck, Phase, find, given, settings,
                        strategies as st)
from hypothesis.errors import InvalidArgument

from localcluster import (JobRunner, LocalSession, MultiNodeCheckpointManager,
                          printer)
from localcluster.testing import (Delay, Epoch, FailCheckpoint, FaultPlan,
                                  Hang, Kill, Op, Step)
from localcluster.testing import strategies
from localcluster.testing._plans import GroupSpec, TaskSpec
from localcluster.testing._vocab import AtomicAdd, Loop, Scale
from localcluster.testing.strategies import (fault_plans, jobs, schedules,
                                             task_groups)

#: settings for finding the smallest example: the same examples on every
#: run (derandomized, no saved examples), and no
#: explaining of the failure (which tries many variations of it)
SHRINK = settings(database=None, max_examples=200, derandomize=True,
                  phases=[Phase.generate, Phase.shrink])

#: a fresh session per example: a session is a fixture of the test, and
#: each example makes (and closes) its own from the test's factory
PER_EXAMPLE = [HealthCheck.function_scoped_fixture]


def assert_blobs(session, expected):
    for node, blobs in expected.items():
        for name, value in blobs.items():
            got = session.fetch_blob(name, node)
            assert got.dtype == value.dtype, (node, name, got, value)
            np.testing.assert_array_equal(got, value, err_msg=f"{node} {name}")


def plan_size(drawn):
    return len(printer.to_string(drawn.build()).splitlines())


# -- drawn plans run as the model predicts ------------------------------------

@settings(max_examples=10, suppress_health_check=PER_EXAMPLE)
@given(drawn=task_groups())
def test_drawn_task_groups_leave_exactly_the_expected_blobs(session_factory,
                                                           drawn):
    with session_factory() as session:
        session.run(drawn.build(), timeout=30)
        assert_blobs(session, drawn.expected)


@settings(max_examples=5, suppress_health_check=PER_EXAMPLE)
@given(drawn=task_groups(nodes=["ps", "trainer"], max_tasks=4))
def test_building_twice_gives_independent_groups_that_both_run(
        session_factory, drawn):
    first, second = drawn.build(), drawn.build()
    assert first is not second
    assert not {id(t) for t in first.tasks()} & {id(t) for t in
                                                 second.tasks()}
    # a rebuild is the same plan, with the same names
    assert printer.to_string(first) == printer.to_string(second)
    assert first.used_nodes() == list(drawn.nodes)
    with session_factory() as session:
        session.run(first, timeout=30)
        session.run(second, timeout=30)
        assert_blobs(session, drawn.expected)
    assert set(drawn.nodes) <= {"ps", "trainer"} and set(drawn.expected) == \
        set(drawn.nodes)


@settings(max_examples=10, suppress_health_check=PER_EXAMPLE)
@given(drawn=jobs())
def test_drawn_jobs_train_the_expected_epochs_to_the_expected_blobs(
        session_factory, tmp_path_factory, drawn):
    job = drawn.build()
    assert job.nodes_to_checkpoint() == list(drawn.nodes)
    prefix = str(tmp_path_factory.mktemp("ckpt"))
    with session_factory() as session:
        runner = JobRunner(job, MultiNodeCheckpointManager(prefix),
                           timeout=30)
        assert runner.train(session) == drawn.epochs
        assert_blobs(session, drawn.expected)


@settings(max_examples=6, suppress_health_check=PER_EXAMPLE)
@given(drawn=jobs(max_epochs=3), data=st.data())
def test_a_drawn_job_resumed_from_any_epoch_ends_as_expected(
        tmp_path_factory, drawn, data):
    prefix = str(tmp_path_factory.mktemp("ckpt"))
    with LocalSession() as session:
        JobRunner(drawn.build(), MultiNodeCheckpointManager(prefix)).train(
            session)
    resume = data.draw(st.integers(0, drawn.epochs), label="resume")
    with LocalSession() as session:
        assert JobRunner(drawn.build(), MultiNodeCheckpointManager(prefix),
                         resume_from_epoch=resume).train(session) == \
            drawn.epochs
        assert_blobs(session, drawn.expected)


@settings(max_examples=40)
@given(group=task_groups(), job=jobs())
def test_drawn_plans_read_no_blob_before_writing_it_and_never_race(group,
                                                                    job):
    printer.analyze(group.build())
    printer.analyze(job.build())


def test_the_largest_values_the_bounds_allow_stay_exact():
    # the most loops the bounds allow, each scaling by the largest
    # coefficient, in the most tasks of the most instances
    grow = Loop(3, (Scale(0, 0, 3), Scale(0, 0, 3)))
    top = Loop(3, (Scale(0, 0, 3), AtomicAdd(0)))
    task = TaskSpec(0, 3, ((3, -3, 3),), (grow, grow, top))
    drawn = strategies.Drawn(GroupSpec(("node_0",), 3, (task,) * 6))
    acc = drawn.expected["node_0"]["acc"]
    assert abs(acc).max() > 2 ** 30  # large, and still exact
    with LocalSession() as session:
        session.run(drawn.build(), timeout=30)
        assert_blobs(session, drawn.expected)


# -- shrinking and printing ---------------------------------------------------

def test_the_smallest_drawn_group_is_one_register_of_zero():
    drawn = find(task_groups(), lambda d: True, settings=SHRINK)
    assert {node: {name: value.tolist() for name, value in blobs.items()}
            for node, blobs in drawn.expected.items()} == \
        {"node_0": {"t0_a": [0.0]}}


def test_a_group_property_failing_on_purpose_shrinks_to_one_node_one_task():
    drawn = find(task_groups(), lambda d: any(
        "count" in blobs for blobs in d.expected.values()),
        settings=SHRINK)
    assert drawn.nodes == ("node_0",)
    assert len(drawn.spec.tasks) == 1 and not drawn.spec.channels
    assert drawn.expected["node_0"]["count"] == 1
    assert plan_size(drawn) <= 12


def test_a_job_property_failing_on_purpose_shrinks_to_a_small_job():
    drawn = find(jobs(), lambda d: d.epochs >= 3,
                 settings=SHRINK)
    assert drawn.epochs == 3
    assert drawn.nodes == ("node_0",)
    assert len(drawn.spec.tasks) == 1 and not drawn.spec.feeds


def test_a_falsifying_example_prints_the_plan_the_expected_values_and_seed():
    @settings(SHRINK, max_examples=50, derandomize=True)
    @given(drawn=task_groups(), faults=fault_plans(3), seed=schedules())
    def never_counts(drawn, faults, seed):
        assert "count" not in drawn.expected.get("node_0", {})

    with pytest.raises(AssertionError) as info:
        never_counts()
    text = "\n".join(getattr(info.value, "__notes__", ()))
    assert "TaskGroup (GLOBAL) on 1 node(s): node_0" in text
    assert "CountUp(count)" in text
    assert "node_0: " in text and "count=1" in text
    assert "faults=FaultPlan()" in text
    assert "seed=0" in text
    assert len(text.splitlines()) < 40, text


def test_a_drawn_plan_prints_as_its_expected_values_and_plan_text():
    drawn = find(jobs(), lambda d: d.spec.feeds,
                 settings=SHRINK)
    text = repr(drawn)
    assert printer.to_string(drawn.build()) in text
    assert "q0_sum=[0]" in text and "q0_count=0" in text
    assert text.startswith("Drawn job on ['node_0'], 1 epoch(s)")


# -- fault plans --------------------------------------------------------------

ALL_KINDS = {"kill": Kill, "hang": Hang, "delay": Delay,
             "fail_checkpoint": FailCheckpoint}


@settings(max_examples=60)
@given(data=st.data(),
       nodes=st.sampled_from([1, 3, ["ps", "trainer_0"]]),
       epochs=st.one_of(st.none(), st.integers(1, 4)),
       max_faults=st.integers(0, 3),
       kinds=st.lists(st.sampled_from(sorted(ALL_KINDS)), min_size=1,
                      unique=True))
def test_fault_plans_stay_within_their_nodes_epochs_kinds_and_count(
        data, nodes, epochs, max_faults, kinds):
    if epochs is None and "fail_checkpoint" in kinds:
        kinds.remove("fail_checkpoint")
        if not kinds:
            kinds = ["kill"]
    plan = data.draw(fault_plans(nodes, epochs, kinds, max_faults,
                                 op_types=["Add"], step_names=["s"]))
    names = ([f"node_{i}" for i in range(nodes)] if isinstance(nodes, int)
             else nodes)
    assert isinstance(plan, FaultPlan) and len(plan) <= max_faults
    assert len(set(plan)) == len(plan)
    for fault in plan:
        assert fault.node in names
        assert type(fault) in [ALL_KINDS[k] for k in kinds]
        if isinstance(fault, FailCheckpoint):
            assert 0 <= fault.epoch <= epochs
            continue
        if epochs is not None:
            assert isinstance(fault.at, Epoch) and fault.at.k <= epochs
        else:
            assert fault.at in (Op("Add", 1), Op("Add", 2), Op("Add", 3),
                                Step("s"))
        if isinstance(fault, Delay):
            assert 0 <= fault.seconds <= 0.05


def test_fault_plans_shrink_to_no_fault_then_the_first_node_and_epoch():
    assert find(fault_plans(3, epochs=4), lambda p: True,
                settings=SHRINK) == FaultPlan()
    assert find(fault_plans(3, epochs=4), lambda p: len(p) >= 1,
                settings=SHRINK) == FaultPlan(Kill("node_0", Epoch(1)))
    assert find(fault_plans(["a", "b"], kinds=[Delay]),
                lambda p: len(p) >= 1, settings=SHRINK) == \
        FaultPlan(Delay("a", Op("GivenTensorFill", 1), 0.0))


def test_fault_plans_take_the_fault_classes_as_kinds():
    plan = find(fault_plans(2, epochs=2, kinds=[FailCheckpoint, Hang]),
                lambda p: len(p) == 2, settings=SHRINK)
    assert {type(f) for f in plan} <= {FailCheckpoint, Hang}


@pytest.mark.parametrize("call,message", [
    (lambda: fault_plans(0), r"nodes=0 must be an int >= 1"),
    (lambda: fault_plans(["a", "a"]), r"nodes=\['a', 'a'\] names a node "
                                      "twice"),
    (lambda: fault_plans(["a/b"]), r"non-empty, without '/'"),
    (lambda: fault_plans(2, epochs=0), r"epochs=0 must be an int >= 1"),
    (lambda: fault_plans(2, kinds=["crash"]), r"'crash' is not a fault kind"),
    (lambda: fault_plans(2, kinds=[]), r"at least one kind"),
    (lambda: fault_plans(2, kinds=["fail_checkpoint"]), r"pass epochs="),
    (lambda: fault_plans(2, max_faults=-1), r"max_faults=-1 must be an int"),
    (lambda: fault_plans(2, op_types=[]), r"at least one op type"),
    (lambda: task_groups(max_tasks=0), r"max_tasks=0 must be an int >= 1"),
    (lambda: task_groups(queues="yes"), r"queues='yes' must be True or "
                                        "False"),
    (lambda: jobs(max_epochs=0), r"max_epochs=0 must be an int >= 1"),
])
def test_misuse_names_the_argument_the_value_and_the_rule(call, message):
    with pytest.raises(InvalidArgument, match=message):
        call()


# -- seeds, generation, the module --------------------------------------------

@settings(max_examples=30)
@given(seed=schedules())
def test_schedules_are_seeds_in_a_fixed_range(seed):
    assert 0 <= seed <= strategies.MAX_SEED


def test_schedules_shrink_to_zero():
    assert find(schedules(), lambda s: True, settings=SHRINK) == 0


@settings(settings.get_profile("ci"), suppress_health_check=(),
          max_examples=30)
@given(group=task_groups(), job=jobs(), plan=fault_plans(3, epochs=5),
       op_plan=fault_plans(["ps", "trainer"]), seed=schedules())
def test_generation_passes_every_health_check_under_the_ci_profile(
        group, job, plan, op_plan, seed):
    assert group.expected and job.expected


def test_the_testing_kit_imports_without_hypothesis():
    code = ("import sys; sys.modules['hypothesis'] = None\n"
            "import localcluster.testing as t\n"
            "assert 'localcluster.testing.strategies' not in sys.modules\n"
            "print(repr(t.FaultPlan()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "FaultPlan()"


def test_the_public_names_of_the_strategies_module():
    assert set(strategies.__all__) == {
        "task_groups", "jobs", "fault_plans", "schedules", "conditions",
        "Drawn", "DrawnJob", "FAULT_KINDS", "DEFAULT_OP_TYPES", "MAX_SEED"}


def test_a_planted_bug_in_the_reference_model_is_found_and_shrunk(
        monkeypatch):
    # the model gets Sub wrong: a property comparing a run with it fails,
    # and shrinks to a node or two, a task or two, the Sub and its inputs
    from localcluster import LocalSession
    from localcluster.testing import _vocab

    def added(self, regs, node):
        regs[self.dst] = _vocab.exact(x + y for x, y in zip(regs[self.a],
                                                            regs[self.b]))

    monkeypatch.setattr(_vocab.Sub, "apply", added)

    def differs(drawn):
        with LocalSession() as session:
            session.run(drawn.build())
            return any(not np.array_equal(session.fetch_blob(name, node),
                                          value)
                       for node, blobs in drawn.expected.items()
                       for name, value in blobs.items())

    drawn = find(task_groups(), differs, settings=SHRINK)
    # a few nodes and tasks at most (shrinking is greedy, not exhaustive)
    assert len(drawn.nodes) <= 2 and len(drawn.spec.tasks) <= 2
    text = repr(drawn)
    assert "Sub(" in text
    assert plan_size(drawn) <= 12, text
