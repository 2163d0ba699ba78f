"""The plan layer: blobs, nets, steps, the builder DSL -- pure data --
and `grouping`, which folds tasks (given as plain values) into per-node
plans.  Nothing here imports the task model or anything above it."""

from .builder import NetBuilder, ops
from .net import BlobRef, Net
from .node_plan import NodePlan, WorkspaceType
from .setup import SetupNets
from .step import ExecutionStep, execution_step, to_execution_step

__all__ = ["BlobRef", "Net", "ExecutionStep", "execution_step",
           "to_execution_step", "NetBuilder", "ops", "SetupNets",
           "NodePlan", "WorkspaceType"]
