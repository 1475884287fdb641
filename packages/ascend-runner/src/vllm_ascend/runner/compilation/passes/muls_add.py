"""``x * scalar + y`` -> ``muls_add(x, scalar, y)``: one pass over memory instead of two.

The product must feed only the add, the factor must be a Python number (a tensor factor is no match),
and ``x``, ``y`` and the sum must share shape and dtype (no broadcasting, no promotion).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import fx
from torch._ops import OpOverload

from vllm_ascend.runner.compilation.passes.base import (
    AscendGraphPass,
    BasePattern,
    erase,
    fake,
    insert_call,
    is_op,
    only_user,
    same_shape,
    vllm_ascend_op,
)

aten = torch.ops.aten
_MUL_OPS = (aten.mul.Tensor, aten.mul.Scalar)


def _scalar_product(node: Any) -> tuple[fx.Node, float] | None:
    """``(x, s)`` when ``node`` is ``x * s`` (either order) for a number ``s``."""
    if not is_op(node, *_MUL_OPS) or node.kwargs:
        return None
    a, b = node.args
    for x, s in ((a, b), (b, a)):
        if isinstance(x, fx.Node) and isinstance(s, numbers.Real) and not isinstance(s, bool):
            return x, float(s)
    return None


def _same_tensor_kind(*nodes: fx.Node) -> bool:
    vals = [fake(n) for n in nodes]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    first = vals[0]
    return first.is_floating_point() and all(
        v.dtype == first.dtype and same_shape(v.shape, first.shape) for v in vals[1:]
    )


class MulsAddPattern(BasePattern):
    """``add(mul(x, s), y)`` or ``add(y, mul(x, s))`` with alpha 1."""

    def __init__(self) -> None:
        self.fused_op = vllm_ascend_op("muls_add")

    def anchors(self) -> tuple[OpOverload, ...]:
        return (aten.add.Tensor,)

    def rewrite(self, graph: fx.Graph, node: fx.Node) -> bool:
        if node.kwargs.get("alpha", 1) != 1 or len(node.args) != 2:
            return False
        a, b = node.args
        for mul, y in ((a, b), (b, a)):
            product = _scalar_product(mul)
            if product is None or not isinstance(y, fx.Node) or not only_user(mul, node):
                continue
            x, scale = product
            if not _same_tensor_kind(node, x, y):
                continue
            fused = insert_call(graph, node, self.fused_op, (x, scale, y))
            node.replace_all_uses_with(fused)
            erase(graph, [node, mul])
            return True
        return False


class MulsAddFusionPass(AscendGraphPass):
    """``x * scalar + y`` -> ``torch.ops.vllm_ascend.muls_add``."""

    NAME = "MulsAddFusionPass"

    def patterns(self) -> list[BasePattern]:
        return [MulsAddPattern()]
