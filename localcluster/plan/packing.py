"""A node plan as bytes: what crosses a pipe or an engine's object store.

``pack_plan(plan)`` pickles a `NodePlan` together with the schemas of the
user-registered ops it uses (built-in kernels are imported by every node
anyway), so a node process that was started before the user registered an
op can still run it; ``unpack_plan`` registers those ops where the plan
lands.  A plan that cannot be pickled fails here, in the master, with a
`PlanError` naming the op and argument, before anything starts.
"""

import pickle

from ..errors import PlanError
from ..kernels import registry

__all__ = ["pack_plan", "unpack_plan"]

_BUILTIN_KERNELS = ("localcluster.kernels.numpy_ops",
                    "localcluster.kernels.io_ops")


def pack_plan(plan, dumps=None):
    """The plan as bytes, with the kernels of any user ops it uses.
    ``dumps``: the pickler (default `pickle.dumps`; an engine whose
    workers import nothing of the user's passes one that pickles
    functions by value)."""
    user_ops = {}
    for net in plan.step.walk_nets():
        for op in net.ops:
            schema = registry.lookup(op.type)
            if schema is not None and \
                    getattr(schema.kernel, "__module__", "") not in \
                    _BUILTIN_KERNELS:
                user_ops[op.type] = schema
    try:
        return (dumps or pickle.dumps)((plan, user_ops),
                                       pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - re-raised as a PlanError
        raise PlanError(_unpicklable(plan, user_ops, exc)) from exc


def unpack_plan(data):
    """The plan `pack_plan` made, its user ops registered here."""
    plan, user_ops = pickle.loads(data)
    for schema in user_ops.values():
        registry.ensure_registered(schema)
    return plan


def _unpicklable(plan, user_ops, exc):
    for net in plan.step.walk_nets():
        for i, op in enumerate(net.ops):
            for key, value in op.args.items():
                try:
                    pickle.dumps(value)
                except Exception:  # noqa: BLE001 - we are naming the culprit
                    what = (f"its function {getattr(value, '__qualname__', value)!r}"
                            if key == "fn" else f"its argument {key}={value!r}")
                    return (f"op {op.type} #{i} of net {net.name!r} on node "
                            f"{plan.node!r} cannot be sent to the node "
                            f"process: {what} does not pickle ({exc}); define"
                            " functions at module level so they pickle by "
                            "reference")
    for name, schema in user_ops.items():
        try:
            pickle.dumps(schema)
        except Exception:  # noqa: BLE001 - we are naming the culprit
            return (f"registered op {name!r} cannot be sent to node "
                    f"{plan.node!r}: its kernel does not pickle ({exc}); "
                    "define it at module level")
    return f"the plan for node {plan.node!r} cannot be pickled: {exc}"
