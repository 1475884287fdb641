"""NPUWorker310: the runner's worker serving the 310P family (its profile names ``worker="310p"``).

The device lifecycle, KV sizing, sleep mode and warm-up are the runner's; what differs on 310P is the
attention backend vLLM is told to build (:class:`~vllm_ascend.ascend310p.attention.backend.AscendAttentionBackend310`)
and the model runner (:class:`~vllm_ascend.ascend310p.model_runner.NPUModelRunner310`). Graph capture never
runs: the 310P profile is eager-only, so the platform refuses graph modes at config time.
"""

from __future__ import annotations

from vllm_ascend.ascend310p.model_runner import NPUModelRunner310
from vllm_ascend.runner.attention.support import AttentionConfigError
from vllm_ascend.runner.worker import NPUWorker

ATTENTION_BACKEND_310P = "vllm_ascend.ascend310p.attention.backend.AscendAttentionBackend310"


class NPUWorker310(NPUWorker):
    """The V1 worker for Atlas 310P (and the reference device emulating it)."""

    @classmethod
    def attention_backend_qualname(cls) -> str:
        return ATTENTION_BACKEND_310P

    @classmethod
    def mla_attention_backend_qualname(cls) -> str:
        """MLA models are refused: the MLA ops (fused infer attention's latent mode) are not documented for
        the Atlas inference series."""
        raise AttentionConfigError(
            "attention with use_mla=True (MLA, DeepSeek-V2/V3-class models) is not supported on Atlas 310P; "
            "supported there: dense decoder attention (MHA/GQA/MQA)"
        )

    @classmethod
    def sparse_mla_attention_backend_qualname(cls) -> str:
        """DeepSeek sparse attention is refused: the lightning indexer and sparse flash attention ops are not
        documented for the Atlas inference series."""
        raise AttentionConfigError(
            "attention with use_sparse=True (DeepSeek sparse attention, DeepSeek-V3.2-class models) is not "
            "supported on Atlas 310P; supported there: dense decoder attention (MHA/GQA/MQA)"
        )

    @classmethod
    def serves_model_runner_v2(cls) -> bool:
        """310P has no Triton (V2's kernels do not run there): vLLM keeps the V1 runner."""
        return False

    def _make_model_runner(self) -> NPUModelRunner310:
        return NPUModelRunner310(self.vllm_config, self.device)
