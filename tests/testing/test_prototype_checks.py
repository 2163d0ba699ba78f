"""The testing kit on a job with a node prototype: its kills name the
instances, and a result that depends on which instance's record the ps
read first is found."""

import pytest

from localcluster import Job, Node, Queue, Task, epoch_limiter, ops
from localcluster.testing import (JobCheckFailed, check_job,
                                  schedule_independent)
from localcluster.testing._check_kills import draw_kills


def build(order_matters=False):
    queue = Queue(4, name="to_ps")
    with Job() as job:
        with Node("trainer", num_instances=3):
            with job.init_group, Task(name="w"):
                ops.Cast([ops.NodeIndex()], ["w"], to="float64")
            with Task(name="step"):
                ops.Add(["w", ops.Const(1.0)], ["w"])
                queue.writer().write_record(ops.net(), {"w": "w"})
        with Node("ps"):
            with job.init_group, Task(name="tot"):
                ops.ConstantFill([], ["tot"], value=0.0)
            with Task(name="gather"):
                with ops.loop(3):
                    _, record = queue.reader().read_record(ops.net())
                    if order_matters:   # the planted bug: 2 * tot + w
                        ops.Scale(["tot"], ["tot"], scale=2.0)
                    ops.Add(["tot", record["w"]], ["tot"])
            epoch_limiter(job, 2)
    return job


def build_buggy():
    return build(order_matters=True)


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
