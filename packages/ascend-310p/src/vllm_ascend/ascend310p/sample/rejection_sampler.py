"""AscendRejectionSampler310: the runner's draft verification with host randomness and plain torch.

The runner's :class:`AscendRejectionSampler` keeps vLLM's order of steps and verifies on
``vllm_ascend.kernels`` dispatchers, which would pick Triton kernels wherever triton-ascend is
installed, and draws its uniforms and exponentials on the device. Neither works on Atlas 310P, so
its verification step (``verify``) is :func:`rejection_sample_310p`:
the same contract and verification methods, the kernels' torch references called directly, the
per-draft uniforms and the recovered-token exponentials drawn on the host from the same CPU
generators as :class:`~vllm_ascend.ascend310p.sample.sampler.AscendSampler310`.

A random request accepts draft ``d`` with probability ``min(1, p(d) / q(d))`` (``q`` one-hot at
``d`` for drafts without probabilities, such as n-gram); its first rejection is replaced by a draw
from ``normalize(max(p - q, 0))`` (the exponential race ``argmax((p - q)+ / E)``); when every
draft is accepted the bonus token follows. Greedy requests accept drafts equal to the argmax.
"""

from __future__ import annotations

import functools

import torch
from vllm.config import SpeculativeConfig
from vllm.utils.platform_utils import is_pin_memory_available
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler

from vllm_ascend.ascend310p.sample.sampler import (
    _generate_request_uniforms_310p,
    _prepare_cpu_generators_310p,
    fill_exponential_310p,
)
from vllm_ascend.kernels import rejection as ref
from vllm_ascend.runner.sample.rejection_sampler import STRICT, AscendRejectionSampler, Verification


def recovery_noise_310p(
    batch_size: int,
    vocab_size: int,
    num_draft_tokens: list[int],
    cpu_generators: dict[int, torch.Generator],
    device: torch.device,
    pin_memory: bool,
) -> torch.Tensor:
    """``[B, V]`` float32 reciprocals of host exponential draws, one row per request; a seeded request
    with drafts draws its row from its host generator, every other row from the global CPU RNG."""
    rows = {row: g for row, g in cpu_generators.items() if row < batch_size and num_draft_tokens[row] > 0}
    q = torch.empty(batch_size, vocab_size, dtype=torch.float32, device=device)
    return fill_exponential_310p(q, rows, pin_memory).reciprocal_()


def rejection_sample_310p(
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
    pin_memory: bool | None = None,
) -> torch.Tensor:
    """``[B, max_spec_len + 1]`` int32 (the runner's ``rejection_sample`` contract): accepted drafts,
    then the replacement of the first rejected draft or the bonus token, then
    ``PLACEHOLDER_TOKEN_ID``. Same verification methods; randomness from the host (staged in pinned
    memory when ``pin_memory``, default: the platform's answer); float32 exponentials."""
    md = sampling_metadata
    pin = is_pin_memory_available() if pin_memory is None else pin_memory
    batch_size = len(num_draft_tokens)
    device = target_logits.device
    output = torch.full(
        (batch_size, max_spec_len + 1), ref.PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device
    )
    ref.check_output(output, cu_num_draft_tokens)
    cpu_generators = _prepare_cpu_generators_310p(md.generators, batch_size)

    def uniforms() -> torch.Tensor:
        return _generate_request_uniforms_310p(num_draft_tokens, cpu_generators, device, pin)

    def noise(vocab_size: int) -> torch.Tensor:
        return recovery_noise_310p(batch_size, vocab_size, num_draft_tokens, cpu_generators, device, pin)

    if synthetic_mode:
        if synthetic_conditional_rates is None:
            raise ValueError("synthetic_mode needs synthetic_conditional_rates; got None")
        uniform = uniforms()
        replacement = target_logits.argmax(dim=-1)
        if not md.all_greedy:
            target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
            recovered = ref.sample_recovered_tokens_torch(
                max_spec_len, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                noise(target_probs.shape[-1]),
            )  # fmt: skip
            greedy_token = (
                ref.expand_batch_to_tokens_torch(md.temperature, cu_num_draft_tokens, draft_token_ids.numel())
                == 0
            )
            replacement = torch.where(greedy_token, replacement, recovered.to(replacement.dtype))
        return ref.rejection_synthetic_sample_torch(
            output, cu_num_draft_tokens, draft_token_ids, replacement, bonus_token_ids, uniform,
            synthetic_conditional_rates,
        )  # fmt: skip

    is_greedy = None if md.all_greedy else md.temperature == 0
    if not md.all_random:
        ref.rejection_greedy_sample_torch(
            output,
            cu_num_draft_tokens,
            draft_token_ids,
            target_logits.argmax(dim=-1),
            bonus_token_ids,
            is_greedy,
        )
        if md.all_greedy:
            return output
    assert is_greedy is not None
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
    ref.check_probs(target_probs, draft_probs, draft_token_ids.numel())
    inv_q = noise(target_probs.shape[-1])
    if verification.method == "entropy":
        threshold = ref.typical_acceptance_threshold_torch(
            target_probs, verification.epsilon, verification.alpha
        )
        no_draft = torch.full_like(draft_token_ids, ref.PLACEHOLDER_TOKEN_ID)  # a draw from p itself
        samples = ref.sample_recovered_tokens_torch(
            max_spec_len, cu_num_draft_tokens, no_draft, None, target_probs, inv_q
        )
        return ref.rejection_random_sample_torch(
            output, cu_num_draft_tokens, draft_token_ids, None, target_probs, bonus_token_ids, samples,
            threshold.to(torch.float64), is_greedy,
        )  # fmt: skip
    uniform = uniforms()
    if verification.method == "block":
        return ref.rejection_block_sample_torch(
            output, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
            uniform, inv_q, is_greedy,
        )  # fmt: skip
    recovered = ref.sample_recovered_tokens_torch(
        max_spec_len, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q
    )
    return ref.rejection_random_sample_torch(
        output, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
        recovered, uniform, is_greedy,
    )  # fmt: skip


class AscendRejectionSampler310(AscendRejectionSampler):
    """The runner's rejection sampler verifying through :func:`rejection_sample_310p` (host
    randomness, torch only); the bonus token comes from ``sampler`` (the 310P runner passes an
    :class:`~vllm_ascend.ascend310p.sample.sampler.AscendSampler310`)."""

    def __init__(
        self,
        sampler: Sampler,
        spec_config: SpeculativeConfig | None = None,
        device: torch.device | None = None,
    ) -> None:
        super().__init__(sampler, spec_config, device)
        self.pin_memory = bool(getattr(sampler, "pin_memory", False))
        self.verify = functools.partial(rejection_sample_310p, pin_memory=self.pin_memory)
