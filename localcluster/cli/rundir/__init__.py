"""A run's checkpoint directory as the command line keeps it: `directory`
(the lock, the run file, a fresh or resumed directory), `metrics` (the
``metrics.jsonl`` history) and `scan` (what the directory holds, per
epoch and node, and pruning it) -- the checkpoint files themselves are
`localcluster.checkpoint`'s."""
