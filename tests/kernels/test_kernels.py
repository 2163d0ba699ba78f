"""Numpy semantics of the built-in operators.

Every op runs through a session -- built into a net, ``session.run(net)``,
read back with ``session.fetch_blob`` -- and is compared with numpy, so
the same table pins every session kind.
"""

import time

import numpy as np
import pytest

from localcluster import Net, Task, TaskGroup, execution_step, ops

A = np.array([[1.0, -2.0, 3.5], [4.0, 0.5, -6.0]])
B = np.array([[0.5, 2.0, -1.0], [8.0, 0.5, 3.0]])
POS = np.array([[0.25, 1.0, 4.0], [9.0, 2.0, 0.5]])
BOOL_A = np.array([True, True, False, False])
BOOL_B = np.array([True, False, True, False])


def run_op(session, op_type, inputs, outputs=1, **args):
    """Run one op on ``inputs`` (arrays fed as constants); return the
    output array, or a tuple of them."""
    net = Net("kernels")
    names = [net.Const(np.asarray(x)) for x in inputs]
    out = getattr(net, op_type)(names, outputs, **args)
    session.run(net)
    if isinstance(out, tuple):
        return tuple(session.fetch_blob(o) for o in out)
    return session.fetch_blob(out)


def run_net(session, net, *names):
    session.run(net)
    return [session.fetch_blob(n) for n in names]


def sleep_20ms():
    time.sleep(0.02)


# -- arithmetic, comparison, logic --------------------------------------------

@pytest.mark.parametrize("op_type, inputs, expected", [
    ("Add", [A, B], A + B),
    ("Sub", [A, B], A - B),
    ("Mul", [A, B], A * B),
    ("Div", [A, B], A / B),
    ("Add", [A, np.array(10.0)], A + 10.0),
    ("Mul", [A, np.array([1.0, 2.0, 3.0])], A * [1.0, 2.0, 3.0]),
    ("Sum", [A], A),
    ("Sum", [A, B], A + B),
    ("Sum", [A, B, POS], A + B + POS),
    ("Neg", [A], -A),
    ("LT", [A, B], A < B),
    ("LE", [A, B], A <= B),
    ("GT", [A, B], A > B),
    ("GE", [A, B], A >= B),
    ("EQ", [A, A], np.ones_like(A, dtype=bool)),
    ("EQ", [np.array([1, 2, 3]), np.array([1, 0, 3])], [True, False, True]),
    ("NE", [np.array([1, 2, 3]), np.array([1, 0, 3])], [False, True, False]),
    ("LT", [A, np.array(1.0)], A < 1.0),
    ("And", [BOOL_A, BOOL_B], BOOL_A & BOOL_B),
    ("Or", [BOOL_A, BOOL_B], BOOL_A | BOOL_B),
    ("Not", [BOOL_A], ~BOOL_A),
    ("Mean", [A, B, POS], (A + B + POS) / 3),
    ("Max", [A, B], np.maximum(A, B)),
    ("Max", [A, B, POS], np.maximum(np.maximum(A, B), POS)),
    ("Min", [A, B], np.minimum(A, B)),
    ("Min", [A, B, POS], np.minimum(np.minimum(A, B), POS)),
    ("WeightedSum", [A, np.array(2.0), B, np.array(-0.5)], 2.0 * A - 0.5 * B),
])
def test_elementwise_ops_match_numpy(session, op_type, inputs, expected):
    got = run_op(session, op_type, inputs)
    np.testing.assert_allclose(got, expected)
    assert got.shape == np.shape(expected)


@pytest.mark.parametrize("op_type", ["LT", "LE", "GT", "GE", "EQ", "NE"])
def test_comparisons_return_bool(session, op_type):
    assert run_op(session, op_type, [A, B]).dtype == np.bool_


def test_integer_div_of_positive_ints_stays_integer(session):
    got = run_op(session, "Div", [np.array([7, 9, 8]), np.array([2, 4, 8])])
    assert got.dtype.kind == "i"
    np.testing.assert_array_equal(got, [3, 2, 1])


def test_add_accepts_the_broadcast_argument(session):
    got = run_op(session, "Add", [A, np.array([1.0, 2.0, 3.0])], broadcast=1)
    np.testing.assert_allclose(got, A + [1.0, 2.0, 3.0])


@pytest.mark.parametrize("x, scale", [
    (A, 2.5),
    (A, -1.0),
    (A.astype(np.float32), 0.5),
])
def test_scale_multiplies_and_keeps_float_dtype(session, x, scale):
    got = run_op(session, "Scale", [x], scale=scale)
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got, x * scale, rtol=1e-6)


def test_scale_defaults_to_identity(session):
    np.testing.assert_array_equal(run_op(session, "Scale", [A]), A)


# -- unary math ---------------------------------------------------------------

@pytest.mark.parametrize("op_type, x, fn", [
    ("Exp", A, np.exp),
    ("Log", POS, np.log),
    ("Sqr", A, np.square),
    ("Sqrt", POS, np.sqrt),
    ("Abs", A, np.abs),
    ("Tanh", A, np.tanh),
    ("Sigmoid", A, lambda x: 1.0 / (1.0 + np.exp(-x))),
    ("Relu", A, lambda x: np.maximum(x, 0.0)),
])
def test_unary_ops_match_numpy(session, op_type, x, fn):
    np.testing.assert_allclose(run_op(session, op_type, [x]), fn(x),
                               rtol=1e-12)


@pytest.mark.parametrize("args, expected", [
    ({"min": -1.0, "max": 2.0}, np.clip(A, -1.0, 2.0)),
    ({"min": 0.0}, np.clip(A, 0.0, None)),
    ({"max": 1.0}, np.clip(A, None, 1.0)),
])
def test_clip(session, args, expected):
    np.testing.assert_array_equal(run_op(session, "Clip", [A], **args),
                                  expected)


# -- casts, copies, fills -----------------------------------------------------

@pytest.mark.parametrize("x, to, dtype", [
    (np.array([1.7, -2.2, 0.0]), "int32", np.int32),
    (np.array([1.7, -2.2, 0.0]), np.int64, np.int64),
    (np.array([1, 0, 3]), np.float32, np.float32),
    (np.array([1, 0, 3]), "float64", np.float64),
    (np.array([1, 0, 3]), "bool", np.bool_),
    (np.array([True, False]), np.int64, np.int64),
])
def test_cast(session, x, to, dtype):
    got = run_op(session, "Cast", [x], to=to)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, x.astype(dtype))


def test_copy_duplicates_the_value(session):
    net = Net("copy")
    src = net.Const(A)
    dst = net.Copy([src])
    net.Scale([src], [src], scale=0.0)  # the copy must not follow
    got_src, got_dst = run_net(session, net, src, dst)
    np.testing.assert_array_equal(got_dst, A)
    np.testing.assert_array_equal(got_src, np.zeros_like(A))


@pytest.mark.parametrize("args, expected", [
    ({"shape": [2, 3], "value": 1.5}, np.full((2, 3), 1.5)),
    ({"shape": [4], "value": 0.0}, np.zeros(4)),
    ({"shape": [2, 2], "value": 7, "dtype": "int32"},
     np.full((2, 2), 7, dtype=np.int32)),
    ({"shape": [3], "value": 2, "dtype": np.float32},
     np.full(3, 2, dtype=np.float32)),
    ({"shape": [2], "value": True, "dtype": "bool"}, np.ones(2, dtype=bool)),
])
def test_constant_fill(session, args, expected):
    got = run_op(session, "ConstantFill", [], **args)
    np.testing.assert_array_equal(got, expected)
    if "dtype" in args:
        assert got.dtype == expected.dtype


@pytest.mark.parametrize("args, expected", [
    ({"values": [1.0, 2.0, 3.0]}, np.array([1.0, 2.0, 3.0])),
    ({"values": [1, 2, 3, 4], "shape": [2, 2]},
     np.array([[1, 2], [3, 4]])),
    ({"values": [1, 2, 3, 4, 5, 6], "shape": [3, 2], "dtype": np.float32},
     np.arange(1, 7, dtype=np.float32).reshape(3, 2)),
    ({"values": [0.5, 1.5], "dtype": "float64"}, np.array([0.5, 1.5])),
])
def test_given_tensor_fill(session, args, expected):
    got = run_op(session, "GivenTensorFill", [], **args)
    np.testing.assert_array_equal(got, expected)
    assert got.shape == expected.shape
    if "dtype" in args:
        assert got.dtype == expected.dtype


def _random_fills(op_type, seeds, **args):
    net = Net("random")
    outs = [getattr(net, op_type)([], seed=s, **args) for s in seeds]
    return net, outs


@pytest.mark.parametrize("op_type, args", [
    ("UniformFill", {"shape": [500], "min": -2.0, "max": 3.0}),
    ("GaussianFill", {"shape": [500], "mean": 1.0, "std": 0.5}),
])
def test_random_fills_are_reproducible_with_a_seed(session, op_type, args):
    net, outs = _random_fills(op_type, [7, 7, 8], **args)
    first = run_net(session, net, *outs)
    again = run_net(session, net, *outs)
    assert first[0].shape == (500,)
    np.testing.assert_array_equal(first[0], first[1])
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.array_equal(first[0], first[2])


def test_uniform_fill_stays_in_range(session):
    got = run_op(session, "UniformFill", [], shape=[20000], min=-2.0,
                 max=3.0, seed=1)
    assert got.min() >= -2.0 and got.max() <= 3.0
    # Spread over the whole range, not a constant or a sub-interval.
    assert got.min() < -1.9 and got.max() > 2.9
    assert abs(got.mean() - 0.5) < 0.1


def test_gaussian_fill_has_the_requested_moments(session):
    got = run_op(session, "GaussianFill", [], shape=[20000], mean=3.0,
                 std=2.0, seed=1)
    assert abs(got.mean() - 3.0) < 0.1
    assert abs(got.std() - 2.0) < 0.1


# -- linear algebra, reductions, shapes ---------------------------------------

M23 = np.arange(6.0).reshape(2, 3)
M32 = np.arange(6.0, 12.0).reshape(3, 2)


@pytest.mark.parametrize("a, b, args, expected", [
    (M23, M32, {}, M23 @ M32),
    (M32, M32, {"trans_a": True}, M32.T @ M32),
    (M23, M23, {"trans_b": True}, M23 @ M23.T),
    (M32, M23, {"trans_a": True, "trans_b": True}, M32.T @ M23.T),
])
def test_matmul(session, a, b, args, expected):
    got = run_op(session, "MatMul", [a, b], **args)
    np.testing.assert_allclose(got, expected)


X3 = np.arange(24.0).reshape(2, 3, 4)


@pytest.mark.parametrize("op_type, fn", [
    ("ReduceSum", np.sum),
    ("ReduceMean", np.mean),
])
@pytest.mark.parametrize("args, np_args", [
    ({}, {}),
    ({"axes": [0]}, {"axis": 0}),
    ({"axes": [1]}, {"axis": 1}),
    ({"axes": [0, 2]}, {"axis": (0, 2)}),
    ({"axes": [1], "keepdims": True}, {"axis": 1, "keepdims": True}),
    ({"axes": [0, 1, 2], "keepdims": True},
     {"axis": (0, 1, 2), "keepdims": True}),
])
def test_reductions(session, op_type, fn, args, np_args):
    got = run_op(session, op_type, [X3], **args)
    expected = fn(X3, **np_args)
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected)


@pytest.mark.parametrize("args, expected", [
    ({}, X3.T),
    ({"axes": [1, 0, 2]}, X3.transpose(1, 0, 2)),
])
def test_transpose(session, args, expected):
    np.testing.assert_array_equal(run_op(session, "Transpose", [X3], **args),
                                  expected)


def test_reshape(session):
    got = run_op(session, "Reshape", [X3], shape=[4, 6])
    np.testing.assert_array_equal(got, X3.reshape(4, 6))


@pytest.mark.parametrize("axis", [0, 1])
def test_concat(session, axis):
    got = run_op(session, "Concat", [M23, M23 + 10, M23 * 2], axis=axis)
    np.testing.assert_array_equal(
        got, np.concatenate([M23, M23 + 10, M23 * 2], axis=axis))


def test_shape_and_size(session):
    net = Net("shapes")
    x = net.Const(X3)
    shape, size = net.Shape([x]), net.Size([x])
    got_shape, got_size = run_net(session, net, shape, size)
    np.testing.assert_array_equal(got_shape, [2, 3, 4])
    assert got_shape.dtype.kind == "i"
    assert int(got_size) == 24


# -- Print --------------------------------------------------------------------

@pytest.mark.not_on_ray(reason="a Ray actor's output reaches the driver "
                        "through Ray's log monitor, not the descriptors it "
                        "inherits (test_ray.py checks the node's lines)")
def test_print_writes_name_and_value_to_stdout(session, capfd):
    # capfd, not capsys: under a multi-process session the node prints from
    # its own process, through the inherited file descriptor.
    net = Net("printing")
    scalar = net.Const(4242, name="the_answer")
    vector = net.Const(np.array([17.5, -3.25]), name="a_vector")
    net.Print([scalar, vector], [])
    capfd.readouterr()
    session.run(net)
    out = capfd.readouterr().out
    answer_line = next(line for line in out.splitlines()
                       if "the_answer" in line)
    assert "4242" in answer_line
    vector_line = next(line for line in out.splitlines()
                       if "a_vector" in line)
    assert "17.5" in vector_line and "-3.25" in vector_line


# -- counters -----------------------------------------------------------------

def counter_net(init_count=None):
    net = Net("counters")
    args = {} if init_count is None else {"init_count": init_count}
    return net, net.CreateCounter([], **args)


@pytest.mark.parametrize("init_count, expected", [(None, 0), (5, 5), (0, 0)])
def test_create_counter(session, init_count, expected):
    net, c = counter_net(init_count)
    count = net.RetrieveCount([c])
    got_c, got_count = run_net(session, net, c, count)
    assert int(got_count) == expected
    assert got_c.dtype.kind == "i"


def test_count_up_returns_the_count_before_incrementing(session):
    net, c = counter_net(5)
    ups = [net.CountUp([c]) for _ in range(3)]
    final = net.RetrieveCount([c])
    got = run_net(session, net, *ups, final)
    assert [int(v) for v in got] == [5, 6, 7, 8]


def test_count_down_returns_false_while_positive_then_true(session):
    net, c = counter_net(2)
    downs = [net.CountDown([c]) for _ in range(4)]
    final = net.RetrieveCount([c])
    got = run_net(session, net, *downs, final)
    assert [bool(v) for v in got[:4]] == [False, False, True, True]
    assert int(got[4]) == 0


def test_count_down_of_a_zero_counter_is_true_and_stays_zero(session):
    net, c = counter_net(0)
    done = net.CountDown([c])
    count = net.RetrieveCount([c])
    got_done, got_count = run_net(session, net, done, count)
    assert bool(got_done) is True
    assert int(got_count) == 0


def test_reset_counter(session):
    net, c = counter_net(1)
    for _ in range(3):
        net.CountUp([c])
    net.ResetCounter([c], [])
    after_reset = net.RetrieveCount([c])
    previous = net.ResetCounter([c], 1, init_count=9)
    after_reset_to_nine = net.RetrieveCount([c])
    got = run_net(session, net, after_reset, previous, after_reset_to_nine)
    assert [int(v) for v in got] == [0, 0, 9]


def test_counters_persist_across_runs(session):
    net, c = counter_net(0)
    session.run(net)
    up = Net("up")
    up.CountUp([c])
    for _ in range(3):
        session.run(up)
    assert int(session.fetch_blob(c)) == 3


def _run_instances(session, init_net, body_net, iters, instances):
    """Run ``body_net`` ``iters`` times in each of ``instances`` concurrent
    task instances, after ``init_net`` made the shared blobs."""
    session.run(init_net)
    with TaskGroup() as tg:
        Task(step=execution_step("body", [body_net], num_iter=iters),
             num_instances=instances)
    session.run(tg, timeout=30)


def test_count_up_is_atomic_across_task_instances(session):
    init, c = counter_net(0)
    body = Net("count_up")
    body.CountUp([c])
    _run_instances(session, init, body, iters=500, instances=8)
    assert int(session.fetch_blob(c)) == 4000


def test_count_down_is_atomic_across_task_instances(session):
    init, c = counter_net(1000)
    body = Net("count_down")
    body.CountDown([c])
    _run_instances(session, init, body, iters=200, instances=8)
    assert int(session.fetch_blob(c)) == 0


def test_atomic_add_is_atomic_across_task_instances(session):
    init = Net("acc_init")
    acc = init.Const(np.zeros(3), name="acc")
    init.Const(np.array([1.0, 2.0, 3.0]), name="step_value")
    body = Net("acc_add")
    body.AtomicAdd([acc, "step_value"], [])
    _run_instances(session, init, body, iters=500, instances=8)
    np.testing.assert_array_equal(session.fetch_blob(acc),
                                  [4000.0, 8000.0, 12000.0])


# -- timers -------------------------------------------------------------------

def test_timer_get_is_nonnegative_int64_nanoseconds_and_monotone(session):
    net = Net("timers")
    t = net.TimerBegin([])
    first = net.TimerGet([t])
    net.Python(sleep_20ms)([], [])
    second = net.TimerGet([t])
    third = net.TimerGet([t])
    got = run_net(session, net, first, second, third)
    for value in got:
        assert value.dtype == np.int64
        assert value.size == 1
    first_ns, second_ns, third_ns = (int(v) for v in got)
    assert 0 <= first_ns <= second_ns <= third_ns
    assert second_ns - first_ns >= 20_000_000
    assert third_ns < 10 * 1_000_000_000


def test_timer_get_and_end_stops_the_timer(session):
    net = Net("timers")
    t = net.TimerBegin([])
    net.Python(sleep_20ms)([], [])
    total = net.TimerGetAndEnd([t])
    net.Python(sleep_20ms)([], [])
    later = net.TimerGet([t])
    got_total, got_later = run_net(session, net, total, later)
    assert got_total.dtype == np.int64
    assert int(got_total) >= 20_000_000
    assert int(got_later) == int(got_total)


def test_timer_end_freezes_timer_get(session):
    net = Net("timers")
    t = net.TimerBegin([])
    net.Python(sleep_20ms)([], [])
    net.TimerEnd([t], [])
    frozen = net.TimerGet([t])
    net.Python(sleep_20ms)([], [])
    still = net.TimerGet([t])
    got_frozen, got_still = run_net(session, net, frozen, still)
    assert 20_000_000 <= int(got_frozen) == int(got_still)


def test_timer_begin_restarts_a_timer(session):
    net = Net("timers")
    t = net.TimerBegin([])
    net.Python(sleep_20ms)([], [])
    net.Python(sleep_20ms)([], [])
    long = net.TimerGet([t])
    net.TimerBegin([], [t])
    short = net.TimerGet([t])
    got_long, got_short = run_net(session, net, long, short)
    assert int(got_short) < int(got_long)


# -- ops DSL over the same kernels --------------------------------------------

def test_ops_dsl_runs_the_same_kernels(session):
    with Task() as task:
        x = ops.Const(A)
        y = ops.MatMul([x, ops.Const(M32)])
        z = ops.ReduceSum([y], axes=[1])
        task.add_output(z)
    session.run(task)
    np.testing.assert_allclose(task.outputs()[0].fetch(),
                               (A @ M32).sum(axis=1))
