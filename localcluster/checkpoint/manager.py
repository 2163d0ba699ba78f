"""The checkpoint managers a `JobRunner` drives (the ops their TaskGroups
run inside each node: `checkpoint.ops`).

A checkpoint is one file per node and epoch, ``<db_prefix>/<node>.<epoch>``
(the name: `checkpoint.names`; the format: `checkpoint.fileformat`),
written by the node itself -- under `LocalHostScheduler` in its own
process, all nodes in parallel.

The blobs a node checkpoints are its global workspace right after the init
group: ``init()`` records their names in a blob on the node
(``__checkpoint__/blob_names``), ``save`` writes those blobs, ``load`` puts
back every blob of the file (all verified first).  The managers only build
TaskGroups (for ``session.run``) and look at files; they hold no session::

    master (JobRunner)                       node process
    session.run(manager.save(3)) --plan-->   SaveCheckpoint op: write its
                                               blobs to <prefix>/<node>.3
    manager.get_resume_from_epoch_id()       (reads the files, verifies)

Every checkpoint's manifest records its node, its epoch and the job's
checkpointed nodes (``job_nodes``).  Loading checks the first two against
what is loaded -- ``<node>.<epoch>`` must hold that node's checkpoint of
that epoch, not a copy, link or edit of another (`CheckpointError` naming
both) -- and the resume epoch is the latest one complete and valid on
*every* node of the job: the nodes the manager was ``init``-ed with, or,
before that, every node the checkpoints under ``db_prefix`` name -- their
writers and their ``job_nodes`` -- so a node that never wrote a file
still makes every epoch incomplete.  Checkpoints written before
``job_nodes`` was recorded count the nodes that wrote a file, as before.
"""

import abc
import os

from . import ops  # noqa: F401 - registers the ops the managers' nets run
from .fileformat import (BLOB_NAMES, read_manifest, remove_partials,
                         verify_checkpoint)
from .names import checkpoint_path, parse_name
from ..errors import CheckpointError, PlanError
from ..plan.instances import expand_nodes, instance_names
from ..plan.net import Net
from ..task import Cluster, Node, Task, TaskGroup, WorkspaceType

__all__ = ["CheckpointManager", "MultiNodeCheckpointManager",
           "UploadTaskGroupBuilder", "MetadataHandler", "BLOB_NAMES"]


class MetadataHandler:
    """Hooks a manager calls about its checkpoints (a database of them,
    say); subclass and override what you need.  The defaults do nothing
    and leave ``get_resume_from_epoch_id`` to the manager."""

    def init(self, db_prefix, db_type, node_names, retrieve_from_epoch):
        """Called by ``manager.init(...)``."""

    def save(self, db_prefix, db_type, node_names, epoch):
        """Called after every node saved ``epoch``."""

    def get_resume_from_epoch_id(self, user_epoch):
        """The epoch to resume from, or None to let the manager look at
        the files."""
        return None


def _job_nodes(manifest):
    """The job's checkpointed nodes a manifest lists (none if it lists
    none, or not as `compact_nodes` writes them)."""
    listed = manifest.get("job_nodes")
    if not isinstance(listed, list):
        return []
    nodes = []
    for entry in listed:
        if isinstance(entry, str):
            nodes.append(entry)
        elif (isinstance(entry, list) and len(entry) == 2 and
              isinstance(entry[0], str) and isinstance(entry[1], int) and
              not isinstance(entry[1], bool) and 0 < entry[1] <= 1 << 24):
            nodes.extend(f"{entry[0]}_{i}" for i in range(entry[1]))
        else:
            return []
    return nodes


def compact_nodes(nodes):
    """``nodes`` as a manifest lists them: a name, or ``[prefix, N]`` for
    ``prefix_0`` ... ``prefix_{N-1}`` (a prototype's instances, or plain
    nodes named so) -- so each of a thousand instances' checkpoints does
    not carry a thousand names."""
    runs, compact = {}, []
    for node in nodes:
        head, sep, tail = node.rpartition("_")
        if sep and tail.isdigit() and str(int(tail)) == tail:
            runs.setdefault(head, set()).add(int(tail))
    whole = {head for head, seen in runs.items()
             if len(seen) > 1 and seen == set(range(len(seen)))}
    for node in nodes:
        head, _, tail = node.rpartition("_")
        if head in whole:
            if tail == "0":
                compact.append((head, len(runs[head])))
            continue
        compact.append(node)
    return tuple(compact)


class _Manager:
    """What both managers share: files, epochs and the groups they run."""

    def __init__(self, db_prefix, db_type="npz", metadata_handler=None):
        if metadata_handler is not None and \
                not isinstance(metadata_handler, MetadataHandler):
            raise PlanError(
                f"metadata_handler must be a MetadataHandler (subclass it), "
                f"got {type(metadata_handler).__name__}")
        if db_type != "npz":
            raise PlanError(f"checkpoint db_type {db_type!r} is not "
                            "supported; use 'npz'")
        if not isinstance(db_prefix, (str, os.PathLike)) or not \
                str(db_prefix):
            raise PlanError(f"db_prefix must be a directory path, got "
                            f"{db_prefix!r}")
        self._db_prefix = os.fspath(db_prefix)
        self._dir_made = False   # a save of this manager made the directory
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._nodes = None

    def __repr__(self):
        return (f"{type(self).__name__}({self._db_prefix!r}, "
                f"nodes={self._nodes})")

    @property
    def db_prefix(self):
        return self._db_prefix

    def get_ckpt_db_name(self, node_name, epoch):
        return checkpoint_path(self._db_prefix, node_name, epoch)

    def _checkpointed(self):
        if self._nodes is None:
            raise PlanError(f"{self!r} has no nodes yet: run init(nodes) "
                            "first")
        return self._nodes

    def _group(self, net_of):
        """A GLOBAL TaskGroup with one task per checkpointed node running
        ``net_of(node)`` -- and one task, on the prototype, for all the
        instances of a prototype of the current Cluster running
        ``net_of(None)``: a net naming no node, which finds its file from
        the node running it, so a thousand instances share one plan (sent
        once) instead of a thousand."""
        group = TaskGroup(workspace_type=WorkspaceType.GLOBAL)
        for entry in self._by_prototype():
            if isinstance(entry, str):
                with Node(entry):
                    Task(step=net_of(entry), group=group, name="checkpoint")
            else:
                with Node(entry[0]):
                    Task(step=net_of(None), group=group, name="checkpoint")
        return group

    def _by_prototype(self):
        """The checkpointed nodes, each a name, or ``(prototype, N)`` for
        all ``N`` instances of a prototype of the current Cluster when the
        files are named the default way (`get_ckpt_db_name` not
        overridden: a node's file is found from its name alone)."""
        nodes = self._checkpointed()
        if type(self).get_ckpt_db_name is not _Manager.get_ckpt_db_name:
            return nodes
        cluster = Cluster.current()
        out = []
        for entry in compact_nodes(nodes):
            if isinstance(entry, str):
                out.append(entry)
            elif cluster.kwargs_of(entry[0]).get("num_instances") == \
                    entry[1]:
                out.append(tuple(entry))
            else:   # plain nodes named like instances
                out.extend(instance_names(*entry))
        return out

    def _where(self, node, epoch):
        """The op arguments naming ``node``'s checkpoint of ``epoch``: its
        path, or for ``node`` None (a prototype's net) the directory, the
        node running the op naming its own file."""
        if node is None:
            return {"directory": self._db_prefix}
        return {"path": self.get_ckpt_db_name(node, epoch)}

    # -- runnables --------------------------------------------------------------

    def init(self, nodes=None, retrieve_from_epoch=None):
        """A TaskGroup recording, on every node, the blobs its checkpoints
        hold: its global workspace now, or the blobs of its checkpoint of
        ``retrieve_from_epoch``.  No file I/O here."""
        self._nodes = self._init_nodes(nodes)
        if self._metadata_handler is not None:
            self._metadata_handler.init(
                db_prefix=self._db_prefix, db_type=self._db_type,
                node_names=list(self._nodes),
                retrieve_from_epoch=retrieve_from_epoch)

        def net(node):
            n = Net("checkpoint_init")
            if retrieve_from_epoch is None:
                n.CheckpointBlobNames([], [BLOB_NAMES])
            else:
                n.CheckpointBlobNames(
                    [], [BLOB_NAMES], epoch=int(retrieve_from_epoch),
                    **self._where(node, retrieve_from_epoch))
            return n
        return self._group(net)

    def save(self, epoch, final=False):
        """A TaskGroup in which every node writes its checkpoint of
        ``epoch`` (creating ``db_prefix`` if needed); ``final`` records
        that training stopped after this epoch, so a run resumed from it
        runs no more epochs."""
        job_nodes = compact_nodes(self._checkpointed())
        # once a save made the directory, a later one does not make it
        # again: moved or removed under the run, it fails (the run says
        # so) instead of splitting the epochs over two directories
        create = not self._dir_made

        def net(node):
            n = Net("checkpoint_save")
            n.SaveCheckpoint([BLOB_NAMES], [], **self._where(node, epoch),
                             epoch=int(epoch), final=bool(final),
                             job_nodes=job_nodes, create_dir=create)
            return n
        return self._group(net)

    def epoch_is_final(self, epoch):
        """Whether training stopped after ``epoch`` (its checkpoints say so).
        """
        return any(read_manifest(self.get_ckpt_db_name(node, epoch),
                                 node=node, epoch=epoch)
                   .get("final", False) for node in self._nodes_for_files())

    def load(self, epoch):
        """A TaskGroup in which every node loads its checkpoint of
        ``epoch`` (verified first; `CheckpointError` if it fails)."""
        return self._load_group(epoch, None)

    def load_blobs_from_checkpoint(self, names, epoch):
        """Like `load`, but only ``names`` (names a checkpoint lacks are
        skipped)."""
        return self._load_group(epoch, [str(n) for n in names])

    def _load_group(self, epoch, names):
        def net(node):
            n = Net("checkpoint_load")
            n.LoadCheckpoint([], [], **self._where(node, epoch),
                             names=names, epoch=int(epoch))
            return n
        return self._group(net)

    def report_saved(self, epoch):
        """Tell the metadata handler that ``epoch`` was saved (the runner
        calls this after every successful save)."""
        self._dir_made = True
        if self._metadata_handler is not None:
            self._metadata_handler.save(
                db_prefix=self._db_prefix, db_type=self._db_type,
                node_names=list(self._checkpointed()), epoch=epoch)

    def check_directory(self, epoch):
        """Raise `CheckpointError` when the directory itself is why a save
        of ``epoch`` failed -- moved or removed under the run -- so that
        is what the run says, not a failed write; nothing here (a manager
        that watches its directory says it)."""

    def remove_partials(self, epoch):
        """Remove what writers of ``epoch`` killed mid-write left behind."""
        removed = []
        for node in self._nodes or ():
            removed += remove_partials(self.get_ckpt_db_name(node, epoch))
        return removed

    # -- files ----------------------------------------------------------------------

    def _nodes_for_files(self):
        """The nodes an epoch must be complete on: the checkpointed nodes;
        before init, the nodes of the job as its checkpoints under
        ``db_prefix`` tell -- each node that wrote one (a file whose
        manifest says so: ``train.log.1`` is no node) and the ``job_nodes``
        its latest such file lists (so a node that never wrote one counts
        too)."""
        if self._nodes is not None:
            return self._nodes
        writers, nodes = set(), set()
        # each writer's latest file: what the job was when it last saved
        for found in sorted(self._files(),
                            key=lambda f: (f["node"], -f["epoch"])):
            if found["node"] in writers:
                continue
            try:
                manifest = read_manifest(
                    self.get_ckpt_db_name(found["node"], found["epoch"]),
                    node=found["node"], epoch=found["epoch"])
            except CheckpointError:
                continue
            if manifest.get("node") == found["node"]:
                writers.add(found["node"])
                nodes.update(_job_nodes(manifest))
        return sorted(writers | nodes)

    def _files(self):
        try:
            names = os.listdir(self._db_prefix)
        except OSError:
            return []
        found = (parse_name(n) for n in names)
        return [{"node": f.node, "epoch": f.epoch} for f in found
                if f is not None and f.exact]

    def _epoch_valid(self, epoch):
        nodes = self._nodes_for_files()
        if not nodes:
            return False
        for node in nodes:
            try:
                verify_checkpoint(self.get_ckpt_db_name(node, epoch),
                                  node=node, epoch=epoch)
            except CheckpointError:
                return False
        return True

    def get_resume_from_epoch_id(self, user_epoch=None):
        """``user_epoch`` if given and valid; else the latest epoch whose
        checkpoint exists and verifies on every node; None if there is
        none.  A metadata handler that answers (not None) decides
        instead."""
        if self._metadata_handler is not None:
            decided = self._metadata_handler.get_resume_from_epoch_id(
                user_epoch)
            if decided is not None:
                return decided
        return self.latest_epoch_on_disk(user_epoch)

    def latest_epoch_on_disk(self, user_epoch=None):
        """`get_resume_from_epoch_id` from the files alone (no metadata
        handler)."""
        if user_epoch is not None:
            if self._epoch_valid(user_epoch):
                return user_epoch
            raise CheckpointError(
                f"epoch {user_epoch} has no complete, valid checkpoint under "
                f"{self._db_prefix} for nodes {self._nodes_for_files()}")
        nodes = set(self._nodes_for_files())
        by_epoch = {}
        for found in self._files():
            if found["node"] in nodes:
                by_epoch.setdefault(found["epoch"], set()).add(found["node"])
        for epoch in sorted(by_epoch, reverse=True):
            if by_epoch[epoch] == nodes and self._epoch_valid(epoch):
                return epoch
        return None

    def other_job_nodes(self, epoch, nodes=None):
        """``(written, ours)`` when the checkpoints of ``epoch`` were
        written by a job with other checkpointed nodes than those
        ``init(nodes)`` would checkpoint (their manifests' ``job_nodes``);
        None when they are the same, or not recorded (checkpoints from
        before they were)."""
        ours = sorted(self._init_nodes(nodes))
        for node in ours:
            try:
                manifest = read_manifest(self.get_ckpt_db_name(node, epoch),
                                         node=node, epoch=epoch)
            except CheckpointError:
                continue
            written = sorted(_job_nodes(manifest))
            if written:
                return None if written == ours else (written, ours)
        return None

    def nodes_without(self, epoch, nodes=None):
        """Which of the nodes ``init(nodes)`` would checkpoint have no
        checkpoint file of ``epoch``."""
        return [n for n in self._init_nodes(nodes)
                if not os.path.isfile(self.get_ckpt_db_name(n, epoch))]

    def cp_accessible(self, epoch=None):
        """Whether ``db_prefix`` is a readable directory -- and, with
        ``epoch``, whether every node's checkpoint of it exists."""
        if not os.path.isdir(self._db_prefix) or \
                not os.access(self._db_prefix, os.R_OK | os.X_OK):
            return False
        if epoch is None:
            return True
        nodes = self._nodes_for_files()
        return bool(nodes) and all(
            os.path.isfile(self.get_ckpt_db_name(n, epoch)) for n in nodes)


class CheckpointManager(_Manager):
    """``CheckpointManager(db_prefix, node_name, db_type='npz',
    metadata_handler=None)``: checkpoints of the one node ``node_name``."""

    def __init__(self, db_prefix, node_name, db_type="npz",
                 metadata_handler=None):
        super().__init__(db_prefix, db_type, metadata_handler)
        self._node_name = str(node_name)
        self._nodes = [self._node_name]

    def _init_nodes(self, nodes):
        return [self._node_name]


class MultiNodeCheckpointManager(_Manager):
    """``MultiNodeCheckpointManager(db_prefix, db_type='npz',
    metadata_handler=None)``: checkpoints of every node given to
    ``init(nodes)``, each node writing its own."""

    def _init_nodes(self, nodes):
        if not nodes:
            raise PlanError("MultiNodeCheckpointManager.init needs the nodes "
                            "to checkpoint (job.nodes_to_checkpoint())")
        # a prototype (a Node, or its name in the current Cluster) stands
        # for its instances, each checkpointing its own file
        cluster = Cluster.current()

        def counted(name):
            count = cluster.kwargs_of(name).get("num_instances")
            return None if count is None else {"num_instances": count}
        return list(expand_nodes([str(n) for n in nodes], counted))

    def load_blobs_locally(self, nodes, blob_names, epoch, session):
        """Load ``blob_names`` from each listed node's checkpoint of
        ``epoch`` into that node's workspace in ``session``; False --
        loading nothing more -- at the first node whose checkpoint is
        missing, True once all are loaded."""
        names = [str(n) for n in blob_names]
        for node in nodes:
            node = str(node)
            if not os.path.isfile(self.get_ckpt_db_name(node, epoch)):
                return False
            group = TaskGroup(workspace_type=WorkspaceType.GLOBAL)
            with Node(node):
                net = Net("checkpoint_load_blobs")
                net.LoadCheckpoint([], [],
                                   path=self.get_ckpt_db_name(node, epoch),
                                   names=names, epoch=int(epoch))
                Task(step=net, group=group, name="checkpoint")
            session.run(group)
        return True


class UploadTaskGroupBuilder(abc.ABC):
    """Builds the TaskGroup a `JobRunner` runs after training to upload
    checkpoints somewhere; subclass it and implement `build`."""

    @abc.abstractmethod
    def build(self, epoch, checkpoint_manager):
        """The TaskGroup uploading the checkpoints of ``epoch``."""
