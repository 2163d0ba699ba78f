"""Setup objects and reporters: what runs around a task, instance or node.

A `SetupNets` is attached to a net with ``net.add_attribute(key, setup)``
where key is one of `TASK_SETUP` (before/after the whole task, once),
`TASK_INSTANCE_SETUP` (before/after each instance, in its private
workspace) or `LOCAL_SETUP` (before/after everything a TaskGroup runs on a
node, once per run).  A periodic step (``run_every_ms`` set) is attached
under `REPORT_STEP` (runs beside its task's body) or `LOCAL_REPORT_STEP`
(runs beside everything the group runs on the node of the task the net is
in).  `localcluster.plan.grouping` collects them when it folds tasks into
per-node plans; the same object found on several nets runs once.

This module registers, with `localcluster.plan.net`, what may be attached
under each of its keys, so a bad attachment fails where it is made.
"""

from ..errors import PlanError
from .net import Net, register_attribute_check
from .step import ExecutionStep

__all__ = ["SetupNets", "TASK_SETUP", "TASK_INSTANCE_SETUP", "LOCAL_SETUP",
           "REPORT_STEP", "LOCAL_REPORT_STEP", "check_attribute"]

TASK_SETUP = "task_setup"
TASK_INSTANCE_SETUP = "task_instance_setup"
LOCAL_SETUP = "local_setup"
REPORT_STEP = "report_step"
LOCAL_REPORT_STEP = "local_report_step"

SETUP_KEYS = (TASK_SETUP, TASK_INSTANCE_SETUP, LOCAL_SETUP)
REPORT_KEYS = (REPORT_STEP, LOCAL_REPORT_STEP)


class SetupNets:
    """Nets or steps to run before (``init_nets``) and after (``exit_nets``)."""

    def __init__(self, init_nets=None, exit_nets=None):
        self.init_nets = _as_list(init_nets, "init_nets")
        self.exit_nets = _as_list(exit_nets, "exit_nets")

    def __repr__(self):
        return (f"SetupNets(init={len(self.init_nets)}, "
                f"exit={len(self.exit_nets)})")


def _as_list(nets, what):
    if nets is None:
        return []
    if isinstance(nets, (Net, ExecutionStep)):
        return [nets]
    nets = list(nets)
    for n in nets:
        if not isinstance(n, (Net, ExecutionStep)):
            raise PlanError(
                f"SetupNets {what} must be nets or steps, got "
                f"{type(n).__name__} {n!r}")
    return nets


def check_attribute(key, obj):
    """Raise `PlanError` unless ``obj`` may be attached under ``key``."""
    if key in SETUP_KEYS and not isinstance(obj, SetupNets):
        raise PlanError(
            f"attribute {key!r} needs a SetupNets, got {type(obj).__name__};"
            " wrap your nets: SetupNets(init_nets=[...], exit_nets=[...])")
    if key in REPORT_KEYS and not isinstance(obj, ExecutionStep):
        raise PlanError(
            f"attribute {key!r} needs an ExecutionStep, got "
            f"{type(obj).__name__}")


for _key in SETUP_KEYS + REPORT_KEYS:
    register_attribute_check(_key, check_attribute)
del _key
