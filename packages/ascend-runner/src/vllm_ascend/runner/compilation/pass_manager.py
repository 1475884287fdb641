"""``GraphFusionPassManager``: the post-grad pass manager the Ascend platform gives vLLM's compile backend.

vLLM builds it with no arguments, calls :meth:`configure` with the ``VllmConfig``, :meth:`add` for any
``post_grad_custom_post_pass`` of the compilation config, hands it to Inductor as that hook (Inductor calls
it on each post-grad graph) and keys its compile cache on :meth:`uuid`. Instead of vLLM's CUDA fusion
passes it runs the Ascend passes that ``additional_config.ascend_compilation_config`` switches on, in this
order: no-op elimination, add_rms_norm + quant, rms_norm + quant, qk-norm + rope, swiglu + quant,
muls + add; then vLLM's utility passes as vLLM's own manager does (post-cleanup, IR lowering, clone
elimination, fix-functionalization, the last only where vLLM's own kernels are in the graph). Match
counts: :func:`fusion_match_counts`.
"""

from __future__ import annotations

from typing import Any

from torch import fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized
from vllm.compilation.passes.inductor_pass import InductorPass
from vllm.compilation.passes.ir.clone_elimination import UnsafeCloneEliminationPass
from vllm.compilation.passes.ir.lowering_pass import VllmIRLoweringPass
from vllm.compilation.passes.pass_manager import PostGradPassManager
from vllm.compilation.passes.utility.fix_functionalization import FixFunctionalizationPass
from vllm.compilation.passes.utility.post_cleanup import PostCleanupPass
from vllm.config import VllmConfig, set_current_vllm_config

from vllm_ascend.runner.compilation.config import SECTION, AscendCompilationConfig
from vllm_ascend.runner.compilation.passes.act_quant import SwiGLUQuantFusionPass
from vllm_ascend.runner.compilation.passes.base import (
    AscendGraphPass,
    fusion_match_counts,
    reset_fusion_match_counts,
)
from vllm_ascend.runner.compilation.passes.muls_add import MulsAddFusionPass
from vllm_ascend.runner.compilation.passes.noop import NoOpEliminationPass
from vllm_ascend.runner.compilation.passes.norm_quant import AddRMSNormQuantFusionPass, RMSNormQuantFusionPass
from vllm_ascend.runner.compilation.passes.qk_norm_rope import QKNormRopeFusionPass

__all__ = [
    "GraphFusionPassManager",
    "ascend_passes",
    "fusion_match_counts",
    "reset_fusion_match_counts",
]


class VllmKernelFixFunctionalizationPass(FixFunctionalizationPass):
    """vLLM's in-place rewrite of its own ``torch.ops._C`` kernels' ``auto_functionalized`` nodes, run only on
    graphs that hold one: the pass looks those kernels up by name, which fails where vLLM's native extension
    lacks them (the Ascend install; a MoE graph's functionalized ops reach that lookup). Inductor reinplaces
    every other ``auto_functionalized`` node itself."""

    def __call__(self, graph: fx.Graph) -> None:
        if any(
            node.op == "call_function"
            and node.target is auto_functionalized
            and getattr(node.args[0], "namespace", None) == "_C"
            for node in graph.nodes
        ):
            super().__call__(graph)


def ascend_passes(section: AscendCompilationConfig) -> list[type[AscendGraphPass]]:
    """The pass classes the section switches on, in the order they run."""
    if not section.enable_graph_fusion:
        return []
    switched: list[tuple[bool, list[type[AscendGraphPass]]]] = [
        (section.eliminate_noops, [NoOpEliminationPass]),
        (section.fuse_norm_quant, [AddRMSNormQuantFusionPass, RMSNormQuantFusionPass]),
        (section.fuse_qknorm_rope, [QKNormRopeFusionPass]),
        (section.fuse_act_quant, [SwiGLUQuantFusionPass]),
        (section.fuse_muls_add, [MulsAddFusionPass]),
    ]
    return [cls for on, classes in switched if on for cls in classes]


class GraphFusionPassManager(PostGradPassManager):
    """vLLM's post-grad pass manager with the Ascend fusion passes in place of vLLM's CUDA ones.

    ``section`` overrides the process-wide ``ascend_compilation_config`` (tests; vLLM passes none).
    """

    def __init__(self, section: AscendCompilationConfig | None = None) -> None:
        super().__init__()
        self._override = section
        self.section: AscendCompilationConfig | None = None

    def configure(self, config: VllmConfig) -> None:
        """Build the passes from the section; vLLM's pass_config fusion switches (CUDA passes) are not read."""
        from vllm_ascend.core.sdk import get_section

        self.pass_config = config.compilation_config.pass_config
        self.section = self._override if self._override is not None else get_section(SECTION)
        with set_current_vllm_config(config, check_compile=False):
            self.passes += [cls(config) for cls in ascend_passes(self.section)]
            self.ir_lowering = VllmIRLoweringPass(config)
            self.clone_elimination = UnsafeCloneEliminationPass(config)
            self.post_cleanup = PostCleanupPass(config)
            self.fix_functionalization = VllmKernelFixFunctionalizationPass(config)

    def uuid(self) -> str:
        """vLLM's key (passes' sources, pass config, compile range) plus the section's values."""
        state: dict[str, Any] = {
            "post_grad": super().uuid(),
            SECTION: self.section.to_dict() if self.section is not None else None,
        }
        return InductorPass.hash_dict(state)
