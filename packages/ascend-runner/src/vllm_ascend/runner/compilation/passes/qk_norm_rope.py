"""QK-norm + RoPE fusion (Qwen3-style attention): per-head RMSNorm of q and k, then rotary embedding.

Matches ``rotary_embedding(positions, q, k, ...)`` where each of ``q`` / ``k`` is
``view(rms_norm(view(src, [T, heads, head_size]), weight, eps), src.shape)`` (the model's
``q.view(..., heads, head_dim)`` → ``q_norm`` → ``view(q.shape)``), every intermediate used only by the
next and one ``eps`` for both; it becomes ``qk_rmsnorm_rope(positions, q_src, k_src, q_weight,
k_weight, eps, head_size, cos_sin_cache, is_neox)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch._ops import OpOverload
from torch.fx.experimental.symbolic_shapes import statically_known_true

from vllm_ascend.runner.compilation.passes.base import (
    VIEW_OPS,
    AscendGraphPass,
    BasePattern,
    arg,
    erase,
    fake,
    getitem_users,
    insert_call,
    insert_getitems,
    is_op,
    only_user,
    shape_kept,
    vllm_ascend_op,
)


class QKNormRopePattern(BasePattern):
    """``rotary_embedding`` of two per-head-normed projections."""

    def __init__(self) -> None:
        self.rope_op = vllm_ascend_op("rotary_embedding")
        self.norm_op = vllm_ascend_op("rms_norm")
        self.fused_op = vllm_ascend_op("qk_rmsnorm_rope")

    def anchors(self) -> tuple[OpOverload, ...]:
        return (self.rope_op,)

    def _normed_heads(
        self, node: Any, user: fx.Node, head_size: Any
    ) -> tuple[fx.Node, Any, Any, list[fx.Node]] | None:
        """``(src, weight, eps, [outer view, norm, inner view])`` when ``node`` is a per-head norm of ``src``."""
        if not (is_op(node, *VIEW_OPS) and only_user(node, user)):
            return None
        norm = node.args[0]
        if not (is_op(norm, self.norm_op) and only_user(norm, node)):
            return None
        inner = arg(norm, 0, "x")
        if not (is_op(inner, *VIEW_OPS) and only_user(inner, norm)):
            return None
        src, heads = inner.args[0], fake(inner)
        src_val = fake(src)
        if not (isinstance(heads, torch.Tensor) and isinstance(src_val, torch.Tensor)):
            return None
        if src_val.dim() != 2 or heads.dim() != 3 or not statically_known_true(heads.shape[-1] == head_size):
            return None
        if not shape_kept(node, src):
            return None
        return src, arg(norm, 1, "weight"), arg(norm, 2, "eps"), [node, norm, inner]

    def rewrite(self, graph: fx.Graph, node: fx.Node) -> bool:
        positions, query, key = arg(node, 0, "positions"), arg(node, 1, "query"), arg(node, 2, "key")
        head_size, cache, is_neox = (
            arg(node, 3, "head_size"),
            arg(node, 4, "cos_sin_cache"),
            arg(node, 5, "is_neox"),
        )
        outputs = getitem_users(node)
        if key is None or outputs is None:
            return False
        q = self._normed_heads(query, node, head_size)
        k = self._normed_heads(key, node, head_size)
        if q is None or k is None or q[2] != k[2]:
            return False
        args = (positions, q[0], k[0], q[1], k[1], q[2], head_size, cache, is_neox)
        fused = insert_call(graph, node, self.fused_op, args)
        items = insert_getitems(graph, fused, 2)
        for index, item in outputs.items():
            item.replace_all_uses_with(items[index])
        erase(graph, [*outputs.values(), node, *q[3], *k[3]])
        return True


class QKNormRopeFusionPass(AscendGraphPass):
    """Per-head q/k RMSNorm + ``rotary_embedding`` -> ``torch.ops.vllm_ascend.qk_rmsnorm_rope``."""

    NAME = "QKNormRopeFusionPass"

    def patterns(self) -> list[BasePattern]:
        return [QKNormRopePattern()]
