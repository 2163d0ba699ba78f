"""Per-node checkpoints: the one owner of the checkpoint format.

- `names`: the ``<node>.<epoch>`` file name rule, and what a file in a
  checkpoint directory is (a node's checkpoint of an epoch, a partial
  write, or something else) -- asked by everyone who looks at files;
- `fileformat`: one node's blobs of one epoch on disk (an ``.npz`` with a
  manifest), written atomically and verified on read; `members`: a blob's
  bytes inside such a file, found and read checked;
- `reuse`: a blob unchanged since the node's earlier checkpoint is not
  written again -- the manifest refers to that file's member;
- `partials`: what an interrupted writer leaves behind, and whose it is;
- `ops`: the operators that save and load a checkpoint inside a node;
- `manager`: the managers a `JobRunner` drives (TaskGroups for
  ``session.run``, the resume epoch from the files).
"""

from .manager import (CheckpointManager, MetadataHandler,
                      MultiNodeCheckpointManager, UploadTaskGroupBuilder)

__all__ = ["CheckpointManager", "MetadataHandler",
           "MultiNodeCheckpointManager", "UploadTaskGroupBuilder"]
