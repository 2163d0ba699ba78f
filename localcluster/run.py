"""``python -m localcluster.run``: run the embedded example job.

For now one group on three nodes, each node its own process under
LocalHostScheduler (``--session local`` runs them in-process): two
``trainer_i`` nodes run hogwild instances that sum a series, and a
``reader`` node computes the same sum in closed form; it prints what each
node computed.  The full command line (jobs, epochs, checkpoints) comes
with the CLI issue.
"""

import argparse
import sys
import time

from . import (LocalHostScheduler, LocalSession, Node, Task, TaskGroup,
               final_output, ops, printer)


def build_example(num_trainers=2, iters=1000, instances=4):
    """A group: each trainer runs ``instances`` threads that each sum
    0..iters-1 in a private blob and count their steps on an atomic shared
    counter; the reader computes the same sum in closed form."""
    outputs = {}
    with TaskGroup() as group:
        for i in range(num_trainers):
            with Node(f"trainer_{i}"), Task(num_instances=instances):
                with ops.task_init():
                    steps = ops.CreateCounter([], ["steps"])
                    sums = ops.ConstantFill([], ["instance_sums"], value=0,
                                            dtype="int64")
                total = ops.ConstantFill([], value=0, dtype="int64")
                with ops.loop(iters) as loop:
                    ops.CountUp(steps)
                    ops.Add([total, loop.iter()], [total])
                # each instance adds its private total to the shared one
                ops.AtomicAdd([sums, total])
                with ops.task_exit():
                    outputs[f"trainer_{i}"] = (
                        final_output(ops.RetrieveCount(steps)),
                        final_output(ops.Copy(sums)))
        with Node("reader"), Task():
            n = ops.Const(iters)
            expected = ops.Div([ops.Mul([n, ops.Sub([n, ops.Const(1)])]),
                                ops.Const(2)])
            outputs["reader"] = (final_output(expected),)
    return group, outputs


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m localcluster.run",
        description="Run localcluster's embedded example job.")
    parser.add_argument("--nodes", type=int, default=2,
                        help="number of trainer nodes (default 2)")
    parser.add_argument("--iters", type=int, default=1000,
                        help="loop iterations per task instance")
    parser.add_argument("--session", choices=("localhost", "local"),
                        default="localhost",
                        help="one process per node (default) or in-process")
    parser.add_argument("--print-plan", action="store_true",
                        help="print the plan and exit")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.iters < 1:
        parser.error("--nodes and --iters must be >= 1")
    group, outputs = build_example(args.nodes, args.iters)
    if args.print_plan:
        print(printer.to_string(group))
        return 0
    start = time.perf_counter()
    session_class = (LocalHostScheduler if args.session == "localhost"
                     else LocalSession)
    with session_class() as session:
        session.run(group)
    seconds = time.perf_counter() - start
    print(f"localcluster example: {args.nodes} trainer node(s) + reader, "
          f"{session_class.__name__}, {seconds:.3f} s")
    for node, outs in outputs.items():
        values = ", ".join(str(o.fetch()) for o in outs)
        print(f"  {node:>12}: {values}")
    reader_sum = outputs["reader"][0].fetch()
    ok = all(o[1].fetch() == 4 * reader_sum for n, o in outputs.items()
             if n != "reader")
    print("  each trainer's 4 hogwild instances summed "
          f"{'4x the reader sum: OK' if ok else 'a WRONG total'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
