"""How a job check judges a run and names a failure: the user's truth
(finite results, ``invariant=``, ``expected=``), where two runs' blobs
differ, and one line of Python that replays the failing case.

The checks (`localcluster.testing.checks`) hand every run's
``{node: {blob: array}}`` (`._check_runs`) to a `Truth`, which says what
is wrong with it on its own -- a NaN or inf (unless ``allow_nonfinite``),
an invariant's message, a blob unlike ``expected=`` -- and compare two
runs with `difference`, which names each run by what made it
(``"seed 3 (pct, depth 2)"``, ``"localhost"``): a disagreement says which
run gave which value, never one of them as "expected", since either may
be the buggy one.  A float difference says how large it is and the
``rtol`` that would accept it.  A replay line imports ``build`` by its
module and name (or a value's ``replay_import``) and the check, fault,
condition and schedule classes it names from `localcluster.testing`, so
it runs as is in a fresh interpreter.
"""

import math

import numpy as np

__all__ = ["Truth", "difference", "replay"]

#: relative differences below this may be rounding: a message says which
#: rtol accepts them; above, it says they are more than rounding
ROUNDING = 1e-3


class Truth:
    """What every run of a check must satisfy on its own."""

    def __init__(self, options, allow_nonfinite=False, invariant=None,
                 expected=None):
        if invariant is not None and not callable(invariant):
            raise TypeError(f"invariant= takes a function of {{node: {{blob:"
                            f" array}}}} returning None or a message, got "
                            f"{invariant!r}")
        if expected is not None and not (isinstance(expected, dict) and all(
                isinstance(v, dict) for v in expected.values())):
            raise TypeError(f"expected= takes {{node: {{blob: value}}}}, got "
                            f"{expected!r}")
        self.options = options
        self.allow_nonfinite = bool(allow_nonfinite or
                                    options.get("allow_nonfinite"))
        self.invariant = invariant
        self.expected = expected

    def replay_args(self):
        """What a replay line passes for this truth."""
        expected = None
        if self.expected is not None:
            expected = {node: {name: np.asarray(value).tolist()
                               for name, value in blobs.items()}
                        for node, blobs in self.expected.items()}
        return {"allow_nonfinite": True if self.allow_nonfinite else None,
                "invariant": self.invariant, "expected": expected}

    def judge(self, label, blobs):
        """What is wrong with the blobs ``label`` ended with, or None."""
        if not self.allow_nonfinite:
            for node in sorted(blobs):
                for name in sorted(blobs[node]):
                    value = blobs[node][name]
                    if value.dtype.kind in "fc" and not np.all(
                            np.isfinite(value)):
                        return (f"{label} ends with blob {name!r} on node "
                                f"{node!r} = {_short(value)}: results must "
                                "be finite (pass allow_nonfinite=True if NaN"
                                " or inf is what the job means)")
        if self.expected is not None:
            for node in sorted(self.expected):
                for name in sorted(self.expected[node]):
                    want = np.asarray(self.expected[node][name])
                    have = blobs.get(node, {}).get(name)
                    if have is None:
                        return (f"{label} ends without blob {name!r} on node"
                                f" {node!r}, which expected= names")
                    said = _unequal(want, have, self.options)
                    if said is not None:
                        return (f"{label} ends with blob {name!r} on node "
                                f"{node!r} = {_short(have)}, but expected= "
                                f"says {_short(want)}{said}")
        if self.invariant is not None:
            said = self.invariant(blobs)
            if said is not None:
                return f"{label} breaks the invariant: {said}"
        return None


def difference(first, a, second, b, options):
    """One line saying where the blobs ``a`` (of run ``first``) and ``b``
    (of run ``second``) differ, or None."""
    for node in sorted(set(a) | set(b)):
        have_a, have_b = a.get(node, {}), b.get(node, {})
        if set(have_a) != set(have_b):
            return (f"on node {node!r} {first} ends with blobs "
                    f"{sorted(have_a)} and {second} with {sorted(have_b)}")
        for name in sorted(have_a):
            x, y = have_a[name], have_b[name]
            if x.shape != y.shape or x.dtype != y.dtype:
                return (f"blob {name!r} on node {node!r} is {x.dtype}"
                        f"{list(x.shape)} after {first} and {y.dtype}"
                        f"{list(y.shape)} after {second}")
            said = _unequal(x, y, options)
            if said is not None:
                return (f"blob {name!r} on node {node!r} is {_short(x)} "
                        f"after {first} and {_short(y)} after {second}"
                        f"{said}")
    return None


def _unequal(x, y, options):
    """None if ``x`` and ``y`` are equal (within the options' tolerance),
    else what a message adds about the difference (a str, maybe empty:
    test it against None)."""
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape:
        return f" (shapes {list(x.shape)} and {list(y.shape)})"
    rtol, atol = options.get("rtol"), options.get("atol")
    floats = x.dtype.kind in "fc" or y.dtype.kind in "fc"
    if (rtol is None and atol is None) or not floats:
        same = np.array_equal(x, y, equal_nan=floats)
    else:
        same = np.allclose(x, y, rtol=rtol or 0.0, atol=atol or 0.0,
                           equal_nan=True)
    if same:
        return None
    if not floats or x.size == 0:
        return ""
    return _float_gap(x, y, rtol, atol)


def _float_gap(x, y, rtol, atol):
    """The size of a float difference and the rtol that would accept it."""
    with np.errstate(all="ignore"):
        both = np.isfinite(x) & np.isfinite(y)
        if not np.array_equal(np.isfinite(x), np.isfinite(y)) or \
                not both.any():
            return " (one has NaN or inf where the other does not)"
        gap = np.abs(x[both].astype(complex if x.dtype.kind == "c"
                                    else float) - y[both])
        scale = np.abs(y[both])
        rel = np.where(scale > 0, gap / np.where(scale > 0, scale, 1),
                       np.where(gap > 0, np.inf, 0))
        worst_abs, worst_rel = float(gap.max()), float(rel.max())
    said = (f" (largest absolute difference {worst_abs:.3g}, relative "
            f"{worst_rel:.3g}")
    if math.isfinite(worst_rel) and 0 < worst_rel < ROUNDING:
        exp = math.floor(math.log10(worst_rel))
        need = float(f"{math.ceil(worst_rel / 10 ** exp * 10) / 10}e{exp}")
        now = "" if rtol is None and atol is None else \
            f" instead of rtol={rtol}, atol={atol}"
        said += (f"; rtol={need:g} in the options build() returns would "
                 f"accept it, if rounding is all it is{now}")
    elif math.isfinite(worst_rel):
        said += "; larger than rounding: no rtol below 1e-3 accepts it"
    return said + ")"


def _short(value):
    # every digit that tells two floats apart (3.6 and 3.6000000000000005)
    return np.array2string(np.asarray(value), threshold=8,
                           floatmode="unique")


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


class _Literal:
    """An expression a replay line writes as is."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def replay(check, build, **kwargs):
    """``import mod; from localcluster.testing import ...; check(...)``."""
    names = [check]
    for fault in kwargs.get("faults") or ():
        names += [type(fault).__name__, type(fault.at).__name__]
    names += [type(c).__name__ for c in kwargs.get("conditions") or ()]
    invariant = kwargs.pop("invariant", None)
    head_more = ""
    if invariant is not None:
        module, target = _name_of(invariant)
        head_more = f"import {module}; " if module else ""
        kwargs["invariant"] = _Literal(target)
    if kwargs.get("schedules"):
        names.append("Schedule")
    module, target = _name_of(build)
    head = f"import {module}; " if module else ""
    if head_more and head_more != head:
        head += head_more
    args = "".join(f", {k}={v!r}" for k, v in kwargs.items()
                   if v is not None)
    return (f"{head}from localcluster.testing import "
            f"{', '.join(dict.fromkeys(names))}; {check}({target}{args})")
