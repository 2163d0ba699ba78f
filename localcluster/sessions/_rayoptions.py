"""From a job to Ray: what a node's actor is started with, and how a
plan's functions travel.

A Node's options become actor options: ``cpus`` -> ``num_cpus`` (how
many; Ray places the actor, the ids are not pinned), ``memory_limit`` ->
``memory`` (Ray's reservation), ``env`` -> ``runtime_env``'s variables,
``resources`` -> ``num_cpus``/``num_gpus``/``resources``, ``placement``
-> a hard constraint: a Ray node id -> node affinity, ``{label: value}``
-> Ray's label selector (or, on a Ray without one, its label scheduling
strategy).  `check_placeable` refuses, before any actor starts, a node
the cluster can never hold, and `check_fits` the nodes of a run that
ask together for more than it has.  `connect` initialises Ray for a
session: a Ray it starts itself runs without the dashboard unless asked
(``include_dashboard=True``) and under a watcher (`_raywatch`) that
kills Ray's processes when this process goes, however it ends;
`shutdown` stops such a Ray.  Plans pickle the user's own modules by
value, so a job defined in ``__main__`` or a test module reaches workers
that cannot import it.
"""

import functools
import importlib
import os
import re
import sys
import sysconfig

import ray

from ..errors import PlanError
from ._raywatch import RayWatcher

__all__ = ["connect", "shutdown", "actor_options", "beside_driver",
           "options_key", "check_placeable", "check_fits",
           "dumps_by_value", "unimportable"]

#: the watcher of the Ray this process started, while it runs
_watcher = None


def connect(address=None, namespace=None, **ray_init_kwargs):
    """Initialise Ray in this process unless it is: connect to
    ``address``, or with None start a local instance sized to this
    machine -- watched, so that its processes die with this one.  True if
    that started a local instance (its starter stops it: `shutdown`)."""
    global _watcher
    if ray.is_initialized():
        return False
    kwargs = {"include_dashboard": False, "log_to_driver": True,
              "configure_logging": False}
    if address is None:
        kwargs["num_cpus"] = os.cpu_count()
    kwargs.update(ray_init_kwargs)
    if address is not None:
        ray.init(address=address, namespace=namespace, **kwargs)
        return False
    if _watcher is not None:   # of a Ray shut down by other means
        _watcher.stop()
    watcher = RayWatcher().start()   # first: a death during init counts
    try:
        with watcher.marking():
            context = ray.init(namespace=namespace, **kwargs)
        watcher.tell(context.address_info["session_dir"])
    except BaseException:
        ray.shutdown()
        watcher.stop()
        raise
    _watcher = watcher
    return True


def shutdown():
    """Shut down the Ray this process started (`connect`), and its
    watcher, which kills whatever process of it is left."""
    global _watcher
    ray.shutdown()
    watcher, _watcher = _watcher, None
    if watcher is not None:
        watcher.stop()


def dumps_by_value(obj, protocol, by_reference=None):
    """``cloudpickle.dumps`` of ``(plan, user_ops)``, the modules of the
    user's functions (Python ops, registered kernels) pickled by value --
    but those installed as packages, which every Ray worker is expected
    to import: ``by_reference`` (a dict) gets ``{module: [function]}``
    of those, for the error of a worker that cannot."""
    plan, user_ops = obj
    functions = [schema.kernel for schema in user_ops.values()]
    for net in plan.step.walk_nets():
        for op in net.ops:
            functions += [v for v in op.args.values() if callable(v)]
    for fn in functions:
        name = getattr(fn, "__module__", None) or ""
        module = sys.modules.get(name)
        if module is None:
            continue
        if _by_value(module):
            ray.cloudpickle.register_pickle_by_value(module)
        elif by_reference is not None and not _ours_or_stdlib(module):
            by_reference.setdefault(name, set()).add(
                f"{name}.{getattr(fn, '__qualname__', fn)}")
    return ray.cloudpickle.dumps(obj, protocol)


def unimportable(error, by_reference):
    """The PlanError of a plan a worker could not load because it could
    not import a module (``error``: the node's PlanError), naming the
    functions of the plan from that module and the ways to ship it."""
    found = re.search(r"No module named '([^']+)'", str(error))
    if found is None:
        return error
    missing = found.group(1)
    functions = sorted(f for module, fns in by_reference.items()
                       if module == missing or
                       module.startswith(missing + ".") for f in fns)
    return PlanError(
        f"{error}; the Ray workers cannot import module {missing!r}"
        + (f" of {functions}" if functions else "") + ": install it on "
        "every Ray node, or ship it with RaySession(runtime_env="
        "{'py_modules': [...]})")


def _ours_or_stdlib(module):
    name = module.__name__
    path = getattr(module, "__file__", None) or ""
    return (name == "localcluster" or name.startswith("localcluster.") or
            not path or path.startswith(_STDLIB) or name == "__main__")


def _by_value(module):
    """A module of the user's own (not localcluster, not installed, not
    the standard library): the workers may not be able to import it."""
    name = module.__name__
    path = getattr(module, "__file__", None) or ""
    return not (name == "localcluster" or name.startswith("localcluster.")
                or name == "__main__" or "site-packages" in path or
                "dist-packages" in path or not path or
                path.startswith(_STDLIB))


_STDLIB = sysconfig.get_paths()["stdlib"]


def actor_options(kwargs):
    """Ray actor options from a Node's options (an actor holds no CPU
    unless its Node asks for some)."""
    options = {"num_cpus": 0, "max_restarts": 0}
    if kwargs.get("cpus"):
        options["num_cpus"] = len(kwargs["cpus"])
    if kwargs.get("memory_limit"):
        options["memory"] = int(kwargs["memory_limit"])
    if kwargs.get("env"):
        options["runtime_env"] = {"env_vars": dict(kwargs["env"])}
    resources = dict(kwargs.get("resources") or {})
    if "CPU" in resources:
        options["num_cpus"] = resources.pop("CPU")
    if "GPU" in resources:
        options["num_gpus"] = resources.pop("GPU")
    if resources:
        options["resources"] = resources
    placement = kwargs.get("placement")
    if isinstance(placement, str):
        from ray.util.scheduling_strategies import \
            NodeAffinitySchedulingStrategy
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            placement, soft=False)
    elif placement and _has_label_selector():
        options["label_selector"] = dict(placement)
    elif placement:
        from ray.util.scheduling_strategies import (
            In, NodeLabelSchedulingStrategy)
        options["scheduling_strategy"] = NodeLabelSchedulingStrategy(
            {k: In(v) for k, v in placement.items()})
    return options


@functools.lru_cache(maxsize=None)
def _has_label_selector():
    """Whether this Ray takes an actor's ``label_selector``: the Ray
    versions that have it schedule by it, and pass over the older
    NodeLabelSchedulingStrategy, which they still accept -- an actor
    given only that lands on any Ray node."""
    for name in ("ray._common.ray_option_utils",
                 "ray._private.ray_option_utils"):
        try:
            table = importlib.import_module(name).actor_options
        except (ImportError, AttributeError):
            continue
        return "label_selector" in table
    return False


def beside_driver():
    """Actor options for a session's own actors -- a queue's channel, the
    fault book -- that put them on this driver's Ray node, holding no CPU.
    Left to Ray, an actor that asks for nothing lands on any Ray node (a
    soft affinity too: Ray spreads such actors all the same), and one
    that leaves would take with it the queues of nodes that run
    elsewhere; beside the driver it fails only with the driver's node,
    which ends the run anyway.  Hard: the actor asks for nothing, so the
    driver's node can always hold it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return {"num_cpus": 0, "scheduling_strategy":
            NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False)}


def options_key(kwargs):
    """A hashable key of a Node's options (a pool keeps actors by it)."""
    return repr(sorted(kwargs.items()))


def check_placeable(name, kwargs):
    """`PlanError` if no node of the Ray cluster can ever hold node
    ``name``: a resource it asks for beyond what the cluster has in all,
    a placement on a node id or labels no live Ray node has."""
    asked = _demand(kwargs)
    total = ray.cluster_resources()
    short = {k: v for k, v in asked.items() if v > total.get(k, 0)}
    if short:
        raise PlanError(
            f"Node({name!r}) asks for {short} but the Ray cluster has "
            f"{_shown(total, short)} in all; ask for less, or add Ray "
            "nodes that have it")
    placement = kwargs.get("placement")
    if not placement:
        return
    live = [n for n in ray.nodes() if n.get("Alive")]
    if isinstance(placement, str):
        ids = [n["NodeID"] for n in live]
        if placement not in ids:
            raise PlanError(
                f"Node({name!r}, placement={placement!r}): no live Ray node "
                f"has that id; the cluster's node ids are {ids}")
        return
    if not any(all(n.get("Labels", {}).get(k) == v
                   for k, v in placement.items()) for n in live):
        raise PlanError(
            f"Node({name!r}, placement={placement!r}): no live Ray node has "
            f"those labels; the nodes have "
            f"{[n.get('Labels', {}) for n in live]}")


def check_fits(wanted):
    """`PlanError` if the nodes ``{name: Node options}`` of a run ask
    together for more of a resource than the Ray cluster has in all: each
    may fit alone (`check_placeable`), but a run needs all its nodes at
    once -- a prototype's N instances ask N times what its Node says --
    and the last would wait for a place that never comes."""
    demands = {name: _demand(kwargs or {}) for name, kwargs in wanted.items()}
    asked = {}
    for demand in demands.values():
        for key, amount in demand.items():
            asked[key] = asked.get(key, 0) + amount
    if not asked:
        return
    total = ray.cluster_resources()
    short = {k: v for k, v in asked.items() if v > total.get(k, 0)}
    if not short:
        return
    askers = [name for name, demand in demands.items()
              if any(demand.get(k) for k in short)]
    shown = ", ".join(askers[:6]) + (f", ... ({len(askers)} nodes)"
                                     if len(askers) > 6 else "")
    raise PlanError(
        f"the run's nodes ask together for {short} ({shown}) but the Ray "
        f"cluster has {_shown(total, short)} in all, and a run needs all "
        "its nodes at once; ask for less, run fewer instances, or add Ray "
        "nodes that have it")


def _demand(kwargs):
    """What an actor started with a Node's options holds while it lives:
    ``{resource: amount}``."""
    asked = dict(kwargs.get("resources") or {})
    if kwargs.get("cpus") and "CPU" not in asked:
        asked["CPU"] = len(kwargs["cpus"])
    if kwargs.get("memory_limit"):
        asked["memory"] = kwargs["memory_limit"]
    return {k: v for k, v in asked.items() if v}


def _shown(total, short):
    return {k: total.get(k, 0) for k in short}
