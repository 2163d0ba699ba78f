"""What check_job promises a user beyond the corpus's verdicts
(`test_corpus_verdicts`): a NaN fails unless allowed; a float difference
says how large it is and which rtol accepts it, naming both runs; the
kills tried of how many; the kinds of kill drawn; conditions drawn by
the checks' own seeded generator, past the plan's time constants; an
interleaving counted once; an intended race declared; and silence on
success.
"""

import functools
import logging
import re

import numpy as np
import pytest

from localcluster import Job, Node, Task, epoch_limiter, ops
from localcluster.plan.conditions import Link
from localcluster.plan.faults import Epoch, Op, Step
from localcluster.testing import (ALL_CHECKS, JobCheckFailed, check_job,
                                  restart_recovers, schedule_independent,
                                  strategies)
from localcluster.testing import _check_conditions

import _corpus as corpus
from _jobs import python_counter_job, scaled_job

# (CheckResult, races and draw_kills are imported by the tests that use
# them: the others then run, and fail on their own, against a kit
# without them)

#: w / w is the point, not noise
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CHECK_NAMES = [check.__name__ for check in ALL_CHECKS]


def with_options(build, options):
    """``build()``'s job with ``options`` (a picklable build with
    `functools.partial`)."""
    return build(), dict(options)


def nan_job():
    """Node "a": ``w = w / w`` from w = 0 -- NaN on every run alike."""
    with Job() as job, Node("a"):
        with job.init_group, Task():
            ops.Const(np.array(0.0), name="w")
        with Task():
            ops.Div(["w", "w"], ["w"])
        epoch_limiter(job, 2)
    return job


two_nodes = scaled_job
counter_job = python_counter_job


def idle_job():
    """Node "a" only counts its two epochs: few interleavings to find."""
    with Job() as job, Node("a"):
        with job.init_group, Task():
            ops.Const(np.array(7), name="n")
        epoch_limiter(job, 2)
    return job


# -- the user's truth ---------------------------------------------------------

def test_a_job_ending_with_nan_fails_unless_nonfinite_is_allowed():
    # every run ends alike (NaN equals NaN between runs): only the truth
    # that results must be finite catches it
    with pytest.raises(JobCheckFailed) as caught:
        check_job(nan_job, max_examples=2)
    message = caught.value.message
    assert "blob 'w' on node 'a' = nan" in message
    assert "must be finite" in message and "allow_nonfinite=True" in message
    results = check_job(nan_job, allow_nonfinite=True, max_examples=2,
                        max_kills=2, sessions=("local",))
    assert list(results) == CHECK_NAMES


# -- differences --------------------------------------------------------------

def test_a_float_difference_gives_its_size_and_an_rtol_that_accepts_it():
    with pytest.raises(JobCheckFailed) as caught:
        schedule_independent(corpus.build_rounding, max_examples=4)
    message = caught.value.message
    assert "largest absolute difference" in message
    assert "relative" in message
    # which run gave which value: neither is "expected"
    assert "after the run without preemptions and" in message
    assert "after the schedule of" in message
    assert "expected" not in message
    found = re.search(r"rtol=([0-9.e+-]+) in the options", message)
    assert found, message
    rtol = float(found.group(1))
    assert 0 < rtol < 1e-12
    # the rtol it names, in the options build() returns, is enough
    tolerant = functools.partial(with_options, corpus.build_rounding,
                                 {"rtol": rtol})
    result = schedule_independent(tolerant, max_examples=4)
    assert result.interleavings > 1


# -- kills --------------------------------------------------------------------

def test_the_kills_drawn_are_of_every_kind_and_the_same_for_a_seed():
    from localcluster.testing._check_kills import draw_kills
    job = two_nodes()
    kills, total = draw_kills(job, 3, seed=0, max_kills=5)
    assert len(kills) == 5 and total > 5
    # the kinds in turn: an epoch, an op, a checkpoint save, the init
    # group's first op, a step
    epoch, op, save, init, step = (kill.at for kill in kills)
    assert isinstance(epoch, Epoch) and 1 <= epoch.k <= 3
    assert isinstance(op, Op) and op.op_type != "SaveCheckpoint"
    assert isinstance(save, Op) and save.op_type == "SaveCheckpoint"
    assert isinstance(init, Op) and init.nth == 1
    assert isinstance(step, Step)
    assert {kill.node for kill in kills} <= {"a", "b"}
    # drawn with the seed: the same kills everywhere
    assert draw_kills(two_nodes(), 3, seed=0, max_kills=5) == (kills, total)
    every, _ = draw_kills(job, 3, seed=0, max_kills=total)
    assert len(every) == len(set(every)) == total


def test_restart_says_how_many_kills_it_tried_of_how_many():
    result = restart_recovers(two_nodes, sessions=("local",), max_kills=2)
    tried, of = result.kills
    assert tried == 2 < of
    assert f"tried 2 of {of} kills (max_kills=2" in result.note
    assert f"2 of {of} kills tried" in repr(result)
    # and a failure says so too (the second drawn kill shows the bug)
    with pytest.raises(JobCheckFailed) as caught:
        restart_recovers(counter_job, sessions=("local",), max_kills=2)
    assert re.search(r"tried 2 of \d+ kills", caught.value.message)


# -- conditions ---------------------------------------------------------------

def test_drawn_conditions_are_the_seeds_alone_and_reach_past_the_plan(
        monkeypatch):
    horizon = _check_conditions.time_constants(
        corpus.build_arrival_within_50ms())
    assert horizon == 0.05        # its ReaderWithTimeLimit's duration

    def no_hypothesis(*args):
        raise AssertionError("hypothesis drew: its draws depend on the "
                             "test module's constants")
    monkeypatch.setattr(_check_conditions, "_hypothesis_draws",
                        no_hypothesis)

    def draw(seed):
        return _check_conditions._draw(
            strategies.conditions(["loader", "trainer"]), 12, "a check",
            seed=seed, horizon=horizon)
    first = draw(3)
    assert draw(3) == first and draw(4) != first
    latencies = [c.latency for drawn in first for c in drawn
                 if isinstance(c, Link)]
    assert latencies and max(latencies) > horizon


# -- exploration --------------------------------------------------------------

def test_a_seed_that_repeats_an_interleaving_is_not_counted():
    result = schedule_independent(idle_job, max_examples=8)
    # every seed allowed (3 x 8) ran, as did the run without preemptions,
    # but few of them interleaved differently: those alone count
    assert result.runs == 1 + 3 * 8
    assert 1 < result.interleavings < 1 + 8


# -- races --------------------------------------------------------------------

def test_a_race_the_options_declare_passes_the_races_check():
    from localcluster.testing import CheckResult, races
    with pytest.raises(JobCheckFailed) as caught:
        check_job(corpus.build_lost_update, checks=[races])
    assert caught.value.check == "races"
    declared = functools.partial(with_options, corpus.build_lost_update,
                                 {"allow_races": ("seen",)})
    assert isinstance(races(declared), CheckResult)
    assert list(check_job(declared, checks=[races])) == ["races"]


# -- silence ------------------------------------------------------------------

def warnings_in(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING]


def test_kills_and_restarts_print_nothing_on_success(capfd, caplog):
    # the kills, restarts and resumes are what the check causes, not news:
    # nothing on stdout or stderr, and nothing logged as a warning (which
    # a script without logging set up would see on stderr)
    restart_recovers(two_nodes, sessions=("localhost",), max_examples=1)
    assert capfd.readouterr() == ("", "")
    assert warnings_in(caplog) == []


def test_check_job_returns_a_result_per_check_and_prints_nothing(capfd,
                                                                 caplog):
    from localcluster.testing import CheckResult
    results = check_job(two_nodes, max_examples=2, max_kills=3)
    assert capfd.readouterr() == ("", "")
    assert warnings_in(caplog) == []
    assert list(results) == CHECK_NAMES
    assert all(isinstance(r, CheckResult) and r.check == name
               for name, r in results.items())
    assert results["schedule_independent"].interleavings == 1 + 2
    assert results["restart_recovers"].kills[0] == 3
    assert results["resume_equals_uninterrupted"].runs > 0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_warnings_the_test_silences_stay_silent_in_the_checks_runs(capfd):
    """The runs happen in fresh processes; a test's warning filters go
    with them (a 0/0 the test expects printed its RuntimeWarning from
    every run of a passing check)."""
    check_job(nan_job, allow_nonfinite=True, checks=[schedule_independent],
              max_examples=2)
    assert "RuntimeWarning" not in capfd.readouterr().err
