"""Folding groups into per-node plans (`localcluster.plan.grouping`).

The folding moved from the task model into pure functions of plain values;
these tests pin that it folds exactly as before (``GOLDEN`` holds the node
plans the task model made before the move, for groups with setup blocks,
reporters, instances, empty tasks and a node remap), that the functions
work without any Task, and that looking at a plan -- printing, analysing,
`TaskGroup.grouped_view` -- changes nothing: no node is registered with
the current Cluster, no name is taken, and the group and its tasks can
still change and run.
"""

import numpy as np
import pytest

from localcluster import (Cluster, Job, Net, NetBuilder, Node, PlanError,
                          SetupNets, Task, TaskGroup, WorkspaceType, ops,
                          printer, to_execution_step)
from localcluster.context import build_scope
from localcluster.plan import grouping
from localcluster.plan.setup import LOCAL_REPORT_STEP

RUN_TIMEOUT = 5.0


# -- groups -------------------------------------------------------------------
# Names are unique to this file: generated names are claimed process-wide,
# so another test's live job with the same names would shift them.

def setup_group():
    with TaskGroup() as tg, Node("gx_setup", cpus=[0], env={"A": "1"}):
        with Task(name="work", num_instances=3) as t:
            with ops.task_init():
                ops.Const(0, blob_out="gx_count")
            with ops.task_exit():
                ops.Copy(["gx_count"], ["gx_final"])
            with ops.task_instance_init():
                ops.Const(1, blob_out="gx_one")
            with ops.task_instance_exit():
                ops.Copy(["gx_one"], ["gx_one_seen"])
            with ops.local_init():
                ops.Const(5, blob_out="gx_local")
            with ops.local_exit():
                ops.Copy(["gx_local"], ["gx_local_seen"])
            ops.Add(["gx_count", "gx_one"], ["gx_count"])
            t.add_output("gx_count")
    return tg


def shared_local_setup_group():
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        with Node("gx_a", memory_limit=1 << 30):
            setup = SetupNets(init_nets=[Net("gx_shared_init")],
                              exit_nets=[Net("gx_shared_exit")])
            for name in ("one", "two"):
                net = Net(f"gx_body_{name}")
                net.Const(1.0, blob_out=f"gx_{name}")
                net.add_attribute(TaskGroup.LOCAL_SETUP, setup)
                task = Task(step=net, name=name)
                task.add_output({"value": f"gx_{name}"})
        with Node("gx_b"):
            with Task(name="other"):
                ops.Const(np.arange(3.0), blob_out="gx_other")
            Task(name="empty")
    return tg


def reporter_group_and_reports():
    """The group, and its report steps as ``(node, step)`` pairs."""
    with TaskGroup() as tg:
        with Node("gx_r1"):
            with Task(name="periodic") as t:
                ops.Const(1, blob_out="gx_tick")
                with ops.task_reporter(interval_ms=20):
                    ops.Copy(["gx_tick"], ["gx_tick_seen"])
                with ops.local_reporter(interval_ms=30):
                    ops.Copy(["gx_tick"], ["gx_local_seen"])
                t.add_output("gx_tick")
            report = Net("gx_group_report")
            report.Copy(["gx_tick"], ["gx_group_seen"])
            report_step = tg.report_step(report, interval_ms=50)
        with Node("gx_r2"):
            with Task(name="plain", num_instances=2):
                ops.Const(2, blob_out="gx_two")
            report_net = tg.report_net(Net("gx_report_net"),
                                       report_interval=2)
    return tg, [("gx_r1", report_step),
                ("gx_r2", to_execution_step(report_net).replace(
                    run_every_ms=2000))]


def reporter_group():
    return reporter_group_and_reports()[0]


def single_task_group():
    with TaskGroup() as tg, Node("gx_single"):
        with Task(name="only"):
            ops.Const(3, blob_out="gx_three")
    return tg


def instances_group():
    with TaskGroup() as tg, Node("gx_i"):
        with Task(name="multi", num_instances=2):
            with ops.task_instance_init():
                ops.Const(0, blob_out="gx_i_local")
            with ops.local_reporter(interval_ms=15):
                ops.Copy(["gx_i_local"], ["gx_i_seen"])
            ops.Add(["gx_i_local", "gx_i_local"], ["gx_i_local"])
        Task(name="nothing")
    return tg


CASES = {"setup": setup_group, "shared": shared_local_setup_group,
         "reporters": reporter_group, "single": single_task_group,
         "instances": instances_group}


# -- describing plans ---------------------------------------------------------

def describe_step(step, depth=0):
    """Every field of a step tree, one line per step, net and op."""
    pad = "  " * depth
    opts = " ".join(f"{k}={v}" for k, v in step.options().items()
                    if v not in (None, False))
    lines = [f"{pad}step {step.name}" + (f" [{opts}]" if opts else "")]
    for net in step.nets:
        lines.append(f"{pad}  net {net.name}")
        lines.extend(f"{pad}    {op.type}({', '.join(op.inputs)}) -> "
                     f"{', '.join(op.outputs)}" for op in net.ops)
    for sub in step.substeps:
        lines.append(describe_step(sub, depth + 1))
    return "\n".join(lines)


def describe_node(node, wtype, outputs, kwargs, step):
    return "\n".join([
        f"{node} ({wtype})",
        f"  outputs: {', '.join(map(str, outputs)) or '-'}",
        f"  node kwargs: {sorted(kwargs.items())}", describe_step(step, 1)])


def describe_plans(plans):
    return "\n".join(describe_node(p.node, p.workspace_type, p.outputs,
                                   p.node_kwargs, p.step) for p in plans)


# Captured from the task model before the folding moved to plan.grouping.
GOLDEN = {
    "setup": """\
gx_setup (PRIVATE)
  outputs: gx_count
  node kwargs: [('cpus', [0]), ('env', {'A': '1'})]
  step gx_setup [task=gx_setup/grouped_by_node]
    step gx_setup:init
      step gx_setup/work/local_init
        net gx_setup/work/local_init
          GivenTensorFill() -> gx_local
    step gx_setup/work [task=gx_setup/work]
      step gx_setup/work:init
        step gx_setup/work/task_init
          net gx_setup/work/task_init
            GivenTensorFill() -> gx_count
      step gx_setup/work:instances [num_concurrent_instances=3]
        step gx_setup/work:instance
          step gx_setup/work:instance:init
            step gx_setup/work/task_instance_init
              net gx_setup/work/task_instance_init
                GivenTensorFill() -> gx_one
          step gx_setup/work
            net gx_setup/work
              Add(gx_count, gx_one) -> gx_count
          step gx_setup/work:instance:exit
            step gx_setup/work/task_instance_exit
              net gx_setup/work/task_instance_exit
                Copy(gx_one) -> gx_one_seen
      step gx_setup/work:exit
        step gx_setup/work/task_exit
          net gx_setup/work/task_exit
            Copy(gx_count) -> gx_final
    step gx_setup:exit
      step gx_setup/work/local_exit
        net gx_setup/work/local_exit
          Copy(gx_local) -> gx_local_seen""",
    "shared": """\
gx_a (GLOBAL)
  outputs: gx_one, gx_two
  node kwargs: [('memory_limit', 1073741824)]
  step gx_a [task=gx_a/grouped_by_node]
    step gx_a:init
      net gx_shared_init
    step gx_a:body [concurrent_substeps=True]
      step gx_a/one [task=gx_a/one]
        net gx_body_one
          GivenTensorFill() -> gx_one
      step gx_a/two [task=gx_a/two]
        net gx_body_two
          GivenTensorFill() -> gx_two
    step gx_a:exit
      net gx_shared_exit
gx_b (GLOBAL)
  outputs: -
  node kwargs: []
  step gx_b:body [concurrent_substeps=True task=gx_b/grouped_by_node]
    step gx_b/other [task=gx_b/other]
      net gx_b/other
        GivenTensorFill() -> gx_other
    step gx_b/empty [task=gx_b/empty]""",
    "reporters": """\
gx_r1 (PRIVATE)
  outputs: gx_tick
  node kwargs: []
  step gx_r1:body [concurrent_substeps=True task=gx_r1/grouped_by_node]
    step gx_r1/periodic/reporter [run_every_ms=30]
      net gx_r1/periodic/reporter_1
        Copy(gx_tick) -> gx_local_seen
    step gx_group_report [run_every_ms=50]
      net gx_group_report
        Copy(gx_tick) -> gx_group_seen
    step gx_r1/periodic:body [task=gx_r1/periodic]
      step gx_r1/periodic/reporter [run_every_ms=20]
        net gx_r1/periodic/reporter
          Copy(gx_tick) -> gx_tick_seen
      step gx_r1/periodic
        net gx_r1/periodic
          GivenTensorFill() -> gx_tick
gx_r2 (PRIVATE)
  outputs: -
  node kwargs: []
  step gx_r2:body [concurrent_substeps=True task=gx_r2/grouped_by_node]
    step gx_report_net [run_every_ms=2000]
      net gx_report_net
    step gx_r2/plain:instances [num_concurrent_instances=2 task=gx_r2/plain]
      step gx_r2/plain
        net gx_r2/plain
          GivenTensorFill() -> gx_two""",
    "single": """\
gx_single (PRIVATE)
  outputs: -
  node kwargs: []
  step gx_single/only [task=gx_single/only]
    net gx_single/only
      GivenTensorFill() -> gx_three""",
    "instances": """\
gx_i (PRIVATE)
  outputs: -
  node kwargs: []
  step gx_i:body [concurrent_substeps=True task=gx_i/grouped_by_node]
    step gx_i/multi/reporter [run_every_ms=15]
      net gx_i/multi/reporter
        Copy(gx_i_local) -> gx_i_seen
    step gx_i/multi:instances [num_concurrent_instances=2 task=gx_i/multi]
      step gx_i/multi:instance
        step gx_i/multi:instance:init
          step gx_i/multi/task_instance_init
            net gx_i/multi/task_instance_init
              GivenTensorFill() -> gx_i_local
        step gx_i/multi
          net gx_i/multi
            Add(gx_i_local, gx_i_local) -> gx_i_local
    step gx_i/nothing [task=gx_i/nothing]""",
    "remapped": """\
gx_m/grouped_by_node on gx_m (GLOBAL)
  outputs: gx_one, gx_two
  node kwargs: [('memory_limit', 1073741824)]
  step gx_m [task=gx_m/grouped_by_node]
    step gx_m:init
      net gx_shared_init
    step gx_m:body [concurrent_substeps=True]
      step gx_a/one [task=gx_a/one]
        net gx_body_one
          GivenTensorFill() -> gx_one
      step gx_a/two [task=gx_a/two]
        net gx_body_two
          GivenTensorFill() -> gx_two
      step gx_b/other [task=gx_b/other]
        net gx_b/other
          GivenTensorFill() -> gx_other
      step gx_b/empty [task=gx_b/empty]
    step gx_m:exit
      net gx_shared_exit""",
}


# -- the same plans as before -------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_node_plans_are_what_the_task_model_made_before(case):
    assert describe_plans(CASES[case]().node_plans()) == GOLDEN[case]


@pytest.mark.parametrize("case", sorted(CASES))
def test_tasks_by_node_gives_the_node_plans_as_grouped_tasks(case):
    group = CASES[case]()
    plans = group.node_plans()
    grouped = group.tasks_by_node().tasks()
    assert [t.name for t in grouped] == \
        [f"{p.node}/grouped_by_node" for p in plans]
    for task, plan in zip(grouped, plans):
        assert task.get_step() is plan.step
        assert task.output_list() == list(plan.outputs)
        assert task.node_kwargs == plan.node_kwargs


def test_grouped_view_with_a_node_map_is_what_it_was_before():
    grouped = shared_local_setup_group().grouped_view(
        {"gx_a": "gx_m", "gx_b": "gx_m"})
    assert "\n".join(
        describe_node(f"{t.name} on {t.node}", t.workspace_type(),
                      t.output_list(), t.node_kwargs, t.get_step())
        for t in grouped.tasks()) == GOLDEN["remapped"]


def _fold_from_plain_values(tasks, report_steps=(), wtype=None):
    """The grouping functions alone: tasks given as plain values."""
    folded = grouping.fold_by_node(
        [grouping.TaskPlan(t.node, t.planned_step(), t.output_list(),
                           t.node_kwargs) for t in tasks], report_steps)
    return grouping.to_node_plans(folded, wtype or WorkspaceType.PRIVATE)


@pytest.mark.parametrize("case", ["setup", "single", "instances",
                                  "reporters"])
def test_the_grouping_functions_alone_make_the_same_plans(case):
    group, reports = (reporter_group_and_reports() if case == "reporters"
                      else (CASES[case](), []))
    plans = _fold_from_plain_values(group.tasks(), reports)
    assert describe_plans(plans) == GOLDEN[case]


def test_task_step_of_plain_values_is_what_get_step_returns():
    with TaskGroup(), Node("gx_ts"):
        with NetBuilder(name="gx_ts_body") as nb:
            with ops.task_init():
                ops.Const(0, blob_out="gx_ts_count")
            with ops.task_instance_exit():
                ops.Copy(["gx_ts_count"], ["gx_ts_seen"])
            with ops.task_reporter(interval_ms=5):
                ops.Copy(["gx_ts_count"], ["gx_ts_reported"])
            ops.Add(["gx_ts_count", "gx_ts_count"], ["gx_ts_count"])
        body = to_execution_step(nb)
        task = Task(step=body, name="steps", num_instances=3)
    expected = grouping.task_step(task.name, body, 3)
    assert task.planned_step() is not expected  # made anew, not cached
    assert describe_step(task.get_step()) == describe_step(expected)
    assert task.get_step() is task.get_step()


def test_the_full_step_of_an_empty_task_is_an_empty_step_labelled_with_it():
    step = grouping.task_step("n/t", None)
    assert (step.name, step.task, step.nets, step.substeps) == \
        ("n/t", "n/t", (), ())


def test_a_wrapped_task_step_is_not_lifted_again():
    step = setup_group().tasks()[0].get_step()
    assert grouping.task_step("other/name", step) is step


def test_a_report_step_for_a_node_without_tasks_names_the_owner():
    task = grouping.TaskPlan("gx_x", grouping.task_step("gx_x/t", None))
    report = to_execution_step(Net("gx_lonely_report")).replace(
        run_every_ms=10)
    with pytest.raises(PlanError, match="node 'gx_y', where my group runs "
                       "no task; add a task on 'gx_y'"):
        grouping.fold_by_node([task], [("gx_y", report)], owner="my group")


# -- local reporters ----------------------------------------------------------

def test_a_local_reporter_is_an_attribute_of_the_net_it_was_built_in():
    with NetBuilder(name="gx_lr") as nb:
        ops.Const(1, blob_out="gx_lr_x")
        with ops.local_reporter(interval_ms=25):
            ops.Copy(["gx_lr_x"], ["gx_lr_seen"])
    net, = nb.children
    step, = net.get_attributes(LOCAL_REPORT_STEP)
    assert step.run_every_ms == 25
    assert grouping.local_report_steps([to_execution_step(nb)]) == [step]


def test_a_local_reporter_runs_once_per_node_whatever_carries_it():
    with NetBuilder(name="gx_lr2") as nb:
        ops.Const(1, blob_out="gx_lr2_x")
        with ops.local_reporter(interval_ms=25):
            ops.Copy(["gx_lr2_x"], ["gx_lr2_seen"])
    body = to_execution_step(nb)
    tasks = [grouping.TaskPlan("gx_n", grouping.task_step(f"gx_n/{i}", body,
                                                          3))
             for i in range(2)]
    node, = grouping.fold_by_node(tasks)
    periodic = [s for s in node.step.substeps if s.run_every_ms]
    assert [s.run_every_ms for s in periodic] == [25]


def test_a_local_reporter_inside_a_local_reporter_is_found_too():
    with NetBuilder(name="gx_lr3") as nb:
        ops.Const(1, blob_out="gx_lr3_x")
        with ops.local_reporter(interval_ms=30):
            ops.Copy(["gx_lr3_x"], ["gx_lr3_outer"])
            with ops.local_reporter(interval_ms=40):
                ops.Copy(["gx_lr3_x"], ["gx_lr3_inner"])
    found = grouping.local_report_steps([to_execution_step(nb)])
    assert [s.run_every_ms for s in found] == [30, 40]


# -- looking changes nothing --------------------------------------------------

def _job():
    with Cluster():
        with Job() as job:
            with Node("gx_job_node"), Task(name="epoch"):
                ops.Const(1, blob_out="gx_job_x")
        with job.init_group, Node("gx_job_init"), Task(name="init"):
            ops.Const(2, blob_out="gx_job_y")
    return job


def _analyze(obj):
    try:
        printer.analyze(obj)
    except PlanError:  # what it finds is not the point here
        pass


LOOKS = {
    "to_string(group)": printer.to_string,
    "analyze(group)": _analyze,
    "to_string(task)": lambda g: [printer.to_string(t) for t in g.tasks()],
    "analyze(task)": lambda g: [_analyze(t) for t in g.tasks()],
    "grouped_view": lambda g: g.grouped_view(),
    "grouped_view(remap)": lambda g: g.grouped_view(
        {n: "gx_elsewhere" for n in g.used_nodes()}),
}


def _global_state():
    """What building or looking at a plan could change: the current
    Cluster's nodes and their options, the names taken in the build scope."""
    cluster, scope = Cluster.current(), build_scope()
    return (cluster.nodes(), cluster.node_kwargs(),
            {k: set(v) for k, v in scope.used.items()} if scope else None)


@pytest.mark.parametrize("look", sorted(LOOKS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_looking_at_a_group_changes_no_global_state(case, look):
    with Cluster() as built_in:
        group = CASES[case]()
    assert built_in.nodes()  # the group's nodes are registered there only
    with Cluster() as looking:
        before = _global_state()
        LOOKS[look](group)
        assert _global_state() == before
        assert looking.nodes() == []
    assert describe_plans(group.node_plans()) == GOLDEN[case]


@pytest.mark.parametrize("look", [printer.to_string, _analyze])
def test_looking_at_a_job_changes_no_global_state(look):
    job = _job()
    with Cluster() as looking:
        before = _global_state()
        look(job)
        assert _global_state() == before
        assert looking.nodes() == []
    with Cluster(), job.epoch_group, Node("gx_job_node"):
        with Task(name="more"):  # its groups can still change
            ops.Const(3, blob_out="gx_job_z")


@pytest.mark.parametrize("look", sorted(LOOKS))
def test_a_group_looked_at_can_still_change_and_run(session, look):
    with Cluster(), TaskGroup() as group, Node("gx_later"):
        later = Task(name="later")
        with Task(name="first") as first:
            first.add_output(ops.Const(1, blob_out="gx_first"))
    with Cluster():
        LOOKS[look](group)
    with Cluster(), Node("gx_later"):
        with later:  # a task without a step can still get one ...
            out = later.add_output(ops.Const(2, blob_out="gx_later"))
        extra = Task(name="extra", group=group)  # ... the group can grow
        extra.set_step(Net("gx_extra"))
    session.run(group, timeout=RUN_TIMEOUT)
    assert out.fetch() == 2
    assert first.outputs()[0].fetch() == 1
    assert [t.name for t in group.tasks()] == \
        ["gx_later/later", "gx_later/first", "gx_later/extra"]


def test_a_grouped_task_with_an_invalid_node_is_refused_as_a_node_is():
    group = single_task_group()
    with pytest.raises(PlanError, match="node name 'a/b' is not valid"):
        group.grouped_view({"gx_single": "a/b"})
    with pytest.raises(PlanError, match="node name 'a/b' is not valid"):
        group.tasks_by_node(lambda node: "a/b")
