"""What every strategy of `localcluster.testing.strategies` checks of its
arguments first: counts, and the nodes a plan is drawn on.

The strategies call these when a strategy is *made* -- not when it draws
-- so misuse fails at once, as hypothesis's own strategies do: an
``InvalidArgument`` naming the argument, the value and the rule.
``nodes`` is taken alike by `task_groups`, `jobs`, `fault_plans` and
`conditions` (`._condition_strategies`): an int N, naming ``node_0`` ...
``node_{N-1}``, or a list of names; what comes back is a tuple of names.
"""

from hypothesis.errors import InvalidArgument

__all__ = ["int_arg", "node_names"]


def int_arg(name, value, low):
    """InvalidArgument unless ``value`` is an int >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgument(f"{name}={value!r} must be an int >= {low}")


def node_names(nodes):
    """The node names ``nodes`` (an int or a list of names) stands for."""
    if isinstance(nodes, int) and not isinstance(nodes, bool):
        int_arg("nodes", nodes, 1)
        return tuple(f"node_{i}" for i in range(nodes))
    if isinstance(nodes, (list, tuple)) and nodes and all(
            isinstance(n, str) and n and "/" not in n for n in nodes):
        if len(set(nodes)) != len(nodes):
            raise InvalidArgument(f"nodes={nodes!r} names a node twice")
        return tuple(nodes)
    raise InvalidArgument(
        f"nodes={nodes!r} must be an int >= 1 or a non-empty list of node "
        "names (non-empty, without '/')")
