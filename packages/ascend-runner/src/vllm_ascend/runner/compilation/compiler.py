"""AscendCompiler: vLLM's compiler interface where Inductor generates no code for the device (NPUs).

vLLM compiles each piece of the model (between attention ops) with the compiler its compilation config
names; Inductor runs the platform's post-grad pass manager as a hook, but Inductor has no NPU code
generator here. AscendCompiler is the NPU's compile path: AOT autograd functionalizes the piece into an
ATen graph, the pass manager vLLM configured (``GraphFusionPassManager``: the Ascend fusion passes) rewrites
it, and the rewritten graph runs as it is, every op through the device adaptor (fused ops included).
NPUs get it as vLLM's default backend (``NPUPlatform.get_compile_backend``, which also names the class vLLM
builds). The reference device compiles with Inductor; tests run this path there by giving the reference
platform the NPU's ``get_compile_backend``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx
from vllm.compilation.compiler_interface import CompilerInterface
from vllm.config.utils import Range


class AscendCompiler(CompilerInterface):
    """Functionalize, run the configured post-grad passes, execute the rewritten ATen graph eagerly.

    Nothing is cached across processes (``compile`` returns no handle): a piece is re-traced at start-up,
    which takes seconds, not Inductor's minutes."""

    name = "ascend"

    def compile(
        self,
        graph: fx.GraphModule,
        example_inputs: list[Any],
        compiler_config: dict[str, Any],
        compile_range: Range,
        key: str | None = None,
    ) -> tuple[Callable[..., Any] | None, Any | None]:
        from functorch.compile import make_boxed_func
        from torch._functorch import config as functorch_config
        from torch._functorch.aot_autograd import aot_module_simplified
        from vllm.platforms import current_platform

        passes = compiler_config.get(current_platform.pass_key)

        def rewrite(module: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
            if passes is not None:
                passes(module.graph)
                module.recompile()
            return make_boxed_func(module.forward)

        with functorch_config.patch(enable_autograd_cache=False):  # its cache stores Inductor output only
            compiled = aot_module_simplified(
                graph, example_inputs, fw_compiler=rewrite, keep_inference_input_mutations=True
            )
        return compiled, None
