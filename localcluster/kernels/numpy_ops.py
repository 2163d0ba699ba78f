"""Built-in numpy kernels for every operator of the public contract.

Kernels are pure functions of arrays (see `registry`).  The few that need
the node -- counters (atomic under the node's lock), ``Print`` (the op's
input names) -- register with ``context=True`` and get an `OpContext`
first.  Counters and timers are plain numpy blobs, updated in place, so
they live in shared memory under LocalHostScheduler and are checkpointed
like any other blob.

Conventions: comparison and logical ops return bool arrays; ``Div`` of two
integer arrays is floor division (numpy ``//``); fills without a ``dtype``
take numpy's type of ``value`` (a Python int is int64, a float float64).
"""

import functools
import sys

import numpy as np

from .registry import register_op

_DTYPE_ALIASES = {
    "FLOAT": "float32", "DOUBLE": "float64", "INT32": "int32",
    "INT64": "int64", "BOOL": "bool", "FLOAT16": "float16",
    "INT8": "int8", "UINT8": "uint8", "INT16": "int16", "float": "float32",
    "double": "float64", "int": "int32", "long": "int64",
}


def to_dtype(dtype):
    """np.dtype for a numpy dtype, a type, or a name such as 'FLOAT'."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        dtype = _DTYPE_ALIASES.get(dtype, _DTYPE_ALIASES.get(dtype.upper(),
                                                               dtype))
    return np.dtype(dtype)


def _shape(shape):
    if shape is None:
        return ()
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


# -- fills -------------------------------------------------------------------

@register_op("ConstantFill")
def constant_fill(*like, shape=None, value=0.0, dtype=None, input_as_shape=False):
    if like:
        shape = like[0].tolist() if input_as_shape else like[0].shape
    return np.full(_shape(shape), value, dtype=to_dtype(dtype))


@register_op("GivenTensorFill")
def given_tensor_fill(values=None, shape=None, dtype=None):
    out = np.array(values, dtype=to_dtype(dtype))
    if shape is not None:
        out = out.reshape(_shape(shape))
    return out


@register_op("UniformFill")
def uniform_fill(*like, shape=None, min=0.0, max=1.0, seed=None, dtype=None):
    shape = like[0].shape if like else _shape(shape)
    out = np.random.default_rng(seed).uniform(min, max, size=shape)
    return out.astype(to_dtype(dtype) or np.float64, copy=False)


@register_op("GaussianFill")
def gaussian_fill(*like, shape=None, mean=0.0, std=1.0, seed=None, dtype=None):
    shape = like[0].shape if like else _shape(shape)
    out = np.random.default_rng(seed).normal(mean, std, size=shape)
    return out.astype(to_dtype(dtype) or np.float64, copy=False)


@register_op("Copy", min_outputs=1, max_outputs=None)
def copy(*xs):
    if len(xs) == 1:
        return np.array(xs[0], copy=True)
    return tuple(np.array(x, copy=True) for x in xs)


# -- arithmetic ----------------------------------------------------------------

def _binary(fn):
    def kernel(a, b, broadcast=None):
        return fn(a, b)
    return kernel


register_op("Add", fast=np.add)(_binary(np.add))
register_op("Sub", fast=np.subtract)(_binary(np.subtract))
register_op("Mul", fast=np.multiply)(_binary(np.multiply))


@register_op("Div")
def div(a, b, broadcast=None):
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":
        return np.floor_divide(a, b)
    return np.true_divide(a, b)


@register_op("Sum")
def sum_(*xs):
    return functools.reduce(np.add, xs)


@register_op("Mean")
def mean(*xs):
    return np.true_divide(functools.reduce(np.add, xs), len(xs))


@register_op("Max")
def max_(*xs):
    return functools.reduce(np.maximum, xs)


@register_op("Min")
def min_(*xs):
    return functools.reduce(np.minimum, xs)


@register_op("WeightedSum")
def weighted_sum(*xs_and_weights):
    """x0 * w0 + x1 * w1 + ... for inputs [x0, w0, x1, w1, ...]."""
    pairs = zip(xs_and_weights[0::2], xs_and_weights[1::2])
    return functools.reduce(np.add, (x * w for x, w in pairs))


@register_op("Scale")
def scale(x, scale=1.0):
    out = np.multiply(x, scale)
    return out.astype(x.dtype, copy=False) if x.dtype.kind == "f" else out


def _unary(fn):
    def kernel(x):
        return fn(x)
    return kernel


for _name, _fn in (("Neg", np.negative), ("Abs", np.abs), ("Exp", np.exp),
                   ("Log", np.log), ("Sqr", np.square), ("Sqrt", np.sqrt),
                   ("Tanh", np.tanh), ("Not", np.logical_not)):
    register_op(_name, fast=_fn)(_unary(_fn))


@register_op("Sigmoid")
def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@register_op("Relu")
def relu(x):
    return np.maximum(x, 0)


@register_op("Clip")
def clip(x, min=None, max=None):
    return np.clip(x, min, max)


# -- comparison and logic ----------------------------------------------------------

for _name, _fn in (("LT", np.less), ("LE", np.less_equal),
                   ("GT", np.greater), ("GE", np.greater_equal),
                   ("EQ", np.equal), ("NE", np.not_equal),
                   ("And", np.logical_and), ("Or", np.logical_or),
                   ("Xor", np.logical_xor)):
    register_op(_name, fast=_fn)(_binary(_fn))


@register_op("Cast")
def cast(x, to=None):
    return x.astype(to_dtype(to))


# -- linear algebra and reductions -----------------------------------------------

@register_op("MatMul")
def matmul(a, b, trans_a=False, trans_b=False):
    return np.matmul(a.T if trans_a else a, b.T if trans_b else b)


def _axes(axes):
    if axes is None:
        return None
    if isinstance(axes, (int, np.integer)):
        return int(axes)
    return tuple(int(a) for a in axes)


@register_op("ReduceSum")
def reduce_sum(x, axes=None, keepdims=False):
    return np.sum(x, axis=_axes(axes), keepdims=bool(keepdims))


@register_op("ReduceMean")
def reduce_mean(x, axes=None, keepdims=False):
    return np.mean(x, axis=_axes(axes), keepdims=bool(keepdims))


@register_op("Transpose")
def transpose(x, axes=None):
    return np.transpose(x, _axes(axes))


@register_op("Reshape")
def reshape(x, shape=None):
    return np.reshape(x, _shape(shape)).copy()


@register_op("Concat")
def concat(*xs, axis=0):
    return np.concatenate(xs, axis=axis)


@register_op("Shape")
def shape(x):
    return np.array(x.shape, dtype=np.int64)


@register_op("Size")
def size(x):
    return np.array(x.size, dtype=np.int64)


# -- counters: int64 0-d arrays, updated in place under the node's lock ------------

@register_op("CreateCounter")
def create_counter(init_count=0):
    return np.array(init_count, dtype=np.int64)


@register_op("CountUp", context=True)
def count_up(ctx, counter):
    with ctx.lock:
        before = counter.item()
        counter[...] = before + 1
    return np.array(before, dtype=np.int64)


@register_op("CountDown", context=True)
def count_down(ctx, counter):
    with ctx.lock:
        count = counter.item()
        if count > 0:
            counter[...] = count - 1
            return np.array(False)
    return np.array(True)


@register_op("RetrieveCount", context=True)
def retrieve_count(ctx, counter):
    with ctx.lock:
        return np.array(counter.item(), dtype=np.int64)


@register_op("ResetCounter", context=True, min_outputs=0, max_outputs=1,
             num_outputs=0)
def reset_counter(ctx, counter, init_count=0):
    with ctx.lock:
        before = counter.item()
        counter[...] = init_count
    return np.array(before, dtype=np.int64)


@register_op("AtomicAdd", num_outputs=0, context=True)
def atomic_add(ctx, acc, value):
    """``acc += value`` in place, atomically across the node's threads."""
    with ctx.lock:
        np.add(acc, value, out=acc, casting="unsafe")


# -- timers: int64 [start_ns, end_ns] (end_ns == -1 while running) -----------------
# They read the run's clock: real time, or a deterministic schedule's
# virtual time (so a ReaderWithTimeLimit keeps to virtual seconds there).

@register_op("TimerBegin", context=True)
def timer_begin(ctx):
    return np.array([ctx.clock.now_ns(), -1], dtype=np.int64)


def _elapsed(ctx, timer):
    end = timer[1] if timer[1] >= 0 else ctx.clock.now_ns()
    return np.array(end - timer[0], dtype=np.int64)


@register_op("TimerEnd", num_outputs=0, context=True)
def timer_end(ctx, timer):
    timer[1] = ctx.clock.now_ns()


@register_op("TimerGetAndEnd", context=True)
def timer_get_and_end(ctx, timer):
    timer[1] = ctx.clock.now_ns()
    return _elapsed(ctx, timer)


@register_op("TimerGet", context=True)
def timer_get(ctx, timer):
    return _elapsed(ctx, timer)


# -- the node ------------------------------------------------------------------

@register_op("NodeIndex", context=True)
def node_index(ctx):
    """The index of the prototype instance running the op (int64 scalar;
    0 on a plain node)."""
    return np.array(ctx.resources.get("instance", (0, 1))[0], dtype=np.int64)


@register_op("NodeCount", context=True)
def node_count(ctx):
    """The number of instances of the prototype running the op (int64
    scalar; 1 on a plain node)."""
    return np.array(ctx.resources.get("instance", (0, 1))[1], dtype=np.int64)


# -- host interaction -----------------------------------------------------------

@register_op("Print", num_outputs=0, context=True)
def print_(ctx, *xs, limit=None):
    """Write each input, with its blob name, to the node's stdout."""
    lines = []
    for name, x in zip(ctx.op.inputs, xs):
        flat = x.reshape(-1)
        shown = flat if limit is None else flat[:int(limit)]
        lines.append(f"{name}: {np.array2string(shown) if x.ndim else x}"
                     f"{' ...' if shown.size < flat.size else ''}\n")
    sys.stdout.write("".join(lines))
    sys.stdout.flush()


@register_op("Python", min_outputs=0, max_outputs=None)
def python(*xs, fn=None):
    """Call ``fn(*arrays)``; it returns an array, a tuple of them, or None."""
    return fn(*xs)
