"""A job module that seeds numpy's global random state when imported."""

import numpy as np

from _jobs import global_draw_job

np.random.seed(7)


def seeded_draw_job():
    """`global_draw_job`, built by a module that seeded numpy."""
    return global_draw_job()
