"""What the strategies return: a drawn spec with ``build()`` and
``expected``, printed as its expected values and its plan.

`Drawn` and `DrawnJob` wrap a `GroupSpec` / `JobSpec` (``.spec``):
``build()`` makes a fresh TaskGroup or Job each call (`._plans`),
``expected`` is the reference model's ``{node: {blob: array}}``
(`._model`).  ``repr`` -- what hypothesis shows for a falsifying example
-- is one line of what was drawn, the expected values, and
`localcluster.printer.to_string` of a freshly built plan.
"""

from .. import printer
from ._model import group_model, job_model
from ._plans import build_group, build_job, group_nodes, job_nodes

__all__ = ["Drawn", "DrawnJob"]


def _value_text(value):
    return str(value.tolist()) if value.ndim else str(value.item())


def _expected_text(expected):
    return "\n".join(
        f"  {node}: " + (", ".join(f"{name}={_value_text(v)}"
                                    for name, v in blobs.items()) or "-")
        for node, blobs in expected.items())


class Drawn:
    """A drawn task group: ``build()`` makes a fresh TaskGroup,
    ``expected`` is ``{node: {blob: array}}`` after one run, ``nodes`` the
    node names it uses.  ``repr`` is the plan's `printer.to_string`."""

    def __init__(self, spec):
        self.spec = spec
        self.nodes = group_nodes(spec)

    def build(self):
        return build_group(self.spec)

    @property
    def expected(self):
        return group_model(self.spec)

    def __repr__(self):
        return (f"Drawn task group on {list(self.nodes)}, "
                f"{len(self.spec.tasks)} task(s), "
                f"{len(self.spec.channels)} queue(s); expected after one "
                f"run:\n{_expected_text(self.expected)}\n"
                f"{printer.to_string(self.build())}")


class DrawnJob:
    """A drawn job: ``build()`` makes a fresh Job, ``expected`` is ``{node:
    {blob: array}}`` after training it, ``epochs`` how many it trains,
    ``nodes`` its nodes (all checkpointed)."""

    def __init__(self, spec):
        self.spec = spec
        self.nodes = job_nodes(spec)
        self.epochs = spec.epochs

    def build(self):
        return build_job(self.spec)

    @property
    def expected(self):
        return job_model(self.spec)

    def __repr__(self):
        stop = ("epoch_limiter" if self.spec.stop == "limiter"
                else "stop_ticks >= epochs")
        return (f"Drawn job on {list(self.nodes)}, {self.epochs} epoch(s) "
                f"({stop}), {len(self.spec.tasks)} epoch task(s), "
                f"{len(self.spec.feeds)} feed(s); expected after the last "
                f"epoch:\n{_expected_text(self.expected)}\n"
                f"{printer.to_string(self.build())}")
