"""Model-based drafting on Ascend: draft model, EAGLE, EAGLE-3 and MTP proposers.

``AscendSpecDecodeBaseProposer`` builds on vLLM's ``SpecDecodeBaseProposer``, which owns what every
model-based method shares: loading the draft network (sharing the target's embeddings and LM head
where the method says so), the drafter's own KV-cache layers, padded batches (rejected slots stay in
the batch, the drafter reads one token per request from fixed indices) and the autoregressive loop.
What is device-specific is ours:

- the index kernels the loop launches (next-token selection, input expansion, per-step slot mapping)
  run the runner's torch implementations on every device (registered by the platform as vLLM's
  Triton-kernel overrides);
- draft tokens are sampled on ascend-kernels: greedy rows take the argmax; random rows draw with the
  seeded Gumbel-max kernel from ``softmax(logits / T)``, keyed by the request's seed (its generator's
  ``initial_seed()``, so a seeded request drafts the same tokens in any batch and its generator is not
  advanced) and the draft's position, and hand those probabilities to the rejection sampler.

The runner constructs these classes where vLLM's runner constructs its own (same arguments), so
vLLM's scheduling, verification and spec-decode metrics see an ordinary drafter.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

from vllm_ascend import kernels

#: Temperatures at or below this are greedy (vLLM's sampler uses the same bound).
SAMPLING_EPS = 1e-5
_SEED_BOUND = 1 << 62


class AscendSpecDecodeBaseProposer(SpecDecodeBaseProposer):
    """vLLM's model-based drafting loop with draft sampling on ascend-kernels."""

    #: The vLLM class this one replaces in vLLM's runner (the runner swaps the name while it builds and
    #: lets vLLM's runner drive it).
    replaces: ClassVar[str] = "EagleProposer"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runner = kwargs.get("runner", args[2] if len(args) > 2 else None)
        self._draft_index = 0

    def propose(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._draft_index = 0
        return super().propose(*args, **kwargs)

    def _sample_draft_tokens(
        self, hidden_states: torch.Tensor, sampling_metadata: SamplingMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        index = self._draft_index
        self._draft_index += 1
        if not self._enable_probabilistic_draft_probs or sampling_metadata.all_greedy:
            return self._greedy_sample(hidden_states), None
        if self.use_heterogeneous_vocab:
            raise ValueError(
                "speculative_config.draft_sample_method = 'probabilistic' needs the draft and target "
                "vocabularies to be equal"
            )
        logits = self.model.compute_logits(hidden_states)
        return self.sample_draft(logits, sampling_metadata, index)

    def sample_draft(
        self, logits: torch.Tensor, sampling_metadata: SamplingMetadata, draft_index: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft tokens and the probabilities they were drawn from, for rows ``[:logits.shape[0]]``.

        Only the temperature shapes the draft (as in vLLM): the rejection sampler corrects for the
        difference to the target's full sampling parameters, so the output law is the target's."""
        if sampling_metadata.temperature is None:
            raise ValueError("random draft sampling needs SamplingMetadata.temperature; got None")
        rows = logits.shape[0]
        temperature = sampling_metadata.temperature[:rows].to(torch.float32)
        greedy = temperature < SAMPLING_EPS
        scaled = logits.to(torch.float32) / torch.where(greedy, 1.0, temperature).unsqueeze(1)
        probs = scaled.softmax(dim=-1)
        seeds, positions = self._noise_keys(rows, draft_index, logits.device)
        tokens = kernels.gumbel_sample(
            scaled, torch.where(greedy, 0.0, 1.0), seeds, positions, apply_temperature=False
        )
        return tokens, probs

    def _noise_keys(
        self, rows: int, draft_index: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row: the request's seed (fresh global draws for unseeded rows) and the draft's position."""
        seeds = torch.randint(0, _SEED_BOUND, (rows,), dtype=torch.int64)
        positions = torch.full((rows,), draft_index, dtype=torch.int64)
        batch = getattr(self.runner, "input_batch", None)
        if batch is not None:
            for row, generator in batch.generators.items():
                if row < rows:
                    seeds[row] = generator.initial_seed() % _SEED_BOUND
            positions += torch.from_numpy(batch.num_tokens_no_spec[:rows].astype("int64"))
        return seeds.to(device), positions.to(device)


class AscendDraftModelProposer(AscendSpecDecodeBaseProposer, DraftModelProposer):
    """``method="draft_model"``: a smaller model of the same vocabulary drafts token by token,
    with its own embeddings, LM head and KV cache."""

    replaces: ClassVar[str] = "DraftModelProposer"


class AscendEagleProposer(AscendSpecDecodeBaseProposer, EagleProposer):
    """``method`` ``"eagle"``, ``"eagle3"`` or ``"mtp"``: a draft head fed the target's hidden states
    (EAGLE-3: several layers' hidden states, which the runner makes the target return), sharing the
    target's embeddings and LM head where the draft checkpoint has none."""

    replaces: ClassVar[str] = "EagleProposer"
