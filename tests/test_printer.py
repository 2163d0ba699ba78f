"""`printer.to_string` (readable plans) and `printer.analyze` (static
checks)."""

import numpy as np
import pytest

from localcluster import (Net, Node, PlanError, Task, TaskGroup,
                          WorkspaceType, execution_step, ops, printer)


# -- helpers ------------------------------------------------------------------

def indent(line):
    return len(line) - len(line.lstrip())


def line_index(lines, *needles, start=0):
    """Index of the first line from ``start`` containing every needle."""
    for i in range(start, len(lines)):
        if all(n in lines[i] for n in needles):
            return i
    raise AssertionError(f"no line contains {needles!r} in:\n" +
                         "\n".join(lines))


def assert_nested(text, outer, inner):
    """The first line naming ``inner`` is indented under an earlier, less
    indented line naming ``outer``."""
    lines = text.splitlines()
    i = line_index(lines, inner)
    parents = [line for line in lines[:i]
               if outer in line and inner not in line and
               indent(line) < indent(lines[i])]
    assert parents, f"{inner!r} is not indented under {outer!r}:\n{text}"


def assert_op_line(text, op_type, inputs, outputs):
    """One line names the op type with all its inputs and outputs."""
    line_index(text.splitlines(), op_type, *map(str, inputs),
               *map(str, outputs))


def sample_net():
    net = Net("sample_net")
    w = net.Const(np.ones(3), name="weights")
    x = net.Const(np.arange(3.0), name="features")
    net.Mul([w, x], "product")
    net.ReduceSum(["product"], "total")
    return net


def writer_task(node, blob, value=1.0, name=None):
    with Node(node):
        with Task(name=name) as task:
            ops.Const(value, name=blob)
    return task


def reader_task(node, blob, out="result", name=None):
    with Node(node):
        with Task(name=name) as task:
            ops.Copy([blob], out)
    return task


# -- to_string ----------------------------------------------------------------

def test_net_text_names_the_net_and_every_op_with_its_blobs():
    text = printer.to_string(sample_net())
    assert "sample_net" in text
    assert_op_line(text, "Mul", ["weights", "features"], ["product"])
    assert_op_line(text, "ReduceSum", ["product"], ["total"])
    lines = text.splitlines()
    mul, reduce_ = line_index(lines, "Mul"), line_index(lines, "ReduceSum")
    assert mul < reduce_
    assert_nested(text, "sample_net", "ReduceSum")


def _scaled(x, factor=1.0):
    return x * factor


def test_a_python_op_given_a_partial_shows_its_function_and_arguments():
    import functools
    net = Net("partial_net")
    net.Python(functools.partial(_scaled, factor=2.5))(["x"], ["y"])
    text = printer.to_string(net)
    assert "{fn=test_printer._scaled(factor=2.5)}" in text, text
    assert " at 0x" not in text


def test_step_text_shows_the_tree_and_its_controls():
    inner = execution_step("inner_step", [sample_net()], num_iter=3)
    outer = execution_step("outer_step", [inner, Net("tail_net")])
    text = printer.to_string(outer)
    lines = text.splitlines()
    assert "num_iter" in lines[line_index(lines, "inner_step")]
    assert "3" in lines[line_index(lines, "inner_step")]
    assert_nested(text, "outer_step", "inner_step")
    assert_nested(text, "inner_step", "sample_net")
    assert_nested(text, "sample_net", "Mul")
    assert "tail_net" in text
    assert_op_line(text, "Mul", ["weights", "features"], ["product"])


def test_task_text_names_the_task_its_nets_and_ops():
    with Node("solo_node"):
        with Task(name="solo") as task:
            x = ops.Const(np.arange(3.0))
            y = ops.Scale([x], scale=2.0)
            task.add_output(y)
    text = printer.to_string(task)
    assert "solo_node/solo" in text
    assert_op_line(text, "Scale", [x], [y])
    assert_nested(text, "solo_node/solo", "Scale")


def two_node_group():
    with TaskGroup() as tg:
        with Node("reader_node"):
            with Task(name="read") as read:
                data = ops.Const(np.arange(4.0))
                scaled = ops.Scale([data], scale=2.0)
                read.add_output(scaled)
        with Node("trainer_node"):
            with Task(name="train"):
                w = ops.Const(1.0)
                one = ops.Const(1.0)
                total = ops.Add([w, one])
    return tg, (data, scaled), (w, one, total)


def test_group_text_names_each_node_task_net_and_op():
    tg, (data, scaled), (w, one, total) = two_node_group()
    text = printer.to_string(tg)
    for node, task in [("reader_node", "reader_node/read"),
                       ("trainer_node", "trainer_node/train")]:
        assert task in text
        assert_nested(text, node, task)
    assert_op_line(text, "Scale", [data], [scaled])
    assert_op_line(text, "Add", [w, one], [total])
    assert_nested(text, "reader_node/read", "Scale")
    assert_nested(text, "trainer_node/train", "Add")
    lines = text.splitlines()
    assert line_index(lines, "Scale") < line_index(lines, "trainer_node/train")


def test_printing_a_group_does_not_stop_it_from_running(session):
    tg, _, _ = two_node_group()
    printer.to_string(tg)
    session.run(tg)
    read_task = tg.tasks()[0]
    np.testing.assert_array_equal(read_task.outputs()[0].fetch(),
                                  [0.0, 2.0, 4.0, 6.0])


# -- analyze: undefined blobs -------------------------------------------------

def test_blob_read_before_any_write_is_undefined():
    with TaskGroup() as tg:
        reader_task("n0", "never_written")
    with pytest.raises(PlanError, match="Blob undefined: never_written"):
        printer.analyze(tg)


def test_blob_read_before_its_write_in_the_same_task_is_undefined():
    with TaskGroup() as tg:
        with Node("n0"):
            with Task():
                ops.Copy(["late"], "early_copy")
                ops.Const(1.0, name="late")
    with pytest.raises(PlanError, match="Blob undefined: late"):
        printer.analyze(tg)


def test_blob_fed_only_at_run_time_is_reported_undefined(session):
    session.feed_blob("fed", np.array(3.0))
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        reader_task("local", "fed")
    with pytest.raises(PlanError, match="Blob undefined: fed"):
        printer.analyze(tg)


def test_blob_written_then_read_in_order_is_fine():
    with TaskGroup() as tg:
        with Node("n0"):
            with Task():
                ops.Const(1.0, name="made")
                ops.Copy(["made"], "copied")
            with Task():
                ops.Const(2.0, name="other")
    printer.analyze(tg)


def test_blob_defined_by_an_earlier_step_on_that_node_is_fine():
    define, use = Net("define"), Net("use")
    define.Const(np.ones(2), name="params")
    use.Scale(["params"], "scaled", scale=3.0)
    with TaskGroup() as tg:
        with Node("n0"):
            Task(step=execution_step("init_then_use", [
                execution_step("init", [define]),
                execution_step("use", [use], num_iter=2)]))
    printer.analyze(tg)


def test_blob_defined_in_task_init_is_fine_in_the_body():
    with TaskGroup() as tg:
        with Node("n0"):
            with Task():
                ops.Copy(["from_init"], "body_copy")
                with ops.task_init():
                    ops.Const(1.0, name="from_init")
    printer.analyze(tg)


def test_blob_defined_on_another_node_is_undefined():
    with TaskGroup() as tg:
        writer_task("n0", "only_on_n0")
        reader_task("n1", "only_on_n0")
    with pytest.raises(PlanError, match="Blob undefined: only_on_n0"):
        printer.analyze(tg)


# -- analyze: concurrent writers ----------------------------------------------

def test_two_concurrent_global_tasks_on_one_node_writing_a_blob_race():
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        writer_task("n0", "shared", 1.0, name="first")
        writer_task("n0", "shared", 2.0, name="second")
    with pytest.raises(PlanError, match="shared"):
        printer.analyze(tg)


def test_the_same_writers_on_different_nodes_are_fine():
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        writer_task("n0", "shared", 1.0, name="first")
        writer_task("n1", "shared", 2.0, name="second")
    printer.analyze(tg)


def test_concurrent_global_tasks_writing_different_blobs_are_fine():
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        writer_task("n0", "mine", 1.0, name="first")
        writer_task("n0", "yours", 2.0, name="second")
    printer.analyze(tg)


# -- analyze: what it accepts -------------------------------------------------

def test_analyze_accepts_a_task():
    good = writer_task("n0", "fine")
    printer.analyze(good)
    bad = reader_task("n0", "missing_input")
    with pytest.raises(PlanError, match="Blob undefined: missing_input"):
        printer.analyze(bad)


def test_analyze_accepts_a_group_and_leaves_it_runnable(session):
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        with Node("n0"):
            with Task():
                ops.Scale([ops.Const(np.arange(3.0))], "tripled", scale=3.0)
    printer.analyze(tg)
    session.run(tg)
    np.testing.assert_array_equal(session.fetch_blob("tripled", node="n0"),
                                  [0.0, 3.0, 6.0])


def test_analyze_error_is_a_value_error():
    with TaskGroup() as tg:
        reader_task("n0", "missing")
    with pytest.raises(ValueError):
        printer.analyze(tg)
