"""The on-device n-gram drafter (specdecode's ``NgramDeviceProposer`` over kernels' ``ngram_propose``)
drafts what the CPU ``NgramProposer`` drafts on the same history, after appending the step's tokens
to the device history as vLLM's runner hands them over."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from vllm_ascend.kernels import ngram as kernel_module
from vllm_ascend.specdecode.ngram import NgramConfigError, NgramProposer
from vllm_ascend.specdecode.ngram_device import NgramDeviceProposer


def _config(min_n=2, max_n=3, k=4, max_model_len=64):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(
            prompt_lookup_min=min_n, prompt_lookup_max=max_n, num_speculative_tokens=k
        ),
        model_config=SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: 100),
    )


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"torch seed {seed}")
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("min_n, max_n, k, spec_k", [(1, 3, 4, 4), (2, 3, 4, 2), (2, 5, 3, 3)])
def test_propose_appends_the_sampled_tokens_and_drafts_as_the_cpu_proposer(gen, min_n, max_n, k, spec_k):
    rows, cols, width, limit = 7, 40, k + 1, 38
    drafter = NgramDeviceProposer(_config(min_n, max_n, k, limit), torch.device("cpu"))
    cpu = NgramProposer(min_n, max_n, k, limit)
    for _ in range(5):
        history = torch.randint(0, 4, (rows, cols), generator=gen, dtype=torch.int32)
        lengths = torch.randint(1, cols + 1, (rows,), generator=gen, dtype=torch.int32)
        lengths[0], lengths[1] = cols - 2, cols  # appending past the row's end
        counts = torch.randint(0, width + 1, (rows,), generator=gen, dtype=torch.int32)
        counts[0], counts[2] = width, 0  # row 2 sampled nothing this step: no draft
        sampled = torch.randint(0, 4, (rows, width), generator=gen, dtype=torch.int32)
        sampled[torch.arange(width) >= counts.unsqueeze(1)] = -1
        want = history.clone()
        for row in range(rows):
            n, c = int(lengths[row]), int(counts[row])
            fits = max(0, min(c, cols - n))
            want[row, n : n + fits] = sampled[row, :fits]
        total = torch.where(counts > 0, (lengths + counts).clamp(max=cols), 0)
        want_drafts, want_counts = cpu.propose_batch(want.numpy(), total.numpy(), k=spec_k)

        drafts, got_counts = drafter.propose(spec_k, lengths, history, sampled, counts)
        assert torch.equal(history, want)  # the step's tokens appended in place, nothing else touched
        assert drafts.tolist() == want_drafts.tolist() and got_counts.tolist() == want_counts.tolist()
        assert got_counts[2] == 0 and drafts.shape == (rows, spec_k)


def test_the_draft_width_and_the_config_are_checked():
    drafter = NgramDeviceProposer(_config(k=3), "cpu")
    args = (torch.ones(1, dtype=torch.int32), torch.zeros(1, 8, dtype=torch.int32))
    tail = (torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    for bad in (0, 4, 2.0):
        with pytest.raises(
            NgramConfigError, match=rf"num_speculative_tokens must be an int in \[1, 3\], got {bad}"
        ):
            drafter.propose(bad, *args, *tail)
    with pytest.raises(NgramConfigError, match=r"min_n \(4\) must be <= max_n \(3\)"):
        NgramDeviceProposer(_config(min_n=4, max_n=3), "cpu")
    assert repr(drafter) == "NgramDeviceProposer(min_n=2, max_n=3, k=3, max_model_len=64, device=cpu)"


def test_load_model_compiles_the_kernel_once(monkeypatch):
    calls = []
    real = kernel_module.ngram_propose
    monkeypatch.setattr(kernel_module, "ngram_propose", lambda *a: calls.append(a[0].shape) or real(*a))
    NgramDeviceProposer(_config(), "cpu").load_model(object())
    assert len(calls) == 1
