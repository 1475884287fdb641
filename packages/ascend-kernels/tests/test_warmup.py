"""Warm-up runs every built-in item, tolerates and reports failures, and rejects unknown names."""

from __future__ import annotations

import logging

import pytest
import torch

from vllm_ascend.kernels import warmup


def test_kernel_warmup_runs_the_built_in_items():
    assert warmup.kernel_warmup("cpu", 64, (torch.float32, torch.bfloat16)) == {
        "sampling": True,
        "penalties": True,
    }


def test_a_failing_item_is_logged_and_the_rest_continue(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(warmup, "_REGISTERED", {})

    def broken(device, vocab_size, dtypes):
        raise RuntimeError("no kernel for you")

    warmup.register_warmup("rejection", broken)
    warmup.register_warmup(
        "qk_rms", lambda device, vocab_size, dtypes: calls.append((device.type, vocab_size))
    )
    plugin_logger = logging.getLogger("vllm_ascend")  # does not propagate to the root logger
    plugin_logger.addHandler(caplog.handler)
    try:
        result = warmup.kernel_warmup("cpu", 32, include=("rejection", "qk_rms"))
    finally:
        plugin_logger.removeHandler(caplog.handler)
    assert result == {"rejection": False, "qk_rms": True}
    assert calls == [("cpu", 32)]
    assert "kernel warm-up 'rejection' failed" in caplog.text


def test_unknown_items_are_rejected():
    with pytest.raises(ValueError, match=r"unknown warm-up items \['nope'\]"):
        warmup.kernel_warmup("cpu", 32, include=("nope",))


def test_compiled_triton_warms_both_tile_variants(monkeypatch):
    from vllm_ascend.kernels._triton import common

    cpu = torch.device("cpu")
    assert warmup._batch_sizes(cpu) == (2,)  # interpreter: one variant
    monkeypatch.setattr(common, "IS_INTERPRETED", False)
    # small-batch tiles, split rows, unsplit rows below and above SMALL_BATCH_ROWS (32 "SMs" off CUDA)
    assert common.multiprocessors(cpu) == 32
    assert warmup._batch_sizes(cpu) == (2, 32, common.SMALL_BATCH_ROWS + 1)
    monkeypatch.setenv("VLLM_ASCEND_KERNEL_BACKEND", "torch")
    assert warmup._batch_sizes(cpu) == (2,)
