"""NPUInputBatch310: the runner's input batch holding 310P block tables (host slot mapping)."""

from __future__ import annotations

from typing import Any

import vllm_ascend.runner.input_batch as runner_input_batch
from vllm_ascend.ascend310p.block_table import MultiGroupBlockTable310
from vllm_ascend.runner.input_batch import NPUInputBatch
from vllm_ascend.runner.patching import replaced_names


class NPUInputBatch310(NPUInputBatch):
    """Same constructor as :class:`NPUInputBatch` (vLLM's ``InputBatch``'s); its block tables are
    :class:`~vllm_ascend.ascend310p.block_table.MultiGroupBlockTable310`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # NPUInputBatch binds vLLM's name to the runner's module-level MultiGroupBlockTable: rebind that.
        with replaced_names(runner_input_batch, {"MultiGroupBlockTable": MultiGroupBlockTable310}):
            super().__init__(*args, **kwargs)
