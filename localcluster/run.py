"""``python -m localcluster.run``: train a job on this machine, one process
per node (the command itself is `localcluster.cli.run`)."""

import sys

from localcluster.cli.run import command, main  # noqa: F401 - main for users

if __name__ == "__main__":
    sys.exit(command())
