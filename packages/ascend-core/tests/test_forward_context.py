"""Forward context, MoE communication selection, MC2 capacity/mask and batch-invariant reductions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend.core import batch_invariant as bi
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.forward_context import (
    get_ascend_forward_context,
    is_ascend_forward_context_available,
    mc2_capacity_for,
    override_in_profile_run,
    set_ascend_forward_context,
)
from vllm_ascend.core.moe_comm import (
    MoECommType,
    compute_mc2_tokens_capacity,
    get_mc2_tokens_capacity,
    reset_mc2_state,
    select_moe_comm_method,
    set_mc2_mask,
    set_mc2_tokens_capacity,
)

AG, A2A, MC2, NAIVE = (
    MoECommType.ALLGATHER,
    MoECommType.ALLTOALL,
    MoECommType.MC2,
    MoECommType.NAIVE_MULTICAST,
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("VLLM_ASCEND_MOE_COMM_METHOD", raising=False)
    monkeypatch.delenv("VLLM_ASCEND_BATCH_INVARIANT", raising=False)
    reset_mc2_state()
    yield
    reset_mc2_state()
    bi._enabled = None


# ---- MoE communication method ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "family", "ep", "dp", "expected"),
    [
        (8, "310P", 16, 1, AG),  # 310P: no MC2, no all-to-all
        (8, "A3", 1, 1, AG),  # no EP, one DP rank
        (8, "A3", 1, 4, NAIVE),  # no EP across DP ranks
        (8, "A2", 16, 1, MC2),  # A2 MC2 only from 16 EP ranks (two nodes)
        (8, "A2", 8, 1, AG),
        (300, "A2", 16, 1, AG),  # beyond MC2 capacity: A2 prefers all-gather
        (8, "A3", 4, 1, MC2),
        (256, "A3", 4, 1, MC2),  # exactly the capacity
        (257, "A3", 4, 1, A2A),
        (8, AscendDeviceType.A5, 2, 1, MC2),
        (4096, "A5", 2, 1, A2A),
        (8, None, 4, 1, A2A),  # reference device: no MC2 kernel
    ],
)
def test_select_moe_comm_method_rules(tokens, family, ep, dp, expected):
    assert select_moe_comm_method(tokens, family, ep, dp, mc2_capacity=256) is expected


def test_forced_method_from_environment_and_argument(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_MOE_COMM_METHOD", "alltoall")
    assert select_moe_comm_method(8, "A3", 4, mc2_capacity=256) is A2A
    assert select_moe_comm_method(8, "A3", 4, mc2_capacity=256, forced="auto") is MC2
    assert select_moe_comm_method(8, "A3", 4, mc2_capacity=256, forced="allgather") is AG


@pytest.mark.parametrize(
    ("forced", "family", "ep", "tokens", "message"),
    [
        (
            "mc2",
            "310P",
            4,
            8,
            "MoE comm method 'mc2' is not available on 310P; allowed: allgather, naive_multicast",
        ),
        (
            "mc2",
            None,
            4,
            8,
            "MoE comm method 'mc2' is not available on the reference device; allowed: allgather, alltoall, naive_multicast",
        ),
        ("alltoall", "A3", 1, 8, "MoE comm method 'alltoall' needs expert parallelism (ep_size > 1)"),
        ("mc2", "A3", 4, 300, "MoE comm method 'mc2' cannot carry 300 tokens: MC2 capacity is 256"),
        (
            "ring",
            "A3",
            4,
            8,
            "MoE comm method 'ring' is unknown; allowed: auto, allgather, alltoall, mc2, naive_multicast",
        ),
    ],
)
def test_forced_method_is_checked(forced, family, ep, tokens, message):
    with pytest.raises(ValueError) as info:
        select_moe_comm_method(tokens, family, ep, mc2_capacity=256, forced=forced)
    assert str(info.value) == message


def test_select_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"ep_size=0 \(>= 1\)"):
        select_moe_comm_method(8, "A3", 0)
    with pytest.raises(ValueError, match="unknown SOC_VERSION 'B9'"):
        select_moe_comm_method(8, "B9", 2)


# ---- MC2 capacity and mask ------------------------------------------------------------------


def test_mc2_capacity():
    assert compute_mc2_tokens_capacity(256) == 256
    assert compute_mc2_tokens_capacity(100, num_speculative_tokens=1, tp_size=4) == 200
    assert compute_mc2_tokens_capacity(100, num_speculative_tokens=1, tp_size=3) == 201
    assert compute_mc2_tokens_capacity(256, 3, tp_size=3, max_num_batched_tokens=128) == 129
    with pytest.raises(ValueError, match=r"max_num_seqs=0 \(>= 1\)"):
        compute_mc2_tokens_capacity(0)


def test_mc2_mask_marks_real_tokens_and_splits_over_tp():
    with pytest.raises(RuntimeError, match="MC2 capacity is not set"):
        set_mc2_mask(1, 2)
    set_mc2_tokens_capacity(16)
    assert get_mc2_tokens_capacity() == 16
    assert set_mc2_mask(5, 8).tolist() == [True] * 5 + [False] * 3
    assert set_mc2_mask(5, 8, tp_size=2, tp_rank=0).tolist() == [True] * 4
    assert set_mc2_mask(5, 8, tp_size=2, tp_rank=1).tolist() == [True, False, False, False]
    assert set_mc2_mask(0, 4).tolist() == [False] * 4
    with pytest.raises(ValueError) as info:
        set_mc2_mask(9, 8)
    assert (
        str(info.value)
        == "MC2 mask needs 0 <= num_actual_tokens (9) <= num_padded_tokens (8) <= capacity (16)"
    )
    with pytest.raises(ValueError, match=r"num_padded_tokens=9 must split evenly over tp_size=2"):
        set_mc2_mask(5, 9, tp_size=2)
    with pytest.raises(ValueError, match="MC2 tokens capacity must be >= 1, got 0"):
        set_mc2_tokens_capacity(0)


# ---- forward context ------------------------------------------------------------------------


def _cfg(tp=1, dp=1, ep=False, moe=None, max_num_seqs=64, spec=None):
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            tensor_parallel_size=tp, data_parallel_size=dp, enable_expert_parallel=ep, is_moe_model=moe
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=4096),
        speculative_config=None if spec is None else SimpleNamespace(num_speculative_tokens=spec),
    )


def test_context_state_and_proxy():
    assert not is_ascend_forward_context_available()
    with pytest.raises(RuntimeError, match="no forward context is set \\(reading 'num_tokens'\\)"):
        get_ascend_forward_context().num_tokens  # noqa: B018
    tokens_dp = torch.tensor([3, 7], dtype=torch.int32)
    with set_ascend_forward_context(
        {"l0": "meta"},
        _cfg(dp=2),
        7,
        num_actual_tokens=5,
        num_tokens_across_dp=tokens_dp,
        with_prefill=False,
        family="A3",
    ) as state:
        ctx = get_ascend_forward_context()
        assert is_ascend_forward_context_available()
        assert (ctx.num_tokens, ctx.num_actual_tokens, ctx.max_tokens_across_dp) == (7, 5, 7)
        assert ctx.attn_metadata == {"l0": "meta"} and ctx.with_prefill is False
        assert ctx.moe_comm_type is NAIVE  # no EP across two DP ranks
        ctx.prefetch_stream = "s1"  # unknown names go to the extras
        assert state.extra == {"prefetch_stream": "s1"} and ctx.prefetch_stream == "s1"
        ctx.in_profile_run = True
        assert state.in_profile_run is True
        with pytest.raises(AttributeError, match="the forward context has no attribute 'missing'"):
            ctx.missing  # noqa: B018
    assert not is_ascend_forward_context_available()


def test_mc2_forward_gets_capacity_and_mask():
    cfg = _cfg(tp=2, ep=True, max_num_seqs=16, spec=1)  # capacity 16 × 2 = 32 tokens
    assert mc2_capacity_for(cfg) == 32
    with set_ascend_forward_context(None, cfg, 7, num_actual_tokens=6, family="A3", tp_rank=1) as state:
        assert get_mc2_tokens_capacity() == 32
        assert state.moe_comm_type is MC2
        assert state.mc2_mask.tolist() == [True, True, False, False]  # padded to 8: rank 1 holds tokens 4..7
    with set_ascend_forward_context(None, cfg, 64, family="A3") as state:
        assert state.moe_comm_type is A2A and state.mc2_mask is None


def test_dense_models_get_no_moe_method_and_nesting_restores():
    with set_ascend_forward_context(None, _cfg(moe=False), 4) as outer:
        assert outer.moe_comm_type is None
        with set_ascend_forward_context(None, None, 2) as inner:
            assert get_ascend_forward_context().num_tokens == 2 and inner.moe_comm_type is None
        assert get_ascend_forward_context().num_tokens == 4


def test_override_in_profile_run():
    with pytest.raises(
        RuntimeError, match="override_in_profile_run needs an active set_ascend_forward_context"
    ):
        with override_in_profile_run():
            pass
    with set_ascend_forward_context(None, None, 1):
        ctx = get_ascend_forward_context()
        with override_in_profile_run():
            assert ctx.in_profile_run is True
        assert ctx.in_profile_run is False


def test_vllm_arguments_need_a_vllm_config():
    with pytest.raises(TypeError, match="unexpected arguments without a vLLM VllmConfig: skip_compiled"):
        with set_ascend_forward_context(None, _cfg(), 1, skip_compiled=True):
            pass


def test_wraps_vllm_set_forward_context():
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig
    from vllm.config.compilation import CUDAGraphMode
    from vllm.forward_context import get_forward_context, is_forward_context_available

    cfg = VllmConfig()
    with set_ascend_forward_context({"layer": 1}, cfg, 8, family="A3") as state:
        vctx = get_forward_context()
        assert vctx.additional_kwargs["ascend"] is state
        assert vctx.attn_metadata == {"layer": 1}
        ctx = get_ascend_forward_context()
        assert ctx.num_tokens == 8
        assert ctx.cudagraph_runtime_mode is CUDAGraphMode.NONE  # read through from vLLM's context
        vctx.additional_kwargs["v2_only"] = 5
        assert ctx.v2_only == 5  # model runner v2 style: additional_kwargs
    assert not is_forward_context_available()


# ---- batch invariance ----------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000, 4099])
def test_reduce_sum_is_batch_invariant_and_accurate(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(37, n, generator=g)
    full = bi.reduce_sum(x)
    for row in (0, 17, 36):
        assert torch.equal(bi.reduce_sum(x[row : row + 1])[0], full[row])
        assert torch.equal(bi.reduce_sum(x[row]), full[row])
    torch.testing.assert_close(full.double(), x.double().sum(-1), rtol=1e-5, atol=1e-4)


def test_reduce_sum_dims_keepdim_and_half():
    x = torch.arange(24.0).reshape(2, 3, 4)
    assert torch.equal(bi.reduce_sum(x, dim=1), x.sum(1))
    assert bi.reduce_sum(x, dim=0, keepdim=True).shape == (1, 3, 4)
    assert bi.reduce_sum(x, dim=-1, keepdim=True).shape == (2, 3, 1)
    h = torch.full((2, 300), 0.1, dtype=torch.float16)
    out = bi.reduce_sum(h)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), h.float().sum(-1), rtol=1e-3, atol=0)


def test_rms_norm_and_add_rms_norm():
    g = torch.Generator().manual_seed(0)
    x, res, w = torch.randn(5, 96, generator=g), torch.randn(5, 96, generator=g), torch.randn(96, generator=g)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(bi.rms_norm(x, w), expected)
    out, summed = bi.add_rms_norm(x, res, w)
    assert torch.equal(summed, x + res)
    torch.testing.assert_close(out, bi.rms_norm(x + res, w))
    assert torch.equal(bi.rms_norm(x[2:3], w)[0], bi.rms_norm(x, w)[2])


def test_mode_switch_and_environment(monkeypatch):
    assert bi.is_batch_invariant() is False
    monkeypatch.setenv("VLLM_ASCEND_BATCH_INVARIANT", "1")
    assert bi.is_batch_invariant() is True
    bi.disable_batch_invariant_mode()
    assert bi.is_batch_invariant() is False
    bi.enable_batch_invariant_mode()
    assert bi.is_batch_invariant() is True


def test_override_envs_and_init(monkeypatch):
    env = {"HCCL_DETERMINISTIC": "false", "OTHER": "x"}
    previous = bi.override_envs_for_invariance(env)
    assert previous == {"HCCL_DETERMINISTIC": "false"}
    assert env == {
        "HCCL_DETERMINISTIC": "true",
        "LCCL_DETERMINISTIC": "1",
        "VLLM_BATCH_INVARIANT": "1",
        "OTHER": "x",
    }
    for key in bi.INVARIANCE_ENV:
        monkeypatch.delenv(key, raising=False)
    assert bi.init_batch_invariance(False) is False
    import os

    assert "HCCL_DETERMINISTIC" not in os.environ
    assert bi.init_batch_invariance(True) is True
    assert os.environ["HCCL_DETERMINISTIC"] == "true" and os.environ["VLLM_BATCH_INVARIANT"] == "1"


def test_mc2_mask_lives_on_the_reference_device_cpu(monkeypatch):
    from vllm_ascend.core.device.config import clear_device_caches

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    clear_device_caches()
    try:
        cfg = _cfg(tp=2, ep=True, max_num_seqs=8)
        with set_ascend_forward_context(None, cfg, 4, num_actual_tokens=3, family="A3", tp_rank=1) as state:
            assert state.moe_comm_type is MC2
            assert state.mc2_mask.device.type == "cpu" and state.mc2_mask.tolist() == [True, False]
    finally:
        clear_device_caches()
