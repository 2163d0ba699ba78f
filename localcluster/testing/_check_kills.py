"""The kills `restart_recovers` draws: where in a job a node can die.

::

    kills, total = draw_kills(job, last_epoch, seed=0, max_kills=20)

A node can die at any point of its life, and a job's recovery can be
wrong at any of them, so the kills are drawn from five kinds of point
for every node of the job's epoch group:

- ``epoch``: `Epoch(k)`, the node's part of epoch k, for k = 1..last;
- ``op``: `Op(op_type, nth)`, just before an op inside an epoch: every
  op type of the node's epoch plan, ``nth`` drawn up to how often the
  plan runs it in all the epochs;
- ``save``: `Op("SaveCheckpoint", nth)`, just before the node's nth
  checkpoint save (the 1st is epoch 0's, after the init group) -- for
  checkpointed nodes;
- ``init``: just before the first op of the node's part of the init
  group;
- ``step``: `Step(name)`, just before a step of the node's epoch plan
  first starts.

Each kind's points are shuffled by a generator seeded with ``seed`` (so
the same job and seed give the same kills everywhere), epochs spread
over the epochs first, and the kinds taken in turn: when ``max_kills``
cuts the list, what is left still has every kind, every epoch and as
many nodes as fit.  ``total`` is how many there were, for the check's
"tried 20 of 57 kills" note.
"""

import collections
import itertools
import random

from ..plan.faults import Epoch, Kill, Op, Step
from ..plan.instances import expand_plans

__all__ = ["draw_kills"]

KINDS = ("epoch", "op", "save", "init", "step")


def _steps(step):
    yield step
    for sub in step.substeps:
        yield from _steps(sub)


def _op_counts(plan):
    counts = collections.Counter()
    for net in plan.step.walk_nets():
        for op in net.ops:
            counts[op.type] += 1
    return counts


def _plans(group):
    """``{node: plan}`` of the nodes that run ``group`` (a prototype's
    instances: they are what dies)."""
    if group is None or not group.num_registered_tasks():
        return {}
    return {plan.node: plan for plan in expand_plans(group.node_plans())}


def draw_kills(job, last, seed=0, max_kills=20):
    """``(kills, total)``: up to ``max_kills`` `Kill` faults (module
    docstring) and how many points there were to draw from."""
    rng = random.Random(f"kills:{seed}")
    epoch_plans = _plans(job.epoch_group)
    init_plans = _plans(job.init_group)
    saved = set(job.nodes_to_checkpoint())
    by_kind = {kind: [] for kind in KINDS}
    epochs = collections.defaultdict(list)
    for node in sorted(epoch_plans):
        for k in range(1, last + 1):
            epochs[k].append(Kill(node, at=Epoch(k)))
        for op_type, count in sorted(_op_counts(epoch_plans[node]).items()):
            if op_type == "SaveCheckpoint":
                continue
            nth = rng.randint(1, max(count * max(last, 1), 1))
            by_kind["op"].append(Kill(node, at=Op(op_type, nth)))
        names = sorted({s.name for s in _steps(epoch_plans[node].step)})
        for name in names:
            by_kind["step"].append(Kill(node, at=Step(name)))
    for node in sorted(saved & set(epoch_plans) | saved & set(init_plans)):
        for nth in range(1, last + 2):
            by_kind["save"].append(Kill(node, at=Op("SaveCheckpoint", nth)))
    for node in sorted(init_plans):
        ops = [op for net in init_plans[node].step.walk_nets()
               for op in net.ops]
        if ops:
            by_kind["init"].append(Kill(node, at=Op(ops[0].type, 1)))
    # epochs in turn (1, 2, 3, 1, 2, 3, ...), each epoch's nodes shuffled
    for k in epochs:
        rng.shuffle(epochs[k])
    by_kind["epoch"] = [kill for turn in itertools.zip_longest(
        *(epochs[k] for k in sorted(epochs))) for kill in turn
        if kill is not None]
    for kind in KINDS[1:]:
        rng.shuffle(by_kind[kind])
    kills = [kill for turn in itertools.zip_longest(
        *(by_kind[kind] for kind in KINDS)) for kill in turn
        if kill is not None]
    return kills[:max_kills], len(kills)
