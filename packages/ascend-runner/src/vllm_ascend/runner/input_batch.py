"""NPUInputBatch: vLLM's persistent input batch holding the Ascend block tables."""

from __future__ import annotations

from typing import Any

from vllm.v1.worker import gpu_input_batch
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_ascend.runner.block_table import MultiGroupBlockTable
from vllm_ascend.runner.patching import replaced_names


class NPUInputBatch(InputBatch):
    """The V1 input batch, built with :class:`~vllm_ascend.runner.block_table.MultiGroupBlockTable`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with replaced_names(gpu_input_batch, {"MultiGroupBlockTable": MultiGroupBlockTable}):
            super().__init__(*args, **kwargs)
