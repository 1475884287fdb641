"""No-op elimination: view / reshape / slice nodes that return their input's shape are dropped, and a
view or reshape of a view or reshape reads the first one's input directly (the fusion patterns then
see producer and consumer adjacent)."""

from __future__ import annotations

import torch
from torch import fx

from vllm_ascend.runner.compilation.passes.base import (
    VIEW_OPS,
    AscendGraphPass,
    BasePattern,
    fake,
    is_op,
    shape_kept,
)

aten = torch.ops.aten


class NoOpPattern(BasePattern):
    """One view-like node: removed when it keeps its input's shape, else re-pointed past a view input."""

    def anchors(self) -> tuple[torch._ops.OpOverload, ...]:
        return (*VIEW_OPS, aten.slice.Tensor)

    def rewrite(self, graph: fx.Graph, node: fx.Node) -> bool:
        source = node.args[0]
        if not isinstance(source, fx.Node):
            return False
        step = node.args[4] if len(node.args) > 4 else node.kwargs.get("step", 1)
        if (node.target != aten.slice.Tensor or step == 1) and shape_kept(node, source):
            node.replace_all_uses_with(source)
            graph.erase_node(node)
            return True
        if node.target in VIEW_OPS and is_op(source, *VIEW_OPS):
            base = source.args[0]
            base_val = fake(base)
            contiguous = isinstance(base_val, torch.Tensor) and base_val.is_contiguous()
            # a view of a non-contiguous base may not exist: reshape (a copy where needed) is always valid
            node.target = node.target if contiguous else aten.reshape.default
            node.args = (base, *node.args[1:])
            if not source.users:
                graph.erase_node(source)
            if shape_kept(node, base):
                node.replace_all_uses_with(base)
                graph.erase_node(node)
            return True
        return False


class NoOpEliminationPass(AscendGraphPass):
    """Drops shape-keeping view/reshape/slice nodes and collapses view/reshape chains."""

    NAME = "NoOpEliminationPass"

    def patterns(self) -> list[BasePattern]:
        return [NoOpPattern()]
