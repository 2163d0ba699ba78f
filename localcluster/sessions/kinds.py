"""Session kinds by name: the one place that says what "localhost",
"local" and "ray" are.

::

    session_class("localhost")      # LocalHostScheduler
    installed_kinds()               # {"local": ..., "localhost": ...,
                                    #  "ray": ... (when Ray is installed)}

Three callers pick a session by name: the command line (``--session
KIND``: `session_class`), the pytest plugin (``any_session`` and
``--localcluster-sessions``: `installed_kinds`) and the job checks
(`localcluster.testing.checks.SESSION_KINDS`, made from
`installed_kinds`).  What crosses is a kind's name one way and a session
class, or a factory taking a session's keyword arguments, the other.

A kind whose session needs an engine that is an extra (Ray) is imported
only when a session of it is asked for: `installed_kinds` *finds* the
engine and the kind's module (`importlib.util.find_spec`) without
importing either -- pytest lists the kinds before any test runs, and
importing Ray takes seconds -- and its factory imports them on the first
session it makes.  Asked for without the engine, `session_class` raises
`KindNotInstalled`, an ImportError saying what to install.
"""

import importlib
import importlib.util

__all__ = ["KINDS", "KindNotInstalled", "session_class", "installed_kinds"]

#: kind -> (module in this package, session class): the reference
#: semantics first, then a process per node, then the engine-backed kind
_CLASSES = {"local": ("local", "LocalSession"),
            "localhost": ("localhost", "LocalHostScheduler"),
            "ray": ("ray", "RaySession")}
#: kinds whose session needs an extra: kind -> (its engine's module,
#: what to install)
_EXTRAS = {"ray": ("ray", "Ray: pip install 'localcluster[ray]'")}

#: every session kind's name, installed or not
KINDS = tuple(_CLASSES)


class KindNotInstalled(ImportError):
    """A session kind whose engine is not installed; the message says
    how to install it."""


def session_class(kind):
    """The session class of ``kind`` (one of `KINDS`), its module
    imported now: `KindNotInstalled` for a kind whose engine is missing,
    ValueError for a name that is no kind."""
    if kind not in _CLASSES:
        raise ValueError(f"unknown session kind {kind!r}; the kinds are "
                         f"{', '.join(KINDS)}")
    module, name = _CLASSES[kind]
    try:
        found = importlib.import_module(f"{__package__}.{module}")
    except ImportError as exc:
        if kind not in _EXTRAS:
            raise   # a kind of the package itself: a bug, not an extra
        raise KindNotInstalled(f"session kind {kind!r} needs "
                               f"{_EXTRAS[kind][1]}") from exc
    return getattr(found, name)


def installed_kinds():
    """``{kind: factory}`` of the installed kinds, in `KINDS` order; a
    factory takes a session's arguments and returns the session.  A kind
    needing an extra is there when its engine and its module are found
    (not imported: its factory imports them)."""
    kinds = {}
    for kind, (module, _) in _CLASSES.items():
        if kind not in _EXTRAS:
            kinds[kind] = session_class(kind)
        elif _findable(_EXTRAS[kind][0]) and \
                _findable(f"{__package__}.{module}"):
            kinds[kind] = _lazy_factory(kind)
    return kinds


def _lazy_factory(kind):
    def make(*args, **kwargs):
        return session_class(kind)(*args, **kwargs)
    make.__name__ = make.__qualname__ = f"{kind}_session"
    make.__doc__ = (f"A new session of kind {kind!r} (its module imported "
                    "with the first).")
    return make


def _findable(module):
    """Whether ``module`` could be imported, without importing it (but,
    for a submodule, its packages)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
