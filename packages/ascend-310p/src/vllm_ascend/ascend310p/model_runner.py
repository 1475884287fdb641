"""NPUModelRunner310: the runner's model runner with 310P's collaborators.

310P has no Triton and no NPU random-number path for sampling, and its attention needs host-side query
lengths and masks: while vLLM's inherited runner code builds its collaborators, the names are bound to the
310P classes — the input batch whose block tables compute slot mappings in numpy, the CDF sampler drawing
uniforms on the host RNG, the torch rejection sampler, and the KV block zeroer without Triton. Everything
else (scheduling, spec decode wiring, sleep mode) is the runner's.
"""

from __future__ import annotations

from typing import Any, ClassVar

from vllm_ascend.ascend310p.input_batch import NPUInputBatch310
from vllm_ascend.ascend310p.kv_zeroer import AscendKVBlockZeroer310
from vllm_ascend.ascend310p.sample.rejection_sampler import AscendRejectionSampler310
from vllm_ascend.ascend310p.sample.sampler import AscendSampler310
from vllm_ascend.runner.model_runner import ASCEND_COMPONENTS, NPUModelRunner

#: The vLLM names the 310P runner binds (the runner's, with 310P's input batch, samplers and zeroer).
ASCEND_310P_COMPONENTS: dict[str, Any] = {
    **ASCEND_COMPONENTS,
    "InputBatch": NPUInputBatch310,
    "Sampler": AscendSampler310,
    "RejectionSampler": AscendRejectionSampler310,
    "KVBlockZeroer": AscendKVBlockZeroer310,
}


class NPUModelRunner310(NPUModelRunner):
    """The V1 model runner for Atlas 310P (see the module docstring)."""

    components: ClassVar[dict[str, Any]] = ASCEND_310P_COMPONENTS
