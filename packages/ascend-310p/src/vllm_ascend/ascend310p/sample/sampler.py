"""AscendSampler310: the runner's sampler with random sampling by CDF inversion over host uniforms.

Atlas 310P has neither the device random path the runner's Gumbel-max sampling needs nor Triton.
Every processing step (penalties, bad words, temperature, min-p, top-k/top-p, logprobs) stays the
runner's, on ``vllm_ascend.kernels`` (which run their torch references where Triton cannot run);
only the draw changes: one uniform per row is drawn on the host from a CPU ``torch.Generator``,
staged in pinned memory where the platform has it, moved to the logits' device, and inverted
through the row's cumulative distribution with cumsum / compare / sum, ops 310P runs.

Seeded requests draw from a CPU generator derived from their own generator (seeded with its
``initial_seed()``, so no device RNG is touched) and cached per generator object: a request with
``seed=s`` samples the same tokens in every run and whatever else is in its batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import torch
import torch.nn as nn
from vllm.config.model import LogprobsMode
from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
from vllm.v1.sample.metadata import SamplingMetadata

import vllm_ascend.kernels as kernels
from vllm_ascend.runner.sample.sampler import AscendSampler

# vLLM's threshold below which a temperature means greedy.
_SAMPLING_EPS = 1e-5

_CPU_GENERATORS: weakref.WeakKeyDictionary[torch.Generator, torch.Generator] = weakref.WeakKeyDictionary()


def _cpu_generator_of(generator: torch.Generator) -> torch.Generator:
    """The host generator standing in for a request's ``generator``: made once per generator object
    from its initial seed, then reused so the request's stream continues across steps."""
    cpu = _CPU_GENERATORS.get(generator)
    if cpu is None:
        cpu = torch.Generator(device="cpu")
        cpu.manual_seed(generator.initial_seed())
        _CPU_GENERATORS[generator] = cpu
    return cpu


def _prepare_cpu_generators_310p(
    generators: Mapping[int, torch.Generator], num_rows: int
) -> dict[int, torch.Generator]:
    """``{row: host generator}`` for the seeded rows below ``num_rows``."""
    return {row: _cpu_generator_of(g) for row, g in generators.items() if row < num_rows}


def _generate_request_uniforms_310p(
    counts: list[int],
    cpu_generators: Mapping[int, torch.Generator],
    device: torch.device,
    pin_memory: bool,
) -> torch.Tensor:
    """``[sum(counts)]`` float64 uniforms in ``[0, 1)`` on ``device``, ``counts[row]`` of them for each row
    in row order: all drawn from the global CPU RNG, then a seeded row's slice redrawn from its host
    generator (rows with no count draw nothing from it). Staged in pinned memory when ``pin_memory``."""
    host = torch.empty(sum(counts), dtype=torch.float64, pin_memory=pin_memory)
    host.uniform_()
    start = 0
    for row, count in enumerate(counts):
        generator = cpu_generators.get(row)
        if count > 0 and generator is not None:
            host[start : start + count].uniform_(generator=generator)
        start += count
    return host.to(device, non_blocking=pin_memory)


def fill_exponential_310p(
    out: torch.Tensor,
    row_generators: Mapping[int, torch.Generator] | None = None,
    pin_memory: bool = False,
) -> torch.Tensor:
    """Fill ``out`` (``[rows, ...]``, floating, any device) with Exp(1) draws made on the host, in place:
    the global CPU RNG for every row, then each row of ``row_generators`` from its own host generator.
    Draws are kept at or above the dtype's smallest normal so their reciprocals stay finite. Returns ``out``."""
    if not out.is_floating_point():
        raise ValueError(f"fill_exponential_310p: out must be a floating tensor, got dtype {out.dtype}")
    host = torch.empty(out.shape, dtype=out.dtype, pin_memory=pin_memory)
    host.exponential_()
    for row, generator in (row_generators or {}).items():
        if not 0 <= row < out.shape[0]:
            raise ValueError(
                f"fill_exponential_310p: row_generators has row {row}; out has rows 0..{out.shape[0] - 1}"
            )
        host[row].exponential_(generator=generator)
    host.clamp_(min=torch.finfo(host.dtype).tiny)
    out.copy_(host, non_blocking=pin_memory)
    return out


def _sample_from_cdf_310p(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64 tokens: per row, the first index whose cumulative probability exceeds
    ``u * total``. A zero-probability token is never returned: its cumulative value equals its
    predecessor's, and when rounding pushes ``u * total`` to the total the row's last token with
    positive probability is taken."""
    cdf = probs.cumsum(dim=-1)
    threshold = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]
    index = (cdf <= threshold).sum(dim=-1)
    positive = (probs > 0).to(probs.dtype)
    last_positive = probs.shape[-1] - 1 - positive.flip(-1).argmax(dim=-1)
    return torch.minimum(index, last_positive)


class AscendTopKTopPSampler310(nn.Module):
    """Top-k / top-p on the kernels, then one CDF draw per row from host uniforms."""

    def __init__(self, pin_memory: bool = False) -> None:
        super().__init__()
        self.pin_memory = pin_memory

    def forward(
        self,
        logits: torch.Tensor,
        generators: Mapping[int, torch.Generator],
        top_k: torch.Tensor | None,
        top_p: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens [B] int64, logits with the tokens outside top-k/top-p at -inf)``; ``logits``
        is masked in place."""
        if top_k is not None or top_p is not None:
            k = top_k.to(torch.int64) if top_k is not None else None
            p = top_p.to(torch.float32) if top_p is not None else None
            logits = kernels.apply_top_k_top_p(logits, k, p)
        num_rows = logits.shape[0]
        uniforms = _generate_request_uniforms_310p(
            [1] * num_rows,
            _prepare_cpu_generators_310p(generators, num_rows),
            logits.device,
            self.pin_memory,
        )
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        return _sample_from_cdf_310p(probs, uniforms), logits


class AscendSampler310(AscendSampler):
    """The runner's sampler (greedy, penalties, bad words, min-p, top-k/top-p, logprobs) whose random
    rows are drawn by :class:`AscendTopKTopPSampler310` instead of device Gumbel noise."""

    def __init__(self, logprobs_mode: LogprobsMode = "raw_logprobs", use_fp64_gumbel: bool = False) -> None:
        super().__init__(logprobs_mode, use_fp64_gumbel)
        self.topk_topp_sampler = AscendTopKTopPSampler310(self.pin_memory)

    def sample(
        self,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        logprobs_mode_override: LogprobsMode | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        md = sampling_metadata
        if md.all_greedy:
            return super().sample(logits, md, logprobs_mode_override)
        if md.temperature is None:
            raise ValueError("random sampling needs SamplingMetadata.temperature; got None")
        mode = logprobs_mode_override or self.logprobs_mode
        wants_logprobs = md.max_num_logprobs is not None or bool(md.logprob_token_ids)
        greedy = None if md.all_random else self.greedy_sample(logits)
        logits = self.apply_temperature(logits, md.temperature, md.all_random)
        for processor in md.logitsprocs.argmax_invariant:
            if isinstance(processor, MinPLogitsProcessor):
                if processor.min_p_count:
                    kernels.apply_min_p(logits, processor.min_p.reshape(-1)[: logits.shape[0]])
            else:
                logits = processor.apply(logits)
        sampled, logits = self.topk_topp_sampler(logits, md.generators, md.top_k, md.top_p)
        processed = self._processed_logprobs(logits, mode, wants_logprobs)
        if greedy is not None:
            sampled = torch.where(md.temperature < _SAMPLING_EPS, greedy, sampled)
        return sampled, processed
