"""Errors of the quant package: a bad description, or checkpoint tensors a scheme cannot use."""

from __future__ import annotations

from vllm_ascend.quant.description import QuantDescriptionError


class QuantLoadError(ValueError):
    """Checkpoint tensors that do not form the layer's quant scheme (the message names layer, tensor, expectation)."""


__all__ = ["QuantDescriptionError", "QuantLoadError"]
