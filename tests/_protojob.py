"""The small prototype job the prototype tests share: ``count`` trainer
instances, each starting at its index and adding 1 per epoch, send their
``w`` through one shared queue to a ps that sums them into ``tot``."""

from localcluster import Job, Node, Queue, Task, epoch_limiter, ops


def build(count=3, epochs=2, order_matters=False, **node_options):
    queue = Queue(4, name="to_ps")
    with Job() as job:
        with Node("trainer", num_instances=count, **node_options):
            with job.init_group, Task(name="w"):
                ops.Cast([ops.NodeIndex()], ["w"], to="float64")
            with Task(name="step"):
                ops.Add(["w", ops.Const(1.0)], ["w"])
                queue.writer().write_record(ops.net(), {"w": "w"})
        with Node("ps"):
            with job.init_group, Task(name="tot"):
                ops.ConstantFill([], ["tot"], value=0.0)
            with Task(name="gather"):
                with ops.loop(count):
                    _, record = queue.reader().read_record(ops.net())
                    if order_matters:   # a planted bug: 2 * tot + w
                        ops.Scale(["tot"], ["tot"], scale=2.0)
                    ops.Add(["tot", record["w"]], ["tot"])
            epoch_limiter(job, epochs)
    return job


def build_buggy():
    """`build` whose sum depends on the order the ps reads records in."""
    return build(order_matters=True)
