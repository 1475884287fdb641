"""AscendRejectionSampler: vLLM's speculative-decoding verification on ``vllm_ascend.kernels``.

vLLM's ``RejectionSampler.forward`` keeps its order of steps (bonus token through the sampler,
logits processors and penalties, temperature / top-k / top-p on the target logits, verification,
logprobs); while it runs, the module-level functions it calls for the device work are bound to
ours: per-token expansion, top-k/top-p and the verification itself (:func:`rejection_sample`),
which dispatch to Triton where Triton runs on the device and to the torch references otherwise.
vLLM's own versions launch CUDA-only Triton kernels.
"""

from __future__ import annotations

import torch
from vllm.config import SpeculativeConfig
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample import rejection_sampler as vllm_rejection
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import RejectionSampler, generate_uniform_probs
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

import vllm_ascend.kernels as kernels
from vllm_ascend.runner.patching import replaced_names


def recovery_noise(
    batch_size: int,
    vocab_size: int,
    num_draft_tokens: list[int],
    generators: dict[int, torch.Generator],
    device: torch.device,
) -> torch.Tensor:
    """``[B, V]`` reciprocals of exponential draws for recovered tokens: from a seeded request's own
    generator when it has drafts (so its run is reproducible), from the global RNG otherwise."""
    q = torch.empty(batch_size, vocab_size, dtype=torch.float32, device=device).exponential_()
    for row, generator in generators.items():
        if row < batch_size and num_draft_tokens[row] > 0:
            q[row].exponential_(generator=generator)
    return q.reciprocal_()


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    synthetic_mode: bool = False,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64_gumbel: bool = False,
) -> torch.Tensor:
    """``[B, max_spec_len + 1]`` int32 output tokens (vLLM's ``rejection_sample`` contract):
    accepted drafts, then the replacement of the first rejected draft or the bonus token, then
    ``PLACEHOLDER_TOKEN_ID``. Exponential draws are float32 (``use_fp64_gumbel`` is not honoured)."""
    if synthetic_mode:
        raise ValueError(
            "rejection_sample_method='synthetic' is not supported on Ascend; allowed: 'standard'"
        )
    batch_size = len(num_draft_tokens)
    device = target_logits.device
    output = torch.full(
        (batch_size, max_spec_len + 1), kernels.PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device
    )
    is_greedy = None if sampling_metadata.all_greedy else sampling_metadata.temperature == 0
    if not sampling_metadata.all_random:
        kernels.rejection_greedy_sample(
            output,
            cu_num_draft_tokens,
            draft_token_ids,
            target_logits.argmax(dim=-1),
            bonus_token_ids,
            is_greedy,
        )
        if sampling_metadata.all_greedy:
            return output
    assert is_greedy is not None
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
    uniform = generate_uniform_probs(
        draft_token_ids.numel(), num_draft_tokens, sampling_metadata.generators, device
    )
    inv_q = recovery_noise(
        batch_size, target_probs.shape[-1], num_draft_tokens, sampling_metadata.generators, device
    )
    recovered = kernels.sample_recovered_tokens(
        max_spec_len, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q
    )
    kernels.rejection_random_sample(
        output,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        bonus_token_ids,
        recovered,
        uniform,
        is_greedy,
    )
    return output


class AscendRejectionSampler(RejectionSampler):
    """Token-wise verification of draft tokens, greedy and random, with or without draft probabilities
    (``rejection_sampler_config.verify_method="strict"``, the only method core's config accepts)."""

    def __init__(
        self,
        sampler: Sampler,
        spec_config: SpeculativeConfig | None = None,
        device: torch.device | None = None,
    ) -> None:
        if spec_config is not None and spec_config.rejection_sample_method != "standard":
            raise ValueError(
                f"speculative_config.rejection_sample_method={spec_config.rejection_sample_method!r} is not "
                "supported on Ascend; allowed: 'standard'"
            )
        super().__init__(sampler, spec_config, device)

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> SamplerOutput:
        with replaced_names(
            vllm_rejection,
            {
                "rejection_sample": rejection_sample,
                "expand_batch_to_tokens": kernels.expand_batch_to_tokens,
                "apply_top_k_top_p": kernels.apply_top_k_top_p,
            },
        ):
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
