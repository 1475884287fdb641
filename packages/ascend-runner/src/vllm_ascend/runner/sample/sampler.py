"""AscendSampler: vLLM's V1 sampling pipeline with every step on ``vllm_ascend.kernels``.

The steps and their order are vLLM's (see ``vllm.v1.sample.sampler.Sampler``); each step calls
a kernels dispatcher, which runs the Triton kernel where Triton can run on the logits' device
(NPU via triton-ascend, CUDA) and the torch reference otherwise (the reference device).

Penalties read the counts the persistent batch keeps across steps (:mod:`.penalty_counts`), one pass
over each row's seen tokens; metadata built elsewhere (no kept counts) has them counted for the call.
Temperature is no pass of its own where the steps after it can take ``1 / T`` while they read the
logits: min-p compares against ``max + T * log(min_p)``, top-k keeps the same tokens either way and
Gumbel sampling scales as it reads; it is applied first only for top-p, argmax-invariant logits
processors other than min-p, and processed logprobs (which must see the scaled logits).

Random sampling is Gumbel-max with one 62-bit seed per row and step, drawn through the device adaptor's
``random_fill``: a seeded request draws it from its own ``torch.Generator`` (so a request with ``seed=s``
samples the same tokens in every run and batch), an unseeded request from the global RNG; the noise is a
counter-based hash of the seed (``kernels.gumbel_sample``), no further random draw.
"""

from __future__ import annotations

import torch
from vllm.config.model import LogprobsMode
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler

import vllm_ascend.kernels as kernels
from vllm_ascend.core.sdk import get_device_adaptor
from vllm_ascend.runner.sample.penalty_counts import KeptCountsMetadata, PenaltyCounts

_SAMPLING_EPS = 1e-5
_PROCESSED_MODES = ("processed_logits", "processed_logprobs")


def pad_token_lists(rows: list[list[int]], num_rows: int, pad: int, device: torch.device) -> torch.Tensor:
    """``[num_rows, max_len]`` int64 of ragged token lists, right-padded with ``pad``."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((num_rows, max(width, 1)), pad, dtype=torch.int64)
    for i, row in enumerate(rows[:num_rows]):
        if row:
            out[i, : len(row)] = torch.as_tensor(row, dtype=torch.int64)
    return out.to(device)


def bad_words_csr(
    bad_words: dict[int, list[list[int]]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's ``{row: [word, ...]}`` as ``(tokens, offsets, rows)`` for :func:`kernels.apply_bad_words`."""
    tokens: list[int] = []
    offsets = [0]
    rows: list[int] = []
    for row, words in sorted(bad_words.items()):
        for word in words:
            if word:
                tokens.extend(word)
                offsets.append(len(tokens))
                rows.append(row)
    as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=device)  # noqa: E731
    return as_tensor(tokens), as_tensor(offsets), as_tensor(rows)


def sampling_seeds(
    num_rows: int, generators: dict[int, torch.Generator], device: torch.device
) -> torch.Tensor:
    """One 62-bit seed per row for this step (int64 on ``device``), drawn through the device adaptor's
    ``random_fill``: from the row's generator if it has one, else the global RNG (on the device by default; on
    the host where the family has no device random path, 310P)."""
    rows = {row: g for row, g in generators.items() if row < num_rows}
    seeds = torch.empty(num_rows, dtype=torch.int64, device=device)
    return get_device_adaptor().random_fill(seeds, "seed", rows)


def sampling_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """float32 temperatures with greedy rows (below vLLM's sampling epsilon) at 0."""
    temperature = temperature.to(torch.float32)
    return torch.where(temperature < _SAMPLING_EPS, 0.0, temperature)


def penalty_counts_of(
    sampling_metadata: SamplingMetadata, vocab_size: int, device: torch.device
) -> PenaltyCounts:
    """The counts the persistent batch keeps, brought up to date; for metadata built elsewhere (no kept
    counts), counts of its prompt and output lists for this call (its rows are the batch rows)."""
    md = sampling_metadata
    counts = md.penalty_counts if isinstance(md, KeptCountsMetadata) else None
    if counts is None:
        if md.prompt_token_ids is None:
            raise ValueError("penalties need SamplingMetadata.prompt_token_ids; got None")
        rows = md.prompt_token_ids.shape[0]
        outputs = [
            list(md.output_token_ids[row]) if row < len(md.output_token_ids) else [] for row in range(rows)
        ]
        counts = PenaltyCounts.from_token_lists(md.prompt_token_ids.tolist(), outputs, vocab_size, device)
    counts.sync()
    return counts


class AscendSampler(Sampler):
    """Greedy, temperature, min-p, top-k/top-p, penalties, bad words, logprobs and seeded sampling."""

    @staticmethod
    def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1).view(-1)

    def apply_logits_processors(
        self,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        predict_bonus_token: bool,
    ) -> torch.Tensor:
        md = sampling_metadata
        output_token_ids = md.output_token_ids
        if predict_bonus_token and md.bad_words_token_ids:
            output_token_ids = self._combine_outputs_with_spec_tokens(output_token_ids, md.spec_token_ids)
        if md.allowed_token_ids_mask is not None:
            logits.masked_fill_(md.allowed_token_ids_mask, float("-inf"))
        if md.bad_words_token_ids:
            self.apply_bad_words(logits, md, output_token_ids)
        for processor in md.logitsprocs.non_argmax_invariant:
            logits = processor.apply(logits)
        drafts = md.spec_token_ids if predict_bonus_token else None
        logits = self.apply_penalties(logits, md, drafts)
        holder = md.thinking_budget_state_holder
        if holder is not None and holder.has_tracked_requests():
            holder.update_state(md.output_token_ids, md.spec_token_ids, repeat_indices=None)
            logits = holder.apply_to_logits(logits, predict_bonus_token, md.spec_token_ids)
        return logits

    @staticmethod
    def apply_bad_words(
        logits: torch.Tensor, sampling_metadata: SamplingMetadata, output_token_ids: list[list[int]]
    ) -> torch.Tensor:
        """Mask the last token of every bad word whose prefix ends a row's generated tokens."""
        num_rows = logits.shape[0]
        history = pad_token_lists(output_token_ids, num_rows, 0, logits.device)
        lengths = torch.tensor(
            [len(output_token_ids[i]) if i < len(output_token_ids) else 0 for i in range(num_rows)],
            dtype=torch.int64,
            device=logits.device,
        )
        tokens, offsets, rows = bad_words_csr(sampling_metadata.bad_words_token_ids, logits.device)
        return kernels.apply_bad_words(logits, history, lengths, tokens, offsets, rows)

    @staticmethod
    def apply_penalties(
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        draft_token_ids: list[list[int]] | None = None,
    ) -> torch.Tensor:
        """Penalties from the batch's kept counts (row ``i`` of ``logits`` is batch row ``i``), with row
        ``i``'s ``draft_token_ids[i]`` counted as outputs too (the bonus token of speculative decoding)."""
        md = sampling_metadata
        if md.no_penalties:
            return logits
        rows = logits.shape[0]
        extra = None
        if draft_token_ids is not None and any(draft_token_ids[:rows]):
            extra = pad_token_lists(draft_token_ids[:rows], rows, -1, logits.device)
        counts = penalty_counts_of(md, logits.shape[1], logits.device)
        return counts.apply(
            logits, range(rows), md.repetition_penalties, md.frequency_penalties, md.presence_penalties, extra
        )

    def sample(
        self,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        logprobs_mode_override: LogprobsMode | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        md = sampling_metadata
        mode = logprobs_mode_override or self.logprobs_mode
        wants_logprobs = md.max_num_logprobs is not None or bool(md.logprob_token_ids)
        greedy = None if md.all_random else self.greedy_sample(logits)
        if md.all_greedy:
            return greedy, self._processed_logprobs(logits, mode, wants_logprobs)

        if md.temperature is None:
            raise ValueError("random sampling needs SamplingMetadata.temperature; got None")
        temperature = sampling_temperature(md.temperature)
        others = [p for p in md.logitsprocs.argmax_invariant if not isinstance(p, MinPLogitsProcessor)]
        scaled = md.top_p is not None or bool(others) or (wants_logprobs and mode in _PROCESSED_MODES)
        if scaled:  # a later step needs the scaled logits themselves (greedy rows keep theirs)
            logits = kernels.apply_temperature(logits, temperature)
        for processor in md.logitsprocs.argmax_invariant:
            if isinstance(processor, MinPLogitsProcessor):
                if processor.min_p_count:
                    min_p = processor.min_p.reshape(-1)[: logits.shape[0]]
                    kernels.apply_min_p(logits, min_p, None if scaled else temperature)
            else:
                logits = processor.apply(logits)
        if md.top_k is not None or md.top_p is not None:
            top_k = md.top_k.to(torch.int64) if md.top_k is not None else None
            top_p = md.top_p.to(torch.float32) if md.top_p is not None else None
            logits = kernels.apply_top_k_top_p(logits, top_k, top_p)
        processed = self._processed_logprobs(logits, mode, wants_logprobs)
        sampled = self.draw(logits, md, apply_temperature=not scaled)
        if greedy is not None:
            sampled = torch.where(md.temperature < _SAMPLING_EPS, greedy, sampled)
        return sampled, processed

    def draw(
        self, logits: torch.Tensor, sampling_metadata: SamplingMetadata, apply_temperature: bool = False
    ) -> torch.Tensor:
        """One token per row from the processed logits (min-p, top-k/top-p applied; temperature too
        unless ``apply_temperature``): Gumbel-max with one seed per row; greedy rows' draws are replaced
        by their argmax afterwards."""
        md = sampling_metadata
        assert md.temperature is not None  # checked by sample()
        seeds = sampling_seeds(logits.shape[0], md.generators, logits.device)
        # Without apply_temperature, the temperature only tells greedy rows (T <= 0).
        return kernels.gumbel_sample(
            logits, sampling_temperature(md.temperature), seeds, torch.zeros_like(seeds), apply_temperature
        )

    def _processed_logprobs(self, logits: torch.Tensor, mode: str, wanted: bool) -> torch.Tensor | None:
        if not wanted:
            return None
        if mode == "processed_logits":
            return logits.clone()
        if mode == "processed_logprobs":
            return self.compute_logprobs(logits)
        return None

    @staticmethod
    def gather_logprobs(
        logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
    ) -> LogprobsTensors:
        """Chosen token + top ``num_logprobs`` ``(ids int32, logprobs, ranks)``; ``logprobs`` are returned as given."""
        ids, _, ranks = kernels.compute_topk_logprobs(logprobs, num_logprobs, token_ids)
        return LogprobsTensors(ids.to(torch.int32), logprobs.gather(-1, ids), ranks)
