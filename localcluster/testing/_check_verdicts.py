"""How a job check judges a run and names a failure: where two runs'
blobs differ, and one line of Python that replays the failing case.

The checks (`localcluster.testing.checks`) call `difference` on the
``{node: {blob: array}}`` two runs ended with (`._check_runs`) and, when
it finds one, put it in a `JobCheckFailed` with `replay`'s line.  What
crosses is plain values -- arrays, the options ``build()`` returned
(``rtol``/``atol``), a check's name and keyword arguments -- so the
verdict does not depend on which session ran what.  A replay line
imports ``build`` by its module and name (or a value's
``replay_import``) and the check and fault classes it names from
`localcluster.testing`, so it runs as is in a fresh interpreter.
"""

import numpy as np

__all__ = ["difference", "replay"]


def difference(expected, got, options):
    """One line saying where ``got`` differs from ``expected``, or None."""
    rtol, atol = options.get("rtol"), options.get("atol")
    for node in sorted(set(expected) | set(got)):
        want, have = expected.get(node, {}), got.get(node, {})
        if set(want) != set(have):
            return (f"node {node!r} has blobs {sorted(have)}, expected "
                    f"{sorted(want)}")
        for name in sorted(want):
            a, b = want[name], have[name]
            if a.shape != b.shape or a.dtype != b.dtype:
                return (f"blob {name!r} on node {node!r} is {b.dtype}"
                        f"{list(b.shape)}, expected {a.dtype}{list(a.shape)}")
            if (rtol is None and atol is None) or a.dtype.kind not in "fc":
                same = np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
            else:
                same = np.allclose(a, b, rtol=rtol or 0.0, atol=atol or 0.0,
                                   equal_nan=True)
            if not same:
                return (f"blob {name!r} on node {node!r} is {_short(b)}, "
                        f"expected {_short(a)}")
    return None


def _short(value):
    return np.array2string(np.asarray(value), threshold=8, precision=6)


def _name_of(build):
    """``(module to import, expression)`` naming ``build`` in a replay
    line: a function by its module and name, a value with a
    ``replay_import`` attribute by its repr."""
    if hasattr(build, "replay_import"):
        return build.replay_import, repr(build)
    module = getattr(build, "__module__", None)
    name = getattr(build, "__qualname__", None)
    if module and name and "<" not in name:
        return module, f"{module}.{name}"
    return None, "build"


def replay(check, build, **kwargs):
    """``import mod; from localcluster.testing import ...; check(...)``."""
    args = "".join(f", {k}={v!r}" for k, v in kwargs.items()
                   if v is not None)
    names = [check]
    for fault in kwargs.get("faults") or ():
        names += [type(fault).__name__, type(fault.at).__name__]
    names += [type(c).__name__ for c in kwargs.get("conditions") or ()]
    module, target = _name_of(build)
    head = f"import {module}; " if module else ""
    return (f"{head}from localcluster.testing import "
            f"{', '.join(dict.fromkeys(names))}; {check}({target}{args})")
