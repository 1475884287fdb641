"""The reference ``mrope`` against a float64 per-frequency oracle: chunked (Qwen2-VL / Qwen2.5-VL) and
interleaved (Qwen3-VL) sections, neox and GPT-J rotation, text-only positions, and the argument checks."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor

HEAD, ROT, SECTION = 16, 12, [2, 2, 2]


def _cache(max_pos: int = 40) -> torch.Tensor:
    inv = 1.0 / 10000 ** (torch.arange(0, ROT, 2, dtype=torch.float64) / ROT)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    return torch.cat((freqs.cos(), freqs.sin()), -1).float()


def _axis(freq: int, interleaved: bool) -> int:
    """Which of T/H/W position frequency ``freq`` reads."""
    t, h, w = SECTION
    if interleaved:
        if freq % 3 == 1 and freq < 3 * h:
            return 1
        if freq % 3 == 2 and freq < 3 * w:
            return 2
        return 0
    return 0 if freq < t else 1 if freq < t + h else 2


def _oracle(positions, x, cache, is_neox, interleaved):
    out = x.double().clone().view(x.shape[0], -1, HEAD)
    half = ROT // 2
    for token in range(x.shape[0]):
        for freq in range(half):
            pos = positions[token] if positions.dim() == 1 else positions[_axis(freq, interleaved), token]
            cos, sin = cache[pos, freq].double(), cache[pos, half + freq].double()
            i, j = (freq, half + freq) if is_neox else (2 * freq, 2 * freq + 1)
            a, b = out[token, :, i].clone(), out[token, :, j].clone()
            out[token, :, i], out[token, :, j] = a * cos - b * sin, b * cos + a * sin
    return out.view(x.shape)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("is_neox", [True, False])
def test_mrope_equals_the_per_frequency_oracle(interleaved, is_neox):
    torch.manual_seed(0)
    cache, positions = _cache(), torch.randint(0, 40, (3, 7))
    q, k = torch.randn(7, 4 * HEAD), torch.randn(7, 2 * HEAD)
    got_q, got_k = ReferenceDeviceAdaptor().mrope(positions, q, k, HEAD, cache, SECTION, is_neox, interleaved)
    torch.testing.assert_close(got_q.double(), _oracle(positions, q, cache, is_neox, interleaved))
    torch.testing.assert_close(got_k.double(), _oracle(positions, k, cache, is_neox, interleaved))
    assert torch.equal(got_q[:, ROT:HEAD], q[:, ROT:HEAD])  # dims past rot_dim pass through


def test_text_positions_rotate_like_rotary_embedding():
    ref = ReferenceDeviceAdaptor()
    cache, positions = _cache(), torch.tensor([0, 3, 9, 39])
    q, k = torch.randn(4, 2 * HEAD), torch.randn(4, HEAD)
    got = ref.mrope(positions, q, k, HEAD, cache, SECTION, True, True)
    want = ref.rotary_embedding(positions, q, k, HEAD, cache, True)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    # equal T/H/W positions are text positions, whatever the sections
    same = ref.mrope(positions.expand(3, 4), q, k, HEAD, cache, SECTION, True, False)
    assert all(torch.equal(g, w) for g, w in zip(same, want, strict=True))


@pytest.mark.parametrize(
    ("positions", "section", "message"),
    [
        (torch.zeros(2, 4, dtype=torch.long), SECTION, "positions must be"),
        (torch.zeros(3, 4, dtype=torch.long), [2, 2, 3], "summing to rot_dim // 2 = 6"),
        (torch.zeros(3, 4, dtype=torch.long), [6, 0], "3 non-negative ints"),
    ],
)
def test_mrope_refuses_bad_arguments(positions, section, message):
    with pytest.raises(DeviceOpError, match=message):
        ReferenceDeviceAdaptor().mrope(
            positions, torch.randn(4, HEAD), torch.randn(4, HEAD), HEAD, _cache(), section, True, False
        )
