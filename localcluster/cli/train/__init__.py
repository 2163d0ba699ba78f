"""One training run of ``python -m localcluster.run``: `loop.Run` drives
the session and the `JobRunner`; `epochs` and `progress` are what the
terminal shows, `failure` the lines of a failed run, `logs` where node
output goes, `trace` the Chrome trace."""
