"""Blobs and nets: the leaves of a plan.

A `Net` is an ordered list of `Op` records (type, input names, output
names, arguments).  Nothing here computes: a net is pure, picklable data
that the runtime executes later, on whatever host the session chooses.
Ops are validated against the op registry when they are *added* (unknown
type, wrong output count, unknown argument), so a bad plan fails where it
was written.

Naming: auto-generated blob names are ``<net name>/<prefix>_<n>`` with a
per-net counter, and net names are made unique within the current build
scope (see `localcluster.context`).  Both are therefore a deterministic
function of how the job was built, which is what lets a rebuilt job resume
from a checkpoint.  A net created outside every context keeps the name you
gave it.
"""

import os
import sys

import numpy as np

from ..context import BuildScope, build_scope
from ..errors import PlanError
from ..kernels import registry

__all__ = ["BlobRef", "Op", "Net", "blob_names", "plan_epoch",
           "register_attribute_check"]

# Bumped whenever any net gains an op: a cache of prepared plans (pickled
# for the node processes, say) is valid while the epoch is unchanged.
_epoch = [0]


def plan_epoch():
    return _epoch[0]


# What may be attached under an attribute key, by key.  The modules that
# define the keys register their rule here (`localcluster.plan.setup` does
# for the setup and report keys): a net stays at the bottom of the plan
# layer and validates what is attached to it without knowing those types.
_attribute_checks = {}


def register_attribute_check(key, check):
    """Make ``net.add_attribute(key, obj)`` call ``check(key, obj)`` first
    (``check`` raises `PlanError` for a value that cannot go there)."""
    _attribute_checks[key] = check


class BlobRef(str):
    """A named reference to a blob; ``str(ref)`` is its name.

    It is a ``str`` so it can be used wherever a blob name is accepted.  A
    generated name keeps its build scope alive, which reserves the name
    against other jobs for as long as the reference is held.
    """

    def __new__(cls, name, _scope=None):
        name = str(name)
        if not name:
            raise PlanError("a blob name cannot be empty")
        ref = super().__new__(cls, name)
        if _scope is not None:
            ref._scope = _scope
        return ref

    def __repr__(self):
        return f"BlobRef({str(self)!r})"

    def __reduce__(self):
        return (BlobRef, (str(self),))


def blob_names(blobs, what="inputs"):
    """Normalise a name, a BlobRef or a list of them to a tuple of names."""
    if blobs is None:
        return ()
    if isinstance(blobs, str):
        return (str(blobs),)
    if isinstance(blobs, (list, tuple)):
        out = []
        for b in blobs:
            if not isinstance(b, str):
                raise PlanError(
                    f"{what} must be blob names or BlobRefs, got "
                    f"{type(b).__name__} {b!r}")
            if not b:
                raise PlanError(f"{what} contain an empty blob name")
            out.append(str(b))
        return tuple(out)
    raise PlanError(
        f"{what} must be a blob name, a BlobRef or a list of them, got "
        f"{type(blobs).__name__} {blobs!r}")


#: the library's own files (its example job is user code): where an op
#: was built is the first frame outside them
_LIBRARY = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) \
    + os.sep
_EXAMPLES = os.path.join(_LIBRARY, "examples") + os.sep


def _built_where():
    """``(file, line, function)`` of the code that is adding an op: the
    innermost frame outside the library (None if there is none)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_LIBRARY) or name.startswith(_EXAMPLES):
            return (name, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


class Op:
    """One operator of a net: ``type(inputs) -> outputs`` with ``args``;
    ``where`` is the ``(file, line, function)`` of the user's code that
    built it (None if unknown), which a failure of the op names."""

    __slots__ = ("type", "inputs", "outputs", "args", "where")

    def __init__(self, type, inputs, outputs, args, where=None):
        self.type = type
        self.inputs = inputs
        self.outputs = outputs
        self.args = args
        self.where = where

    def __getstate__(self):
        return (self.type, self.inputs, self.outputs, self.args, self.where)

    def __setstate__(self, state):
        (self.type, self.inputs, self.outputs, self.args,
         self.where) = state

    def built_at(self):
        """``"<file>:<line> in <function>"`` where the op was built, or
        None."""
        if self.where is None:
            return None
        file, line, function = self.where
        return f"{file}:{line} in {function}"

    def __repr__(self):
        return (f"Op({self.type}, inputs={list(self.inputs)}, "
                f"outputs={list(self.outputs)})")


class _OpMaker:
    """``net.OpType`` -- call it to append an op of that type."""

    __slots__ = ("_net", "_schema", "_fixed_args")

    def __init__(self, net, schema, fixed_args=None):
        self._net = net
        self._schema = schema
        self._fixed_args = fixed_args or {}

    def __call__(self, inputs=None, outputs=None, **args):
        args.update(self._fixed_args)
        return self._net.add_op(self._schema, inputs, outputs, args)


class Net:
    """An ordered list of operators; ``net.Add([a, b])`` appends one.

    Attribute access with an op type name returns a callable
    ``(inputs=None, outputs=None, **args)`` that appends the op and returns
    its output `BlobRef` (one output) or a tuple of them.  ``outputs`` may be
    a name, a BlobRef, a list of them, or an int N meaning N fresh blobs;
    omitted, the op gets its default number of fresh outputs (one for most).
    """

    def __init__(self, name="net"):
        name = str(name) if name else "net"
        # A net made outside every context is its own scope: it keeps its
        # name, and its blob names depend only on its own ops.
        self._scope = build_scope() or BuildScope()
        self._name = self._scope.name("net", name)
        self._ops = []
        self._attributes = {}
        self._next_blob_id = 0

    # -- identity and contents -----------------------------------------------

    @property
    def name(self):
        return self._name

    @property
    def ops(self):
        """The ops, in order (a read-only tuple, copied on each call)."""
        return tuple(self._ops)

    @property
    def num_ops(self):
        """How many ops the net has (no copy: the runtime asks each run)."""
        return len(self._ops)

    def __repr__(self):
        return f"Net({self._name!r}, {len(self._ops)} ops)"

    def __str__(self):
        return self._name

    def __getstate__(self):
        return {"name": self._name, "ops": self._ops,
                "attributes": self._attributes,
                "next_blob_id": self._next_blob_id}

    def __setstate__(self, state):
        self._scope = None
        self._name = state["name"]
        self._ops = state["ops"]
        self._attributes = state["attributes"]
        self._next_blob_id = state["next_blob_id"]

    # -- building ------------------------------------------------------------

    def next_blob(self, prefix="blob", detail=()):
        """A fresh auto-named BlobRef of this net (``detail``: what the op
        that makes it does, so another job's op never gets its name)."""
        if self._scope is None:
            self._scope = BuildScope()
        name = self._scope.name(
            "blob", f"{self._name}/{prefix}_{self._next_blob_id}", detail)
        self._next_blob_id += 1
        return BlobRef(name, self._scope)

    def __getattr__(self, op_type):
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        schema = registry.lookup(op_type)
        if schema is None:
            close = registry.close_matches(op_type)
            hint = (f"; did you mean {', '.join(close)}?" if close else
                    "; register it with localcluster.register_op")
            raise AttributeError(f"unknown op type {op_type!r}{hint}")
        return _OpMaker(self, schema)

    def add_op(self, schema_or_type, inputs=None, outputs=None, args=None):
        """Append an op; returns its output BlobRef(s) as ``net.Op`` does."""
        schema = (schema_or_type if isinstance(schema_or_type,
                                               registry.OpSchema)
                  else registry.lookup(schema_or_type))
        if schema is None:
            raise PlanError(f"unknown op type {schema_or_type!r}")
        args = dict(args or {})
        schema.check_args(args)
        in_names = blob_names(inputs, f"inputs of {schema.name}")
        schema.check_num_inputs(len(in_names))
        prefix = schema.name.lower()
        if outputs is None:
            outputs = schema.num_outputs
        if isinstance(outputs, bool) or not isinstance(
                outputs, (int, str, list, tuple)):
            raise PlanError(
                f"outputs of {schema.name} must be a name, a BlobRef, a list "
                f"of them or an int, got {type(outputs).__name__}")
        if isinstance(outputs, int):
            if outputs < 0:
                raise PlanError(f"outputs of {schema.name} cannot be negative")
            detail = (schema.name, in_names, args)
            out_refs = tuple(self.next_blob(prefix, detail)
                             for _ in range(outputs))
        else:
            out_refs = tuple(BlobRef(n) for n in
                             blob_names(outputs, f"outputs of {schema.name}"))
        schema.check_num_outputs(len(out_refs))
        _epoch[0] += 1
        self._ops.append(Op(schema.name, in_names,
                            tuple(str(o) for o in out_refs), args,
                            _built_where()))
        if len(out_refs) == 1:
            return out_refs[0]
        return out_refs

    def Const(self, value, name=None, dtype=None, blob_out=None):
        """A blob holding ``np.asarray(value, dtype)`` (int -> int64...)."""
        array = np.array(value, dtype=dtype)
        if array.dtype == object:
            raise PlanError(
                f"Const value {value!r} is not a numeric array; pass numbers,"
                " bools or lists of them")
        out = blob_out if blob_out is not None else name
        if out is None:
            out = self.next_blob("const", ("GivenTensorFill", array))
        return self.add_op("GivenTensorFill", [], [out], {"values": array})

    def Python(self, fn):
        """``net.Python(fn)(inputs, outputs)``: an op calling ``fn(*arrays)``."""
        if not callable(fn):
            raise PlanError(f"Python op needs a callable, got {fn!r}")
        return _OpMaker(self, registry.lookup("Python"), {"fn": fn})

    # -- attributes (setup objects, report steps) ------------------------------

    def add_attribute(self, key, obj):
        check = _attribute_checks.get(key)
        if check is not None:
            check(key, obj)
        self._attributes.setdefault(key, []).append(obj)

    def get_attributes(self, key):
        return list(self._attributes.get(key, ()))
