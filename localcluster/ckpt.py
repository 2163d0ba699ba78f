"""``python -m localcluster.ckpt``: list and prune checkpoint directories
(the command itself is `localcluster.cli.ckpt`)."""

import sys

from localcluster.cli.ckpt import main

if __name__ == "__main__":
    sys.exit(main())
