"""How a check judges one run and compares two: the user's truth and the
difference between runs, on plain ``{node: {blob: array}}`` values."""

import numpy as np

from localcluster.testing._check_verdicts import Truth, difference


def blobs(value):
    return {"n": {"x": np.asarray(value)}}


def test_integer_blobs_that_differ_are_a_difference():
    # ints have no float gap to print, but they differ all the same
    said = difference("run A", blobs([3]), "run B", blobs([2]), {})
    assert said is not None
    assert "run A" in said and "run B" in said and "'x'" in said
    assert difference("run A", blobs([3]), "run B", blobs([3]), {}) is None
    # a tolerance does not make unequal ints equal
    assert difference("run A", blobs(3), "run B", blobs(2),
                      {"rtol": 0.5}) is not None


def test_an_integer_blob_unlike_expected_breaks_the_truth():
    truth = Truth({}, expected={"n": {"x": 55}})
    said = truth.judge("the run", blobs(36))
    assert said is not None and "expected=" in said and "36" in said
    assert truth.judge("the run", blobs(55)) is None


def test_a_difference_names_both_runs_and_calls_neither_expected():
    # either run may be the buggy one: each is named by what made it
    said = difference("schedule seed 3 (pct, depth 2)", blobs([1.0, 2.0]),
                      "localhost", blobs([1.0, 2.5]), {})
    assert "is [1. 2.] after schedule seed 3 (pct, depth 2)" in said
    assert "[1.  2.5] after localhost" in said
    assert "expected" not in said
    assert "largest absolute difference 0.5, relative 0.2" in said
