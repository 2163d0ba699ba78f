"""The reference model: what a drawn plan leaves on its nodes.

`group_model` and `job_model` predict ``{node: {blob: array}}`` for a
`GroupSpec` run once and a `JobSpec` trained to its last epoch, by running
the statements' ``apply`` (`._vocab`) on Python ints -- never the kernels
-- and converting to the dtypes the plan makes (float64 registers and
``acc``, int64 counters and sums).  What the model cannot see, because no
drawn plan depends on it, is left out: blobs it does not name (a loop's
counter, a reader's cursor, a CountUp's output) and the registers of a
task of several instances (each instance's vanish with its workspace).
"""

import numpy as np

from ._plans import STATE_LETTERS, group_nodes, job_nodes
from ._vocab import COUNT, NodeModel, exact, floats, register_names, uses

__all__ = ["group_model", "job_model"]


def _run_program(init, program, node):
    regs = [exact(v) for v in init]
    for item in program:
        item.apply(regs, node)
    return regs


def _shared_blobs(models, used):
    out = {}
    for (node, name) in sorted(used):
        model = models[node]
        out.setdefault(node, {})[name] = (
            np.array(model.count, dtype=np.int64) if name == COUNT
            else floats(model.acc))
    return out


def _sum_blobs(j, total, count):
    return {f"q{j}_sum": np.array([total], dtype=np.int64),
            f"q{j}_count": np.array(count, dtype=np.int64)}


def group_model(spec):
    """``{node: {blob: array}}`` after one run of ``build_group(spec)``."""
    expected = {node: {} for node in group_nodes(spec)}
    models = {node: NodeModel(spec.width) for node in expected}
    used = set()
    for i, task in enumerate(spec.tasks):
        node = spec.nodes[task.node]
        used |= {(node, n) for n in uses(task.program)}
        for _ in range(task.instances):
            regs = _run_program(task.init, task.program, models[node])
        if task.instances == 1:  # else each instance's vanish with it
            names = register_names(f"t{i}", len(task.init))
            expected[node].update(zip(names, map(floats, regs)))
    for node, blobs in _shared_blobs(models, used).items():
        expected[node].update(blobs)
    for j, ch in enumerate(spec.channels):
        total = ch.scale * ch.records * (ch.records - 1) // 2
        expected[spec.nodes[ch.dst]].update(_sum_blobs(j, total, ch.records))
    return expected


def job_model(spec):
    """``{node: {blob: array}}`` after training ``build_job(spec)``."""
    nodes = job_nodes(spec)
    models = {node: NodeModel(spec.width) for node in nodes}
    state = [[exact(v) for v in task.state] for task in spec.tasks]
    cursors = [0] * len(spec.feeds)
    sums = [[0, 0] for _ in spec.feeds]
    for _ in range(spec.epochs):
        for task, regs in zip(spec.tasks, state):
            for _ in range(task.instances):
                temps = _run_program(task.temps, task.program,
                                     models[spec.nodes[task.node]])
                for update in task.updates:
                    update.apply(regs, temps)
        for j, (feed, total) in enumerate(zip(spec.feeds, sums)):
            taken = feed.data[cursors[j]:cursors[j] + feed.per_epoch]
            cursors[j] += len(taken)
            total[0] += feed.scale * sum(taken)
            total[1] += len(taken)
    expected = {node: {} for node in nodes}
    used = set()
    for i, (task, regs) in enumerate(zip(spec.tasks, state)):
        node = spec.nodes[task.node]
        used |= {(node, n) for n in uses(task.program)}
        names = register_names(f"t{i}", len(regs), STATE_LETTERS)
        expected[node].update(zip(names, map(floats, regs)))
    for node, blobs in _shared_blobs(models, used).items():
        expected[node].update(blobs)
    for j, (feed, (total, count)) in enumerate(zip(spec.feeds, sums)):
        expected[spec.nodes[feed.dst]].update(_sum_blobs(j, total, count))
    if spec.stop == "blob":
        expected[spec.nodes[spec.stop_node]]["stop_ticks"] = floats(
            [spec.epochs])
    return expected
