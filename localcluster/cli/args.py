"""The options of ``python -m localcluster.run``: `parser` and the
argparse types that check each value (a bad one is a one-line usage
error naming it and the range or form it takes)."""

import argparse

from ..errors import PlanError
from .conditions import SIM_OP_SECONDS
from .cpus import parse_cpus
from ..plan.conditions import parse_link, parse_seconds, parse_slowdown
from ..plan.fault_text import SYNTAX as FAULT_SYNTAX
from ..plan.faults import FaultPlan
from ..sessions.kinds import KINDS

__all__ = ["parser", "OneLineParser", "MAX_NODES", "MAX_EPOCHS", "MAX_THREADS",
           "MAX_RESTARTS", "MAX_SECONDS"]

#: what one machine runs: beyond these a run only exhausts memory or time
MAX_NODES, MAX_EPOCHS, MAX_THREADS = 4096, 10 ** 6, 1024
MAX_RESTARTS, MAX_SECONDS = 10 ** 4, 10 ** 7


# -- the command line ----------------------------------------------------------------

def _whole(low, high):
    """An argparse type: a whole number from ``low`` to ``high``."""
    def convert(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text[:40]!r} is not a whole number; give one from {low} "
                f"to {high}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{value} is out of range; give a whole number from {low} "
                f"to {high}")
        return value
    convert.__name__ = f"whole number {low}..{high}"
    return convert


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_SECONDS:  # also NaN
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a number of seconds above 0 and at most "
            f"{MAX_SECONDS}")
    return value


def _faults(text):
    try:
        plan = FaultPlan.parse(text)
    except PlanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not len(plan):
        raise argparse.ArgumentTypeError(
            "no fault given; e.g. --faults 'kill trainer_1 at epoch 3'")
    return plan


def _condition(parse):
    def convert(text):
        try:
            return parse(text)
        except PlanError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def _op_seconds(text):
    if text == "measured":
        return text
    return _condition(lambda t: parse_seconds(t, "--op-seconds"))(text)


def _cpus(text):
    try:
        return parse_cpus(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _resume(text):
    return "latest" if text == "latest" else _whole(0, 10 ** 9)(text)


class OneLineParser(argparse.ArgumentParser):
    """Usage errors are one line (the usage text is what --help is for):
    the parser of every ``python -m localcluster.*`` command."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the "
                     "options)\n")


def parser():
    p = OneLineParser(
        prog="python -m localcluster.run",
        description="Train a job on this machine, one process per node "
                    "(default: the embedded parameter-server regression).")
    p.add_argument("--job", metavar="MODULE:FUNC",
                   help="your job: MODULE:FUNC or path/to/file.py:FUNC, a "
                        "function returning a Job (or (job, options))")
    p.add_argument("--nodes", type=_whole(1, MAX_NODES), metavar="N",
                   help=f"trainer nodes, 1 to {MAX_NODES} (default 2 for "
                        "the embedded job, which adds a reader and a ps "
                        "node)")
    p.add_argument("--epochs", type=_whole(1, MAX_EPOCHS), metavar="N",
                   help=f"epochs to train, 1 to {MAX_EPOCHS} (default 5 "
                        "for the embedded job)")
    p.add_argument("--seed", type=_whole(0, 2 ** 63 - 1),
                   help="seed of the job's data (default 0)")
    p.add_argument("--threads", type=_whole(1, MAX_THREADS),
                   help="hogwild threads per trainer (default 2; 1 makes a "
                        "run bit-for-bit repeatable)")
    # the default first
    p.add_argument("--session", choices=sorted(KINDS,
                                               key=lambda k: k != "localhost"),
                   default=None,
                   help="one process per node (default), all in-process, "
                        "or a Ray actor per node")
    p.add_argument("--slowdown", type=_condition(parse_slowdown),
                   action="append", default=[], metavar="NODE=FACTOR",
                   help="every op of the node(s) takes FACTOR times as long,"
                        " e.g. trainer_1=3 or 'trainer_*=2' (repeatable)")
    p.add_argument("--stragglers", type=_whole(1, MAX_NODES), metavar="K",
                   help="the embedded job's last K trainers run 4x slower "
                        "(--slowdown with their names)")
    p.add_argument("--link", type=_condition(parse_link), action="append",
                   default=[], metavar="SRC->DST:KEY=VALUE,...",
                   help="the network between nodes, e.g. 'trainer_*->ps:"
                        "latency=5ms,bandwidth=100MB/s' (keys latency, "
                        "bandwidth, jitter, seed; repeatable)")
    p.add_argument("--simulate", action="store_true",
                   help="run on a deterministic schedule and a virtual "
                        "clock (in one process): epochs report the time "
                        "they would take with a machine per node")
    p.add_argument("--op-seconds", type=_op_seconds, default=None,
                   metavar="SECONDS|measured",
                   help="with --simulate: the virtual time of one op "
                        f"(default {SIM_OP_SECONDS * 1e6:g}us), or 'measured':"
                        " the real time each op takes")
    p.add_argument("--cpus", type=_cpus, action="append", default=[],
                   metavar="NODE=CPUS",
                   help="pin the node(s) to CPUs, e.g. 'trainer_*=0,1' or "
                        "'ps=2-3' (Node(cpus=); repeatable, the last "
                        "matching wins)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="with --session ray: the Ray cluster to run on "
                        "(default: a local Ray instance for the run)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="where every node checkpoints every epoch (default: "
                        "a fresh temporary directory, printed); one run at "
                        "a time")
    p.add_argument("--keep-last", type=_whole(1, MAX_EPOCHS), metavar="N",
                   help="after each epoch keep only the N newest complete "
                        "epochs' checkpoints, and the earlier ones they "
                        "refer to for unchanged blobs (default: all in a "
                        "--checkpoint-dir; 1 in the temporary directory)")
    p.add_argument("--resume", nargs="?", const="latest", type=_resume,
                   metavar="EPOCH",
                   help="resume from EPOCH's checkpoint (no number, or "
                        "'latest': the latest epoch complete on every node);"
                        " needs --checkpoint-dir")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a --checkpoint-dir that holds "
                        "another run's checkpoints, deleting them")
    p.add_argument("--max-restarts", type=_whole(0, MAX_RESTARTS),
                   default=None, metavar="K",
                   help="restart a dead (or timed-out) node and resume from "
                        "the last checkpoint up to K times (default 0)")
    p.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                   help="bound every run of the job (an epoch, a "
                        "checkpoint): nodes still running are stopped, and "
                        "the run fails (or restarts, with --max-restarts)")
    p.add_argument("--faults", type=_faults, metavar="PLAN",
                   help="inject faults into the run, e.g. 'kill trainer_1 "
                        "at epoch 3' (several: separated by ';'): "
                        + FAULT_SYNTAX)
    p.add_argument("--check", nargs="?", const="all", metavar="CHECKS",
                   help="instead of training, check the job: all checks, "
                        "or a comma list of races, schedule_independent, "
                        "sessions_agree, resume_equals_uninterrupted, "
                        "restart_recovers; exit 1 if one fails")
    p.add_argument("--max-examples", type=_whole(1, 10 ** 4), default=20,
                   metavar="N",
                   help="with --check: the distinct interleavings and "
                        "the kills the checks try (default 20 each)")
    p.add_argument("--print-plan", action="store_true",
                   help="print the job's plan and exit (with --json: as "
                        "JSON)")
    p.add_argument("--trace", metavar="FILE",
                   help="write a Chrome trace (chrome://tracing, Perfetto) "
                        "to the regular file FILE, also for a run that "
                        "fails or is interrupted")
    p.add_argument("--report", metavar="FILE",
                   help="when the run ends (however it ends), write its "
                        "report -- one self-contained HTML page with the "
                        "metrics, throughput and each node's CPU and memory "
                        "per epoch -- to FILE")
    p.add_argument("--json", action="store_true",
                   help="print one JSON summary on stdout (the progress "
                        "lines go to stderr)")
    p.add_argument("--log-dir", metavar="DIR",
                   help="write each node's output to DIR/<node>.log and "
                        "the master's lines to DIR/master.log; the terminal"
                        " then shows no node output (see --tee)")
    p.add_argument("--tee", action="store_true",
                   help="with --log-dir: show the node output on the "
                        "terminal too")
    p.add_argument("--log-nodes", action="append", default=[],
                   metavar="PATTERN",
                   help="show only these nodes' output on the terminal, "
                        "e.g. 'trainer_*' (repeatable; the --log-dir files "
                        "keep every node's)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="after each epoch line, a line per node: its pid, "
                        "CPU, memory and seconds; every metric in full")
    p.add_argument("--log-level", default="WARNING", type=str.upper,
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="logging level (default WARNING; any case)")
    p.add_argument("--cleanup", action="store_true",
                   help="remove what killed runs left -- shared-memory "
                        "segments, and partial checkpoints in "
                        "--checkpoint-dir DIR (default: in the temporary "
                        "directories of runs without one, and those of "
                        "them with nothing to resume) -- report it, and "
                        "exit")
    return p
