"""``python -m localcluster.ckpt``: look into and prune checkpoint
directories.

``ls DIR`` lists one run's checkpoint directory -- or every run directory
right inside DIR (say, the temporary directory, where runs without
``--checkpoint-dir`` keep theirs): the job, whether a run holds it now,
how the last run ended, its size, and per epoch which nodes have a sound
checkpoint and what is wrong with the others; and the epoch ``--resume``
would pick.  Every checkpoint is read in full (CRC-32) unless ``--quick``
(manifests only).

``prune DIR --keep N`` keeps the N newest complete epochs and removes
every other checkpoint of the run, torn epochs and partial files of
writers that are gone -- never the run file, the lock, ``metrics.jsonl``
or files that are not the run's checkpoints; the directory stays
resumable.  A directory a live run holds is refused.  The logic is in
`rundir.scan` and `rundir.prune`.

Exit status: 0 on success, 1 on a failure (one line), 2 on a usage error
(one line), 130 on Ctrl-C.
"""

import argparse
import json
import os
import sys

from .rundir.prune import prune_plan, remove
from .rundir.scan import is_run_dir, run_dirs, scan
from .args import OneLineParser
from .rundir.directory import DirLock, in_use
from .jobspec import RunFailure, UsageError, first_line

__all__ = ["main", "parser"]


def _keep(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a whole number; give 1 or more") from None
    if value == 0:
        raise argparse.ArgumentTypeError(
            "0 would keep no checkpoint; to drop a whole run, remove its "
            "directory (rm -r DIR)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value


def parser():
    p = OneLineParser(prog="python -m localcluster.ckpt",
                description="Look into and prune the checkpoint directories "
                            "of python -m localcluster.run.")
    sub = p.add_subparsers(dest="command", metavar="{ls,prune}",
                           parser_class=OneLineParser)
    sub.required = True
    ls = sub.add_parser(
        "ls", help="list a run's checkpoints (or of every run directory in "
                   "DIR): epochs, what is torn, what --resume picks")
    ls.add_argument("directory", metavar="DIR",
                    help="a run's checkpoint directory, or one holding "
                         "several (the temporary directory, say)")
    ls.add_argument("--quick", action="store_true",
                    help="read the manifests only, not every byte (for huge "
                         "directories; a corrupted blob goes unseen)")
    ls.add_argument("--json", action="store_true",
                    help="print the listing as JSON")
    pr = sub.add_parser(
        "prune", help="keep the N newest complete epochs of a run, remove "
                      "its other checkpoints")
    pr.add_argument("directory", metavar="DIR",
                    help="a run's checkpoint directory")
    pr.add_argument("--keep", type=_keep, required=True, metavar="N",
                    help="how many of the newest complete epochs to keep "
                         "(1 or more)")
    pr.add_argument("--dry-run", action="store_true",
                    help="say what would be removed; remove nothing")
    pr.add_argument("--quick", action="store_true",
                    help="judge epochs by their manifests only")
    pr.add_argument("--json", action="store_true",
                    help="print the result as JSON")
    return p


def main(argv=None):
    """The command line; its exit status (never a traceback)."""
    p = parser()
    try:
        args = p.parse_args(argv)
        try:
            return _ls(args) if args.command == "ls" else _prune(args)
        except UsageError as exc:
            p.error(str(exc))
        except (RunFailure, OSError) as exc:
            sys.stderr.write(f"error: {first_line(exc)}\n")
            return 1
    except SystemExit as exc:
        return exc.code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:  # noqa: BLE001 -- a bug: one line, not a trace
        sys.stderr.write(f"error: unexpected {type(exc).__name__}: "
                         f"{first_line(exc)} (a bug in localcluster; please "
                         "report it)\n")
        return 1


def _directory(path):
    if not os.path.isdir(path):
        raise UsageError(f"{path} is not a directory; give a run's "
                         "checkpoint directory (or one holding several)")
    try:
        os.listdir(path)
    except OSError as exc:
        raise RunFailure(f"{path} cannot be read ({exc.strerror}); give a "
                         "directory of yours") from exc
    return path


# -- ls -------------------------------------------------------------------------------

def _ls(args):
    directory = _directory(args.directory)
    found = [scan(d, quick=args.quick) for d in run_dirs(directory)]
    if args.json:
        _json({"directory": directory, "runs": [f.as_json() for f in found]})
        return 0
    if not found:
        print(f"no run's checkpoint directory in {directory} (one holds a "
              "run file or checkpoints)")
    for i, run in enumerate(found):
        if i:
            print()
        _print_run(run)
    return 0


def _print_run(run):
    status = f"running, pid {run.pid}" if run.in_use and run.pid else \
        "running" if run.in_use else "not in use"
    last = f"last run {run.last_run}" if run.last_run else "no run history"
    print(f"{run.path}: job {run.job or '(no run file)'}; {status}; {last}; "
          f"{_bytes(run.size)}")
    if not run.epochs:
        print("  no checkpoints")
    else:
        print(f"  {'epoch':>6}  {'nodes':<7}  {'size':>10}  state")
        for number in sorted(run.epochs):
            epoch = run.epochs[number]
            state = epoch.state
            if epoch.refers:
                state += (f" (unchanged blobs in {_epochs(epoch.refers)})")
            if epoch.problems:
                state += ": " + "; ".join(
                    f"{node} {why}" for node, why in
                    sorted(epoch.problems.items()))
            nodes = f"{len(epoch.present)}/{len(epoch.expected)}"
            print(f"  {number:>6}  {nodes:<7}  {_bytes(epoch.size):>10}  "
                  f"{state}")
    gone = [name for name, alive in run.partials if not alive]
    if gone:
        print(f"  {len(gone)} partial file(s) of writers that are gone "
              "(prune removes them)")
    if run.foreign:
        print(f"  not checkpoints of this run (kept): "
              f"{_names(sorted(run.foreign))}")
    checked = " (manifests only)" if run.quick else ""
    print(f"  --resume picks epoch {run.resume_epoch}{checked}"
          if run.resume_epoch is not None else
          "  --resume: no complete epoch to resume from")


# -- prune ----------------------------------------------------------------------------

def _prune(args):
    directory = _directory(args.directory)
    if not is_run_dir(directory):
        raise UsageError(f"{directory} is not a run's checkpoint directory "
                         "(no run file, no checkpoint in it); "
                         "'python -m localcluster.ckpt ls' lists them")
    _refuse_if_running(directory)
    lock = None
    if not args.dry_run:
        try:
            lock = DirLock(directory).acquire()
        except RunFailure:
            _refuse_if_running(directory)
            raise
    try:
        found = scan(directory, quick=args.quick)
        pruned = prune_plan(found, args.keep)
        plan = pruned.remove
        sizes = {name: _size(os.path.join(directory, name))
                 for name, _ in plan}
        if args.dry_run:
            removed, freed, errors = [n for n, _ in plan], \
                sum(sizes.values()), []
        else:
            removed, freed, errors = remove(directory,
                                            [n for n, _ in plan])
    finally:
        if lock is not None:
            lock.release(remove=lock.created)
    done = set(removed)
    if args.json:
        _json({"path": directory, "dry_run": args.dry_run,
               "keep": args.keep, "kept_epochs": pruned.kept,
               "referred_epochs": pruned.referred,
               "removed": [{"name": n, "why": why, "bytes": sizes[n]}
                           for n, why in plan if n in done],
               "bytes_freed": freed, "resume_epoch": found.resume_epoch,
               "errors": errors})
    else:
        _print_prune(args, found, pruned, [(n, why) for n, why in plan
                                           if n in done], freed)
    if errors:
        sys.stderr.write(f"error: {len(errors)} file(s) could not be "
                         f"removed, first {errors[0]}\n")
        return 1
    return 0


def _refuse_if_running(directory):
    held, pid = in_use(directory)
    if held:
        raise RunFailure(
            f"{directory} is in use by a running run"
            f"{f' (pid {pid})' if pid else ''}: pruning it could remove "
            "what that run needs; prune it after the run ends")


def _print_prune(args, found, pruned, plan, freed):
    if not pruned.kept:
        print(f"{found.path}: no complete epoch -- its torn epochs are "
              "kept (nothing can resume from them; rm -r removes the run)")
    else:
        newest = [n for n in pruned.kept if n not in pruned.referred]
        its = "its" if len(pruned.referred) == 1 else "their"
        referred = (f", and {_epochs(pruned.referred)}: the kept epochs "
                    f"refer to {its} files for the blobs that did not "
                    "change" if pruned.referred else "")
        print(f"{found.path}: keeping {_epochs(newest)} (complete"
              f"{', manifests only' if found.quick else ''}){referred}")
    verb = "would remove" if args.dry_run else "removed"
    if not plan:
        print("nothing to remove")
    else:
        print(f"{verb} {len(plan)} file(s), {_bytes(freed)}"
              f"{'' if args.dry_run else ' freed'}:")
        groups = {}
        for name, why in plan:
            groups.setdefault(why, []).append(name)
        for why, names in groups.items():
            print(f"  {why}: {_names(names)}")
    if found.resume_epoch is not None:
        print(f"--resume picks epoch {found.resume_epoch}")


# -- output ---------------------------------------------------------------------------

def _epochs(numbers):
    numbers = sorted(numbers)
    return (f"epoch{'' if len(numbers) == 1 else 's'} "
            f"{', '.join(map(str, numbers))}")


def _names(names, most=8):
    shown = " ".join(names[:most])
    return shown + (f" (+{len(names) - most} more)"
                    if len(names) > most else "")


def _bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _size(path):
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _json(value):
    json.dump(value, sys.stdout, indent=1)
    sys.stdout.write("\n")
    sys.stdout.flush()

