"""Generated names: deterministic per job, never shared between jobs."""

import subprocess
import sys
import textwrap

import pytest

from localcluster import (Cluster, Net, Node, PlanError, Task, TaskGroup,
                          WorkspaceType, ops, printer)
from localcluster.context import fresh_names


def build_job():
    with TaskGroup() as tg:
        with Node("trainer"), Task(num_instances=2):
            with ops.task_init():
                steps = ops.CreateCounter([], ["steps"])
            with ops.loop(3) as loop:
                ops.CountUp(steps)
                ops.Add([ops.Const(1.5), loop.iter()])
        with Node("reader"), Task():
            total = ops.ReduceSum(ops.Const([1.0, 2.0]))
    return tg, total


def test_building_the_same_job_twice_gives_the_same_names():
    first, total_1 = build_job()
    second, total_2 = build_job()
    assert str(total_1) == str(total_2)
    assert printer.to_string(first) == printer.to_string(second)


def test_the_same_job_gets_the_same_names_in_a_new_process():
    # as a fresh process would name it: a different job an earlier test
    # of this process keeps alive would rightly suffix its names
    with fresh_names():
        tg, total = build_job()
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        from test_naming import build_job
        from localcluster import printer
        tg, total = build_job()
        print(str(total))
        print(printer.to_string(tg))
    """) % (__file__.rsplit("/", 1)[0],)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    name, plan = out.split("\n", 1)
    assert name == str(total)
    assert plan.rstrip("\n") == printer.to_string(tg)


def test_a_different_job_never_shares_generated_names(session):
    with TaskGroup(WorkspaceType.GLOBAL) as keep:
        with Task():
            kept = ops.Const(1.0)
            with ops.loop(4):
                ops.Add([kept, ops.Const(1.0)], [kept])
    session.run(keep)
    # A separately built PRIVATE group whose first op looks alike but is
    # not the same: its temporaries must not land on the kept blob.
    with TaskGroup() as other:
        with Task():
            temp = ops.Const(7.0)
            ops.Mul([temp, temp])
    session.run(other)
    assert str(temp) != str(kept)
    assert session.fetch_blob(kept) == 5.0


def test_names_within_one_build_never_collide():
    with Cluster(), TaskGroup() as tg:
        with Node("n"):
            refs = []
            for _ in range(3):
                with Task():
                    refs.append(ops.Const(0))
    assert len(set(map(str, refs))) == 3
    assert len({t.name for t in tg.tasks()}) == 3


def test_a_net_made_outside_any_context_keeps_its_name():
    assert Net("my_net").name == "my_net"
    assert Net("my_net").name == "my_net"


def test_a_report_step_for_a_node_without_tasks_is_a_plan_error():
    with TaskGroup() as tg:
        with Node("a"), Task():
            ops.Const(1)
        tg.report_step(Net("report"), node="b")
    with pytest.raises(PlanError, match="'b'"):
        tg.tasks_by_node()
