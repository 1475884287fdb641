"""``method="ngram_gpu"`` on Ascend: prompt lookup for the whole batch on the device.

vLLM's runner keeps, for ``ngram_gpu``, every request's tokens in a device tensor
(``token_ids_gpu_tensor [max_num_reqs, max_model_len]``, new requests copied in, lengths synced each
step), turns the step's sampled tokens into per-row valid tokens and counts on the device
(``update_token_ids_ngram``, inherited) and asks its drafter for ``(drafts, valid counts)`` tensors,
which it copies to the host asynchronously and uses to trim the scheduled drafts. Our runner builds
:class:`NgramDeviceProposer` where vLLM's runner builds its ``NgramProposerGPU`` (the class is a
subclass, so vLLM's type checks hold); its ``propose`` appends the sampled tokens to the device
history and drafts with ascend-kernels' ``ngram_propose`` (Triton on the NPU, the torch reference
elsewhere): the search of the CPU :class:`~vllm_ascend.specdecode.ngram.NgramProposer` (longest
n-gram, most recent occurrence, never past ``max_model_len``), with no host round trip.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.v1.spec_decode.ngram_proposer_gpu import NgramProposerGPU

from vllm_ascend import kernels
from vllm_ascend.kernels.ngram import ngram_warmup
from vllm_ascend.specdecode.ngram import NgramConfigError, NgramProposer


class NgramDeviceProposer(NgramProposerGPU):
    """Batched prompt-lookup drafter on the device, standing in for vLLM's ``NgramProposerGPU``.

    ``min_n``/``max_n`` (``prompt_lookup_min``/``max``), ``k`` (``num_speculative_tokens``) and
    ``max_model_len`` are validated as for the CPU ``NgramProposer`` (:class:`NgramConfigError`)."""

    #: The vLLM class this one stands in for: the runner binds that name in vLLM's runner to this class
    #: while vLLM's runner builds its drafter, then lets vLLM's runner drive it.
    replaces: ClassVar[str] = "NgramProposerGPU"

    def __init__(self, vllm_config: Any, device: torch.device, runner: Any = None) -> None:
        # NgramProposerGPU.__init__ is not called: it compiles vLLM's own torch search.
        config = NgramProposer.from_vllm_config(vllm_config)
        self.min_n, self.max_n, self.k = config.min_n, config.max_n, config.k
        self.max_model_len = config.max_model_len
        self.device = torch.device(device)
        self.vocab_size = vllm_config.model_config.get_vocab_size()

    def __repr__(self) -> str:
        return (
            f"NgramDeviceProposer(min_n={self.min_n}, max_n={self.max_n}, k={self.k}, "
            f"max_model_len={self.max_model_len}, device={self.device})"
        )

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No weights to load: compiles the kernel instead (one dummy batch), before serving."""
        ngram_warmup(self.device, self.vocab_size, ())

    def propose(
        self,
        num_speculative_tokens: int,
        num_tokens_no_spec: torch.Tensor,
        token_ids_gpu: torch.Tensor,
        valid_sampled_token_ids_gpu: torch.Tensor,
        valid_sampled_tokens_count: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append each row's valid sampled tokens to its history in ``token_ids_gpu`` (in place) and
        draft ``num_speculative_tokens`` tokens per row; rows that sampled nothing get no draft.

        ``num_tokens_no_spec``: ``[B]`` history lengths before this step's tokens;
        ``valid_sampled_token_ids_gpu``: ``[B, W]``, each row's ``valid_sampled_tokens_count`` valid
        tokens first. Returns ``(drafts [B, num_speculative_tokens] int64 padded with -1, counts [B]
        int32)``, on the device."""
        if type(num_speculative_tokens) is not int or not 1 <= num_speculative_tokens <= self.k:
            raise NgramConfigError(
                f"num_speculative_tokens must be an int in [1, {self.k}], got {num_speculative_tokens!r}"
            )
        rows = num_tokens_no_spec.shape[0]
        history = token_ids_gpu[:rows]
        counts = valid_sampled_tokens_count[:rows].to(torch.int64)
        lengths = num_tokens_no_spec.to(torch.int64)
        append_tokens(history, lengths, valid_sampled_token_ids_gpu[:rows], counts)
        total = torch.where(counts > 0, lengths + counts, 0)
        return kernels.ngram_propose(
            history, total, self.min_n, self.max_n, num_speculative_tokens, self.max_model_len
        )


def append_tokens(
    history: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor
) -> None:
    """Write ``tokens[i, :counts[i]]`` at ``history[i, lengths[i]:]`` (what fits in the row), without a
    host synchronisation: each row rewrites one window of distinct columns starting at
    ``min(lengths[i], L - W)``, with its new tokens where they go and the old values elsewhere."""
    cols = history.shape[1]
    width = min(tokens.shape[1], cols)
    if width == 0:
        return
    offs = torch.arange(width, device=history.device)
    start = lengths.clamp(0, cols - width).unsqueeze(1)
    where = start + offs  # [B, W] distinct in-row columns
    source = where - lengths.unsqueeze(1)  # index into the row's new tokens
    fresh = (source >= 0) & (source < counts.unsqueeze(1))
    new = tokens.gather(1, source.clamp(0, tokens.shape[1] - 1)).to(history.dtype)
    history.scatter_(1, where, torch.where(fresh, new, history.gather(1, where)))
