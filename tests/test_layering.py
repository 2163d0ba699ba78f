"""The package's import layering, checked statically.

Layers, each importing only the ones below it::

    run > job, checkpoint, pipeline, dataio, queues > task
        > plan > kernels, runtime, context, errors

Sessions are the Session boundary: they take what the task model builds
(a TaskGroup, a Task) and drive the runtime, so they may import the task
model and the plan, and nothing below them imports a session.

Every module under ``localcluster/`` is parsed with `ast`; every import at
any depth counts (one inside a function is as much a dependency as one at
the top, it is only deferred).  Importing ``a.b.c`` runs ``a`` and ``a.b``
first, but those are edges of the interpreter, not of the importing
module: counting them would report a cycle through every package
``__init__`` that re-exports its submodules.  So ``import a.b.c`` is an
edge to ``a.b.c`` only, and ``from a.b import c`` an edge to ``a.b.c``
when that is a module, else to ``a.b``.
"""

import ast
import pathlib

import pytest

import localcluster

PACKAGE = "localcluster"
ROOT = pathlib.Path(localcluster.__file__).resolve().parent

#: modules that make up the lower layers ...
LOW_LAYERS = ("localcluster.plan", "localcluster.kernels",
              "localcluster.runtime", "localcluster.context",
              "localcluster.errors")
#: ... and what they must never import: the task model and all above it
HIGH_LAYERS = ("localcluster.task", "localcluster.job",
               "localcluster.checkpoint", "localcluster.pipeline",
               "localcluster.dataio", "localcluster.queues",
               "localcluster.run", "localcluster.printer",
               "localcluster.sessions", "localcluster.testing")


def module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules():
    """{module name: (path, is package)} of every module of the package."""
    return {module_name(p): (p, p.name == "__init__.py")
            for p in sorted(ROOT.rglob("*.py"))}


def _resolve(node, importer, is_package):
    """The absolute module a ``from ... import`` names (None if outside)."""
    if node.level == 0:
        return node.module
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_in(source, name, is_package, modules):
    """The localcluster modules module ``name`` (whose text is ``source``)
    imports; ``modules``: every module name (see the docstring)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, name, is_package)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found
            if m == PACKAGE or m.startswith(PACKAGE + ".")} - {name}


def import_graph():
    modules = all_modules()
    return {name: imports_in(path.read_text(), name, is_package, modules)
            for name, (path, is_package) in modules.items()}


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    state = {}  # module -> "open" while on the stack, "done" after
    stack = []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def in_layer(module, layers):
    return any(module == p or module.startswith(p + ".") for p in layers)


# -- the checker itself -------------------------------------------------------

def test_find_cycle_reports_the_cycle_and_none_without_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == \
        ["a", "b", "c", "a"]


MODULES = {"localcluster", "localcluster.task", "localcluster.plan",
           "localcluster.plan.net", "localcluster.plan.step"}


@pytest.mark.parametrize("source, name, is_package, expected", [
    # inside a function, relative: the module
    ("def f():\n    from ..task import Task\n", "localcluster.plan.step",
     False, {"localcluster.task"}),
    # a submodule by ``from . import``: the submodule, not the package
    ("from . import net, step\n", "localcluster.plan", True,
     {"localcluster.plan.net", "localcluster.plan.step"}),
    # a name from a package: the package
    ("from .plan import Net\n", "localcluster", True, {"localcluster.plan"}),
    # ``import a.b.c``: a.b.c only, not its packages
    ("import localcluster.plan.net\n", "localcluster.task", False,
     {"localcluster.plan.net"}),
    # absolute, other packages, and itself: only localcluster's others
    ("import numpy\nfrom localcluster.task import Task\n"
     "from .step import x\n", "localcluster.plan.step", False,
     {"localcluster.task"}),
])
def test_imports_are_found_at_any_depth_and_resolved(source, name, is_package,
                                                     expected):
    assert imports_in(source, name, is_package, MODULES) == expected


def test_the_graph_covers_every_module():
    graph = import_graph()
    assert {"localcluster", "localcluster.task", "localcluster.plan",
            "localcluster.plan.grouping", "localcluster.sessions.base"} <= \
        set(graph)
    assert {"localcluster.errors", "localcluster.printer"} <= \
        graph["localcluster"]


# -- the rules ----------------------------------------------------------------

def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_lower_layers_import_nothing_from_the_task_model_or_above():
    upward = sorted(
        f"{module} imports {dep}"
        for module, deps in import_graph().items()
        if in_layer(module, LOW_LAYERS)
        for dep in deps if in_layer(dep, HIGH_LAYERS))
    assert not upward, (
        "a lower layer (plan, kernels, runtime, context, errors) imports the"
        " task model or a layer above it; move the code down or pass plain "
        "values in:\n" + "\n".join(upward))
