"""Operator registry and the built-in numpy kernels (imported for effect)."""

from . import io_ops, numpy_ops  # noqa: F401  register the built-in ops
from .registry import OpContext, OpSchema, lookup, op_names, register_op

__all__ = ["OpContext", "OpSchema", "lookup", "op_names", "register_op"]
