"""AscendPunicaWrapper against float64 equations of vLLM's punica semantics, through vLLM's own mapping
(``LoRAMapping`` -> ``update_metadata``): linear with merged slices, embedding, logits, decode and prefill."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.layers.utils import LoRAMapping

from vllm_ascend.runner.punica_wrapper import AscendPunicaWrapper

#: Adapter ids per token (0: none) for three requests of 3, 1 and 2 tokens; slots hold ids 7, 5, 9.
TOKEN_IDS = (7, 7, 7, 0, 9, 9)
REQUEST_IDS = (7, 0, 9)
SLOTS = [7, 5, 9, None]
RANK, HIDDEN, VOCAB = 8, 24, 40


def _wrapper(is_prefill: bool) -> AscendPunicaWrapper:
    wrapper = AscendPunicaWrapper(64, 8, "cpu")
    mapping = LoRAMapping(TOKEN_IDS, REQUEST_IDS, is_prefill=is_prefill)
    wrapper.update_metadata(mapping, SLOTS, max_loras=4, vocab_size=VOCAB)
    return wrapper


def _slot(adapter_id: int) -> int:
    return SLOTS.index(adapter_id) if adapter_id else -1


@pytest.mark.parametrize("is_prefill", [True, False])
def test_linear_with_merged_slices_matches_the_equation(is_prefill):
    gen = torch.Generator().manual_seed(0)
    slices = (16, 8, 8)
    a = tuple(torch.randn(4, 1, RANK, HIDDEN, generator=gen) for _ in slices)
    b = tuple(torch.randn(4, 1, width, RANK, generator=gen) for width in slices)
    x = torch.randn(len(TOKEN_IDS), HIDDEN, generator=gen)
    y = torch.randn(len(TOKEN_IDS), sum(slices), generator=gen)
    want = y.double().clone()
    for t, adapter in enumerate(TOKEN_IDS):
        if adapter:
            s = _slot(adapter)
            want[t] += torch.cat(
                [
                    0.5 * x[t].double() @ ai[s, 0].double().T @ bi[s, 0].double().T
                    for ai, bi in zip(a, b, strict=True)
                ]
            )
    _wrapper(is_prefill).add_lora_linear(y, x, a, b, 0.5, slices)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("is_prefill", [True, False])
def test_embedding_adds_each_tokens_adapter(is_prefill):
    gen = torch.Generator().manual_seed(1)
    b = torch.randn(4, 1, HIDDEN, RANK, generator=gen)
    x = torch.randn(len(TOKEN_IDS), RANK, generator=gen)
    y = torch.randn(len(TOKEN_IDS), HIDDEN, generator=gen)
    want = y.double().clone()
    for t, adapter in enumerate(TOKEN_IDS):
        if adapter:
            want[t] += x[t].double() @ b[_slot(adapter), 0].double().T
    _wrapper(is_prefill).add_lora_embedding(y, x, b, add_inputs=True)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)


def test_logits_use_each_requests_adapter_and_drop_padded_vocabulary():
    """One row per request (``sampler_indices``); B carries a padded vocabulary wider than the logits."""
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(4, 1, RANK, HIDDEN, generator=gen)
    b = torch.randn(4, 1, VOCAB + 24, RANK, generator=gen)
    x = torch.randn(len(REQUEST_IDS), HIDDEN, generator=gen)
    y = torch.randn(len(REQUEST_IDS), VOCAB, generator=gen)
    want = y.double().clone()
    for r, adapter in enumerate(REQUEST_IDS):
        if adapter:
            s = _slot(adapter)
            want[r] += 2.0 * x[r].double() @ a[s, 0].double().T @ b[s, 0, :VOCAB].double().T
    _wrapper(False).add_lora_logits(y, x, a, b, 2.0)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)


def test_both_platforms_hand_vllm_this_wrapper(monkeypatch):
    """The worker names the wrapper; core's platforms read it (the reference device no longer gets vLLM's CPU one)."""
    from vllm_ascend.core.platform import NPUPlatform, ReferencePlatform

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    for platform in (ReferencePlatform, NPUPlatform):
        assert platform.get_punica_wrapper() == "vllm_ascend.runner.punica_wrapper.AscendPunicaWrapper"


def test_full_linear_replaces_the_rows_of_enabled_adapters():
    """Classifier heads an adapter replaces: ``x @ W^T + b`` for requests whose adapter enables the module,
    the base output for the others (no adapter, or an adapter with the module disabled)."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(4, 1, 6, HIDDEN, generator=gen)
    bias = torch.randn(4, 6, generator=gen)
    enabled = torch.tensor([True, True, False, False])
    x = torch.randn(len(REQUEST_IDS), HIDDEN, generator=gen)
    y = torch.randn(len(REQUEST_IDS), 6, generator=gen)
    want = y.double().clone()
    for r, adapter in enumerate(REQUEST_IDS):
        if adapter and enabled[_slot(adapter)]:
            s = _slot(adapter)
            want[r] = x[r].double() @ weight[s, 0].double().T + bias[s].double()
    _wrapper(False).apply_lora_full_linear(y, x, weight, bias, enabled)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
