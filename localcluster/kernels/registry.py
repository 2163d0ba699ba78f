"""The operator registry: op type name -> kernel and its signature.

This is the one deliberate global of the package, and it is append-only:
an op type, once registered, keeps its kernel for the life of the process
(re-registering the *same* function, e.g. when a module is reloaded, is
allowed).  The plan layer reads it to validate ops when they are built
(unknown type, wrong number of outputs, unknown argument); the runtime reads
it to find kernels.  Forked node processes inherit it.

A kernel is a plain function of numpy arrays::

    @register_op("Clip")
    def clip(x, lo=0.0, hi=1.0):
        return np.clip(x, lo, hi)

It receives the input arrays positionally and the op's arguments as
keywords (its parameters with a default, or keyword-only), and returns one array (one output), a tuple (several outputs) or
None (no outputs).  Built-in kernels that need the node (counters need its
lock, queues its channels) register with ``context=True`` and receive an
`OpContext` first.
"""

import difflib
import inspect
import threading

from ..errors import PlanError

__all__ = ["register_op", "OpSchema", "OpContext", "lookup", "op_names",
           "close_matches"]

_REGISTRY = {}
_REGISTRY_LOCK = threading.Lock()


class OpSchema:
    """What the plan layer knows about an op type."""

    __slots__ = ("name", "kernel", "num_outputs", "min_outputs",
                 "max_outputs", "context", "arg_names", "fast", "atomic",
                 "lends", "may_skip", "inputs", "bind")

    def __init__(self, name, kernel, num_outputs, min_outputs, max_outputs,
                 context, fast=None, atomic=False, lends=False,
                 may_skip=False):
        self.name = name
        self.kernel = kernel
        self.num_outputs = num_outputs
        self.min_outputs = min_outputs
        self.max_outputs = max_outputs
        self.context = context
        self.arg_names = _keyword_names(kernel)
        self.fast = fast  # same result as kernel for an op with no arguments
        self.atomic = atomic  # read, compute and write under the node lock
        self.lends = lends  # returns (outputs, done): outputs only lent
        self.may_skip = may_skip  # None: its outputs are left as they are
        #: (fewest, most or None) inputs the kernel takes; None: unknown
        self.inputs = _input_counts(kernel, context)
        #: None, or what the executor calls once per compiled op instead
        #: of binding the kernel to its context and arguments (`bind`)
        self.bind = None

    def check_args(self, args):
        if self.arg_names is None:
            return
        unknown = sorted(set(args) - self.arg_names)
        if unknown:
            allowed = ", ".join(sorted(self.arg_names)) or "none"
            raise PlanError(
                f"op {self.name} got unknown argument(s) {', '.join(unknown)};"
                f" its arguments are: {allowed}")

    def check_num_inputs(self, n):
        """PlanError when the op is given ``n`` inputs its kernel cannot
        take -- found as the op is built, not as numpy's words at run
        time."""
        if self.inputs is None:
            return
        lo, hi = self.inputs
        if n < lo or (hi is not None and n > hi):
            want = (f"{lo}" if hi == lo else f"at least {lo}"
                    if hi is None else f"{lo} to {hi}")
            raise PlanError(
                f"op {self.name} takes {want} input(s), got {n}")

    def check_num_outputs(self, n):
        hi = self.max_outputs
        if n < self.min_outputs or (hi is not None and n > hi):
            want = (f"{self.min_outputs}" if hi == self.min_outputs else
                    f"{self.min_outputs} to {hi}" if hi is not None else
                    f"at least {self.min_outputs}")
            raise PlanError(
                f"op {self.name} takes {want} output(s), got {n}")


class OpContext:
    """What a ``context=True`` kernel may use of the node running it.

    ``clock`` is the clock of the run in progress (real time, or a
    deterministic schedule's virtual time): a kernel that reads the time
    or waits uses it.  The runtime makes one per run (``run``: what holds
    the run's ``clock``, see `localcluster.runtime.clock`); the kernels
    only read it, so this layer needs nothing of the runtime."""

    __slots__ = ("node", "lock", "cancelled", "resources", "op", "run")

    def __init__(self, node, lock, cancelled, run, resources=None, op=None):
        self.node = node
        self.lock = lock            # node-wide: atomic counter ops
        self.cancelled = cancelled  # threading.Event set when the run stops
        self.run = run              # what holds the run's ``clock``
        self.resources = resources if resources is not None else {}
        self.op = op                # the op being run (names, arguments)

    @property
    def clock(self):
        return self.run.clock

    def for_op(self, op):
        return OpContext(self.node, self.lock, self.cancelled, self.run,
                         self.resources, op)


def _input_counts(kernel, context):
    """``(fewest, most)`` inputs of ``kernel`` (most None: any number):
    its positional parameters without a default (after the `OpContext`
    of a ``context`` kernel); None if its signature cannot be read."""
    try:
        params = list(inspect.signature(kernel).parameters.values())
    except (TypeError, ValueError):
        return None
    if context:
        params = params[1:]
    fixed = sum(1 for p in params
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty)
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    return fixed, None if variadic else fixed


def _keyword_names(kernel):
    """Names the kernel accepts as op arguments; None if it takes **kwargs.

    Inputs are the positional parameters without a default; arguments are
    the parameters with a default and the keyword-only ones.
    """
    try:
        params = inspect.signature(kernel).parameters.values()
    except (TypeError, ValueError):
        return None
    names = set()
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind is p.KEYWORD_ONLY or (
                p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty):
            names.add(p.name)
    return names


def register_op(name, *, num_outputs=1, min_outputs=None, max_outputs=None,
                context=False, fast=None, atomic=False, lends=False,
                may_skip=False):
    """Register ``kernel`` as op type ``name``; use as a decorator.

    ``num_outputs`` is how many fresh outputs an op gets when the caller
    omits ``outputs``; ``min_outputs``/``max_outputs`` bound what a caller
    may pass (default: exactly ``num_outputs``; ``max_outputs=None`` with
    ``min_outputs`` set means unbounded).  ``fast``, if given, is called
    instead of the kernel for ops without arguments (a numpy ufunc, say),
    saving a Python frame per op in tight loops.  ``atomic=True`` runs the
    whole op -- reading its inputs, the kernel, writing its outputs -- under
    the node's lock.  ``lends=True``: the kernel returns ``(outputs,
    done)`` where the outputs may be views on memory it only lends (a
    queue's slot, say); the executor copies them into the workspace, then
    calls ``done()`` (unless it is None) -- also when storing fails.
    ``may_skip=True``: the kernel may return None to leave its outputs as
    they are (as a ``Python`` op may).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise PlanError(
            f"op name {name!r} is not valid; use a Python identifier such "
            "as 'MyOp' so it can be called as net.MyOp(...)")
    lo = num_outputs if min_outputs is None else min_outputs
    hi = num_outputs if (min_outputs is None and max_outputs is None) \
        else max_outputs

    def decorate(kernel):
        if not callable(kernel):
            raise TypeError(f"register_op({name!r}) needs a callable kernel")
        with _REGISTRY_LOCK:
            old = _REGISTRY.get(name)
            if old is not None and _same_function(old.kernel, kernel) is False:
                raise PlanError(
                    f"op {name!r} is already registered with "
                    f"{_qualname(old.kernel)}; the registry is append-only, "
                    "so register your kernel under another name")
            _REGISTRY[name] = OpSchema(name, kernel, num_outputs, lo, hi,
                                       context, fast, atomic, lends, may_skip)
        return kernel

    return decorate


def _qualname(fn):
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def _same_function(a, b):
    return a is b or _qualname(a) == _qualname(b)


def ensure_registered(schema):
    """Register ``schema`` as it is, unless its name is taken (node side:
    the ops a plan brings along)."""
    with _REGISTRY_LOCK:
        _REGISTRY.setdefault(schema.name, schema)


def bind(name, binder):
    """Give built-in op type ``name`` a binder: ``binder(ctx, **args)``
    (``ctx`` None for an op without context), called once per compiled
    op, returns the callable the executor calls with the op's inputs
    instead of ``kernel(ctx, *inputs, **args)`` -- with the kernel's
    results and errors, what each call would look up done once.  For the
    few ops a tight loop runs per record."""
    _REGISTRY[name].bind = binder


def lookup(name):
    """The schema of op type ``name``, or None."""
    return _REGISTRY.get(name)


def op_names():
    return sorted(_REGISTRY)


def close_matches(name):
    return difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.6)
