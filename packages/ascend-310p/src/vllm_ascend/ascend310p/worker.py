"""NPUWorker310: the runner's worker serving the 310P family (its profile names ``worker="310p"``).

Everything but the attention backends is the runner's: device lifecycle, KV sizing, sleep mode, warm-up and
the model runner vLLM selects (Model Runner V2, ``NPUModelRunnerV2``, by default: its kernels run their torch
references on 310P, which has no Triton; the V1 ``NPUModelRunner`` where vLLM falls back to V1). What 310P
names is the attention backend vLLM builds
(:class:`~vllm_ascend.ascend310p.attention.backend.AscendAttentionBackend310`) and the refusal of MLA and
DeepSeek sparse attention, whose ops the Atlas inference series lacks. Graph capture never runs: the 310P
profile is eager-only, so the platform refuses graph modes at config time.

The class is what core's ``WORKERS`` registry holds for the profile's ``worker="310p"``: the platform asks it
which attention backend to build (``get_attn_backend_cls``), so these three answers live here rather than as
profile data.
"""

from __future__ import annotations

from vllm_ascend.runner.attention.support import AttentionConfigError
from vllm_ascend.runner.worker import NPUWorker

ATTENTION_BACKEND_310P = "vllm_ascend.ascend310p.attention.backend.AscendAttentionBackend310"


class NPUWorker310(NPUWorker):
    """The worker for Atlas 310P (and the reference device emulating it)."""

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
