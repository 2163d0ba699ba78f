"""The package's import layering, checked statically.

Every module of ``localcluster`` stands in one layer, and imports only
modules of the layers below it and of its own layer.  From the top::

    1  cli  run ckpt report           the command line and its entry points
    2  examples                       the example job the command line trains
    3  testing                        the testing kit
    4  localcluster                   the package face (``__init__.py``)
    5  job checkpoint pipeline dataio queues printer  |  sessions
    6  task  |  runtime
    7  plan
    8  kernels
    9  context errors

A ``|`` separates siblings of one level: they share the level but never
import each other (the library around a job and the sessions that drive
it; the task model and the runtime it is turned into).  Within one group
any import is fine (``queues`` may import ``dataio``).  A name stands for
that module and, when it is a package, every module under it; the name
``localcluster`` stands for the package face alone.

`localcluster.examples` has a layer of its own, between the command line
and the testing kit: it is a user of the library (it imports the face and
`dataio`), and nothing imports it with an import statement -- the command
line names it by string (``cli.jobspec.DEFAULT_JOB``) and loads it when a
run starts.  So the command line may use it, but it never imports the
command line, and neither the testing kit nor the library imports it.

Three more rules keep the command line on top:

* nothing outside `localcluster.cli` and the entry points imports
  `localcluster.cli`;
* the command line imports the concrete modules it uses, never the package
  face (``from .. import printer`` is the module `localcluster.printer`,
  fine; ``from .. import LocalClusterError`` is the face, not);
* the entry points ``localcluster.run``, ``.ckpt`` and ``.report`` are a
  few lines each that import only ``localcluster.cli.<name>``.

One exception, and only one (`ALLOWED`): the face imports
`localcluster.cli.signals`, the command line's Ctrl-C guard.

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


def parse_layers(table):
    """The layers of ``table`` (one level a line, top first; names apart by
    spaces, sibling groups apart by ``|``; names relative to the package,
    ``localcluster`` itself meaning the face) as a tuple of levels, each a
    tuple of groups, each a tuple of absolute module names."""
    def absolute(name):
        return name if name == PACKAGE else f"{PACKAGE}.{name}"
    return tuple(
        tuple(tuple(absolute(n) for n in group.split())
              for group in line.split("|"))
        for line in table.splitlines() if line.strip())


#: the layers, from the top (see the docstring)
LAYERS = parse_layers("""
    cli run ckpt report
    examples
    testing
    localcluster
    job checkpoint pipeline dataio queues printer  |  sessions
    task  |  runtime
    plan
    kernels
    context errors
""")

#: (importer, imported): the only imports the rules let through.
ALLOWED = {
    # Under ``python -m localcluster.run`` the package face installs the
    # command line's Ctrl-C guard first thing, so a signal while the
    # package imports is never lost: the command line stops with its exit
    # status instead of a traceback from inside an import.
    ("localcluster", "localcluster.cli.signals"),
}

CLI = "localcluster.cli"
ENTRY_POINTS = ("localcluster.run", "localcluster.ckpt",
                "localcluster.report")


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


def names(name, module):
    """Whether layer name ``name`` stands for ``module``."""
    return module == name or (name != PACKAGE
                              and module.startswith(name + "."))


def places(module, layers):
    """Every (level, group) of ``layers`` that names ``module``; level 0
    is the top."""
    return [(level, group)
            for level, groups in enumerate(layers)
            for group, members in enumerate(groups)
            if any(names(n, module) for n in members)]


def short(name):
    return name if name == PACKAGE else name[len(PACKAGE) + 1:]


def describe(level, layers):
    """``level 6 (task  |  runtime)``: a level as the docstring shows it."""
    groups = "  |  ".join(" ".join(short(n) for n in group)
                          for group in layers[level])
    return f"level {level + 1} ({groups})"


def is_cli(module):
    return module == CLI or module.startswith(CLI + ".")


def edges(graph):
    return sorted((module, dep) for module, deps in graph.items()
                  for dep in deps)


def unlayered(graph, layers):
    """Modules no layer names, or more than one; and names of no module."""
    found = []
    for module in sorted(graph):
        where = places(module, layers)
        if not where:
            found.append(
                f"{module}: no layer names it; add it to a layer in LAYERS"
                f" in tests/test_layering.py (or move it into a package a"
                f" layer names)")
        elif len(where) > 1:
            found.append(
                f"{module}: named by more than one layer ("
                + ", ".join(describe(level, layers) for level, _ in where)
                + "); keep it in one of them in tests/test_layering.py")
    for groups in layers:
        for group in groups:
            for name in group:
                if not any(names(name, m) for m in graph):
                    found.append(
                        f"{name}: a layer names it but there is no such "
                        f"module; remove it from LAYERS in "
                        f"tests/test_layering.py")
    return found


def layer_violations(graph, layers, allowed):
    """Imports of a higher layer, or of a sibling on the importer's level."""
    found = []
    for module, dep in edges(graph):
        if (module, dep) in allowed:
            continue
        here, there = places(module, layers), places(dep, layers)
        if len(here) != 1 or len(there) != 1:
            continue  # `unlayered` reports it
        (level, group), (dep_level, dep_group) = here[0], there[0]
        if dep_level < level:
            found.append(
                f"{module} imports {dep}: an upward import, "
                f"{describe(level, layers)} imports "
                f"{describe(dep_level, layers)}; move the code down or "
                f"pass plain values in")
        elif dep_level == level and dep_group != group:
            found.append(
                f"{module} imports {dep}: a sibling import on "
                f"{describe(level, layers)}, whose groups never import each"
                f" other; move the shared code down a level")
    return found


def cli_importers(graph, allowed):
    """Modules outside the command line and its entry points that import
    the command line."""
    return [f"{module} imports {dep}: only the command line and its entry "
            f"points import localcluster.cli; move what {module} needs out"
            f" of the command line into the library"
            for module, dep in edges(graph)
            if is_cli(dep) and not is_cli(module)
            and module not in ENTRY_POINTS and (module, dep) not in allowed]


def face_in_cli(graph):
    """Modules of the command line that import the package face."""
    return [f"{module} imports the package face {PACKAGE}: import the "
            f"concrete module instead (from ..errors import X, not from .."
            f" import X)"
            for module, dep in edges(graph)
            if is_cli(module) and dep == PACKAGE]


def entry_point_imports(graph):
    """Imports of the entry points that are not of the command line."""
    return [f"{module} imports {dep}: an entry point imports only "
            f"localcluster.cli.<name>; move the code into the command line"
            for module, dep in edges(graph)
            if module in ENTRY_POINTS and not is_cli(dep)]


def violations(graph, layers, allowed):
    """Every breach of the rules (see the docstring) in ``graph``, one
    human-readable line each; ``allowed``: the (importer, imported) edges
    let through."""
    return (unlayered(graph, layers)
            + layer_violations(graph, layers, allowed)
            + cli_importers(graph, allowed)
            + face_in_cli(graph)
            + entry_point_imports(graph))


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


TOY_LAYERS = parse_layers("""
    cli run
    testing
    localcluster
    job  |  sessions
    task
    errors
""")


def toy_graph(*extra):
    """A graph that keeps every rule of `TOY_LAYERS`, plus ``extra`` edges."""
    graph = {
        "localcluster.cli": {"localcluster.cli.signals", "localcluster.job"},
        "localcluster.cli.signals": set(),
        "localcluster.run": {"localcluster.cli"},
        "localcluster.testing": {"localcluster", "localcluster.job"},
        "localcluster": {"localcluster.job", "localcluster.sessions",
                         "localcluster.errors"},
        "localcluster.job": {"localcluster.task"},
        "localcluster.sessions": {"localcluster.task"},
        "localcluster.task": {"localcluster.errors"},
        "localcluster.errors": set(),
    }
    for module, dep in extra:
        graph.setdefault(module, set()).add(dep)
    return graph


TOY_ALLOWED = {("localcluster", "localcluster.cli.signals")}


def test_the_toy_graph_keeps_every_rule():
    assert violations(toy_graph(), TOY_LAYERS, TOY_ALLOWED) == []


def test_the_checker_flags_an_upward_import():
    assert violations(toy_graph(("localcluster.errors", "localcluster.task")),
                      TOY_LAYERS, TOY_ALLOWED) == [
        "localcluster.errors imports localcluster.task: an upward import, "
        "level 6 (errors) imports level 5 (task); move the code down or "
        "pass plain values in"]


def test_the_checker_flags_a_sibling_import_but_not_one_within_a_group():
    found = violations(toy_graph(("localcluster.sessions",
                                  "localcluster.job.x")),
                       TOY_LAYERS, TOY_ALLOWED)
    assert found == [
        "localcluster.sessions imports localcluster.job.x: a sibling import "
        "on level 4 (job  |  sessions), whose groups never import each "
        "other; move the shared code down a level"]
    assert violations(toy_graph(("localcluster.run", "localcluster.cli.x"),
                                ("localcluster.job.a", "localcluster.job.b")),
                      TOY_LAYERS, TOY_ALLOWED) == []


def test_the_checker_flags_a_module_no_layer_names_or_two_do():
    stray = ("localcluster.stray", "localcluster.errors")
    found = violations(toy_graph(stray), TOY_LAYERS, TOY_ALLOWED)
    assert len(found) == 1 and found[0].startswith(
        "localcluster.stray: no layer names it; add it to a layer in LAYERS")
    twice = parse_layers("cli run\ntesting\nlocalcluster\njob | sessions\n"
                         "task\nerrors task")
    assert any(v.startswith("localcluster.task: named by more than one")
               for v in violations(toy_graph(), twice, TOY_ALLOWED))


def test_the_face_names_itself_only():
    assert places("localcluster", TOY_LAYERS) == [(2, 0)]
    assert places("localcluster.job.x", TOY_LAYERS) == [(3, 0)]
    assert places("localcluster.jobs", TOY_LAYERS) == []


def test_the_checker_lets_through_the_allowed_import_and_nothing_else():
    face_guard = ("localcluster", "localcluster.cli.signals")
    assert violations(toy_graph(face_guard), TOY_LAYERS, TOY_ALLOWED) == []
    assert len(violations(toy_graph(face_guard), TOY_LAYERS, set())) == 2
    for edge in [("localcluster", "localcluster.cli"),
                 ("localcluster.job", "localcluster.cli.signals")]:
        found = violations(toy_graph(edge), TOY_LAYERS, TOY_ALLOWED)
        assert found and all(v.startswith(f"{edge[0]} imports {edge[1]}")
                             for v in found), found


def test_the_checker_flags_the_library_importing_the_command_line():
    found = violations(toy_graph(("localcluster.task", "localcluster.cli.x")),
                       TOY_LAYERS, TOY_ALLOWED)
    assert ("localcluster.task imports localcluster.cli.x: only the command "
            "line and its entry points import localcluster.cli; move what "
            "localcluster.task needs out of the command line into the "
            "library") in found
    # even from a module of the command line's own layer and group
    beside = parse_layers("cli run examples\nlocalcluster")
    graph = {"localcluster.examples": {"localcluster.cli.x"},
             "localcluster.cli.x": set(), "localcluster.run": set(),
             "localcluster": set()}
    assert [v.split(":")[0] for v in violations(graph, beside, set())] == \
        ["localcluster.examples imports localcluster.cli.x"]


def test_the_checker_flags_the_command_line_importing_the_face():
    assert violations(toy_graph(("localcluster.cli.x", "localcluster")),
                      TOY_LAYERS, TOY_ALLOWED) == [
        "localcluster.cli.x imports the package face localcluster: import "
        "the concrete module instead (from ..errors import X, not from .. "
        "import X)"]


def test_the_checker_flags_an_entry_point_importing_the_library():
    assert violations(toy_graph(("localcluster.run", "localcluster.job")),
                      TOY_LAYERS, TOY_ALLOWED) == [
        "localcluster.run imports localcluster.job: an entry point imports "
        "only localcluster.cli.<name>; move the code into the command line"]


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


def test_every_module_is_in_exactly_one_layer():
    found = unlayered(import_graph(), LAYERS)
    assert not found, "\n".join(found)


def test_no_module_imports_a_higher_layer_or_a_sibling():
    found = layer_violations(import_graph(), LAYERS, ALLOWED)
    assert not found, "\n".join(found)


def test_only_the_command_line_imports_the_command_line():
    found = cli_importers(import_graph(), ALLOWED)
    assert not found, "\n".join(found)


def test_the_command_line_imports_modules_not_the_package_face():
    found = face_in_cli(import_graph())
    assert not found, "\n".join(found)


def test_the_entry_points_import_only_the_command_line():
    found = entry_point_imports(import_graph())
    assert not found, "\n".join(found)


def test_a_command_line_that_does_not_check_leaves_the_testing_kit_unloaded():
    """The kit (its checks and their modules) is imported by ``--check``
    only: every other command line starts without it."""
    import subprocess
    import sys
    code = ("import sys, localcluster.cli.run; print(sorted(m for m in "
            "sys.modules if m.startswith('localcluster.testing')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"
