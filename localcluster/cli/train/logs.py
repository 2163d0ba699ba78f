"""Node output on the command line: ``--log-dir``, ``--tee``,
``--log-nodes``.

- no option: as always, every node's output on the terminal as
  ``[node] line``;
- ``--log-dir DIR``: each node's output goes to ``DIR/<node>.log`` (a
  line per process start marks a restart) and the master's -- its
  progress lines, warnings and errors -- to ``DIR/master.log``
  (``localcluster-master.log`` if a node is named ``master``); the
  terminal keeps the progress lines and no node output;
- ``--tee``: with ``--log-dir``, the terminal shows the node output too;
- ``--log-nodes PATTERN`` (repeatable): the terminal shows only the
  output of the nodes matching one of the patterns (with or without
  ``--log-dir``; the files always have every node's).

`log_options` turns them into the session's ``log_dir`` / ``log_echo``;
`MasterLog` is the master's own file.  A session whose nodes print
through this process (``--session local``: threads) has its nodes' output
routed by node even with no option -- every node echoed -- so that the
terminal shows ``[node] line`` there as from node processes.
"""

import logging
import os

from ..jobspec import UsageError, nodes_matching

__all__ = ["log_options", "MasterLog", "master_log_name"]


#: a ``log_echo`` that echoes every node (a pattern matching any name):
#: unlike the default (True) it routes in-process nodes' output by node
EVERY_NODE = ("*",)


def log_options(logs, nodes, in_process=False):
    """The session keyword arguments of the `LogOptions` ``logs`` (``{}``:
    none given, the session's default -- or, ``in_process`` (the nodes
    are threads of this process), every node echoed with its prefix)."""
    if logs.tee and logs.log_dir is None:
        raise UsageError("--tee keeps the terminal copy of --log-dir's "
                         "files: give --log-dir DIR with it")
    for pattern in logs.log_nodes:
        nodes_matching("--log-nodes", pattern, nodes)
    if logs.log_dir is None and not logs.log_nodes:
        return {"log_echo": EVERY_NODE} if in_process else {}
    if logs.log_nodes:
        echo = list(logs.log_nodes)
    else:
        echo = logs.tee or logs.log_dir is None
    options = {"log_echo": echo}
    if logs.log_dir is not None:
        options["log_dir"] = logs.log_dir
    return options


def master_log_name(nodes):
    return "localcluster-master.log" if "master" in nodes else "master.log"


class MasterLog:
    """``DIR/master.log``: every line the master prints, and its warnings
    (the ``localcluster`` loggers), appended as they come."""

    def __init__(self, directory, nodes):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.path = os.path.join(directory, master_log_name(nodes))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT |
                     os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self._file = os.fdopen(fd, "a", buffering=1)
        self._handler = logging.StreamHandler(self._file)
        self._handler.setFormatter(logging.Formatter(
            "%(levelname)s %(name)s: %(message)s"))
        logging.getLogger("localcluster").addHandler(self._handler)

    def write(self, text):
        if self._file is not None:
            try:
                self._file.write(text if text.endswith("\n") else text + "\n")
            except OSError:
                pass

    def close(self):
        if self._file is None:
            return
        logging.getLogger("localcluster").removeHandler(self._handler)
        try:
            self._file.close()
        except OSError:
            pass
        self._file = None
