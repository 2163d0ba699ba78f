"""Example jobs that ship with localcluster; ``python -m localcluster.run``
runs `regression` by default.  Read them, copy them, change them."""
