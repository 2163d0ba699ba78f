"""A corpus of small jobs with planted bugs, and correct controls.

Each ``build_<name>()`` returns a fresh `Job` (or ``(job, options)``) as
`localcluster.testing.check_job` takes it.  Each bug job carries one known
bug of the kind real training code has; its docstring says what the bug
is, how it shows (which kind of run exposes it, and the wrong value it
ends with) and which check should catch it.  The controls must pass every
check.  ``test_corpus_bugs.py`` pins that each bug still shows the way its
docstring says, so the corpus does not rot as the library changes.

At the end: ``BUGS`` (name -> (check that must fail, one line)) and
``CONTROLS`` (names of the jobs that must pass every check); the
functions ``expected_always_wrong``, ``invariant_always_wrong`` and
``conditions_arrival_within_50ms`` give what those jobs' checks need.

The names in ``BUGS`` are the checks of `localcluster.testing`, the
first of them -- in `check_job`'s order: ``races``,
``schedule_independent``, ``sessions_agree``,
``resume_equals_uninterrupted``, ``restart_recovers`` -- that fails on
the job as a user checks it (``test_corpus_verdicts.py`` pins each
verdict).  Finite results, ``invariant=`` and ``expected=`` are judged
on every run of every check, so a bug they catch is named by the first
check whose runs show it (a NaN the run without preemptions ends with:
``schedule_independent``); so is a bug that shows under ``conditions=``
(``schedule_independent`` runs under them first).

Every job is small (one or two nodes, except the 11 nodes of
``epoch2_bug_many_nodes``), trains two or three epochs and runs in well
under a second.  Functions that ``ops.Python`` ops call are module-level,
so node processes (``LocalHostScheduler``) reach them.
"""

import os

import numpy as np

from localcluster import (Dataset, Job, Link, Net, Node, Queue,
                          ReaderWithLimit, ReaderWithTimeLimit, Task,
                          epoch_limiter, ops, pipe, pipe_and_output)

__all__ = ["BUGS", "CONTROLS", "STARVATION_RECORDS"]


# -- the control --------------------------------------------------------------

#: records of the control's dataset, read four an epoch for three epochs
CONTROL_RECORDS = 12


def build_control():
    """A correct job with real concurrency; it must pass every check.

    Node ``reader`` keeps a dataset of the ints 1..12 whose cursor the
    init group makes (so it carries over epochs and is checkpointed); each
    epoch a pipe sends the next four records through a queue of capacity 2
    to node ``trainer``, whose one consumer adds them to ``total`` (ints:
    any arrival order gives the same sum).  Beside the pipes, two task
    instances on ``reader`` and three on ``trainer`` count with
    ``AtomicAdd`` (atomic across the node's threads), and ``trainer``
    counts epochs with ``epoch_limiter`` (3).

    Every run ends with ``total`` = 78, ``hits`` = 45 (3 instances x 5 x 3
    epochs) on ``trainer`` and ``ticks`` = 6 (2 x 3), cursor 12 on
    ``reader``: on real threads, on every schedule seed, after a resume
    from any epoch and after any kill with a restart.
    """
    with Job() as job:
        with Node("reader"):
            with job.init_group, Task():
                data = Dataset({"x": np.arange(1, CONTROL_RECORDS + 1)},
                               name="data")
                reader = data.reader()
                ops.Const(np.array(0), name="ticks")
        with Node("trainer"), job.init_group, Task():
            ops.Const(np.array(0), name="total")
            ops.Const(np.array(0), name="hits")
        queue = Queue(2, name="batches")
        with Node("reader"):
            pipe(ReaderWithLimit(reader, num_iter=4), output=queue,
                 name="send")
            with Task(num_instances=2):
                ops.AtomicAdd(["ticks", ops.Const(np.array(1))], [])
        with Node("trainer"):
            def add_to_total(record):
                ops.Add(["total", ops.ReduceSum([record["x"]])], ["total"])
            pipe(queue, processor=add_to_total, name="consume")
            with Task(num_instances=3):
                one = ops.Const(np.array(1))
                with ops.loop(5):
                    ops.AtomicAdd(["hits", one], [])
            epoch_limiter(job, 3)
    return job


# -- starvation: two workers share one reader ---------------------------------

#: the sizes the starvation jobs come in (records of the shared dataset)
STARVATION_RECORDS = (4, 8, 16)


def starvation_job(records):
    """Two workers, ``worker_0`` and ``worker_1`` (two pipes: two tasks of
    node ``trainer`` in the epoch group), read ONE shared dataset reader
    -- ``records`` rows ``(x, 1)``, every x = 0.5 (a constant loss, so a
    worker's mean does not depend on which rows it got); the reader is
    made outside every task, so each epoch reads from the start -- and
    each adds the rows it reads to ``acc_<i>`` = (sum, count), one op a
    row.  After the epoch each computes its mean as sum / count, adds it
    to ``means_<i>`` (checkpointed) and zeroes ``acc_<i>``; three epochs.

    The bug: a worker that gets no row computes 0 / 0 = NaN, and NaN
    stays in ``means_<i>`` for good.  Right end: ``means_0`` =
    ``means_1`` = 1.5, whatever the split.  On real threads the first
    worker to start drains the reader before the other reads:
    ``means_1`` = NaN in essentially every run (20 of 20 at each size).
    Under a uniform random schedule it is rarer, and rarer with more
    records: ``worker_0`` must run about 2 x records ops before
    ``worker_1`` runs the few ops up to its first read (28 of seeds
    0..99 at 4 records, first seed 1 -- each epoch's run draws its own
    decisions, so a seed has three chances; none of 0..99 at 8 or 16).
    Runs on real threads agree with each other (NaN compares equal to
    NaN), so comparing them alone would pass.
    Caught by: results must be finite -- the run without preemptions
    (each branch goes on while it can: ``worker_0`` drains the reader)
    ends with ``means_1`` = NaN, so ``schedule_independent`` fails at
    once with 0 preemptions.
    """
    with Job() as job, Node("trainer"):
        with job.init_group, Task():
            for i in range(2):
                ops.Const(np.zeros((1, 2)), name=f"acc_{i}")
                ops.Const(np.array(0.0), name=f"means_{i}")
            rows = np.stack([np.full(records, 0.5), np.ones(records)], axis=1)
            data = Dataset({"xc": rows}, name="data")
        shared = data.reader()         # one cursor, made by whichever
        for i in range(2):             # worker starts first
            def accumulate(record, i=i):
                ops.Add([f"acc_{i}", record["xc"]], [f"acc_{i}"])

            def mean(i=i):
                total = ops.MatMul([f"acc_{i}",
                                    ops.Const(np.array([[1.0], [0.0]]))])
                count = ops.MatMul([f"acc_{i}",
                                    ops.Const(np.array([[0.0], [1.0]]))])
                value = ops.Reshape([ops.Div([total, count])], shape=[])
                ops.Add([f"means_{i}", value], [f"means_{i}"])
                ops.ConstantFill([], [f"acc_{i}"], shape=[1, 2], value=0.0)
                return []

            pipe_and_output(shared, processor=accumulate, name=f"worker_{i}",
                            final_outputs=mean)
        epoch_limiter(job, 3)
    return job


def build_starvation_4():
    """`starvation_job` with 4 records (see there)."""
    return starvation_job(4)


def build_starvation_8():
    """`starvation_job` with 8 records (see there)."""
    return starvation_job(8)


def build_starvation_16():
    """`starvation_job` with 16 records (see there)."""
    return starvation_job(16)


# -- read-modify-write races --------------------------------------------------

def build_lost_update():
    """Two task instances (``Task(num_instances=2)``) on node ``worker_0``
    each count an epoch by a read-modify-write of one blob: ``last =
    ops.Copy(["seen"])`` then ``ops.Add([last, one], ["seen"])``, three
    epochs -- the job of README's "What a failure looks like".

    The bug: an instance that reads ``seen`` before the other writes it
    overwrites the other's increment.  The right end is ``seen`` = 6.0.
    On real threads an instance runs its three ops within one switch
    interval, so no run of 20 lost one; under a schedule 90 of seeds
    0..99 lose one or more (seeds 0 and 1 end right; seed 2 ends with
    ``seen`` = 5.0, seed 3 with 3.0 -- one update lost in every epoch;
    each epoch's run draws its own decisions).  Caught by: ``races``
    (first), and ``schedule_independent`` without it.
    """
    with Job() as job, Node("worker_0"):
        with job.init_group, Task():
            ops.Const(np.array(0.0), name="seen")
        with Task(num_instances=2):
            last = ops.Copy(["seen"])
            one = ops.Const(np.array(1.0))
            ops.Add([last, one], ["seen"])
        epoch_limiter(job, 3)
    return job


def build_two_thread_race():
    """README's test template ("two workers add a batch of ones to their
    weights every epoch") with the two workers made two threads -- two
    tasks -- of ONE node ``worker_0`` sharing one ``w``, each applying
    its batch by a read-modify-write: ``seen = ops.Copy(["w"])`` then
    ``ops.Add([seen, batch], ["w"])``.  The first thread computes its
    batch in three ops (2 x 0.5), the second in one, three epochs.

    The bug: a thread that copies ``w`` while the other is between its
    Copy and its Add loses the other's batch.  The right end is ``w`` =
    [6, 6, 6, 6].  About half the uniform random schedules expose it
    -- the first thread's three ops before its Copy often let the
    second finish first, but each epoch's run draws its own decisions,
    so a seed has three chances: 53 of seeds 0..99 end with ``w`` =
    [5, 5, 5, 5] or [4, 4, 4, 4] (seed 0 does, seed 1 ends right).
    Real threads never showed it (0 of 20).
    Caught by: ``races`` (first), and ``schedule_independent`` without
    it.
    """
    with Job() as job, Node("worker_0"):
        with job.init_group, Task():
            ops.Const(np.zeros(4), name="w")
        with Task():
            batch = ops.Mul([ops.Const(np.full(4, 2.0)),
                             ops.Const(np.full(4, 0.5))])
            seen = ops.Copy(["w"])
            ops.Add([seen, batch], ["w"])
        with Task():
            batch = ops.Const(np.ones(4))
            seen = ops.Copy(["w"])
            ops.Add([seen, batch], ["w"])
        epoch_limiter(job, 3)
    return job


def build_exit_step_race():
    """A reporter (``ops.task_reporter(interval_ms=20)``, a
    ``run_every_ms`` step that runs beside the task's body and once after
    it) logs progress by adding the body's ``step`` counter to
    ``progress_log`` (checkpointed); the body sleeps 10 ms and counts a
    step, four times; two epochs on node ``trainer``.

    The bug: the reporter reads ``step`` while the body writes it, so
    ``progress_log`` depends on when the reporter ran.  On real threads
    the timing is steady on an idle machine (all of 20 runs ended with
    ``progress_log`` = 28) but not by contract; under a schedule the
    reporter's 20 ms and 40 ms wake-ups tie with the body's on the
    virtual clock and the seed breaks the tie: seed 0 ends with 29,
    seed 1 with 21, and seeds 0..99 with 14 values from 18 to 32 (80 of
    them not 29).  Caught by:
    ``races`` (first: the reporter reads a blob a concurrent branch
    writes), and ``schedule_independent`` without it.
    """
    with Job() as job, Node("trainer"):
        with job.init_group, Task():
            ops.Const(np.array(0), name="step")
            ops.Const(np.array(0), name="progress_log")
        with Task():
            with ops.task_reporter(interval_ms=20):
                ops.Add(["progress_log", "step"], ["progress_log"])
            one = ops.Const(np.array(1))
            with ops.loop(4):
                ops.Sleep([], [], seconds=0.01)
                ops.Add(["step", one], ["step"])
        epoch_limiter(job, 2)
    return job


#: rows of ``dataset_beside_pipe``'s dataset: enough that making its
#: columns gives the pipe's thread time to start and read first, now and
#: then, on real threads
BESIDE_PIPE_RECORDS = 1000


def build_dataset_beside_pipe():
    """``with Node("src"), Task(): ds = Dataset(...); pipe(ds.reader(),
    q)``: the dataset's four columns (1000 rows) are made by that task
    while the pipe -- a task of its own, concurrent with it in the epoch
    group -- reads them, 250 rows a batch, and sends them through a queue
    to node ``trainer``, which adds their ``x`` to ``total`` (two epochs;
    right end: ``total`` = 2 x 499500 = 999000.0).

    The bug: nothing orders the dataset's ops before the pipe's first
    read (``printer.analyze`` says "Blob undefined: data/uid ...").
    Under a schedule the pipe's ``ReadDataset`` often runs before the
    task has made all four columns, and the run fails with
    ``TaskFailedError`` caused by ``BlobNotFoundError``: seed 0 does, and
    87 of seeds 0..99 (seed 1 ends right).  On real threads sometimes: under
    ``LocalSession`` 20 of 40 and 8 of 20 runs on a 2-core machine
    (making the 1000-row columns takes long enough for the pipe's thread
    to start), under ``LocalHostScheduler`` none of 5.  Caught by:
    ``races`` (first), and ``schedule_independent`` without it (a
    scheduled run raises).
    """
    with Job() as job:
        with Node("trainer"), job.init_group, Task():
            ops.Const(np.array(0.0), name="total")
        queue = Queue(4, name="records")
        with Node("src"), Task():
            rows = np.arange(float(BESIDE_PIPE_RECORDS))
            data = Dataset({"uid": rows, "x": rows, "y": rows,
                            "weight": np.ones(BESIDE_PIPE_RECORDS)},
                           name="data")
            pipe(data.reader(batch_size=BESIDE_PIPE_RECORDS // 4), queue,
                 name="send")
        with Node("trainer"):
            def add_x(record):
                ops.Add(["total", ops.ReduceSum([record["x"]])], ["total"])
            pipe(queue, processor=add_x, name="consume")
            epoch_limiter(job, 2)
    return job


def build_deadlock():
    """A request/reply loop where each side waits first: node ``ping``
    reads a ball from queue ``to_ping``, adds one and sends it to
    ``to_pong``; node ``pong`` reads ``to_pong`` and sends to ``to_ping``
    -- and neither sends before it has read (a cyclic wait).

    The bug: no run can end.  Under a deterministic schedule the first
    epoch raises `DeadlockError` at once (virtual time 0, naming both
    branches and the queues they wait on); on real threads the run hangs
    until its timeout (`RunTimeoutError` after ``timeout`` seconds).
    Caught by: every check; under schedules it must fail fast (the
    reference run of ``schedule_independent`` raises `DeadlockError`).
    """
    with Job() as job:
        for node in ("ping", "pong"):
            with Node(node), job.init_group, Task():
                ops.Const(np.array([0.0]), name="ball")
        to_pong, to_ping = Queue(2, name="to_pong"), Queue(2, name="to_ping")
        # the sends first: a queue learns its fields from its first writer
        send_pong, send_ping = Net("ping_send"), Net("pong_send")
        to_pong.writer().write_record(send_pong, {"ball": "ball"})
        to_ping.writer().write_record(send_ping, {"ball": "ball"})
        for node, inbox, send in (("ping", to_ping, send_pong),
                                  ("pong", to_pong, send_ping)):
            with Node(node), Task():
                _, record = inbox.reader().read_record(
                    ops.net(name=f"{node}_wait"))
                ops.Add([record["ball"], ops.Const(np.array([1.0]))],
                        ["ball"])
                ops.net(send)
        with Node("ping"):
            epoch_limiter(job, 2)
    return job


# -- state outside the checkpoints --------------------------------------------

#: the trainers of ``epoch2_bug_many_nodes``; ``ps`` comes after them, the
#: 11th node in ``job.nodes_to_checkpoint()``
EPOCH2_TRAINERS = tuple(f"trainer_{i}" for i in range(10))

#: pid -> the first epoch ``ps`` ran in that process (see `warmup_lr`)
_WARMUP_START = {}


def warmup_lr(epoch):
    """The learning rate of ``epoch``: 0.5 ** (epochs since the first one
    *this process* ran) -- a per-process cache (keyed by pid, as code
    that guards against fork does), not a checkpointed blob."""
    start = _WARMUP_START.setdefault(os.getpid(), int(epoch))
    return np.array(0.5 ** (int(epoch) - start))


def build_epoch2_bug_many_nodes():
    """Eleven nodes, three epochs: ``trainer_0`` .. ``trainer_9`` each add
    ones to their ``w``; ``ps`` (the 11th node) counts ``epoch``
    (checkpointed) and adds ``warmup_lr(epoch)`` to its ``w``.

    The bug: ``warmup_lr`` decays from the first epoch the *process* ran,
    kept in a Python dict keyed by pid, so a ``ps`` process restarted
    after epoch 1 starts its decay over.  Right end: ``w`` = 1 + 0.5 +
    0.25 = 1.75 on ``ps``.  Under ``LocalHostScheduler`` a
    ``Kill("ps", at=Epoch(2))`` (or ``Epoch(3)``) with a restart ends
    with ``w`` = 2.5; a kill in epoch 1 restarts from epoch 0 and ends
    right, as does every kill of another node and every kill under
    ``LocalSession`` (the same process).  Kills tried epoch by epoch,
    node by node, at most 20, would stop at ``trainer_8`` in epoch 2 and
    never reach it (the kit draws its kills instead: with seed 2 or 4,
    20 of them include ``Kill("ps", at=Epoch(3))``).  A resume in the
    same process ends right (the dict remembers epoch 1); a resume from
    epoch 1 or 2 in a fresh process shows it too.  Caught by:
    ``resume_equals_uninterrupted`` (first: it resumes in a fresh
    process; from epoch 1 ``w`` = 2.5), and ``restart_recovers`` without
    it (a kill of any node in epoch 2 or later, resumed from epoch 1 in a
    fresh process; under localhost, a restart after ``ps`` is killed in
    epoch 2 or 3).
    """
    with Job() as job:
        for node in EPOCH2_TRAINERS + ("ps",):
            with Node(node), job.init_group, Task():
                ops.Const(np.zeros(2), name="w")
                if node == "ps":
                    ops.Const(np.array(0), name="epoch")
        for node in EPOCH2_TRAINERS:
            with Node(node), Task():
                ops.Add(["w", ops.Const(np.ones(2))], ["w"])
        with Node("ps"), Task():
            ops.Add(["epoch", ops.Const(np.array(1))], ["epoch"])
            lr = ops.Python(warmup_lr)(["epoch"])
            ops.Add(["w", lr], ["w"])
        with Node("trainer_0"):
            epoch_limiter(job, 3)
    return job


#: the scale ``featurizer`` keeps in its Python process (see `normalize`)
_FIRST_SCALE = {}


def normalize(x):
    """``x`` divided by the first ``x`` this Python process normalized --
    a module-level cache the author thought harmless."""
    scale = _FIRST_SCALE.setdefault("x", float(np.asarray(x).reshape(-1)[0]))
    return (x / scale).astype(x.dtype)


def build_state_outside_checkpoint():
    """Node ``trainer`` (checkpointed) holds a dataset x = 1..6 whose
    cursor it checkpoints, and each epoch sends the next two records
    through a queue to node ``featurizer`` -- stateless by design, so
    not checkpointed (``Job(nodes_to_checkpoint=["trainer"])``) -- which
    normalizes them with a Python op (`normalize`) and sends them back to
    ``trainer`` to be added to ``total``; three epochs.

    The bug: `normalize` keeps its scale (the first x it saw) in a
    module-level dict, so the featurizer carries state no checkpoint
    holds.  In one Python process every run sees the same first x (1.0):
    an uninterrupted run ends with ``total`` = 21.0, and so does a resume
    from any epoch in the same process (the dict remembers).  A resume
    in a fresh process from epoch 1 ends with ``total`` = 3 + 18 / 3 =
    9.0 (from epoch 2: 10 + 11 / 5 = 12.2; from epochs 0 and 3, 21.0).
    A kill of ``trainer`` with a restart leaves the featurizer's process
    (and dict) alone, and sessions and schedules agree.  Caught by:
    ``resume_equals_uninterrupted`` resumed in a fresh process.

    Mind where the checkpoints are written: a job built while another,
    different job is alive in the process gets suffixed generated names
    (``epoch_counter_init_1/...``, see `localcluster.context`), which a
    rebuild in a fresh process does not, so its resume there fails with
    ``BlobNotFoundError`` whatever the job does -- train the reference
    in a fresh process too (as ``test_corpus_bugs`` does).
    """
    with Job(nodes_to_checkpoint=["trainer"]) as job:
        with Node("trainer"), job.init_group, Task():
            data = Dataset({"x": np.arange(1.0, 7.0)}, name="data")
            reader = data.reader()
            ops.Const(np.array(0.0), name="total")
        raw, features = Queue(2, name="raw"), Queue(2, name="features")
        with Node("trainer"):
            pipe(ReaderWithLimit(reader, num_iter=2), output=raw,
                 name="send")
        with Node("featurizer"):
            def featurize(record):
                return {"x": ops.Python(normalize)([record["x"]])}
            pipe(raw, output=features, processor=featurize,
                 name="featurize")
        with Node("trainer"):
            def add_x(record):
                ops.Add(["total", ops.ReduceSum([record["x"]])], ["total"])
            pipe(features, processor=add_x, name="consume")
            epoch_limiter(job, 3)
    return job


# -- deterministic, but wrong -------------------------------------------------

#: the data ``always_wrong`` should make one pass over in two epochs
ALWAYS_WRONG_DATA = np.arange(1, 11)
ALWAYS_WRONG_EPOCHS = 2


def build_always_wrong():
    """Node ``worker`` holds the ints 1..10 and should add all of them to
    ``total`` in two epochs, five an epoch; its cursor is checkpointed.

    The bug: an off-by-one in the records per epoch
    (``ReaderWithLimit(reader, num_iter=per_epoch - 1)``): every epoch
    leaves its last record unread, so ``total`` ends at 1 + .. + 8 = 36,
    not 55.  It is deterministic: every run -- any session, seed, resume
    or restart -- ends with 36, so every comparing check passes.  Caught
    by: ``expected=`` (`expected_always_wrong`) or ``invariant=``
    (`invariant_always_wrong`), judged on the first run of all, the
    run without preemptions of ``schedule_independent``.
    """
    per_epoch = len(ALWAYS_WRONG_DATA) // ALWAYS_WRONG_EPOCHS
    with Job() as job, Node("worker"):
        with job.init_group, Task():
            data = Dataset({"x": ALWAYS_WRONG_DATA}, name="data")
            reader = data.reader()
            ops.Const(np.array(0), name="total")

        def add_to_total(record):
            ops.Add(["total", ops.ReduceSum([record["x"]])], ["total"])
        pipe(ReaderWithLimit(reader, num_iter=per_epoch - 1),
             processor=add_to_total)
        epoch_limiter(job, ALWAYS_WRONG_EPOCHS)
    return job


def expected_always_wrong():
    """What ``always_wrong`` should end with: ``{node: {blob: value}}``."""
    return {"worker": {"total": np.array(ALWAYS_WRONG_DATA.sum())}}


def invariant_always_wrong(blobs):
    """None when the final ``blobs`` ({node: {blob: array}}) hold the sum
    of the whole dataset, else a message saying what they hold."""
    total = blobs["worker"]["total"]
    want = int(ALWAYS_WRONG_DATA.sum())
    if int(total) != want:
        return (f"'total' on 'worker' is {int(total)}, but one pass over "
                f"the data sums to {want}")
    return None


# -- rounding -----------------------------------------------------------------

def build_rounding():
    """Three tasks of node ``acc`` each ``AtomicAdd`` their own float
    (0.1, 0.2, 0.3) to ``total`` three times an epoch, two epochs.

    Not a bug in the job: the adds are atomic, but float addition is
    not associative, so the order the threads take changes the last bit:
    ``total`` is 3.6 or 3.6000000000000005 (a relative difference of
    1.2e-16).  Real threads ran in one order (3.6, 20 of 20 runs); under
    schedules seed 0 ends with 3.6000000000000005 and seed 3 with 3.6
    (of seeds 0..99: 57, 40 and 3 with 3.6000000000000005, 3.6 and
    3.5999999999999996).  Without tolerances a comparing check fails
    (``schedule_independent``); its message gives the size of the
    difference and the ``rtol`` that would accept it (it prints both
    values to six digits, alike).  With ``{"rtol": 1e-9}``
    (`build_rounding_tolerant`) it must pass.
    """
    with Job() as job, Node("acc"):
        with job.init_group, Task():
            ops.Const(np.array(0.0), name="total")
        for value in (0.1, 0.2, 0.3):
            with Task():
                step = ops.Const(np.array(value))
                with ops.loop(3):
                    ops.AtomicAdd(["total", step], [])
        epoch_limiter(job, 2)
    return job


def build_rounding_tolerant():
    """`build_rounding` with ``{"rtol": 1e-9}``: a control, it must pass
    every check."""
    return build_rounding(), {"rtol": 1e-9}


# -- timing assumptions -------------------------------------------------------

def build_arrival_within_50ms():
    """Node ``loader`` holds x = 1..12 (cursor checkpointed) and pipes
    four records an epoch through a queue to node ``trainer``, which reads
    them through ``ReaderWithTimeLimit(queue.reader(), duration=0.05)``
    -- it assumes every record arrives within 50 ms -- counting them in
    ``seen`` and adding them to ``total``; three epochs.

    The bug: the time limit cuts the stream short when the link is slow,
    and the records left in the queue are dropped (the loader's cursor
    has moved past them).  With no latency every run ends with ``seen``
    = 12.0, ``total`` = 78.0 (real threads and every seed).  With
    ``Link("loader", "trainer", latency=0.2)`` the first record of an
    epoch arrives after 200 ms, the limit is then past, and the run ends
    with ``seen`` = 3.0, ``total`` = 15.0 (1 + 5 + 9) -- on real threads
    and under ``Schedule(seed, op_seconds=1e-6)`` alike.  Caught by:
    checks under conditions whose latencies reach past the plan's 50 ms
    (`conditions_arrival_within_50ms`, or drawn by
    ``strategies.conditions(["loader", "trainer"])``, which the checks
    draw past the plan's time constants): ``schedule_independent``, the
    first check to run under them.
    """
    with Job() as job:
        with Node("trainer"), job.init_group, Task():
            ops.Const(np.array(0.0), name="seen")
            ops.Const(np.array(0.0), name="total")
        with Node("loader"), job.init_group, Task():
            data = Dataset({"x": np.arange(1.0, 13.0)}, name="data")
            reader = data.reader()
        queue = Queue(4, name="batches")
        with Node("loader"):
            pipe(ReaderWithLimit(reader, num_iter=4), output=queue,
                 name="send")
        with Node("trainer"):
            def train_step(record):
                ops.Add(["seen", ops.Const(np.array(1.0))], ["seen"])
                ops.Add(["total", ops.ReduceSum([record["x"]])], ["total"])
            pipe(ReaderWithTimeLimit(queue.reader(), duration=0.05),
                 processor=train_step, name="consume")
            epoch_limiter(job, 3)
    return job


def conditions_arrival_within_50ms():
    """Conditions under which ``arrival_within_50ms`` ends differently."""
    return [Link("loader", "trainer", latency=0.2)]


# -- the index ----------------------------------------------------------------

#: name -> (the check that fails first, one line); ``build_<name>``
#: builds it (see the module docstring; ``test_corpus_verdicts`` pins it)
BUGS = {
    "starvation_4": (
        "schedule_independent", "two workers share one reader; the one "
        "that reads nothing computes 0/0 = NaN (4 records)"),
    "starvation_8": (
        "schedule_independent", "two workers share one reader; the one "
        "that reads nothing computes 0/0 = NaN (8 records)"),
    "starvation_16": (
        "schedule_independent", "two workers share one reader; the one "
        "that reads nothing computes 0/0 = NaN (16 records)"),
    "lost_update": (
        "races", "two task instances count by Copy then Add of one blob: "
        "an interleaving loses an update"),
    "two_thread_race": (
        "races", "two threads of one node read-modify-write w; about "
        "half the random schedules expose it"),
    "exit_step_race": (
        "races", "a run_every_ms reporter reads the counter the body "
        "writes and logs it into a checkpointed blob"),
    "dataset_beside_pipe": (
        "races", "a task builds a Dataset while its pipe, a concurrent "
        "task, reads it: BlobNotFoundError"),
    "deadlock": (
        "schedule_independent", "two nodes each wait to read a queue the "
        "other writes only after reading"),
    "epoch2_bug_many_nodes": (
        "resume_equals_uninterrupted", "11 nodes; ps keeps a per-process "
        "warm-up start, wrong after a resume or restart from epoch 1 on"),
    "state_outside_checkpoint": (
        "resume_equals_uninterrupted", "a Python op caches a scale in a "
        "module global: a resume in a fresh process differs"),
    "always_wrong": (
        "schedule_independent", "an off-by-one reads 4 of 5 records an "
        "epoch: every run ends with the same wrong total (expected= or "
        "invariant= catches it)"),
    "rounding": (
        "schedule_independent", "float atomic adds in different orders "
        "differ in the last bit; no tolerance given"),
    "arrival_within_50ms": (
        "schedule_independent", "a 50 ms ReaderWithTimeLimit over a queue "
        "from another node: a drawn slow link drops records"),
}

#: the jobs that must pass every check
CONTROLS = ["control", "rounding_tolerant"]
