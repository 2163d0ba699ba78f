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
another, gives the same names.  Across scopes, generated net and blob names
are also claimed process-wide by the fingerprint of what was built before
them in their scope, so a *different* job built later in the same process
gets suffixed names instead of silently sharing blobs with the first.

Parent classes see child instances: entering a ``_Loop`` (a `NetBuilder`
subclass) makes it ``NetBuilder.current()`` as well, because an instance is
pushed on the stack of every managed class in its MRO.
"""

import contextlib
import hashlib
import threading
import weakref

__all__ = ["Managed", "DefaultManaged", "build_scope", "fresh_names"]


class _NameRegistry:
    """Process-wide owners of generated names (by fingerprint).

    A generated name is claimed with the fingerprint of everything its build
    scope generated up to it.  The same fingerprint means the same job built
    again, so it gets the same name; a different one means another job that
    would collide, so it gets a suffixed name instead -- as long as the
    first job is alive (any of its nets or BlobRefs is referenced).  A name
    whose jobs are all gone is free again, so what other, finished work did
    earlier in a process does not shift the names of a job built now.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._owners = {}   # (kind, name) -> (fingerprint, WeakSet of scopes)
        self._given = {}    # (kind, name asked, fingerprint) -> name given

    def claim(self, kind, name, fingerprint, scope, fmt):
        with self._lock:
            # The same job asking again gets what it got before, whatever
            # came and went in between.
            asked = (kind, name, fingerprint)
            candidate = self._given.get(asked, name)
            i = 0
            while True:
                key = (kind, candidate)
                entry = self._owners.get(key)
                if entry is None or not entry[1]:
                    self._owners[key] = (fingerprint, weakref.WeakSet([scope]))
                    break
                if entry[0] == fingerprint:
                    entry[1].add(scope)
                    break
                i += 1
                candidate = fmt.format(name, i)
            self._given[asked] = candidate
            return candidate


_REGISTRY = _NameRegistry()


@contextlib.contextmanager
def fresh_names():
    """Generated names made inside are those a fresh process would make:
    the jobs alive in this one do not suffix them.  For a build whose job
    runs in sessions of its own and is compared with builds made in fresh
    processes (the testing kit's in-process runs)."""
    global _REGISTRY
    saved, _REGISTRY = _REGISTRY, _NameRegistry()
    try:
        yield
    finally:
        _REGISTRY = saved


def _stable(value):
    """A description of an op argument that is the same in every process."""
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_stable(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_stable(v)}" for k, v in
                              sorted(value.items(), key=lambda kv: repr(kv[0])
                                     )) + "}"
    tobytes = getattr(type(value), "tobytes", None)
    if tobytes is not None and hasattr(value, "dtype"):
        digest = hashlib.sha1(tobytes(value)).hexdigest()
        return f"array({value.dtype},{getattr(value, 'shape', ())},{digest})"
    qualname = getattr(value, "__qualname__", None)
    if qualname is not None:
        return f"{getattr(value, '__module__', '?')}.{qualname}"
    return type(value).__qualname__


class BuildScope:
    """Names generated so far in one outermost build context.

    `name` makes a name unique within the scope (``base``, ``base_1``...)
    and claims it process-wide: a rebuild of the same job gets the same
    names, a different job never reuses a name with another meaning.
    """

    def __init__(self):
        self.used = {}
        self._fingerprint = b""

    def name(self, kind, base, detail=(), fmt="{}_{}"):
        candidate = self._free(kind, base, fmt)
        self._fingerprint = hashlib.sha1(
            self._fingerprint + f"{kind}|{candidate}|{_stable(detail)}".encode()
        ).digest()
        final = _REGISTRY.claim(kind, candidate, self._fingerprint, self, fmt)
        self.used[kind].add(final)
        return final

    def unique(self, kind, name, fmt="{}_{}"):
        """``name`` made unique within this scope only."""
        candidate = self._free(kind, name, fmt)
        self.used[kind].add(candidate)
        return candidate

    def _free(self, kind, name, fmt):
        """``name``, or ``name`` with a numeric suffix, unused in the scope."""
        used = self.used.setdefault(kind, set())
        candidate, i = name, 0
        while candidate in used:
            i += 1
            candidate = fmt.format(name, i)
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
