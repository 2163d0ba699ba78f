"""The testing kit on a job with a node prototype: its kills name the
instances, and a result that depends on which instance's record the ps
read first is found."""

import pytest
from _protojob import build, build_buggy

from localcluster.testing import (JobCheckFailed, check_job,
                                  schedule_independent)
from localcluster.testing._check_kills import draw_kills


def test_the_kills_drawn_name_instances_not_the_prototype():
    kills, total = draw_kills(build(), 2, max_kills=1000)
    nodes = {kill.node for kill in kills}
    assert nodes == {"trainer_0", "trainer_1", "trainer_2", "ps"}
    assert len(kills) == total


def test_a_prototype_job_passes_every_check():
    results = check_job(build, max_examples=3, max_kills=3)
    assert set(results) == {"races", "schedule_independent", "sessions_agree",
                            "resume_equals_uninterrupted", "restart_recovers"}


def test_a_sum_that_depends_on_arrival_order_is_found():
    with pytest.raises(JobCheckFailed, match="schedule_independent"):
        check_job(build_buggy, max_examples=8,
                  checks=[schedule_independent])
