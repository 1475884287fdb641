"""Reference-device MoE layer: an Ascend ``MoERunner`` for vLLM 0.32 with EPLB expert maps.

Nothing here imports vLLM: :func:`register_moe_runner` acts only in a process that has already
imported it (vLLM loads our plugins), so ``import vllm_ascend.eplb`` and the EPLB policy process stay
free of vLLM.
"""

from __future__ import annotations

import sys

#: The vLLM 0.32 pluggable layer this subpackage replaces.
MOE_RUNNER_NAME = "MoERunner"


def register_moe_runner() -> bool:
    """Replace vLLM's ``MoERunner`` with :class:`~vllm_ascend.eplb.moe.runner.AscendMoERunner` when our
    platform is active and vLLM is loaded. Idempotent; returns whether the replacement is in place."""
    if "vllm" not in sys.modules:
        return False
    from vllm_ascend.core.device.detection import detect

    try:
        active = detect().active
    except ValueError:
        return False
    if not active:
        return False
    from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot

    from vllm_ascend.eplb.moe.runner import AscendMoERunner

    current = op_registry_oot.get(MOE_RUNNER_NAME)
    if current is AscendMoERunner:
        return True
    if current is not None:
        raise RuntimeError(
            f"vLLM's {MOE_RUNNER_NAME} is already replaced by {current.__module__}.{current.__qualname__}; "
            "the Ascend EPLB MoE runner cannot also replace it"
        )
    PluggableLayer.register_oot(AscendMoERunner, name=MOE_RUNNER_NAME)
    return True
