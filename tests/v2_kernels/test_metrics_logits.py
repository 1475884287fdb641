"""V2 NaN-count override against vLLM's own kernel (run in Triton's interpreter)."""

from __future__ import annotations

import types

import pytest
import torch

from vllm_ascend.kernels.v2 import metrics_logits as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import _namespace, clone_args, vllm_kernel

_MODULE = "vllm.v1.worker.gpu.metrics.logits"


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)
    # Triton's interpreter has no libdevice (its functions are stubs resolved by a GPU backend): the
    # kernel's ``libdevice.isnan`` is read as the IEEE test ``x != x``.
    monkeypatch.setitem(_namespace(_MODULE), "libdevice", types.SimpleNamespace(isnan=lambda x: x != x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_reqs", "vocab", "block"), [(0, 40, 16), (1, 40, 16), (5, 100, 32)])
def test_num_nans_matches_vllm(num_reqs: int, vocab: int, block: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(num_reqs + vocab)
    logits = torch.randn(num_reqs, vocab + 3, generator=g)
    logits[torch.rand(num_reqs, vocab + 3, generator=g) < 0.2] = float("nan")
    logits[:, -3:] = float("nan")  # past vocab_size: not counted
    args = {
        "logits_ptr": logits.to(dtype),
        "logits_stride": vocab + 3,
        "num_nans_ptr": torch.full((num_reqs + 2,), -7, dtype=torch.int32),
        "vocab_size": vocab,
        "BLOCK_SIZE": block,
    }
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._num_nans_kernel")((num_reqs,), **expected)
    v2.num_nans_torch((num_reqs,), **args)
    assert torch.equal(args["num_nans_ptr"], expected["num_nans_ptr"])
    assert torch.equal(args["num_nans_ptr"][:num_reqs], logits[:, :vocab].isnan().sum(-1).int())
