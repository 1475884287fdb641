"""AscendRejectionSampler: vLLM's speculative-decoding verification on ``vllm_ascend.kernels``.

vLLM's ``RejectionSampler.forward`` keeps its order of steps (bonus token through the sampler,
logits processors and penalties, temperature / top-k / top-p on the target logits, verification,
logprobs); the target logits' penalties read the batch's kept counts (:mod:`.penalty_counts`) with
each draft position's earlier drafts counted on top; while it runs, the module-level functions it calls
for the device work are bound to ours: per-token expansion, top-k/top-p and the verification itself (:func:`rejection_sample`),
which dispatch to Triton where Triton runs on the device and to the torch references otherwise.
vLLM's own versions launch CUDA-only Triton kernels. Random requests are verified token-wise, by
block verification or by entropy (typical acceptance, not distribution-preserving) as configured.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from vllm.config import SpeculativeConfig
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample import rejection_sampler as vllm_rejection
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

import vllm_ascend.kernels as kernels
from vllm_ascend.core.sdk import get_ascend_config, get_device_adaptor
from vllm_ascend.runner.patching import replaced_names
from vllm_ascend.runner.sample.sampler import pad_token_lists, penalty_counts_of


def recovery_noise(
    batch_size: int,
    vocab_size: int,
    num_draft_tokens: list[int],
    generators: dict[int, torch.Generator],
    device: torch.device,
) -> torch.Tensor:
    """``[B, V]`` float32 reciprocals of exponential draws for recovered tokens, drawn through the device
    adaptor's ``random_fill``: from a seeded request's own generator when it has drafts (so its run is
    reproducible), from the global RNG otherwise (on the host where the family has no device random path)."""
    rows = {row: g for row, g in generators.items() if row < batch_size and num_draft_tokens[row] > 0}
    q = torch.empty(batch_size, vocab_size, dtype=torch.float32, device=device)
    return get_device_adaptor().random_fill(q, "exponential", rows).reciprocal_()


def verification_uniforms(
    num_tokens: int,
    num_draft_tokens: list[int],
    generators: dict[int, torch.Generator],
    device: torch.device,
) -> torch.Tensor:
    """``[num_tokens]`` float64 uniforms, ``num_draft_tokens[r]`` for request ``r`` in request order, a seeded
    request's from its generator (vLLM's ``generate_uniform_probs``), drawn through the device adaptor's
    ``random_fill``."""
    rows = {row: g for row, g in generators.items() if row < len(num_draft_tokens)}
    uniform = torch.empty(num_tokens, dtype=torch.float64, device=device)
    return get_device_adaptor().random_fill(uniform, "uniform", rows, num_draft_tokens)


@dataclass(frozen=True)
class Verification:
    """How random requests' drafts are verified: ``strict`` (token-wise), ``block`` or ``entropy``
    (with its typical-acceptance threshold ``epsilon`` and scale ``alpha``)."""

    method: str = "strict"
    epsilon: float = 0.09
    alpha: float = 0.3


STRICT = Verification()


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
    verification: Verification = STRICT,
) -> torch.Tensor:
    """``[B, max_spec_len + 1]`` int32 output tokens (vLLM's ``rejection_sample`` contract):
    accepted drafts, then the replacement of the first rejected draft or the bonus token, then
    ``PLACEHOLDER_TOKEN_ID``. Greedy requests accept drafts equal to the target argmax whatever the
    verification; random ones follow ``verification``. ``synthetic_mode`` (vLLM's
    ``rejection_sample_method="synthetic"``) accepts every request's drafts with the per-position
    ``synthetic_conditional_rates`` instead, for benchmarking. Exponential draws are float32
    (``use_fp64_gumbel`` is not honoured); every random draw goes through the device adaptor's ``random_fill``."""
    batch_size = len(num_draft_tokens)
    device = target_logits.device
    output = torch.full(
        (batch_size, max_spec_len + 1), kernels.PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device
    )
    is_greedy = None if sampling_metadata.all_greedy else sampling_metadata.temperature == 0
    if synthetic_mode:
        if synthetic_conditional_rates is None:
            raise ValueError("synthetic_mode needs synthetic_conditional_rates; got None")
        return _synthetic_sample(
            output,
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            sampling_metadata,
            synthetic_conditional_rates,
        )
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
    inv_q = recovery_noise(
        batch_size, target_probs.shape[-1], num_draft_tokens, sampling_metadata.generators, device
    )
    if verification.method == "entropy":
        return kernels.rejection_entropy_sample(
            output,
            cu_num_draft_tokens,
            draft_token_ids,
            target_probs,
            bonus_token_ids,
            inv_q,
            is_greedy,
            verification.epsilon,
            verification.alpha,
        )
    uniform = verification_uniforms(
        draft_token_ids.numel(), num_draft_tokens, sampling_metadata.generators, device
    )
    if verification.method == "block":
        return kernels.rejection_block_sample(
            output,
            cu_num_draft_tokens,
            draft_token_ids,
            draft_probs,
            target_probs,
            bonus_token_ids,
            uniform,
            inv_q,
            is_greedy,
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


def _synthetic_sample(
    output: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    conditional_rates: torch.Tensor,
) -> torch.Tensor:
    """vLLM's synthetic acceptance on the kernels: position ``j`` accepted while ``u < rate[j]``;
    the first rejection writes the target argmax (greedy requests) or the recovered token (random)."""
    device = target_logits.device
    uniform = verification_uniforms(
        draft_token_ids.numel(), num_draft_tokens, sampling_metadata.generators, device
    )
    replacement = target_logits.argmax(dim=-1)
    if not sampling_metadata.all_greedy:
        target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
        inv_q = recovery_noise(
            len(num_draft_tokens),
            target_probs.shape[-1],
            num_draft_tokens,
            sampling_metadata.generators,
            device,
        )
        recovered = kernels.sample_recovered_tokens(
            max_spec_len, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q
        )
        greedy_token = (
            kernels.expand_batch_to_tokens(
                sampling_metadata.temperature, cu_num_draft_tokens, draft_token_ids.numel()
            )
            == 0
        )
        replacement = torch.where(greedy_token, replacement, recovered.to(replacement.dtype))
    return kernels.rejection_synthetic_sample(
        output,
        cu_num_draft_tokens,
        draft_token_ids,
        replacement,
        bonus_token_ids,
        uniform,
        conditional_rates,
    )


def verification_of(spec_config: SpeculativeConfig | None) -> Verification:
    """The verification the configs ask for: ``rejection_sampler_config`` (``verify_method``,
    ``posterior_threshold``, ``posterior_alpha``) and vLLM's ``rejection_sample_method`` ("block"
    selects block verification; "synthetic" is handled by vLLM's sampler state). A ValueError names
    both fields when they ask for different methods."""
    section = get_ascend_config().rejection_sampler_config
    method = section.verify_method
    vllm_method = "standard" if spec_config is None else spec_config.rejection_sample_method
    if vllm_method not in ("standard", "synthetic", "block"):
        raise ValueError(
            f"speculative_config.rejection_sample_method={vllm_method!r} is not supported on Ascend; "
            "allowed: 'standard', 'synthetic', 'block'"
        )
    if vllm_method != "standard" and method not in ("strict", vllm_method):
        raise ValueError(
            f"speculative_config.rejection_sample_method={vllm_method!r} conflicts with "
            f"{section.PATH}.verify_method={method!r}; give one of them"
        )
    if vllm_method == "block":
        method = "block"
    return Verification(method, section.posterior_threshold, section.posterior_alpha)


class AscendRejectionSampler(RejectionSampler):
    """Verification of draft tokens on the kernels: greedy requests by argmax, random ones by
    ``rejection_sampler_config.verify_method`` (``strict``, ``block`` or ``entropy``) or vLLM's
    ``rejection_sample_method`` (``block``, or ``synthetic`` acceptance for benchmarking)."""

    #: The verification step, with :func:`rejection_sample`'s contract (a family's sampler sets its own).
    verify: Callable[..., torch.Tensor] = staticmethod(rejection_sample)

    def __init__(
        self,
        sampler: Sampler,
        spec_config: SpeculativeConfig | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.verification = verification_of(spec_config)
        super().__init__(sampler, spec_config, device)

    @staticmethod
    def apply_penalties(
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        metadata: SpecDecodeMetadata,
        repeat_indices: torch.Tensor,
        output_token_ids: list[list[int]],
    ) -> torch.Tensor:
        """Penalties of the target logits (one row per draft token) from the batch's kept counts: the
        row of draft ``k`` of request ``r`` counts ``r``'s drafts before ``k`` as outputs (vLLM's
        ``output_token_ids`` here, the lists with those drafts appended, are not needed)."""
        md = sampling_metadata
        if md.no_penalties:
            return logits
        spec = md.spec_token_ids or []
        rows: list[int] = []
        earlier: list[list[int]] = []
        for request, num_drafts in enumerate(metadata.num_draft_tokens):
            drafts = spec[request] if request < len(spec) else []
            rows.extend([request] * num_drafts)
            earlier.extend(list(drafts[:k]) for k in range(num_drafts))
        extra = pad_token_lists(earlier, len(rows), -1, logits.device) if any(earlier) else None
        counts = penalty_counts_of(md, logits.shape[1], logits.device)
        return counts.apply(
            logits,
            rows,
            md.repetition_penalties[repeat_indices],
            md.frequency_penalties[repeat_indices],
            md.presence_penalties[repeat_indices],
            extra,
        )

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
                "rejection_sample": functools.partial(self.verify, verification=self.verification),
                "expand_batch_to_tokens": kernels.expand_batch_to_tokens,
                "apply_top_k_top_p": kernels.apply_top_k_top_p,
            },
        ):
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
