"""The node runtime: workspaces, the step executor, a node's run.

Free of session concerns, so it can be hosted in a thread, a forked
process or an engine's worker.
"""
