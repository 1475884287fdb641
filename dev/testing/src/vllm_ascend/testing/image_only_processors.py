"""Test-only shim: Qwen-VL processors load image-only where torchvision is missing.

Why: torchvision cannot be installed beside this torch (PyPI's build breaks torch imports), and transformers
builds every Qwen-VL processor with a video processor whose classes all require torchvision
(``AutoVideoProcessor`` itself is a torchvision placeholder, and ``ProcessorMixin`` cannot even resolve the video base class
to type-check a ``None``), and vLLM's Qwen-VL model modules import ``smart_resize`` from transformers'
torchvision image-processor module, which imports torchvision at its top. The image path needs none of it: the checkpoints of
:mod:`vllm_ascend.testing.tiny_vl_models` save the PIL image processor (``Qwen2VLImageProcessorPil``), and
the tests serve images only (``limit_mm_per_prompt={"video": 0}``).

:func:`install` (idempotent, a no-op when torchvision is importable) gives the processor a
:class:`NoVideoProcessor` (refusing any video): transformers' modality table loads video processors with it
instead of ``AutoVideoProcessor`` and the class check for a video processor accepts it, and the torchvision
image-processor module name resolves to the PIL one (its ``smart_resize`` is the same function, line for line). Calling such a processor with videos fails inside transformers, as it should. It reaches every vLLM process
of a test (vLLM inspects model classes in a child interpreter; a served engine is another process) as a vLLM
general plugin of this dev-only distribution, acting only where ``VLLM_ASCEND_TESTING_IMAGE_ONLY_PROCESSORS=1``
(:func:`install_if_requested`). Nothing in the published packages imports this module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from transformers.utils import PushToHubMixin

_installed = False


class NoVideoProcessor(PushToHubMixin):
    """Stands in for ``AutoVideoProcessor`` and the video processor it would load: carries the checkpoint's
    ``video_preprocessor_config.json`` fields (vLLM sizes its video budget from them) and refuses every video."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *_: Any, **__: Any) -> NoVideoProcessor:
        config = Path(pretrained_model_name_or_path) / "video_preprocessor_config.json"
        return cls(**(json.loads(config.read_text()) if config.is_file() else {}))

    @property
    def valid_kwargs(self) -> type:
        from transformers.processing_utils import VideosKwargs

        return VideosKwargs

    def to_dict(self) -> dict[str, Any]:
        return {**self.fields, "video_processor_type": type(self).__name__}

    def __call__(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError("video inputs need torchvision, which is not installed (image-only processor)")


ENV = "VLLM_ASCEND_TESTING_IMAGE_ONLY_PROCESSORS"


def install_if_requested() -> None:
    """vLLM general plugin: :func:`install` where ``$VLLM_ASCEND_TESTING_IMAGE_ONLY_PROCESSORS`` is ``1``."""
    if os.environ.get(ENV) == "1":
        install()


def install() -> None:
    """Let Qwen-VL processors load without a video processor when torchvision is not importable."""
    global _installed
    if _installed or importlib.util.find_spec("torchvision") is not None:
        return
    from transformers import processing_utils
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl

    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor" and isinstance(argument, NoVideoProcessor):
            return NoVideoProcessor
        return check(self, argument_name, argument)

    processing_utils.ProcessorMixin.check_argument_for_proper_class = check_argument_for_proper_class  # type: ignore[method-assign]
    mapping = processing_utils.MODALITY_TO_AUTOPROCESSOR_MAPPING
    mapping._MAPPING_NAMES = {**mapping._MAPPING_NAMES, "video_processor": (__name__, "NoVideoProcessor")}
    sys.modules.setdefault(
        "transformers.models.qwen2_vl.image_processing_qwen2_vl", image_processing_pil_qwen2_vl
    )
    _installed = True
