"""RMSNorm + int8 quant fusion: the norm feeding a W8A8 (static) or W8A8_DYNAMIC linear's activation quant.

``add_rms_norm -> [0] -> quantize`` becomes ``add_rms_norm_quant`` (the residual sum ``[1]`` comes from the
fused op), ``-> dynamic_quant`` becomes ``add_rms_norm_dynamic_quant``; likewise ``rms_norm -> quantize /
dynamic_quant`` become ``rms_norm_quant`` / ``rms_norm_dynamic_quant``. Shape-keeping views between the
norm and the quant (the schemes' ``x.reshape(-1, hidden)``) are looked through. The normed activation
must have no other user (a MoE layer's norm also feeds the router: no match there).
"""

from __future__ import annotations

import operator
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
    insertion_point,
    is_op,
    only_user,
    through_noop_views,
    vllm_ascend_op,
)


class NormQuantPattern(BasePattern):
    """A norm whose normed output goes only, through shape-keeping views, into one int8 quant."""

    def __init__(self, with_residual: bool, dynamic: bool) -> None:
        self.with_residual = with_residual
        self.dynamic = dynamic
        self.norm_op = vllm_ascend_op("add_rms_norm" if with_residual else "rms_norm")
        self.quant_op = vllm_ascend_op("dynamic_quant" if dynamic else "quantize")
        fused = ("add_" if with_residual else "") + "rms_norm_" + ("dynamic_" if dynamic else "") + "quant"
        self.fused_op = vllm_ascend_op(fused)

    def anchors(self) -> tuple[OpOverload, ...]:
        return (self.quant_op,)

    def rewrite(self, graph: fx.Graph, node: fx.Node) -> bool:
        quant_items = getitem_users(node) if self.dynamic else {0: node}
        if quant_items is None:
            return False
        source, views = through_noop_views(node.args[0], node)
        first_user = views[0] if views else node
        total = None
        if self.with_residual:
            if not (
                is_op(source, operator.getitem) and source.args[1] == 0 and only_user(source, first_user)
            ):
                return False
            norm = source.args[0]
            outputs = getitem_users(norm) if is_op(norm, self.norm_op) else None
            if outputs is None:
                return False
            total = outputs.get(1)
            norm_args: tuple[Any, ...] = (
                arg(norm, 0, "x"),
                arg(norm, 1, "residual"),
                arg(norm, 2, "weight"),
                arg(norm, 3, "eps"),
            )
            dead = [source, *([total] if total is not None else []), norm]
        else:
            norm = source
            if not (is_op(norm, self.norm_op) and only_user(norm, first_user)):
                return False
            norm_args = (arg(norm, 0, "x"), arg(norm, 1, "weight"), arg(norm, 2, "eps"))
            dead = [norm]
        quant_args: tuple[Any, ...]
        if self.dynamic:
            quant_args = (arg(node, 1, "smooth_scales"),)
        else:
            quant_args = (arg(node, 1, "scale"), arg(node, 2, "offset"))
        args = norm_args + quant_args
        replaced = [*quant_items.values(), *([total] if total is not None else [])]
        where = insertion_point(graph, [norm, node], args, [u for r in replaced for u in r.users])
        if where is None:
            return False
        fused = insert_call(graph, where, self.fused_op, args)
        num_outputs = (2 if self.dynamic else 1) + (1 if self.with_residual else 0)  # q [, scale] [, total]
        outs = [fused] if num_outputs == 1 else insert_getitems(graph, fused, num_outputs)
        for index, item in quant_items.items():
            item.replace_all_uses_with(outs[index])
        if total is not None:
            total.replace_all_uses_with(outs[-1])
        dead_quant = [*quant_items.values(), node] if self.dynamic else [node]
        erase(graph, [*dead_quant, *reversed(views), *dead])
        return True


class AddRMSNormQuantFusionPass(AscendGraphPass):
    """``add_rms_norm`` + ``quantize`` / ``dynamic_quant`` -> ``add_rms_norm_quant`` / ``add_rms_norm_dynamic_quant``."""

    NAME = "AddRMSNormQuantFusionPass"

    def patterns(self) -> list[BasePattern]:
        return [NormQuantPattern(True, False), NormQuantPattern(True, True)]


class RMSNormQuantFusionPass(AscendGraphPass):
    """``rms_norm`` + ``quantize`` / ``dynamic_quant`` -> ``rms_norm_quant`` / ``rms_norm_dynamic_quant``."""

    NAME = "RMSNormQuantFusionPass"

    def patterns(self) -> list[BasePattern]:
        return [NormQuantPattern(False, False), NormQuantPattern(False, True)]
