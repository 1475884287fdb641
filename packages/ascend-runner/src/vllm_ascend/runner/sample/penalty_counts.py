"""Penalty token counts kept across steps for the V1 runner's persistent batch.

vLLM's V1 sampler rebuilds each penalised request's prompt and output counts from its token lists on
every step. Here they live on the device in the kernels' format (``vllm_ascend.kernels.penalties``: one
word per token and slot, and each slot's list of seen tokens), one slot per penalised request:

- the batch's changes reach :meth:`PenaltyCounts.update` as vLLM's logits processors get them (requests
  added, removed, moved or swapped by ``condense``): a request takes a free slot with its prompt and its
  live output-token list; moves only permute the row-to-slot map;
- at sampling time :meth:`PenaltyCounts.sync` adds what each output list gained since the last step (the
  accepted tokens only: rejected drafts and discarded chunked-prefill samples never enter the lists;
  async placeholders ``-1`` are counted once resolved) and recounts a slot whose list was rewritten;
- :meth:`PenaltyCounts.apply` then applies the penalties in one pass over each row's seen tokens, with a
  row's draft tokens counted on top where the sampler verifies them.

Memory: ``max_num_reqs * (V + min(V, max_model_len))`` int32 on the device, allocated with the batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor.interface import MoveDirectionality
from vllm.v1.sample.metadata import SamplingMetadata

import vllm_ascend.kernels as kernels


def uses_penalties(params: SamplingParams | None) -> bool:
    """Whether a request's sampling parameters ask for any of the three penalties."""
    return params is not None and (
        params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
    )


class PenaltyCounts:
    """Per-request prompt marks and output counts on ``device``, for the rows of a persistent batch."""

    def __init__(self, max_num_reqs: int, vocab_size: int, max_model_len: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.counts = torch.zeros(max_num_reqs, vocab_size, dtype=torch.int32, device=device)
        self.seen = torch.zeros(
            max_num_reqs, min(vocab_size, max_model_len), dtype=torch.int32, device=device
        )
        self.num_seen = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.slot_of_row = np.full(max_num_reqs, -1, dtype=np.int64)
        self._free = list(range(max_num_reqs - 1, -1, -1))
        self._dirty = np.zeros(max_num_reqs, dtype=bool)  # a slot holding counts to clear before reuse
        self._prompts: list[Sequence[int]] = [() for _ in range(max_num_reqs)]
        self._outputs: list[list[int] | None] = [None] * max_num_reqs
        self._counted = np.zeros(max_num_reqs, dtype=np.int64)  # output tokens of the list in the counts
        self._last = np.full(max_num_reqs, -1, dtype=np.int64)  # the last of them (tells a rewritten list)
        self._bound = np.zeros(max_num_reqs, dtype=np.int64)  # upper bound of the slot's seen tokens

    @classmethod
    def from_token_lists(
        cls,
        prompts: Sequence[Sequence[int]],
        outputs: Sequence[list[int]],
        vocab_size: int,
        device: torch.device,
    ) -> PenaltyCounts:
        """Counts for rows ``0..B-1`` from their token lists alone (a batch not kept across steps):
        every row has a slot; prompt entries outside ``[0, V)`` are padding."""
        rows = len(outputs)
        longest = max((len(p) + len(o) for p, o in zip(prompts, outputs, strict=True)), default=0)
        counts = cls(max(rows, 1), vocab_size, max(longest, 1), device)
        for row in range(rows):
            counts._take(row, [t for t in prompts[row] if 0 <= t < vocab_size], outputs[row])
        return counts

    def update(
        self,
        removed: Iterable[int],
        added: Iterable[tuple[int, SamplingParams | None, Sequence[int] | None, list[int]]],
        moved: Iterable[tuple[int, int, MoveDirectionality]],
    ) -> None:
        """A batch change, in vLLM's ``BatchUpdate`` terms and order (removed, added, moved): an added
        request replaces whatever was at its row; a one-way move leaves its source row empty."""
        for row in removed:
            self._release(row)
        for row, params, prompt, output in added:
            self._release(row)
            if uses_penalties(params):
                self._take(row, prompt or (), output)
        for a, b, direction in moved:
            if direction == MoveDirectionality.SWAP:
                self.slot_of_row[[a, b]] = self.slot_of_row[[b, a]]
            else:
                self._release(b)
                self.slot_of_row[b], self.slot_of_row[a] = self.slot_of_row[a], -1

    def _take(self, row: int, prompt: Sequence[int], output: list[int]) -> None:
        slot = self._free.pop()
        self.slot_of_row[row] = slot
        self._prompts[slot] = prompt
        self._outputs[slot] = output
        self._counted[slot] = -1  # nothing counted, not even the prompt

    def _release(self, row: int) -> None:
        slot = int(self.slot_of_row[row])
        if slot >= 0:
            self.slot_of_row[row] = -1
            self._outputs[slot] = None
            self._free.append(slot)

    def sync(self) -> None:
        """Add to the device counts every output token the live lists gained since the last call (and
        the prompt of a request new to its slot); clear and recount a slot whose list was rewritten."""
        clear: list[int] = []
        slots: list[int] = []
        tokens: list[int] = []
        prompt_flags: list[bool] = []
        for slot in self.slot_of_row[self.slot_of_row >= 0].tolist():
            output = self._outputs[slot]
            assert output is not None
            done = int(self._counted[slot])
            if done > 0 and (len(output) < done or output[done - 1] != self._last[slot]):
                done = -1  # the list was cut or rewritten (e.g. tokens discarded after a KV-load failure)
            if done < 0:
                if self._dirty[slot]:
                    clear.append(slot)
                prompt = self._prompts[slot]
                slots.extend([slot] * len(prompt))
                tokens.extend(prompt)
                prompt_flags.extend([True] * len(prompt))
                self._bound[slot] = len(prompt)
                self._dirty[slot] = True
                done = 0
            end = len(output)
            if -1 in output[done:]:
                end = output.index(-1, done)  # async placeholders: counted once resolved
            new = output[done:end]
            slots.extend([slot] * len(new))
            tokens.extend(new)
            prompt_flags.extend([False] * len(new))
            self._counted[slot] = end
            self._last[slot] = output[end - 1] if end else -1
            self._bound[slot] += len(new)
        if clear:
            kernels.penalty_counts_clear(
                self.counts,
                self.seen,
                self.num_seen,
                torch.tensor(clear, dtype=torch.int64, device=self.device),
            )
        if tokens:
            kernels.penalty_counts_add(
                self.counts,
                self.seen,
                self.num_seen,
                torch.tensor(slots, dtype=torch.int64, device=self.device),
                torch.tensor(tokens, dtype=torch.int64, device=self.device),
                torch.tensor(prompt_flags, dtype=torch.bool, device=self.device),
            )

    def apply(
        self,
        logits: torch.Tensor,
        rows: Sequence[int] | np.ndarray,
        repetition: torch.Tensor,
        frequency: torch.Tensor,
        presence: torch.Tensor,
        extra_output_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Penalise ``logits`` in place: row ``i`` is batch row ``rows[i]`` (penalties ``[len(rows)]``
        per logits row); ``extra_output_ids`` ``[len(rows), K]``: tokens counted as outputs of that
        logits row on top of its request's (draft tokens; ``-1`` pads)."""
        slot_np = self.slot_of_row[np.asarray(rows, dtype=np.int64)]
        live = slot_np[slot_np >= 0]
        if not live.size:
            return logits
        slots = torch.from_numpy(slot_np).to(self.device)
        max_seen = int(self._bound[live].max())
        return kernels.apply_penalties(
            logits,
            slots,
            self.counts,
            self.seen,
            self.num_seen,
            repetition,
            frequency,
            presence,
            extra_output_ids,
            max_seen,
        )


@dataclass
class KeptCountsMetadata(SamplingMetadata):
    """vLLM's V1 sampling metadata carrying the persistent batch's :class:`PenaltyCounts` (rows are batch
    rows); ``dataclasses.replace`` keeps them."""

    penalty_counts: PenaltyCounts | None = None
