"""``races(obj)``: the blobs concurrent branches of a plan share unordered.

::

    from localcluster.testing import races

    for race in races(job):          # a Job, a TaskGroup or a Task
        print(race)
    assert races(build()) == []      # build() -> (job, options) too

A race is a blob one branch writes while another branch of the same node
-- another task of the node in the same group, another instance of a
task, a concurrent substep, a pipe thread, a report step -- reads or
writes it, not through an atomic op and not ordered by the setup and exit
nets around them (nor by a queue between them); `Race` names the blob,
the node and both ops.  What counts as concurrent, atomic and ordered is
`localcluster.plan.races`, which reads the same per-node plans a session
runs.  A Job's groups are analysed one at a time, in the order the runner
runs them (init, epoch, download, exit: groups never overlap), each
knowing which blobs the GLOBAL groups before it left on each node.

Intended races -- hogwild trainers updating one weight blob without locks
-- are declared with ``allow_races=("w", ...)`` in the options a job
function returns next to its Job (``return job, {"allow_races": ("w",)}``):
``races((job, options))`` leaves them out, as does ``races(job,
allow=("w",))``.  A name no race involves is fine.
"""

from ..errors import PlanError
from ..job import Job
from ..plan.grouping import TaskPlan, fold_by_node
from ..plan.node_plan import WorkspaceType
from ..plan.races import Access, Race, group_races
from ..task import Task, TaskGroup

__all__ = ["races", "Race", "Access", "allowed_races", "ALLOW_RACES"]

#: the options key naming the blobs whose races a job intends
ALLOW_RACES = "allow_races"


def allowed_races(options):
    """The blob names ``options["allow_races"]`` gives (``()`` if absent),
    as a tuple of str; `PlanError` unless it is a tuple or list of blob
    names."""
    if not isinstance(options, dict):
        raise PlanError(f"job options must be a dict, got "
                        f"{type(options).__name__}")
    return _check_allow(options.get(ALLOW_RACES, ()), ALLOW_RACES)


def _check_allow(allow, what):
    if isinstance(allow, str) or not isinstance(allow, (list, tuple)):
        raise PlanError(
            f"{what} must be a tuple or list of blob names, such as "
            f"('w',), got {type(allow).__name__} {allow!r}")
    bad = [name for name in allow if not isinstance(name, str) or not name]
    if bad:
        raise PlanError(f"{what} must hold blob names (non-empty str), got "
                        f"{bad[0]!r} in {allow!r}")
    return tuple(str(name) for name in allow)


def races(obj, allow=()):
    """The `Race` values of ``obj`` -- a Job, a TaskGroup, a Task, or the
    ``(job, options)`` a job function returns (its ``allow_races`` then
    count as allowed) -- sorted by node, blob and ops, without those on a
    blob named in ``allow``.  Only looks: nothing is fixed or run."""
    allow = _check_allow(allow, "allow")
    if isinstance(obj, tuple) and len(obj) == 2 and \
            isinstance(obj[0], Job):
        obj, options = obj
        allow += allowed_races(options)
    known, found = {}, []
    for plans, workspace_type, repeats in _groups(obj):
        if repeats and workspace_type is WorkspaceType.GLOBAL:
            # an epoch group runs again on what its last run left
            _, left = group_races(plans, known)
            known = _add(known, left)
        group, left = group_races(plans, known)
        found.extend(group)
        if workspace_type is WorkspaceType.GLOBAL:
            known = _add(known, left)
    allowed = set(allow)
    return sorted((race for race in found if race.blob not in allowed),
                  key=Race.sort_key)


def _add(known, more):
    merged = {node: set(names) for node, names in known.items()}
    for node, names in more.items():
        merged.setdefault(node, set()).update(names)
    return merged


def _groups(obj):
    """``(plans, workspace type, repeats)`` of each group ``obj`` runs, in
    order; ``plans``: ``[(node, step)]``."""
    groups = getattr(type(obj), "printable_groups", None)
    if groups is not None:
        for label, group in obj.printable_groups():
            if group is not None and group.num_registered_tasks():
                yield _folded(group) + (label == "epoch",)
    elif isinstance(obj, TaskGroup):
        yield _folded(obj) + (False,)
    elif isinstance(obj, Task):
        # as a session runs a Task alone: a group of just it, GLOBAL
        # unless the task says otherwise
        folded = fold_by_node([TaskPlan(obj.node, obj.planned_step())])
        yield ([(p.node, p.step) for p in folded],
               obj.workspace_type() or WorkspaceType.GLOBAL, False)
    else:
        raise TypeError(f"races needs a Job, a TaskGroup or a Task (or a "
                        f"job function's (job, options)), got "
                        f"{type(obj).__name__}")


def _folded(group):
    return ([(t.node, t.planned_step())
             for t in group.grouped_view().tasks()],
            group.workspace_type())

