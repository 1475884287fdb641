"""SwiGLU + int8 quant fusion: the MLP activation feeding a W8A8 / W8A8_DYNAMIC down projection.

``swiglu -> quantize`` becomes ``swiglu_quant``, ``swiglu -> dynamic_quant`` becomes
``swiglu_dynamic_quant``, looking through shape-keeping views; the activation must have no other user.
"""

from __future__ import annotations

from typing import Any

from torch import fx
from torch._ops import OpOverload

from vllm_ascend.runner.compilation.passes.base import (
    AscendGraphPass,
    BasePattern,
    arg,
    erase,
    getitem_users,
    insert_call,
    insert_getitems,
    is_op,
    only_user,
    through_noop_views,
    vllm_ascend_op,
)


class SwiGLUQuantPattern(BasePattern):
    """``swiglu`` whose output goes only, through shape-keeping views, into one int8 quant."""

    def __init__(self, dynamic: bool) -> None:
        self.dynamic = dynamic
        self.swiglu_op = vllm_ascend_op("swiglu")
        self.quant_op = vllm_ascend_op("dynamic_quant" if dynamic else "quantize")
        self.fused_op = vllm_ascend_op("swiglu_dynamic_quant" if dynamic else "swiglu_quant")

    def anchors(self) -> tuple[OpOverload, ...]:
        return (self.quant_op,)

    def rewrite(self, graph: fx.Graph, node: fx.Node) -> bool:
        quant_items = getitem_users(node) if self.dynamic else {0: node}
        if quant_items is None:
            return False
        act, views = through_noop_views(node.args[0], node)
        if not (is_op(act, self.swiglu_op) and only_user(act, views[0] if views else node)):
            return False
        args: tuple[Any, ...]
        if self.dynamic:
            args = (arg(act, 0, "x"), arg(node, 1, "smooth_scales"))
        else:
            args = (arg(act, 0, "x"), arg(node, 1, "scale"), arg(node, 2, "offset"))
        # every input precedes the quant node and every consumer follows it
        fused = insert_call(graph, node, self.fused_op, args)
        outs = insert_getitems(graph, fused, 2) if self.dynamic else [fused]
        for index, item in quant_items.items():
            item.replace_all_uses_with(outs[index])
        dead_quant = [*quant_items.values(), node] if self.dynamic else [node]
        erase(graph, [*dead_quant, *reversed(views), act])
        return True


class SwiGLUQuantFusionPass(AscendGraphPass):
    """``swiglu`` + ``quantize`` / ``dynamic_quant`` -> ``swiglu_quant`` / ``swiglu_dynamic_quant``."""

    NAME = "SwiGLUQuantFusionPass"

    def patterns(self) -> list[BasePattern]:
        return [SwiGLUQuantPattern(False), SwiGLUQuantPattern(True)]
