"""The vision-language ops against vLLM's own torch code on the same inputs: ``AscendMMEncoderAttention``
(packed sequences by ``cu_seqlens``, batch rows without), ``AscendMRotaryEmbedding`` (chunked / interleaved
sections, text-only positions) and ``AscendApplyRotaryEmb`` (the vision towers' rope); each calls its device op."""

from __future__ import annotations

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config

from vllm_ascend.core.device.config import clear_device_caches, get_device_adaptor
from vllm_ascend.runner.ops.mm_encoder_attention import AscendMMEncoderAttention
from vllm_ascend.runner.ops.registry import register_custom_ops
from vllm_ascend.runner.ops.rotary_embedding import AscendApplyRotaryEmb, AscendMRotaryEmbedding


@pytest.fixture
def adaptor():
    clear_device_caches()
    register_custom_ops()
    ad = get_device_adaptor()
    ad.reset_counts()
    yield ad
    clear_device_caches()


def test_mm_encoder_attention_equals_vllm_sdpa(adaptor):
    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        attn = AscendMMEncoderAttention(num_heads=4, head_size=16, num_kv_heads=2)
    # one row of packed sequences (an image's windows), with vLLM's padding entries repeating the end
    q, k, v = torch.randn(1, 23, 4, 16), torch.randn(1, 23, 2, 16), torch.randn(1, 23, 2, 16)
    cu = torch.tensor([0, 5, 16, 23, 23], dtype=torch.int32)
    torch.testing.assert_close(attn.forward_oot(q, k, v, cu), attn.forward_native(q, k, v, cu))
    # batch rows, no cu_seqlens: each row one sequence; [B, S, H*D] in, the same layout out
    q3, k3, v3 = torch.randn(3, 7, 64), torch.randn(3, 7, 32), torch.randn(3, 7, 32)
    got = attn.forward_oot(q3, k3, v3)
    assert got.shape == (3, 7, 64)
    torch.testing.assert_close(got, attn.forward_native(q3, k3, v3))
    # batch rows sharing one split
    q2, k2, v2 = torch.randn(2, 9, 4, 16), torch.randn(2, 9, 2, 16), torch.randn(2, 9, 2, 16)
    split = torch.tensor([0, 4, 9], dtype=torch.int32)
    torch.testing.assert_close(attn.forward_oot(q2, k2, v2, split), attn.forward_native(q2, k2, v2, split))
    assert adaptor.call_counts["packed_attention"] == 3


@pytest.mark.parametrize("interleaved", [False, True])
def test_mrope_equals_vllm_mrotary_embedding(adaptor, interleaved):
    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        rope = AscendMRotaryEmbedding(32, 32, 64, 10000.0, True, torch.float32, [4, 6, 6], interleaved)
    q, k = torch.randn(9, 4 * 32), torch.randn(9, 2 * 32)
    for positions in (torch.randint(0, 64, (3, 9)), torch.arange(9)):
        got, want = rope.forward_oot(positions, q, k), rope.forward_native(positions, q, k)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    assert adaptor.call_counts["mrope"] == 2


@pytest.mark.parametrize("is_neox", [True, False])
def test_apply_rotary_emb_equals_vllm(adaptor, is_neox):
    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        op = AscendApplyRotaryEmb(enforce_enable=True, is_neox_style=is_neox)
    cos, sin = torch.randn(7, 8), torch.randn(7, 8)
    for x in (torch.randn(2, 7, 3, 16), torch.randn(7, 3, 16)):
        torch.testing.assert_close(op.forward_oot(x, cos, sin), op.forward_native(x, cos, sin))
    with pytest.raises(ValueError, match=r"cos/sin must be \[seq_len=7, head_size/2=8\]"):
        op.forward_oot(torch.randn(7, 3, 16), cos[:, :4], sin[:, :4])
    assert adaptor.call_counts["rotary_embedding"] == 2
