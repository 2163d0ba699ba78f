"""A fault plan's text form -- what ``--faults`` takes and ``str(plan)``
prints -- reads back as the same plan, and a text it cannot read is a
PlanError naming the part and the syntax."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localcluster import PlanError
from localcluster.testing import (Delay, Epoch, FailCheckpoint, FaultPlan,
                                  Partition,
                                  Hang, Kill, Op, Step)

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",
                                                                 "Cc")),
                min_size=1, max_size=12)
triggers = st.one_of(st.builds(Epoch, st.integers(1, 10 ** 6)),
                     st.builds(Op, names, st.integers(1, 99)),
                     st.builds(Step, names))
faults = st.one_of(
    st.builds(Kill, names, triggers, st.sampled_from(["sigkill", "exit",
                                                      "raise"])),
    st.builds(Hang, names, triggers),
    st.builds(Delay, names, triggers,
              st.floats(0, 1e6, allow_nan=False, allow_infinity=False)),
    st.builds(FailCheckpoint, names, st.integers(0, 10 ** 6)),
    st.builds(lambda a, b, k, heal: Partition(a, b, Epoch(k), heal),
              st.lists(names.filter(lambda n: "," not in n and "/" not in n
                                    and n != "x"), min_size=1, max_size=2),
              st.just(["x"]), st.integers(1, 100),
              st.none() | st.floats(0, 1e6, allow_nan=False,
                                    allow_infinity=False)))


@given(st.lists(faults, max_size=4))
def test_the_text_form_reads_back_as_the_same_plan(drawn):
    plan = FaultPlan(*drawn)
    assert FaultPlan.parse(str(plan)) == plan


def test_the_text_form_reads_as_a_user_writes_it():
    plan = FaultPlan.parse("kill trainer_1 at epoch 3; "
                           "delay reader 0.5s at op EnqueueRecords nth 2;"
                           "hang 'node a' at step 'node a/train'  ;"
                           "kill ps at op Sum by raise; "
                           "fail-checkpoint ps at epoch 0")
    assert plan == FaultPlan(
        Kill("trainer_1", at=Epoch(3)),
        Delay("reader", at=Op("EnqueueRecords", nth=2), seconds=0.5),
        Hang("node a", at=Step("node a/train")),
        Kill("ps", at=Op("Sum"), how="raise"), FailCheckpoint("ps", 0))
    assert str(plan).startswith("kill trainer_1 at epoch 3; delay reader "
                                "0.5s at op EnqueueRecords nth 2; hang "
                                "'node a' at step 'node a/train'")


@pytest.mark.parametrize("text, names", [
    ("kill x", "expected 'at'"),
    ("kill x at epoch", "'epoch' is no trigger point"),
    ("kill x at epoch two", "'two' is not a number"),
    ("kill x at epoch 1 extra", "is no trigger point"),
    ("delay x 5 at epoch 1", "needs its unit"),
    ("explode x at epoch 1", "'explode' is no fault"),
    ("fail-checkpoint x at step s", "at an epoch"),
    ("kill 'x at epoch 1", "No closing quotation"),
    ("kill x at epoch 0", r"Epoch\(k\) must be an int >= 1"),
    ("kill x at epoch 2 by fire", "'fire'"),
])
def test_a_text_that_is_no_plan_names_the_part_and_the_syntax(text, names):
    with pytest.raises(PlanError, match=names):
        FaultPlan.parse(text)


@pytest.mark.parametrize("plan", [
    FaultPlan(FailCheckpoint(";", 0)),
    FaultPlan(Kill(";;", Epoch(1)), Hang("a;b", Step(";"))),
    FaultPlan(Partition([";"], ["x;", "'"], Epoch(2), 0.5)),
])
def test_a_quoted_semicolon_is_a_name_not_the_end_of_a_fault(plan):
    assert FaultPlan.parse(str(plan)) == plan
