"""Execution steps: the tree that says how nets run.

An `ExecutionStep` holds either nets (run in order) or substeps (run in
order, or concurrently on threads), never both, plus the controls the
runtime honours:

- ``num_iter``: run the body this many times (default one pass);
- ``should_stop_blob``: checked after every net and every substep; while it
  is false the body repeats (``only_once=True``: one pass that may end
  early).  Mutually exclusive with ``num_iter``;
- ``num_concurrent_instances``: run that many copies of the body
  concurrently, each in a private child workspace;
- ``create_workspace``: run in a private child workspace;
- ``run_every_ms``: as a substep, run every that many milliseconds while
  its siblings run, and once more after they finish.

Steps are immutable once built; `ExecutionStep.replace` makes a changed
copy.  Invalid combinations raise `PlanError` here, not when they run.
"""

from ..errors import PlanError
from .net import Net

__all__ = ["ExecutionStep", "execution_step", "to_execution_step"]

_OPTIONS = ("num_iter", "concurrent_substeps", "should_stop_blob",
            "only_once", "num_concurrent_instances", "create_workspace",
            "run_every_ms", "task")


def _positive_int(name, value, step_name, allow_zero=False):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as np
            if isinstance(value, np.integer):
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise PlanError(
                f"step {step_name!r}: {name} must be an int, got "
                f"{type(value).__name__} {value!r}") from None
    if value < 0 or (value == 0 and not allow_zero):
        rule = ">= 0" if allow_zero else ">= 1"
        raise PlanError(f"step {step_name!r}: {name} must be {rule}, got {value}")
    return value


class ExecutionStep:
    """A node of the execution tree (see the module docstring)."""

    __slots__ = ("name", "nets", "substeps") + _OPTIONS + ("__weakref__",)

    def __init__(self, name, nets=(), substeps=(), num_iter=None,
                 concurrent_substeps=False, should_stop_blob=None,
                 only_once=False, num_concurrent_instances=None,
                 create_workspace=False, run_every_ms=None, task=None):
        name = str(name) if name else "step"
        nets, substeps = tuple(nets), tuple(substeps)
        if nets and substeps:
            raise PlanError(
                f"step {name!r} holds both nets and substeps; a step holds "
                "one or the other -- use execution_step(), which wraps mixed "
                "lists into substeps")
        for n in nets:
            if not isinstance(n, Net):
                raise PlanError(f"step {name!r}: {n!r} is not a Net")
        for s in substeps:
            if not isinstance(s, ExecutionStep):
                raise PlanError(f"step {name!r}: {s!r} is not an ExecutionStep")
        if num_iter is not None and should_stop_blob is not None:
            raise PlanError(
                f"step {name!r} sets both num_iter and should_stop_blob; they"
                " are mutually exclusive -- use one")
        if only_once and num_iter is not None:
            raise PlanError(
                f"step {name!r} sets both only_once and num_iter; only_once "
                "only makes sense with should_stop_blob")
        if concurrent_substeps and nets:
            raise PlanError(
                f"step {name!r} has concurrent_substeps but holds nets, which "
                "always run in order; pass substeps (execution_step() wraps "
                "each net in its own step)")
        if should_stop_blob is not None:
            if not isinstance(should_stop_blob, str) or not should_stop_blob:
                raise PlanError(
                    f"step {name!r}: should_stop_blob must be a blob name, "
                    f"got {should_stop_blob!r}")
            should_stop_blob = str(should_stop_blob)
        self.name = name
        self.nets = nets
        self.substeps = substeps
        self.num_iter = _positive_int("num_iter", num_iter, name, True)
        self.concurrent_substeps = bool(concurrent_substeps)
        self.should_stop_blob = should_stop_blob
        self.only_once = bool(only_once)
        self.num_concurrent_instances = _positive_int(
            "num_concurrent_instances", num_concurrent_instances, name)
        self.create_workspace = bool(create_workspace)
        self.run_every_ms = _positive_int("run_every_ms", run_every_ms, name)
        self.task = task  # name of the Task whose step this is (for errors)

    def __setattr__(self, key, value):
        if hasattr(self, "task"):
            raise AttributeError(
                f"ExecutionStep {self.name!r} is immutable; use "
                f"step.replace({key}=...) for a changed copy")
        object.__setattr__(self, key, value)

    _FIELDS = ("name", "nets", "substeps") + _OPTIONS

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self._FIELDS)

    def __setstate__(self, state):
        for k, v in zip(self._FIELDS, state):
            object.__setattr__(self, k, v)

    def options(self):
        return {k: getattr(self, k) for k in _OPTIONS}

    def replace(self, **changes):
        """A copy with some fields changed (validated like a new step)."""
        fields = dict(name=self.name, nets=self.nets, substeps=self.substeps)
        fields.update(self.options())
        fields.update(changes)
        return ExecutionStep(**fields)

    def __repr__(self):
        body = (f"{len(self.nets)} nets" if self.nets else
                f"{len(self.substeps)} substeps")
        return f"ExecutionStep({self.name!r}, {body})"

    # -- walking ------------------------------------------------------------------

    def walk_nets(self):
        """Every net of the tree, depth first, in order (repeats included)."""
        for n in self.nets:
            yield n
        for s in self.substeps:
            yield from s.walk_nets()

    def get_all_attributes(self, key):
        """Attribute ``key`` of every net of the tree, in order."""
        out = []
        for net in self.walk_nets():
            out.extend(net.get_attributes(key))
        return out


def execution_step(name, steps_or_nets, num_iter=None,
                   concurrent_substeps=False, should_stop_blob=None,
                   only_once=False, num_concurrent_instances=None,
                   create_workspace=False, run_every_ms=None):
    """Build an `ExecutionStep` from a net, a step or a list of them.

    A list of nets becomes the step's nets (or, with
    ``concurrent_substeps=True``, one substep per net); any other list
    becomes substeps, each converted with `to_execution_step`.
    """
    options = dict(num_iter=num_iter, concurrent_substeps=concurrent_substeps,
                   should_stop_blob=should_stop_blob, only_once=only_once,
                   num_concurrent_instances=num_concurrent_instances,
                   create_workspace=create_workspace,
                   run_every_ms=run_every_ms)
    nets, substeps = (), ()
    if steps_or_nets is None:
        pass
    elif isinstance(steps_or_nets, ExecutionStep):
        substeps = (steps_or_nets,)
    elif isinstance(steps_or_nets, Net):
        nets = (steps_or_nets,)
    elif isinstance(steps_or_nets, (list, tuple)):
        items = list(steps_or_nets)
        if all(isinstance(x, Net) for x in items) and not concurrent_substeps:
            nets = tuple(items)
        else:
            substeps = tuple(to_execution_step(x) for x in items)
    else:
        substeps = (to_execution_step(steps_or_nets),)
    return ExecutionStep(name, nets=nets, substeps=substeps, **options)


def to_execution_step(step_or_nets, default_name=None):
    """A step from a step, a net, a list of nets/steps, or a NetBuilder."""
    if isinstance(step_or_nets, ExecutionStep):
        return step_or_nets
    if _is_builder(step_or_nets):
        return step_or_nets.to_step(default_name)
    if isinstance(step_or_nets, Net):
        return execution_step(default_name or step_or_nets.name,
                              [step_or_nets])
    if isinstance(step_or_nets, (list, tuple)):
        return execution_step(default_name or "step", list(step_or_nets))
    raise PlanError(
        f"cannot make an execution step from {type(step_or_nets).__name__} "
        f"{step_or_nets!r}; pass a step, a Net, a list of them or a NetBuilder")


def _is_builder(obj):
    """A NetBuilder, known by its ``to_step`` method: the builder module
    sits above this one (it makes steps), so it is not imported here.
    Looked up on the type, so a Net's op-type ``__getattr__`` is not asked."""
    return callable(getattr(type(obj), "to_step", None))
