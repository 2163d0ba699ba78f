"""Setup objects: nets that run around a task, a task instance or a node.

A `SetupNets` is attached to a net with ``net.add_attribute(key, setup)``
where key is one of `TASK_SETUP` (before/after the whole task, once),
`TASK_INSTANCE_SETUP` (before/after each instance, in its private
workspace) or `LOCAL_SETUP` (before/after everything a TaskGroup runs on a
node, once per run).  The task model collects them when it builds a task's
step; the same object found on several nets runs once.

This module registers, with `localcluster.plan.net`, what may be attached
under each of its keys, so a bad attachment fails where it is made.
"""

from ..errors import PlanError
from .net import Net, register_attribute_check
from .step import ExecutionStep

__all__ = ["SetupNets", "TASK_SETUP", "TASK_INSTANCE_SETUP", "LOCAL_SETUP",
           "REPORT_STEP", "check_attribute"]

TASK_SETUP = "task_setup"
TASK_INSTANCE_SETUP = "task_instance_setup"
LOCAL_SETUP = "local_setup"
REPORT_STEP = "report_step"

SETUP_KEYS = (TASK_SETUP, TASK_INSTANCE_SETUP, LOCAL_SETUP)


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
    if key == REPORT_STEP and not isinstance(obj, ExecutionStep):
        raise PlanError(
            f"attribute {key!r} needs an ExecutionStep, got "
            f"{type(obj).__name__}")


for _key in SETUP_KEYS + (REPORT_STEP,):
    register_attribute_check(_key, check_attribute)
del _key
