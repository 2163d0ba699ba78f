"""The testing kit's verdict on every job of the corpus (`_corpus`).

`check_job` runs on each job as a user would -- only fewer examples and
kills, and ``sessions=("local",)`` for the bugs a real-process session
adds nothing to -- and each must end as `VERDICTS` says: a bug job with
a `JobCheckFailed` from that check whose message names what is wrong (the
blob, or the queues of a deadlock), a control with every check passed.
A verdict is only as useful as what it hands back, so these also pin
that a failure's replay line, run as is, fails the same check again,
that a schedule's counter-example is shrunk to few preemptions, and that
a deadlock fails within seconds, not at a run's timeout.

`test_corpus_bugs` pins that each job shows its bug; this file pins what
the kit says about it.  Rows marked in `KIT_BUGS` are verdicts the kit
gets wrong today: strict xfails, so a fix shows as an unexpected pass.
"""

import functools
import time

import pytest

from localcluster.testing import (ALL_CHECKS, JobCheckFailed, Schedule,
                                  check_job, strategies)

import _corpus as corpus

#: 0/0 in the starvation jobs is the point, not noise
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: row -> (the check that must fail, or None: every check passes; what
#: its message must say).  A row is a job of the corpus, or ``job[how]``
#: for a job checked in more than one way (see `ARGS`).
VERDICTS = {
    "starvation_4": ("schedule_independent",
                     ["blob 'means_1'", "must be finite"]),
    "starvation_8": ("schedule_independent",
                     ["blob 'means_1'", "must be finite"]),
    "starvation_16": ("schedule_independent",
                      ["blob 'means_1'", "must be finite"]),
    "lost_update": ("races", ["blob 'seen'"]),
    "two_thread_race": ("races", ["blob 'w'"]),
    "exit_step_race": ("races", ["blob 'step'", "every 20 ms"]),
    "dataset_beside_pipe": ("races", ["blob 'data/uid'", "ReadDataset"]),
    "deadlock": ("schedule_independent",
                 ["deadlock", "'queue/to_ping'", "'queue/to_pong'"]),
    "epoch2_bug_many_nodes": ("resume_equals_uninterrupted",
                              ["blob 'w' on node 'ps'", "fresh process"]),
    "state_outside_checkpoint": ("resume_equals_uninterrupted",
                                 ["blob 'total'", "resumed from epoch 1 in "
                                  "a fresh process"]),
    "always_wrong[expected]": ("schedule_independent",
                               ["blob 'total'", "expected= says 55"]),
    "always_wrong[invariant]": ("schedule_independent",
                                ["breaks the invariant", "'total'", "55"]),
    "rounding": ("schedule_independent", ["blob 'total'", "rtol="]),
    "arrival_within_50ms": ("schedule_independent",
                            ["blob 'seen'", "conditions=[Link("]),
    "control": (None, []),
    "rounding_tolerant": (None, []),
}

#: row -> what the scheduled runs say of the jobs whose race the static
#: analysis names first (``check_job(..., checks=ALL_CHECKS[1:])``): the
#: dynamic check must catch them too, with a schedule to show
WITHOUT_RACES = {
    "lost_update": ("schedule_independent", ["blob 'seen'"]),
    "two_thread_race": ("schedule_independent", ["blob 'w'"]),
    "exit_step_race": ("schedule_independent", ["blob 'progress_log'"]),
    "dataset_beside_pipe": ("schedule_independent",
                            ["BlobNotFoundError", "'data/"]),
}

#: the few examples and kills that keep this file fast; the bugs fail
#: before any real-process session would run
FAST = {"max_examples": 8, "max_kills": 6, "sessions": ("local",)}

#: row -> what `check_job` takes beyond `FAST` (the controls: every
#: session kind, as a user's default)
ARGS = {
    "always_wrong[expected]": {"expected": corpus.expected_always_wrong()},
    "always_wrong[invariant]": {"invariant": corpus.invariant_always_wrong},
    "arrival_within_50ms": {
        "conditions": strategies.conditions(["loader", "trainer"])},
    "control": {"sessions": ("local", "localhost")},
    "rounding_tolerant": {"sessions": ("local", "localhost")},
}

#: (table, row, "verdict" or "replay") -> why the kit gets it wrong
#: today: those tests are strict xfails (a wrong verdict's replay too);
#: empty while the kit gets every verdict right
KIT_BUGS = {}

CHECK_NAMES = [check.__name__ for check in ALL_CHECKS]


def job_of(row):
    return row.partition("[")[0]


@functools.lru_cache(maxsize=None)
def verdict(table, row):
    """What `check_job` returns or raises for ``row`` of ``table``."""
    kwargs = dict(FAST, **ARGS.get(row, {}))
    if table == "WITHOUT_RACES":
        kwargs["checks"] = ALL_CHECKS[1:]
    build = getattr(corpus, f"build_{job_of(row)}")
    try:
        return check_job(build, **kwargs)
    except JobCheckFailed as failed:
        # kept without its traceback, whose frames would keep the check's
        # jobs alive -- and a job alive in this process suffixes the names
        # a job built later generates, in other test modules too
        return JobCheckFailed(failed.check, failed.message,
                              failed.counterexample, failed.replay)


def rows(table, what, failing_only=False):
    """``table``'s rows as parameters, the `KIT_BUGS` ones xfail."""
    params = []
    for row, (check, _) in globals()[table].items():
        if failing_only and check is None:
            continue
        # a wrong verdict has no replay to run either
        reason = KIT_BUGS.get((table, row, what)) or \
            KIT_BUGS.get((table, row, "verdict"))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] \
            if reason else []
        params.append(pytest.param(table, row, marks=marks,
                                   id=f"{table}-{row}"))
    return params


# -- the table ----------------------------------------------------------------

def test_the_table_covers_the_corpus_and_agrees_with_its_index():
    assert {job_of(row) for row in VERDICTS} == \
        set(corpus.BUGS) | set(corpus.CONTROLS)
    for row, (check, said) in VERDICTS.items():
        assert check is None or check in CHECK_NAMES, row
        name = job_of(row)
        if name in corpus.CONTROLS:
            assert check is None, row
        else:
            assert corpus.BUGS[name][0] == check, row
            assert said, f"{row}: say what the message must name"
    for row, (check, _) in WITHOUT_RACES.items():
        assert VERDICTS[row][0] == "races" and check in CHECK_NAMES
    assert set(WITHOUT_RACES) == {row for row, (check, _) in VERDICTS.items()
                                  if check == "races"}


# -- the verdicts -------------------------------------------------------------

@pytest.mark.parametrize("table, row", rows("VERDICTS", "verdict") +
                         rows("WITHOUT_RACES", "verdict"))
def test_the_kit_gives_the_verdict(table, row):
    check, said = globals()[table][row]
    got = verdict(table, row)
    if check is None:
        assert not isinstance(got, JobCheckFailed), got
        assert set(got) == set(CHECK_NAMES)
        assert got["schedule_independent"].interleavings > 1
        assert got["restart_recovers"].kills[0] > 0
        return
    assert isinstance(got, JobCheckFailed), \
        f"{row}: no check failed: {got}"
    assert got.check == check, got
    for part in said:
        assert part in got.message, f"{row}: {part!r} not in {got.message}"


@pytest.mark.parametrize("table, row",
                         rows("VERDICTS", "replay", failing_only=True) +
                         rows("WITHOUT_RACES", "replay"))
def test_the_replay_line_fails_the_same_check(table, row):
    got = verdict(table, row)
    assert isinstance(got, JobCheckFailed), got
    with pytest.raises(JobCheckFailed) as again:
        exec(got.replay, {})
    assert again.value.check == got.check
    # the same thing is wrong: the message names what the verdict's does
    for part in globals()[table][row][1][:1]:
        assert part in again.value.message


# -- the counter-examples -----------------------------------------------------

def schedule_example(table, row):
    got = verdict(table, row)
    assert isinstance(got, JobCheckFailed) and \
        got.check == "schedule_independent", got
    example = got.counterexample
    assert isinstance(example["schedule"], Schedule)
    assert example["schedule"].switched is not None   # Schedule.switches
    assert example["interleavings"] >= 1
    return got, example


def test_lost_update_shrinks_to_a_few_preemptions():
    got, example = schedule_example("WITHOUT_RACES", "lost_update")
    assert "seed" in example                 # found by exploring ...
    assert 1 <= example["preemptions"] <= 3  # ... and shrunk
    assert f"to {example['preemptions']} preemption(s)" in got.message
    assert "Schedule.switches([(" in got.replay


@pytest.mark.parametrize("records", corpus.STARVATION_RECORDS)
def test_starvation_shows_without_a_preemption(records):
    got, example = schedule_example("VERDICTS", f"starvation_{records}")
    # the run that lets each branch go on starves the second worker
    assert example["preemptions"] <= 1
    assert "the run without preemptions" in got.message


def test_a_condition_counterexample_names_its_conditions():
    got, example = schedule_example("VERDICTS", "arrival_within_50ms")
    links = example["conditions"]
    assert links and all(link.src == "loader" and link.latency > 0.05
                         for link in links)
    assert "conditions=[Link(" in got.replay


def test_a_deadlock_fails_within_seconds_not_at_the_timeout():
    start = time.monotonic()
    with pytest.raises(JobCheckFailed) as failed:
        check_job(corpus.build_deadlock)     # the defaults: timeout=60
    assert time.monotonic() - start < 5.0
    assert failed.value.check == "schedule_independent"
    assert failed.value.counterexample["preemptions"] == 0
    # the schedule that deadlocks, and a replay line that runs it
    schedule = failed.value.counterexample["schedule"]
    assert isinstance(schedule, Schedule)
    assert "deadlock under the run without preemptions" in \
        failed.value.message
    assert f"schedules=[{schedule!r}]" in failed.value.replay
