"""Hypothesis strategies for plans, fault plans and schedules.

::

    @given(drawn=task_groups(), seed=schedules())
    def test_my_session_runs_what_the_model_predicts(drawn, seed):
        with LocalSession(schedule=seed) as session:
            session.run(drawn.build())
            for node, blobs in drawn.expected.items():
                for name, value in blobs.items():
                    assert_array_equal(session.fetch_blob(name, node), value)

- `task_groups` draws a `Drawn` (``build()``, ``expected``, ``nodes``): a
  GLOBAL TaskGroup of tasks that each run a short program on float64
  registers of their own (constants, ``Copy``, ``Add``, ``Sub``,
  ``Scale``, ``Mul`` by a constant, ``ops.loop(n)``), count up their
  node's ``count`` and ``AtomicAdd`` into its ``acc``, some with several
  instances; with ``queues=True`` also pipes that send records through a
  Queue, to the same node or another one, where they are summed.
- `jobs` draws a `DrawnJob` (``build()``, ``expected``, ``epochs``,
  ``nodes``): an init group making every blob the job keeps, on every
  node it uses (so every node is checkpointed), an epoch group whose
  tasks update those blobs and whose pipes feed a Dataset's records to
  another node a few per epoch, and `epoch_limiter` or a stop-condition
  blob.  ``expected`` is what ``JobRunner(job,
  MultiNodeCheckpointManager(dir)).train(session)`` leaves on its nodes.
- `fault_plans` draws a `FaultPlan`; `schedules` draws seeds, which
  ``LocalSession(schedule=seed)`` takes.
- `conditions` draws a list of cluster conditions (`Link`, `Slowdown`)
  for a job's nodes, which every session takes as ``conditions=`` and
  `check_job` as ``conditions=``.

The model behind ``expected`` is the statements' own Python-int
arithmetic (`localcluster.testing._vocab`), never the kernels.  Every
drawn plan is valid and race-free by construction -- a task writes only
its own registers; what tasks share is changed only by atomic ops -- so
``expected`` holds under every session and every schedule, and nothing
is filtered: every draw is used, so generation stays fast.  Blobs the
model does not name (a loop's counter, a pipe's cursor, a CountUp's
output) are not in ``expected``.

Shrinking: every count shrinks towards its lower bound, every choice
towards its first option, so a failing example shrinks towards one node,
one task, one register of width 1 holding 0, no queue, one epoch and no
fault.  A `Drawn`'s or `DrawnJob`'s ``repr`` -- what hypothesis shows
for a falsifying example -- is the expected values followed by
`localcluster.printer.to_string` of the plan; a `FaultPlan`'s is the
Python that makes it, and a seed is an int.

Decisions the contract leaves open:

- ``nodes``: an int N (names ``node_0`` ... ``node_{N-1}``) or a list of
  names; a plan uses some of them (``.nodes``, in order of first use),
  drawing lower indices first.
- Task groups are GLOBAL, so their blobs can be fetched after the run;
  their ``expected`` holds after a run in a fresh session, or after runs
  of the same group (every run makes its blobs again).  A task's
  registers are in ``expected`` only if it has one instance: several
  instances run in workspaces of their own, which vanish.
- `fault_plans` takes ``kinds`` as names ("kill", "hang", "delay",
  "fail_checkpoint") or the fault classes; without ``epochs`` faults
  trigger at `Op` (of ``op_types``) or, given ``step_names``, at `Step`,
  and "fail_checkpoint" needs ``epochs``.  "hang" stops a node until its
  run's timeout, so give runs a timeout when it is drawn.
- Misuse raises hypothesis's ``InvalidArgument``, naming the argument,
  the value and the rule, when the strategy is made.

This module is the public face: the plan, job, fault plan and schedule
strategies are here; `conditions` is made in `._condition_strategies`
(and imported from here, as ever), and the argument checks every
strategy shares are `._strategy_args`.
"""

import functools

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ..plan.faults import (Delay, Epoch, FailCheckpoint, FaultPlan, Hang,
                           Kill, KILL_HOWS, Op, Step)
from ._condition_strategies import conditions
from ._drawn import Drawn, DrawnJob
from ._plans import (ChannelSpec, EpochTaskSpec, FeedSpec, GroupSpec, JobSpec,
                     TaskSpec)
from ._strategy_args import int_arg as _int_arg, node_names as _node_names
from ._vocab import (AtomicAdd, Add, Copy, CountUp, Loop, MulConst, Scale,
                     SetConst, Sub, Update, UPDATE_OPS)

__all__ = ["task_groups", "jobs", "fault_plans", "schedules", "conditions",
           "Drawn",
           "DrawnJob", "FAULT_KINDS", "DEFAULT_OP_TYPES", "MAX_SEED"]

#: the fault kinds `fault_plans` draws, by name
FAULT_KINDS = {"kill": Kill, "hang": Hang, "delay": Delay,
               "fail_checkpoint": FailCheckpoint}
#: the op types an `Op` trigger names unless ``op_types`` is given: ops
#: every drawn plan runs (every constant is a GivenTensorFill)
DEFAULT_OP_TYPES = ("GivenTensorFill", "Add", "Copy")
#: seeds are drawn from 0 .. MAX_SEED
MAX_SEED = 2 ** 32 - 1

# Bounds of the vocabulary: with them no value gets near 2**53, so float64
# holds every one exactly (`_vocab.exact` checks).
_MAX_REGISTERS = 3
_MAX_WIDTH = 3
_MAX_ITEMS = 3         # statements or loops, per program
_MAX_LOOP = 3          # iterations
_MAX_BODY = 2          # statements in a loop's body
_MAX_INSTANCES = 3
_MAX_RECORDS = 4       # per queue in a task group
_MAX_EPOCH_TASKS = 3
_MAX_FEEDS = 2
_MAX_DATA = 8          # records of a job's Dataset
_MAX_STATE = 2         # persistent registers of an epoch task
_MAX_UPDATES = 3
_MAX_DELAY_MS = 50

_values = st.integers(-3, 3)
_coefficients = st.integers(-3, 3)


# -- programs -----------------------------------------------------------------
#
# A composite makes the strategies of its later draws from its earlier ones
# (a program's from its number of registers): made afresh on every draw,
# validating them would take most of the time, so each is made once.

@functools.lru_cache(maxsize=None)
def _statements(registers, width):
    reg = st.integers(0, registers - 1)
    return st.one_of(
        st.builds(Copy, reg, reg),
        st.builds(Add, reg, reg, reg),
        st.builds(Sub, reg, reg, reg),
        st.builds(Scale, reg, reg, _coefficients),
        st.builds(MulConst, reg, reg, _coefficients),
        st.builds(SetConst, reg, _vectors(width)),
        st.builds(CountUp),
        st.builds(AtomicAdd, reg))


@functools.lru_cache(maxsize=None)
def _programs(registers, width):
    stmt = _statements(registers, width)
    loop = st.builds(Loop, st.integers(0, _MAX_LOOP),
                     st.lists(stmt, min_size=1, max_size=_MAX_BODY).map(tuple))
    return st.lists(st.one_of(stmt, loop), max_size=_MAX_ITEMS).map(tuple)


@functools.lru_cache(maxsize=None)
def _vectors(width):
    return st.tuples(*[_values] * width)


@functools.lru_cache(maxsize=None)
def _registers(width, low=1, high=_MAX_REGISTERS):
    return st.lists(_vectors(width), min_size=low, max_size=high).map(tuple)


# -- task groups --------------------------------------------------------------

@st.composite
def _tasks(draw, nodes, width):
    init = draw(_registers(width))
    return TaskSpec(node=draw(st.integers(0, len(nodes) - 1)),
                    instances=draw(st.integers(1, _MAX_INSTANCES)),
                    init=init, program=draw(_programs(len(init), width)))


@functools.lru_cache(maxsize=None)
def _channels(nodes):
    node = st.integers(0, len(nodes) - 1)
    return st.builds(ChannelSpec, src=node, dst=node,
                     records=st.integers(0, _MAX_RECORDS),
                     scale=_coefficients, capacity=st.integers(1, 4),
                     readers=st.integers(1, 2))


@st.composite
def _groups(draw, nodes, max_tasks, queues):
    width = draw(st.integers(1, _MAX_WIDTH))
    tasks = draw(st.lists(_tasks(nodes, width), min_size=1,
                          max_size=max_tasks))
    # a queue is two tasks (its sending and its receiving pipe)
    room = (max_tasks - len(tasks)) // 2 if queues else 0
    channels = draw(st.lists(_channels(nodes), max_size=room))
    return Drawn(GroupSpec(nodes, width, tuple(tasks), tuple(channels)))


def task_groups(nodes=3, max_tasks=6, queues=True):
    """A `Drawn` task group on (some of) ``nodes`` with 1..``max_tasks``
    tasks (a queue counts as two: its pipes), queues if ``queues``."""
    names = _node_names(nodes)
    _int_arg("max_tasks", max_tasks, 1)
    if not isinstance(queues, bool):
        raise InvalidArgument(f"queues={queues!r} must be True or False")
    return _groups(names, max_tasks, queues)


# -- jobs ---------------------------------------------------------------------

@st.composite
def _epoch_tasks(draw, nodes, width):
    node = draw(st.integers(0, len(nodes) - 1))
    instances = draw(st.integers(1, _MAX_INSTANCES))
    # several instances would race on what they keep: they keep nothing
    # but what atomic ops add up
    state = draw(_registers(width, 0 if instances > 1 else 1,
                            0 if instances > 1 else _MAX_STATE))
    temps = draw(_registers(width, 1, 2))
    updates = ()
    if state:
        updates = draw(st.lists(st.builds(
            Update, st.sampled_from(sorted(UPDATE_OPS)),
            st.integers(0, len(state) - 1), st.integers(0, len(temps) - 1)),
            max_size=_MAX_UPDATES).map(tuple))
    return EpochTaskSpec(node, instances, state, temps,
                         draw(_programs(len(temps), width)), updates)


@functools.lru_cache(maxsize=None)
def _feeds(nodes):
    node = st.integers(0, len(nodes) - 1)
    return st.builds(
        FeedSpec, src=node, dst=node,
        data=st.lists(st.integers(0, 9), max_size=_MAX_DATA).map(tuple),
        per_epoch=st.integers(1, 3), scale=_coefficients,
        capacity=st.integers(1, 4))


@st.composite
def _jobs(draw, nodes, max_epochs):
    width = draw(st.integers(1, _MAX_WIDTH))
    epochs = draw(st.integers(1, max_epochs))
    tasks = draw(st.lists(_epoch_tasks(nodes, width), min_size=1,
                          max_size=_MAX_EPOCH_TASKS))
    feeds = draw(st.lists(_feeds(nodes), max_size=_MAX_FEEDS))
    used = sorted({t.node for t in tasks} |
                  {n for f in feeds for n in (f.src, f.dst)})
    stop = draw(st.sampled_from(["limiter", "blob"]))
    stop_node = draw(st.sampled_from(used))
    return DrawnJob(JobSpec(nodes, width, tuple(tasks), tuple(feeds), epochs,
                            stop, stop_node))


def jobs(nodes=3, max_epochs=5):
    """A `DrawnJob` on (some of) ``nodes`` training 1..``max_epochs``
    epochs."""
    names = _node_names(nodes)
    _int_arg("max_epochs", max_epochs, 1)
    return _jobs(names, max_epochs)


# -- fault plans --------------------------------------------------------------

def _kind_names(kinds, epochs):
    if kinds is None:
        names = list(FAULT_KINDS)
        return names if epochs is not None else names[:-1]
    by_class = {cls: name for name, cls in FAULT_KINDS.items()}
    names = []
    for kind in kinds:
        name = by_class.get(kind, kind)
        if name not in FAULT_KINDS:
            raise InvalidArgument(
                f"kinds={kinds!r}: {kind!r} is not a fault kind; use names "
                f"from {list(FAULT_KINDS)} or the classes Kill, Hang, Delay, "
                "FailCheckpoint")
        if name not in names:
            names.append(name)
    if not names:
        raise InvalidArgument(f"kinds={kinds!r} must name at least one kind")
    if "fail_checkpoint" in names and epochs is None:
        raise InvalidArgument(
            "kinds includes 'fail_checkpoint', which names the epoch whose "
            "checkpoint fails; pass epochs= (the number the job trains)")
    return names


def _names_arg(name, value):
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, str) and v for v in value):
        raise InvalidArgument(f"{name}={value!r} must be a list of non-empty "
                              "strings")
    return tuple(value)


def _triggers(epochs, op_types, step_names):
    if epochs is not None:
        return st.builds(Epoch, st.integers(1, epochs))
    ops_at = st.builds(Op, st.sampled_from(op_types), st.integers(1, 3))
    if not step_names:
        return ops_at
    return st.one_of(ops_at, st.builds(Step, st.sampled_from(step_names)))


def _faults(kind, node, at, epochs):
    if kind == "kill":
        return st.builds(Kill, node, at, st.sampled_from(KILL_HOWS))
    if kind == "hang":
        return st.builds(Hang, node, at)
    if kind == "delay":
        return st.builds(Delay, node, at, st.integers(
            0, _MAX_DELAY_MS).map(lambda ms: ms / 1000))
    return st.builds(FailCheckpoint, node, st.integers(0, epochs))


def fault_plans(nodes, epochs=None, kinds=None, max_faults=2, *,
                op_types=DEFAULT_OP_TYPES, step_names=()):
    """A `FaultPlan` of up to ``max_faults`` distinct faults on ``nodes``
    (an int or names, as for `task_groups`), of ``kinds`` (names or
    classes; default all, "fail_checkpoint" only with ``epochs``),
    triggered at ``Epoch(k)``, ``1 <= k <= epochs``, when ``epochs`` is
    given, else at ``Op(op_type, nth)`` (``op_type`` from ``op_types``,
    ``nth`` 1..3) or ``Step(name)`` (``name`` from ``step_names``)."""
    names = _node_names(nodes)
    if epochs is not None:
        _int_arg("epochs", epochs, 1)
    kind_names = _kind_names(kinds, epochs)
    _int_arg("max_faults", max_faults, 0)
    op_types = _names_arg("op_types", op_types)
    if not op_types:
        raise InvalidArgument("op_types=() must name at least one op type")
    step_names = _names_arg("step_names", step_names)
    node = st.sampled_from(names)
    at = _triggers(epochs, op_types, step_names)
    fault = st.one_of(*[_faults(k, node, at, epochs) for k in kind_names])
    return st.lists(fault, max_size=max_faults, unique=True).map(
        lambda faults: FaultPlan(*faults))


# -- schedules ----------------------------------------------------------------

def schedules():
    """Seeds for ``LocalSession(schedule=seed)``: ints 0..`MAX_SEED`,
    shrinking to 0."""
    return st.integers(0, MAX_SEED)
