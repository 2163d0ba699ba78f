"""The installed package's version, for what the commands write down (the
metrics history, ``--json``, the report's footer) -- read from the
package's metadata, so the command line needs nothing of the package face."""

from importlib import metadata

try:
    __version__ = metadata.version("localcluster")
except metadata.PackageNotFoundError:  # a source tree that is not installed
    __version__ = "unknown"
