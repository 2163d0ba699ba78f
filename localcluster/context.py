"""Per-thread "current" stacks for the job model's context managers.

``with Node('trainer'):``, ``with TaskGroup():``, ``with NetBuilder():`` and
friends push an instance on a per-thread stack; ``Cls.current()`` returns the
innermost one.  A class registers for this by inheriting `Managed` (no
current instance unless one was entered) or `DefaultManaged` (a default
instance is created on first use, once per thread).

Entering the outermost context of a thread also opens a *build scope*
(`build_scope`): the names the plan layer generates (net names, task names,
auto-generated blob names) are made unique within it, and a new outermost
context starts a new one.  That is what makes names a deterministic function
of how a job was built: building the same job again, in this process or
another, gives the same names.

Parent classes see child instances: entering a ``_Loop`` (a `NetBuilder`
subclass) makes it ``NetBuilder.current()`` as well, because an instance is
pushed on the stack of every managed class in its MRO.
"""

import threading

__all__ = ["Managed", "DefaultManaged", "build_scope"]


class BuildScope:
    """Names used so far in one outermost build context."""

    def __init__(self):
        self.used = {}

    def unique(self, kind, name, fmt="{}_{}"):
        """Return ``name``, or ``name`` with a numeric suffix, unused so far."""
        used = self.used.setdefault(kind, set())
        candidate, i = name, 0
        while candidate in used:
            i += 1
            candidate = fmt.format(name, i)
        used.add(candidate)
        return candidate


class _Stacks(threading.local):
    def __init__(self):
        self.stacks = {}
        self.defaults = {}
        self.depth = 0
        self.scope = None

    def stack(self, cls):
        return self.stacks.setdefault(cls, [])


_local = _Stacks()


def build_scope():
    """The current thread's build scope, or None outside every context."""
    return _local.scope


def _managed_classes(obj):
    return [c for c in type(obj).__mro__
            if issubclass(c, Managed) and c not in (Managed, DefaultManaged)]


class Managed:
    """A class whose instances can be entered as the current one."""

    @classmethod
    def current(cls, value=None, required=True):
        """Return ``value`` if given, else the innermost entered instance.

        With ``required=False`` returns None when there is none.
        """
        if value is not None:
            if not isinstance(value, cls):
                raise TypeError(
                    f"{cls.__name__}.current() got {type(value).__name__} "
                    f"{value!r}; pass a {cls.__name__} instance or None")
            return value
        stack = _local.stack(cls)
        if stack:
            return stack[-1]
        if required:
            raise LookupError(
                f"no current {cls.__name__}: use it inside "
                f"'with {cls.__name__}(...):'")
        return None

    def __enter__(self):
        for cls in _managed_classes(self):
            _local.stack(cls).append(self)
        if _local.depth == 0:
            _local.scope = BuildScope()
        _local.depth += 1
        return self

    def __exit__(self, *exc):
        for cls in _managed_classes(self):
            stack = _local.stack(cls)
            if not stack or stack[-1] is not self:
                raise RuntimeError(
                    f"{cls.__name__} contexts exited out of order")
            stack.pop()
        _local.depth -= 1
        if _local.depth == 0:
            _local.scope = None


class DefaultManaged(Managed):
    """A managed class with a per-thread default instance."""

    @classmethod
    def current(cls, value=None, required=True):
        found = super().current(value, required=False)
        if found is not None:
            return found
        default = _local.defaults.get(cls)
        if default is None:
            default = _local.defaults[cls] = cls()
        return default
