"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from importlib.util import find_spec

from vllm_ascend.core.sdk import ExtensionDescriptor
from vllm_ascend.specdecode._version import __version__


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.sdk import CONFIG_SECTIONS, SPEC_DECODE_METHODS

    SPEC_DECODE_METHODS.register("ngram", "vllm_ascend.specdecode.ngram:NgramProposer")
    SPEC_DECODE_METHODS.register("suffix", "vllm_ascend.specdecode.suffix:SuffixDecodingProposer")
    if find_spec("vllm") is not None:  # model-based and on-device proposers extend vLLM's drafter classes
        SPEC_DECODE_METHODS.register(
            "draft_model", "vllm_ascend.specdecode.proposer:AscendDraftModelProposer"
        )
        for method in ("eagle", "eagle3", "mtp"):
            SPEC_DECODE_METHODS.register(method, "vllm_ascend.specdecode.proposer:AscendEagleProposer")
        SPEC_DECODE_METHODS.register("ngram_gpu", "vllm_ascend.specdecode.ngram_device:NgramDeviceProposer")
    CONFIG_SECTIONS.register(
        "dynamic_spec_config", "vllm_ascend.specdecode.dynamic:validate_dynamic_spec_config"
    )


EXTENSION = ExtensionDescriptor(
    name="specdecode",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("spec_decode_methods", "config_sections"),
    register=register,
    description="Speculative decoding proposers and additional_config.dynamic_spec_config",
)
