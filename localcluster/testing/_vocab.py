"""The statements drawn programs are made of, each with its reference model.

A drawn task runs a short *program* on a few float64 registers of its own
(``t0_a``, ``t0_b``...; each a vector of the drawn width) and on blobs its
node shares between tasks (the counter ``count``, the vector ``acc``).
Every statement knows two things:

- ``build(regs)`` appends it, with the ops DSL, to the task being built
  (``regs``: the task's register names);
- ``apply(regs, node)`` does the same to the reference model: ``regs`` a
  list of tuples of Python ints, ``node`` a `NodeModel`.

Values are integers kept in float64, so every result is exact: the
strategies bound their growth (coefficients of magnitude <= 3, a few
statements, short loops) far below 2**53, and `exact` checks it.  Shared
blobs are touched only by atomic ops (``CountUp``, ``AtomicAdd``) whose
results do not depend on the order concurrent tasks run in, so the
model's value is the value under every schedule.

`Update`s are what an epoch task does to its *persistent* registers (the
``t0_w``, ``t0_x``... the init group made): additive, so values grow
linearly with the number of epochs.
"""

import dataclasses

import numpy as np

from ..plan.builder import ops

__all__ = ["NodeModel", "exact", "floats", "register_names", "SetConst",
           "Copy", "Add", "Sub", "Scale", "MulConst", "CountUp", "AtomicAdd",
           "Loop", "uses", "Update", "UPDATE_OPS", "COUNT", "ACC"]

#: the names of the blobs a node's tasks share
COUNT, ACC = "count", "acc"

#: the largest magnitude float64 holds exactly as an integer
_EXACT = 2 ** 53


def exact(values):
    """``values`` (ints) as a tuple, after checking float64 holds them."""
    values = tuple(values)
    for v in values:
        if abs(v) >= _EXACT:
            raise AssertionError(
                f"a drawn program reached {v}, beyond what float64 holds "
                f"exactly (2**53); the vocabulary's bounds are wrong")
    return values


def register_names(prefix, count, letters="abcdefgh"):
    """``prefix_a``, ``prefix_b``, ... (``count`` of them, lettered from
    ``letters``)."""
    return tuple(f"{prefix}_{letters[i]}" for i in range(count))


def floats(values):
    return np.array(values, dtype=np.float64)


@dataclasses.dataclass
class NodeModel:
    """The shared blobs of one node in the model."""
    width: int
    count: int = 0
    acc: tuple = None

    def __post_init__(self):
        if self.acc is None:
            self.acc = (0,) * self.width


# -- statements ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SetConst:
    """``dst = values``"""
    dst: int
    values: tuple

    def build(self, regs):
        ops.Const(floats(self.values), blob_out=regs[self.dst])

    def apply(self, regs, node):
        regs[self.dst] = exact(self.values)


@dataclasses.dataclass(frozen=True)
class Copy:
    """``dst = a``"""
    dst: int
    a: int

    def build(self, regs):
        ops.Copy([regs[self.a]], [regs[self.dst]])

    def apply(self, regs, node):
        regs[self.dst] = regs[self.a]


@dataclasses.dataclass(frozen=True)
class Add:
    """``dst = a + b``"""
    dst: int
    a: int
    b: int

    def build(self, regs):
        ops.Add([regs[self.a], regs[self.b]], [regs[self.dst]])

    def apply(self, regs, node):
        regs[self.dst] = exact(x + y for x, y in zip(regs[self.a],
                                                     regs[self.b]))


@dataclasses.dataclass(frozen=True)
class Sub:
    """``dst = a - b``"""
    dst: int
    a: int
    b: int

    def build(self, regs):
        ops.Sub([regs[self.a], regs[self.b]], [regs[self.dst]])

    def apply(self, regs, node):
        regs[self.dst] = exact(x - y for x, y in zip(regs[self.a],
                                                     regs[self.b]))


@dataclasses.dataclass(frozen=True)
class Scale:
    """``dst = a * scale`` (the ``Scale`` op)"""
    dst: int
    a: int
    scale: int

    def build(self, regs):
        ops.Scale([regs[self.a]], [regs[self.dst]], scale=self.scale)

    def apply(self, regs, node):
        regs[self.dst] = exact(x * self.scale for x in regs[self.a])


@dataclasses.dataclass(frozen=True)
class MulConst:
    """``dst = a * c`` (``Mul`` by a constant blob)"""
    dst: int
    a: int
    c: int

    def build(self, regs):
        ops.Mul([regs[self.a], ops.Const(float(self.c))], [regs[self.dst]])

    def apply(self, regs, node):
        regs[self.dst] = exact(x * self.c for x in regs[self.a])


@dataclasses.dataclass(frozen=True)
class CountUp:
    """The node's ``count`` goes up by one (atomic)."""

    def build(self, regs):
        ops.CountUp([COUNT])

    def apply(self, regs, node):
        node.count += 1


@dataclasses.dataclass(frozen=True)
class AtomicAdd:
    """The node's ``acc += a`` (atomic)."""
    a: int

    def build(self, regs):
        ops.AtomicAdd([ACC, regs[self.a]])

    def apply(self, regs, node):
        node.acc = exact(x + y for x, y in zip(node.acc, regs[self.a]))


@dataclasses.dataclass(frozen=True)
class Loop:
    """``with ops.loop(n):`` the statements of ``body``"""
    n: int
    body: tuple

    def build(self, regs):
        with ops.loop(self.n):
            for stmt in self.body:
                stmt.build(regs)

    def apply(self, regs, node):
        for _ in range(self.n):
            for stmt in self.body:
                stmt.apply(regs, node)


def uses(program):
    """The shared blobs (`COUNT`, `ACC`) ``program`` touches."""
    found = set()
    for item in program:
        if isinstance(item, Loop):
            found |= uses(item.body)
        elif isinstance(item, CountUp):
            found.add(COUNT)
        elif isinstance(item, AtomicAdd):
            found.add(ACC)
    return found


# -- updates of persistent registers (epoch tasks) ----------------------------

#: op -> what it does (``w`` a persistent register, ``t`` a temporary)
UPDATE_OPS = {"add": "w += t", "sub": "w -= t", "set": "w = t",
              "neg": "w = -w"}


@dataclasses.dataclass(frozen=True)
class Update:
    """One of `UPDATE_OPS` on persistent register ``w`` and temporary ``t``."""
    op: str
    w: int
    t: int

    def build(self, state, temps):
        w, t = state[self.w], temps[self.t]
        if self.op == "add":
            ops.Add([w, t], [w])
        elif self.op == "sub":
            ops.Sub([w, t], [w])
        elif self.op == "set":
            ops.Copy([t], [w])
        else:
            ops.Scale([w], [w], scale=-1)

    def apply(self, state, temps):
        w, t = state[self.w], temps[self.t]
        if self.op == "add":
            state[self.w] = exact(x + y for x, y in zip(w, t))
        elif self.op == "sub":
            state[self.w] = exact(x - y for x, y in zip(w, t))
        elif self.op == "set":
            state[self.w] = t
        else:
            state[self.w] = tuple(-x for x in w)
