"""A run every session refuses the same way: validation lives in one place
(the plan layer) and runs under every session."""

import numpy as np
import pytest


def test_an_object_array_cannot_be_fed_on_any_session(session):
    with pytest.raises(TypeError, match=r"feed_blob\('x'\): value must be "
                                        "numeric array-like, got list"):
        session.feed_blob("x", [1, "two", None])
    assert not session.has_blob("x")


@pytest.mark.parametrize("value", ["hello", b"bytes", np.array(["a", "b"])])
def test_text_cannot_be_fed_on_any_session(session, value):
    """feed_blob("w", "hello") was accepted: text is no blob an op
    computes with, and a checkpoint would carry it as if it were."""
    with pytest.raises(TypeError, match=r"feed_blob\('w'\): value must be "
                                        "numeric array-like"):
        session.feed_blob("w", value)
    assert not session.has_blob("w")
