"""The three commands: ``python -m localcluster.run``, ``.ckpt`` and
``.report`` (their entry points, ``localcluster/run.py`` and the others,
only call in here).

The command line is a user of the library like any other: it imports the
concrete modules it uses, never the package face, and nothing in the
library imports it (the one exception is the package face installing
`signals.STOP` first thing under ``python -m localcluster.run``, so a
Ctrl-C while the package imports is never lost)::

    run.py --argv--> args (parser -> Options) --> jobspec (build the job)
      |                                        --> conditions, cpus, resume
      +--> rundir/ (the run's directory: lock, run file, metrics history,
      |             the checkpoint-directory scan and prune)
      +--> train/  (the training loop: session + JobRunner, epoch lines,
      |             progress, failure text, node logs, trace)
      +--> check   (--check: the testing kit's checks on the job)
    ckpt.py   --> rundir/ (ls, prune)
    report.py --> htmlreport/ (data -> page + svg) of rundir/metrics
"""
