"""The linear and embedding layers' apply path: Ascend methods that quant schemes can replace.

vLLM gives every unquantized linear layer an ``UnquantizedLinearMethod`` and every embedding /
LM head an ``UnquantizedEmbeddingMethod``. The Ascend layer classes swap those for the methods
below, so a layer's matmul always runs through ``quant_method.apply`` of an Ascend method
(``F.linear`` maps onto the NPU matmul under torch_npu and onto the cpu matmul on the reference
device — no CPU weight repacking). A quantized layer keeps the method its quant scheme chose.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
    VocabParallelEmbedding,
)


def _plain(weight: torch.Tensor) -> torch.Tensor:
    """The weight as a plain tensor in eager execution: vLLM's parameter classes route every torch call they
    take part in through Python's ``__torch_function__``, a per-call cost the matmul of a small batch notices.
    Traced graphs keep the parameter (it is the graph's input)."""
    return weight if torch.compiler.is_compiling() else weight.data


class AscendUnquantizedLinearMethod(UnquantizedLinearMethod):
    """``y = x @ W^T + b`` with the weight kept as loaded (``[out, in]``)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return None

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return F.linear(x, _plain(layer.weight), bias)


class AscendUnquantizedEmbeddingMethod(UnquantizedEmbeddingMethod):
    """Token embedding lookup and the (tied or untied) LM head matmul."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return None

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return F.linear(x, _plain(layer.weight), bias)

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_, _plain(layer.weight))


class _AscendLinearMixin:
    quant_method: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self.quant_method) is UnquantizedLinearMethod:
            self.quant_method = AscendUnquantizedLinearMethod()


class _AscendEmbeddingMixin:
    quant_method: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self.quant_method) is UnquantizedEmbeddingMethod:
            self.quant_method = AscendUnquantizedEmbeddingMethod()


class AscendReplicatedLinear(_AscendLinearMixin, ReplicatedLinear):
    """ReplicatedLinear with the Ascend apply path."""


class AscendColumnParallelLinear(_AscendLinearMixin, ColumnParallelLinear):
    """ColumnParallelLinear with the Ascend apply path."""


class AscendMergedColumnParallelLinear(_AscendLinearMixin, MergedColumnParallelLinear):
    """MergedColumnParallelLinear (gate/up) with the Ascend apply path."""


class AscendQKVParallelLinear(_AscendLinearMixin, QKVParallelLinear):
    """QKVParallelLinear with the Ascend apply path."""


class AscendRowParallelLinear(_AscendLinearMixin, RowParallelLinear):
    """RowParallelLinear with the Ascend apply path."""


class AscendVocabParallelEmbedding(_AscendEmbeddingMixin, VocabParallelEmbedding):
    """VocabParallelEmbedding with the Ascend embedding method."""


class AscendParallelLMHead(_AscendEmbeddingMixin, ParallelLMHead):
    """ParallelLMHead with the Ascend LM-head matmul."""
