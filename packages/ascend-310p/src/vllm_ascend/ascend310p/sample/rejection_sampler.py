"""AscendRejectionSampler310: the runner's draft verification with host randomness.

The runner's :class:`AscendRejectionSampler` keeps vLLM's order of steps and verifies on
``vllm_ascend.kernels`` (torch implementations on 310P: the profile has no Triton), drawing its
uniforms and exponentials on the device. Atlas 310P has no device random path for them, so its
verification step (``verify``) is :func:`rejection_sample_310p`: the runner's verification with the
per-draft uniforms and the recovered-token exponentials drawn on the host from the same CPU generators
as :class:`~vllm_ascend.ascend310p.sample.sampler.AscendSampler310`.

A random request accepts draft ``d`` with probability ``min(1, p(d) / q(d))`` (``q`` one-hot at
``d`` for drafts without probabilities, such as n-gram); its first rejection is replaced by a draw
from ``normalize(max(p - q, 0))`` (the exponential race ``argmax((p - q)+ / E)``); when every
draft is accepted the bonus token follows. Greedy requests accept drafts equal to the argmax.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from vllm.config import SpeculativeConfig
from vllm.utils.platform_utils import is_pin_memory_available
from vllm.v1.sample.sampler import Sampler

from vllm_ascend.ascend310p.sample.sampler import (
    _generate_request_uniforms_310p,
    _prepare_cpu_generators_310p,
    fill_exponential_310p,
)
from vllm_ascend.runner.sample.rejection_sampler import (
    AscendRejectionSampler,
    VerificationRandomness,
    rejection_sample,
)


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


class HostRandomness310(VerificationRandomness):
    """Verification's draws on the host: per-draft uniforms and recovered-token exponentials from the same
    per-request CPU generators as :class:`~vllm_ascend.ascend310p.sample.sampler.AscendSampler310`
    (global CPU RNG for unseeded requests), staged in pinned memory when ``pin_memory``."""

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory

    def uniforms(self, num_tokens, num_draft_tokens, generators, device):
        cpu = _prepare_cpu_generators_310p(generators, len(num_draft_tokens))
        uniform = _generate_request_uniforms_310p(num_draft_tokens, cpu, device, self.pin_memory)
        assert uniform.numel() == num_tokens
        return uniform

    def recovery_noise(self, batch_size, vocab_size, num_draft_tokens, generators, device):
        cpu = _prepare_cpu_generators_310p(generators, batch_size)
        return recovery_noise_310p(batch_size, vocab_size, num_draft_tokens, cpu, device, self.pin_memory)


def rejection_sample_310p(*args: Any, pin_memory: bool | None = None, **kwargs: Any) -> torch.Tensor:
    """The runner's :func:`~vllm_ascend.runner.sample.rejection_sampler.rejection_sample` (same arguments
    and output) with every random draw on the host (:class:`HostRandomness310`; ``pin_memory`` defaults to
    the platform's answer). Its kernels run their torch implementations: 310P has no Triton."""
    pin = is_pin_memory_available() if pin_memory is None else pin_memory
    kwargs["randomness"] = HostRandomness310(pin)
    return rejection_sample(*args, **kwargs)


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
