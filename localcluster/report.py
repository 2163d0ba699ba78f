"""``python -m localcluster.report``: one self-contained HTML page of a
run's metrics history (the command itself is `localcluster.cli.report`)."""

import sys

from localcluster.cli.report import main

if __name__ == "__main__":
    sys.exit(main())
