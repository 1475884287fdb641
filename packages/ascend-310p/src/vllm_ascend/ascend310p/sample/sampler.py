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
from vllm.v1.sample.metadata import SamplingMetadata

from vllm_ascend.runner.sample.sampler import AscendSampler

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


class AscendSampler310(AscendSampler):
    """The runner's sampler (greedy, penalties, bad words, min-p, top-k/top-p on the kernels' torch
    implementations, logprobs) whose random rows are drawn by CDF inversion of host uniforms
    instead of device Gumbel noise."""

    def draw(self, logits: torch.Tensor, sampling_metadata: SamplingMetadata) -> torch.Tensor:
        """One CDF draw per row of the processed logits, from a host uniform (the row's request
        generator's CPU stream, else the global CPU RNG)."""
        num_rows = logits.shape[0]
        uniforms = _generate_request_uniforms_310p(
            [1] * num_rows,
            _prepare_cpu_generators_310p(sampling_metadata.generators, num_rows),
            logits.device,
            self.pin_memory,
        )
        return _sample_from_cdf_310p(logits.softmax(dim=-1, dtype=torch.float32), uniforms)
