"""Numbered names, ``<stem>_<n>``: one per node (``train_loss_7``,
``trainer_31``), which the epoch line and the report show as a family
(``train_loss_*``, ``trainer_0..trainer_31``) when there are many.

Any ASCII digits count, ``worker_07`` too (zero-padded node numbers are
common); other Unicode digits do not (``int`` would read them, a reader
would not).
"""

import re

__all__ = ["numbered", "families"]

_NUMBERED = re.compile(r"^(?P<stem>.+)_(?P<n>[0-9]+)$")


def numbered(name):
    """``(stem, n)`` of a name ``<stem>_<n>``, else None (a name that is
    not a string included)."""
    found = _NUMBERED.match(name) if isinstance(name, str) else None
    return (found["stem"], int(found["n"])) if found else None


def families(names):
    """``{stem: [names]}`` of the numbered names among ``names``, each
    family in the order of ``names``."""
    out = {}
    for name in names:
        found = numbered(name)
        if found:
            out.setdefault(found[0], []).append(name)
    return out
