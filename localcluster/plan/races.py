"""Static race analysis: blobs that concurrent branches of a node share.

::

    from localcluster.plan.races import group_races
    found, persisted = group_races([(node, step) for ...])  # one group
    for race in found:
        print(race)
    # blob 'seen' on node 'worker_0': op Add #2 of net 'worker_0/task'
    # (task 'worker_0/task', step 'worker_0/task') writes it in instance 0
    # of task 'worker_0/task' while op Copy #1 of net ... reads it in
    # instance 1 of task 'worker_0/task'; ...

(`localcluster.testing.races` is the face of this module: it takes a Job,
TaskGroup or Task and folds it into the per-node steps analysed here.)

A node runs its part of a group as one `ExecutionStep` tree on one
workspace (a PRIVATE group's child workspace sees -- and writes -- the
node's blobs too).  The executor (`localcluster.runtime.executor`) starts
branches on threads at exactly these points, and nowhere else:

- concurrent substeps (``concurrent_substeps`` with two or more regular
  substeps): the tasks of one node in one group, a pipe's
  ``num_threads`` copies, steps made with ``concurrent_substeps=True``;
- instances (``num_concurrent_instances`` above 1): a Task's
  ``num_instances``, a pipe's ``num_runtime_threads``.  Each instance runs
  in a private child workspace: a blob an instance creates (its first
  access a write, and no blob of that name visible when it starts) is its
  own and never shared; a blob that exists outside it is the same blob
  for every instance;
- periodic substeps (``run_every_ms``: report steps, reporters): each on
  a timer thread of its own, beside the other substeps of its step.

Everything else runs in order: nets and ops in a step, sequential
substeps, and so a task's setup (``task_init``) before its instances and
its exit nets after them, a node's ``local_init`` before its tasks.
Nodes never share a blob: each has its own workspace.

A *race* is one blob, at one place (the node's workspace or one private
child workspace), accessed by two branches that run concurrently, at
least one of them writing it, not both through an atomic op (`ATOMIC`:
the counters, ``AtomicAdd``/``AtomicOr``, a reader's cursor, the ops
registered ``atomic=True``), and not ordered through a queue either: an
access happens before every op that follows a ``DequeueRecords`` of a
queue when it happens before every op that could let that read return --
every ``EnqueueRecord`` and ``CloseQueue`` of the queue in the group, on
any node (so a trainer that writes its weights, sends them to a ps and
takes the ps's answer back has them in order).  A read-only sharing is no
race.  One race is reported per node, blob and pair of branches (the
fork where they part), the pair of ops that shows it best: a write
beside a read if there is one.

The same walk gives `switch_points`: the ops of a group before which a
deterministic schedule must offer the other branches a turn (see it),
and `missing_blob_hint`: when an op finds a blob missing
and the only ops of the node that write it run concurrently with it, the
`BlobNotFoundError` names that writer instead of suggesting the ops are
out of order.  It is worked out once per plan, when a blob is first
found missing -- never while a run goes well.
"""

import itertools
import threading
import weakref
from typing import NamedTuple

from ..kernels import registry

__all__ = ["Access", "Race", "ATOMIC", "group_races", "missing_blob_hint",
           "switch_points", "BLOB_ONLY"]

#: ops that take the node's lock around their in-place access to an input
#: (the kernels of `localcluster.kernels`): ``{op type: {input position:
#: "reads" or "writes"}}``.  Ops registered ``atomic=True`` (``CreateCursor``,
#: ``AppendDataset``, yours) are atomic in every input and output.
ATOMIC = {
    "CountUp": {0: "writes"}, "CountDown": {0: "writes"},
    "RetrieveCount": {0: "reads"}, "ResetCounter": {0: "writes"},
    "AtomicAdd": {0: "writes"}, "AtomicOr": {0: "writes"},
    "ReadDataset": {0: "writes"}, "CursorAtEnd": {0: "reads"},
}

#: ops that write an input in place, without the lock
_IN_PLACE = {"TimerEnd": (0,), "TimerGetAndEnd": (0,)}

#: queue ops: what may let a ``DequeueRecords`` of their queue return
_ENABLERS = ("EnqueueRecord", "CloseQueue")

#: queue ops that return once a record is there (or the queue is closed)
_DEQUEUES = ("DequeueRecords", "DrainRecords")


class Access(NamedTuple):
    """One side of a `Race`: an op and how it uses the blob.

    ``mode`` is ``"reads"``, ``"writes"`` or ``"reads and writes"``;
    ``branch`` says which concurrent branch the op runs on (``"task
    'n/t'"``, ``"instance 1 of task 'n/t'"``, ``"report step 'r' (every
    100 ms)"`` ...)."""
    task: str
    step: str
    net: str
    op_type: str
    op_index: int
    mode: str
    branch: str

    def __str__(self):
        return (f"op {self.op_type} #{self.op_index} of net {self.net!r} "
                f"(task {self.task!r}, step {self.step!r})")


class Race(NamedTuple):
    """Blob ``blob`` on node ``node`` is used by ``first`` and ``second``
    (`Access` values) concurrently, and at least one of them writes it."""
    blob: str
    node: str
    first: Access
    second: Access

    def __str__(self):
        return (f"blob {self.blob!r} on node {self.node!r}: {self.first} "
                f"{self.first.mode} it in {self.first.branch} while "
                f"{self.second} {self.second.mode} it in "
                f"{self.second.branch}; nothing orders them (no setup or "
                f"exit net, queue or atomic op between them)")

    def sort_key(self):
        return (self.node, self.blob, self.first, self.second)


# -- the walk -----------------------------------------------------------------

class _Scope:
    """A workspace the walk is in: the node's (depth 0), or a private
    child (an instance's, a ``create_workspace`` step's)."""
    __slots__ = ("parent", "depth")

    def __init__(self, parent):
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1

    def chain(self):
        scope = self
        while scope is not None:
            yield scope
            scope = scope.parent


class _Visit:
    """A step where the walk met it: how its children run."""
    __slots__ = ("step", "task", "repeating", "instances", "concurrent",
                 "periodic", "instance_depth")

    def __init__(self, step, task, repeating, instances, concurrent,
                 periodic, instance_depth):
        self.step = step
        self.task = task
        self.repeating = repeating      # its body runs more than once
        self.instances = instances      # concurrent copies of its body
        self.concurrent = concurrent    # its regular substeps on threads
        self.periodic = periodic        # child indices run on timers
        self.instance_depth = instance_depth  # its instances' scope depth


class _Event:
    """An op's use of one blob (or, for queue ops, of its queue).

    ``pos``: the place of the op in the tree, ``((visit id, child), ...)``
    from the node's root; the last child is ``(net index, op index)``."""
    __slots__ = ("node", "name", "reads", "writes", "atomic", "scope",
                 "created", "pos", "net", "index", "op", "task", "step",
                 "order")

    def mode(self):
        if self.reads and self.writes:
            return "reads and writes"
        return "writes" if self.writes else "reads"


def _op_uses(op):
    """``{blob: [reads, writes, atomic]}`` of ``op``."""
    schema = registry.lookup(op.type)
    whole = schema is not None and schema.atomic
    locked = ATOMIC.get(op.type, {})
    in_place = _IN_PLACE.get(op.type, ())
    uses = {}

    def use(name, reads, writes, atomic):
        found = uses.get(name)
        if found is None:
            uses[name] = [reads, writes, atomic]
        else:
            found[0] |= reads
            found[1] |= writes
            found[2] &= atomic

    for k, name in enumerate(op.inputs):
        how = locked.get(k)
        if how is not None:
            use(name, True, how == "writes", True)
        else:
            use(name, True, k in in_place, whole)
    for name in op.outputs:
        use(name, False, True, whole)
    return uses


class _Walk:
    """The events of one group: every node's step walked in the order
    it runs, noting where each blob lives (see `_resolve`)."""

    def __init__(self):
        self.visits = {}
        self.events = []        # blob uses, in walk order
        self.queue_ops = []     # queue ops, as events named by their queue
        self._ids = itertools.count()
        self._order = itertools.count()

    def node(self, node, step, known=()):
        """Walk ``node``'s whole step; ``known``: blobs the node has
        before it starts."""
        self._node = node
        self._step(step, (), [[_Scope(None), set(known)]], None, False)

    def _step(self, step, pos, env, task, periodic_run):
        task = step.task or task
        if step.num_iter == 0:
            return      # its body never runs
        vid = next(self._ids)
        repeating = periodic_run or (
            step.num_iter is not None and step.num_iter > 1) or (
            step.num_iter is None and step.should_stop_blob is not None
            and not step.only_once)
        if step.create_workspace:
            env = env + [[_Scope(env[-1][0]), set()]]
        instances = step.num_concurrent_instances or 1
        if step.num_concurrent_instances is not None:
            # each instance in a child workspace of its own (one of them
            # too: the executor gives a single instance a child as well)
            env = env + [[_Scope(env[-1][0]), set()]]
        periodic = frozenset(i for i, s in enumerate(step.substeps)
                             if s.run_every_ms)
        regular = [i for i in range(len(step.substeps)) if i not in periodic]
        concurrent = step.concurrent_substeps and len(regular) > 1
        self.visits[vid] = _Visit(step, task, repeating, instances,
                                  concurrent, periodic,
                                  len(env) - 1 if instances > 1 else None)
        for ni, net in enumerate(step.nets):
            for oi, op in enumerate(net.ops):
                self._op(op, net, oi, pos + ((vid, (ni, oi)),), env, task,
                         step)
        if not step.substeps:
            return
        # the branches the step starts: each regular substep (concurrent)
        # or all of them in order, and each periodic substep on its timer
        branches = ([[i] for i in regular] if concurrent else
                    [regular] if regular else [])
        branches += [[i] for i in sorted(periodic)]
        if len(branches) == 1:
            for i in branches[0]:
                self._step(step.substeps[i], pos + ((vid, i),), env, task,
                           i in periodic)
            return
        # every branch sees what was made before the fork; after the join,
        # what any of them made
        made = [set() for _ in env]
        for branch in branches:
            mine = [[scope, set(names)] for scope, names in env]
            for i in branch:
                self._step(step.substeps[i], pos + ((vid, i),), mine, task,
                           i in periodic)
            for level, (_, names) in enumerate(mine):
                made[level] |= names
        for level, names in enumerate(made):
            env[level][1] |= names

    def _op(self, op, net, index, pos, env, task, step):
        if op.type in _ENABLERS or op.type in _DEQUEUES:
            if "queue" in op.args:
                self.queue_ops.append(self._event(
                    op.args["queue"], op, net, index, pos, task, step))
        for name, (reads, writes, atomic) in _op_uses(op).items():
            event = self._event(name, op, net, index, pos, task, step)
            event.reads, event.writes, event.atomic = reads, writes, atomic
            event.scope, event.created = _resolve(env, name, reads)
            self.events.append(event)

    def _event(self, name, op, net, index, pos, task, step):
        event = _Event()
        event.node, event.name, event.op = self._node, name, op
        event.net, event.index, event.pos = net, index, pos
        event.task, event.step = task, step
        event.order = next(self._order)
        event.reads = event.writes = event.atomic = event.created = False
        event.scope = None
        return event


def _resolve(env, name, reads):
    """``(scope, created)``: where blob ``name`` lives for an op of the
    innermost workspace of ``env`` -- the innermost workspace that has it
    (a child workspace reads and writes its ancestors' blobs); a blob
    nothing made before is read from the node's workspace (whoever writes
    it there, or it is missing), and written where the op runs (created
    there, private to it)."""
    for scope, names in reversed(env):
        if name in names:
            return scope, False
    if reads:
        env[0][1].add(name)
        return env[0][0], False
    env[-1][1].add(name)
    return env[-1][0], len(env) > 1


# -- order and concurrency ----------------------------------------------------

def _parting(pa, pb):
    """The level where two places part (None: the same op)."""
    for k in range(min(len(pa), len(pb))):
        if pa[k][1] != pb[k][1]:
            return k
    return None


class _Order:
    """What runs concurrently with what, and what comes before what, in
    the walked group."""

    def __init__(self, walk):
        self.visits = walk.visits
        self._hb = {}
        dequeues, self._enablers = {}, {}
        for event in walk.queue_ops:
            if event.op.type in _DEQUEUES:
                dequeues.setdefault(event.node, []).append(event)
            else:
                self._enablers.setdefault(event.name, []).append(event)
        self._dequeues = dequeues

    def fork(self, a, b, scope):
        """Where ``a`` and ``b`` (uses of one blob living in ``scope``)
        run concurrently: ``(visit id, None)`` for two instances of a
        step, ``(visit id, (child, child))`` for two branches of a fork;
        None when they run in order."""
        visits = self.visits
        for (va, ca), (_, cb) in zip(a.pos, b.pos):
            visit = visits[va]
            if visit.instances > 1 and scope.depth < visit.instance_depth:
                return va, None     # a blob outside each instance's own
            if ca != cb:
                if visit.concurrent or ca in visit.periodic or \
                        cb in visit.periodic:
                    return va, (ca, cb)
                return None
        return None

    def follows(self, d, z):
        """Whether every run of op ``z`` comes after a run of op ``d``,
        both of one node (program order: ``z`` after ``d`` in the same
        branch)."""
        if d.node != z.node:
            return False
        k = _parting(d.pos, z.pos)
        if k is None:
            return True
        return self._in_order(d, z, k)

    def strictly_before(self, x, e):
        """Whether every run of ``x`` ends before any run of ``e`` starts
        (program order on one node, neither inside a repetition or the
        instances of a step both are in)."""
        if x.node != e.node:
            return False
        k = _parting(x.pos, e.pos)
        if k is None:
            return False
        for vid, _ in x.pos[:k + 1]:
            visit = self.visits[vid]
            if visit.repeating or visit.instances > 1:
                return False
        return self._in_order(x, e, k)

    def _in_order(self, a, b, k):
        """Whether ``a`` comes before ``b`` in the visit where their
        positions part (level ``k``): one after the other, not side by
        side and neither a periodic step."""
        vid, ca = a.pos[k]
        cb = b.pos[k][1]
        visit = self.visits[vid]
        if visit.concurrent or ca in visit.periodic or cb in visit.periodic:
            return False
        return ca < cb

    def before(self, x, z):
        """Whether every run of ``x`` happens before every run of ``z``:
        in program order, or through a queue (see the module
        docstring)."""
        key = (id(x), id(z))
        found = self._hb.get(key)
        if found is not None:
            return found
        self._hb[key] = False   # a cycle of queues proves nothing
        found = self.strictly_before(x, z) or any(
            self._through(x, d) for d in self._dequeues.get(z.node, ())
            if self.follows(d, z))
        self._hb[key] = found
        return found

    def _through(self, x, d):
        """Whether ``x`` happens before every op that could let queue
        read ``d`` return."""
        enablers = [e for e in self._enablers.get(d.name, ())
                    if not (e.op.type == "CloseQueue" and
                            self.strictly_before(d, e))]
        return bool(enablers) and all(
            self.before(x, e) or _inside(x, e) for e in enablers)


def _inside(x, e):
    """Whether ``x`` is a read by queue op ``e`` itself: an op reads its
    inputs before it enqueues them."""
    return x.op is e.op and x.pos == e.pos and not x.writes


# -- races ----------------------------------------------------------------------

def _promote(walk, order):
    """A blob an op creates in a private workspace lives in an outer one
    when a concurrent branch may have written it there first: the place a
    write goes to then depends on timing -- a race with that branch."""
    outer = {}
    for event in walk.events:
        if event.writes:
            outer.setdefault((event.node, event.name), []).append(event)
    moved = {}
    for event in walk.events:
        if not event.created:
            continue
        key = (event.node, event.name, id(event.scope))
        if key not in moved:
            moved[key] = event.scope
            ancestors = list(event.scope.chain())[1:]
            for other in outer.get((event.node, event.name), ()):
                if other.scope in ancestors and order.fork(
                        event, other, other.scope) is not None:
                    moved[key] = other.scope
                    break
    for event in walk.events:
        target = moved.get((event.node, event.name, id(event.scope)))
        if target is not None:
            event.scope = target


def _label(visit, child):
    step = visit.step.substeps[child]
    if child in visit.periodic:
        return f"report step {step.name!r} (every {step.run_every_ms} ms)"
    if step.task is not None and step.task != visit.task:
        return f"task {step.task!r}"
    if visit.concurrent:
        return f"concurrent step {step.name!r}"
    return f"step {step.name!r}"


def _instance_label(visit, number):
    task = visit.task
    if task is not None and visit.step.name == f"{task}:instances":
        return f"instance {number} of task {task!r}"
    return f"instance {number} of step {visit.step.name!r}"


def _access(event, branch):
    return Access(event.task or "", event.step.name, event.net.name,
                  event.op.type, event.index, event.mode(), branch)


def _branches(order, where):
    vid, children = where
    visit = order.visits[vid]
    if children is None:
        return _instance_label(visit, 0), _instance_label(visit, 1)
    return _label(visit, children[0]), _label(visit, children[1])


def _races(walk, order):
    by_place = {}
    for event in walk.events:
        by_place.setdefault((event.node, event.name, id(event.scope)),
                            []).append(event)
    best = {}
    for (node, name, _), events in by_place.items():
        if not any(e.writes for e in events):
            continue
        scope = events[0].scope
        for a in events:
            if not a.writes:
                continue
            for b in events:
                # each pair once: a writer with every reader, and with
                # every writer from itself on (itself: two instances)
                if (b.writes and b.order < a.order) or (a.atomic and
                                                        b.atomic):
                    continue
                where = order.fork(a, b, scope)
                if where is None:
                    continue
                if a is not b and (order.before(a, b) or
                                   order.before(b, a)):
                    continue
                first, second = (b, a) if b.writes and not a.writes \
                    else (a, b)
                if where[1] is not None and first is b:
                    where = (where[0], where[1][::-1])
                rank = (second.writes, first.order, second.order)
                key = (node, name, where[0],
                       None if where[1] is None else frozenset(where[1]))
                if key not in best or rank < best[key][0]:
                    best[key] = (rank, first, second, where)
    found = []
    for (node, name, _, _), (_, first, second, where) in best.items():
        one, other = _branches(order, where)
        found.append(Race(name, node, _access(first, one),
                          _access(second, other)))
    return found


def group_races(plans, known=None):
    """The races of one group run: ``plans`` is ``[(node, step)]``, each
    node's whole step (as `localcluster.plan.grouping.fold_by_node` makes
    it), ``known`` ``{node: blob names}`` the nodes hold before the run.

    Returns ``(races, persisted)``: the `Race` list, and ``{node: blob
    names}`` the run reads or writes in the node's own workspace (what a
    GLOBAL group leaves there for the next)."""
    walk, order = _walk_of(plans, known)
    persisted = {}
    for event in walk.events:
        if event.scope.depth == 0:
            persisted.setdefault(event.node, set()).add(event.name)
    return _races(walk, order), persisted


def _walk_of(plans, known):
    """The walk of a group run's plans and the order among its events
    (what `group_races` and `switch_points` both start from)."""
    known = known or {}
    walk = _Walk()
    for node, step in plans:
        walk.node(node, step, known.get(node, ()))
    order = _Order(walk)
    _promote(walk, order)
    return walk, order


# -- switch points ---------------------------------------------------------------

#: ops with a context whose only effect is on the blobs they name (under
#: the node's lock): like an op without a context, they interact with
#: another branch only through a blob both use.  Every other op with a
#: context -- queues, clocks and sleeps, prints, checkpoints, a user's --
#: and every ``Python`` op reach past their blobs.
BLOB_ONLY = frozenset({
    "NodeIndex", "NodeCount", "CountUp", "CountDown", "RetrieveCount",
    "ResetCounter", "AtomicAdd", "AtomicOr", "CreateCursor", "ReadDataset",
    "CursorAtEnd"})

#: uses of one blob at one place compared pairwise up to this many; a
#: place used more often counts every use as interacting (fewer points
#: would be found, never too few)
_MAX_PAIRED = 256


def _reaches_out(op):
    """Whether ``op`` may act on more than the blobs it names."""
    if op.type in BLOB_ONLY:
        return False
    schema = registry.lookup(op.type)
    return schema is None or schema.context or op.type == "Python"


def switch_points(plans, known=None):
    """Where a deterministic schedule decides, for one group run: ``{node:
    {id(net): frozenset of op indices}}`` (``plans``, ``known``: as
    `group_races` takes them; a net with no point is left out).

    A decision before an op is needed only when the op can interact with
    another branch of the run: when it reaches past its blobs (a queue, a
    clock, a sleep, a print, a checkpoint, a ``Python`` op, an op of
    unknown type), or when it uses a blob another branch of its node uses
    concurrently, one of the two writing it, and nothing orders the two
    (`_Order.before`: program order or a queue) -- atomic ops included,
    since which of two counts first still matters.  Every other op
    commutes with whatever the other branches do meanwhile, so running
    it without a decision leaves the run's possible results as they are
    (partial-order reduction) and saves a decision that could only give
    an equivalent interleaving.  Nodes share no blob: branches of
    different nodes meet only in queues."""
    walk, order = _walk_of(plans, known)
    found = {}

    def mark(event):
        found.setdefault(event.node, {}).setdefault(
            id(event.net), set()).add(event.index)

    for node, step in plans:
        for net in step.walk_nets():
            for index, op in enumerate(net.ops):
                if _reaches_out(op):
                    found.setdefault(node, {}).setdefault(
                        id(net), set()).add(index)
    by_place = {}
    for event in walk.events:
        by_place.setdefault((event.node, event.name, id(event.scope)),
                            []).append(event)
    for events in by_place.values():
        writers = [e for e in events if e.writes]
        if not writers:
            continue
        if len(events) > _MAX_PAIRED:
            for event in events:
                mark(event)
            continue
        scope = events[0].scope
        for a in writers:
            for b in events:
                if order.fork(a, b, scope) is None:
                    continue
                if a is not b and (order.before(a, b) or
                                   order.before(b, a)):
                    continue
                mark(a)
                mark(b)
    return {node: {net: frozenset(indices) for net, indices in nets.items()}
            for node, nets in found.items()}


# -- the missing blob's hint ----------------------------------------------------

_WALKS = weakref.WeakKeyDictionary()   # node step -> (walk, order)
_WALKS_LOCK = threading.Lock()


def _walked(step, node):
    with _WALKS_LOCK:
        found = _WALKS.get(step)
    if found is None:
        walk = _Walk()
        walk.node(node, step)
        order = _Order(walk)
        _promote(walk, order)
        found = (walk, order)
        with _WALKS_LOCK:
            _WALKS[step] = found
    return found


def missing_blob_hint(step, node, net, index, blob):
    """What to say of blob ``blob`` that op ``index`` of ``net`` found
    missing on ``node``, whose whole step is ``step``: when every op of
    the node that writes it runs concurrently with that op (none before
    it, none after it in its branch), which one; else None."""
    walk, order = _walked(step, node)
    reader = writers = None
    for event in walk.events:
        if event.name == blob and event.reads and event.net is net and \
                event.index == index:
            reader = event
            break
    if reader is None:
        return None
    writers = [e for e in walk.events
               if e.name == blob and e.writes and e.scope is reader.scope]
    concurrent = [(w, order.fork(w, reader, reader.scope)) for w in writers]
    if not concurrent or any(where is None for _, where in concurrent):
        return None
    writer, where = concurrent[0]
    mine, theirs = _branches(order, where)
    more = len(concurrent) - 1
    also = f" (and {more} more op{'s' if more > 1 else ''})" if more else ""
    return (f"it is written only by {_access(writer, mine)}{also}, in "
            f"{mine}, which runs concurrently with this op, in {theirs}, "
            "and nothing orders the two: write it before they start -- in a"
            " setup net (ops.task_init, ops.local_init), an earlier step or "
            "an earlier group -- or send it through a queue")
