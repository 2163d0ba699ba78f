"""check_job and its checks find what they promise: a job that keeps state
outside its checkpoints fails resume and restart with the smallest
counter-example and a line that replays it; a correct job passes."""

import numpy as np
import pytest

from localcluster import Job, Node, Task, epoch_limiter, ops
from localcluster.testing import (Epoch, JobCheckFailed, Kill, Op,
                                  Schedule, check_job, restart_recovers,
                                  resume_equals_uninterrupted,
                                  schedule_independent, sessions_agree)

from _jobs import python_counter_job, scaled_job

correct_job = scaled_job   # w <- 1.5 w + 1 per epoch, three epochs


def racy_job():
    """Two task instances add 1 to ``x`` by a Copy and an Add: an
    unsynchronized read-modify-write, so an increment is lost when the
    instances interleave between the two ops."""
    with Job() as job, Node("a"):
        with job.init_group, Task():
            ops.Const(np.array(0.0), name="x")
        with Task(num_instances=2):
            seen = ops.Copy(["x"])
            ops.Add([seen, ops.Const(np.array(1.0))], ["x"])
        epoch_limiter(job, 2)
    return job


def test_a_correct_job_passes_every_check():
    check_job(correct_job, max_examples=4)


def test_an_unsynchronized_race_fails_schedule_independent_with_its_schedule():
    with pytest.raises(JobCheckFailed) as caught:
        schedule_independent(racy_job)
    failed = caught.value
    example = failed.counterexample
    assert set(example) == {"schedule", "preemptions", "seed",
                            "interleavings"}
    # the failing seed's schedule, shrunk to the switches that matter
    schedule = example["schedule"]
    assert isinstance(schedule, Schedule) and schedule.switched
    assert 1 <= example["preemptions"] <= len(schedule.switched)
    assert example["interleavings"] >= 2
    assert f"schedule seed {example['seed']} " in str(failed)
    assert f"{example['preemptions']} preemption(s)" in str(failed)
    assert "'x'" in str(failed)
    # the failing run is named by the switches the counter-example gives
    assert f"after the schedule of {len(schedule.switched)} switch" \
        in failed.message
    # the replay runs just that schedule, and fails the same way
    assert f"schedules=[{schedule!r}]" in failed.replay
    with pytest.raises(JobCheckFailed) as again:
        exec(failed.replay, {})
    assert again.value.counterexample["schedule"] == schedule
    assert again.value.counterexample["preemptions"] == \
        example["preemptions"]
    assert failed.message.startswith(again.value.message)


def test_state_outside_the_checkpoints_fails_resume_naming_the_epoch():
    with pytest.raises(JobCheckFailed) as caught:
        resume_equals_uninterrupted(python_counter_job)
    failed = caught.value
    assert failed.check == "resume_equals_uninterrupted"
    # epoch 0 resumes to three counts, as the uninterrupted run made;
    # epoch 1 is the first that shows the difference
    assert failed.counterexample == {"epoch": 1, "session": "local"}
    assert "epoch 1" in str(failed) and "'seen'" in str(failed)
    assert failed.replay in str(failed)
    # the line replays it, alone
    with pytest.raises(JobCheckFailed) as again:
        exec(failed.replay, {})
    assert again.value.counterexample == failed.counterexample


def test_state_outside_the_checkpoints_fails_restart_with_the_kill():
    with pytest.raises(JobCheckFailed) as caught:
        restart_recovers(python_counter_job, sessions=("localhost",))
    failed = caught.value
    # the run resumed in a fresh process after a kill in epoch 2 (at the
    # second epoch's CountDown: the drawn kills try an epoch first, then
    # an op) counts from the wrong place; a kill in epoch 1 resumes from
    # epoch 0, where the fresh count happens to be right
    assert failed.counterexample == {
        "fault": Kill("a", at=Op("CountDown", 2)), "session": "local"}
    assert "'seen'" in str(failed)
    with pytest.raises(JobCheckFailed) as again:
        exec(failed.replay, {})
    assert again.value.counterexample == failed.counterexample


def test_tolerances_from_the_jobs_options_are_used():
    calls = [0]

    def wobbly():
        calls[0] += 1
        job = correct_job()
        # the options make tiny differences acceptable
        return job, {"rtol": 1e-6}

    result = sessions_agree(wobbly, sessions=("local", "local"))
    # a fresh job for each run, and one the check read the options from
    assert calls[0] == result.runs + 1 == 3


def test_a_build_that_returns_no_job_is_a_type_error():
    with pytest.raises(TypeError, match="Job or"):
        sessions_agree(lambda: 42, sessions=("local",))


def test_a_session_kind_a_test_adds_is_the_one_the_checks_open(monkeypatch):
    # SESSION_KINDS is open to tests; a fresh process would not know the
    # kind, so its runs are made here, by its own factory.  "local" is
    # replaced too, so the reference is made here as well: a job built in
    # a process that built others may get suffixed generated blob names,
    # which a fresh process's run of it would not have
    from localcluster import LocalSession
    from localcluster.testing import checks
    made = []

    def factory(kind):
        def make(**kwargs):
            made.append((kind, kwargs.get("conditions")))
            return LocalSession(**kwargs)
        return make
    monkeypatch.setitem(checks.SESSION_KINDS, "mine", factory("mine"))
    monkeypatch.setitem(checks.SESSION_KINDS, "local", factory("local"))
    result = sessions_agree(correct_job, sessions=("mine",))
    assert made == [("local", None), ("mine", None)] and result.runs == 2


def test_a_failing_restart_check_leaves_no_run_behind(monkeypatch):
    # the kill after the failing one was under way: its runs are reaped
    # with the failure, not by the garbage collector, which would print
    # "Exception ignored in" once the check's processes were gone
    import gc
    import sys
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(JobCheckFailed) as caught:
        restart_recovers(python_counter_job, sessions=("local",),
                         faults=[Kill("a", at=Epoch(2)),
                                 Kill("a", at=Epoch(3))])
    assert caught.value.counterexample["fault"] == Kill("a", at=Epoch(2))
    del caught
    gc.collect()
    assert unraisable == []
