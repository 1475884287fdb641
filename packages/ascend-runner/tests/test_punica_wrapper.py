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
def test_linear_with_merged_slices_matches_the_equation(is_prefill, monkeypatch):
    """All slices in one shrink and one expand call (the kernels' ``_slices`` forms), on the equation."""
    from vllm_ascend.kernels import lora

    launched: list[str] = []
    dispatch = lora.dispatch

    def recording(module, name, reference, device):
        launched.append(name)
        return dispatch(module, name, reference, device)

    monkeypatch.setattr(lora, "dispatch", recording)
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
    form = (
        ("lora_shrink_slices", "lora_expand_slices")
        if is_prefill
        else (
            "lora_shrink_tokens_slices",
            "lora_expand_tokens_slices",
        )
    )
    assert launched == list(form)


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


def _linear_equation(x, a, b, y, scale, tokens=TOKEN_IDS):
    """``y + scale * x @ A^T @ B^T`` per token's adapter slot (float64), the slices side by side."""
    want = y.double().clone()
    for t, adapter in enumerate(tokens):
        if adapter:
            s = _slot(adapter)
            want[t] += torch.cat(
                [
                    scale * x[t].double() @ ai[s, 0].double().T @ bi[s, 0].double().T
                    for ai, bi in zip(a, b, strict=True)
                ]
            )
    return want


@pytest.mark.parametrize("is_prefill", [True, False])
def test_fully_sharded_tp2_call_patterns_add_up_to_the_equation(is_prefill):
    """vLLM's fully sharded LoRA layers over two ranks, simulated in one process. Column-parallel: each rank
    shrinks with its half of A's rank into a [slices, T, rank/2] buffer, the halves are concatenated (the
    all-gather), and the full rank expands. Row-parallel: each rank shrinks its half of the input with A's
    matching columns, the shrinks are summed (the all-reduce), and each rank expands its half of B's outputs at
    ``offset_start = rank * shard`` into its partial output."""
    gen = torch.Generator().manual_seed(4)
    wrapper = _wrapper(is_prefill)
    slices = (16, 8)
    a = tuple(torch.randn(4, 1, RANK, HIDDEN, generator=gen) for _ in slices)
    b = tuple(torch.randn(4, 1, width, RANK, generator=gen) for width in slices)
    x = torch.randn(len(TOKEN_IDS), HIDDEN, generator=gen)
    y = torch.randn(len(TOKEN_IDS), sum(slices), generator=gen)
    want = _linear_equation(x, a, b, y, 1.0)
    half = RANK // 2
    shrunk = []
    for rank in range(2):
        buffer = torch.zeros(len(slices), len(TOKEN_IDS), half)
        wrapper.add_shrink(buffer, x, tuple(ai[:, :, rank * half : (rank + 1) * half] for ai in a), 1.0)
        shrunk.append(buffer)
    wrapper.add_expand(y, torch.cat(shrunk, dim=-1), b, slices, offset_start=0)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)

    (a_row,), (b_row,) = a[:1], b[:1]
    y = torch.randn(len(TOKEN_IDS), slices[0], generator=gen)
    want = _linear_equation(x, (a_row,), (b_row,), y, 1.0)
    cols, shard = HIDDEN // 2, slices[0] // 2
    reduced = torch.zeros(1, len(TOKEN_IDS), RANK)
    for rank in range(2):
        partial = torch.zeros(1, len(TOKEN_IDS), RANK)
        part = (a_row[:, :, :, rank * cols : (rank + 1) * cols],)
        wrapper.add_shrink(partial, x[:, rank * cols : (rank + 1) * cols].contiguous(), part, 1.0)
        reduced += partial
    outputs = [torch.zeros_like(y) for _ in range(2)]
    for rank in range(2):
        b_shard = (b_row[:, :, rank * shard : (rank + 1) * shard],)
        wrapper.add_expand(outputs[rank], reduced, b_shard, (shard,), offset_start=rank * shard)
    torch.testing.assert_close((y + outputs[0] + outputs[1]).double(), want, rtol=1e-5, atol=1e-4)


def test_compiled_lora_runs_per_token_on_the_step_mapping_and_leaves_padding_alone(monkeypatch):
    """Under ``torch.compile`` (full graph: Dynamo traces the wrapper) a prefill mapping runs per token through
    ``torch.ops.vllm.ascend_lora_shrink`` / ``ascend_lora_expand`` (never the segmented kernels); one graph
    serves successive steps, reading each step's mapping from the persistent buffer; rows past the step's
    tokens (a graph's padding) are left as they were."""
    from vllm_ascend.kernels import lora

    def refused(*args, **kwargs):
        raise AssertionError("the segmented kernel ran in a compiled region")

    monkeypatch.setattr(lora, "lora_shrink_segmented_torch", refused)
    monkeypatch.setattr(lora, "lora_expand_segmented_torch", refused)
    gen = torch.Generator().manual_seed(5)
    slices = (16, 8)
    a = tuple(torch.randn(4, 1, RANK, HIDDEN, generator=gen) for _ in slices)
    b = tuple(torch.randn(4, 1, width, RANK, generator=gen) for width in slices)
    padded = len(TOKEN_IDS) + 2
    x = torch.randn(padded, HIDDEN, generator=gen)
    y = torch.randn(padded, sum(slices), generator=gen)
    wrapper = AscendPunicaWrapper(64, 8, "cpu")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm

    compiled = torch.compile(
        lambda out, x: wrapper.add_lora_linear(out, x, a, b, 0.5, slices), backend=backend, fullgraph=True
    )
    n = len(TOKEN_IDS)
    wrapper.update_metadata(LoRAMapping((5,) * n, (5,) * 3, is_prefill=True), SLOTS, 4, VOCAB)
    first = y.clone()
    compiled(first, x)
    wrapper.update_metadata(LoRAMapping(TOKEN_IDS, REQUEST_IDS, is_prefill=True), SLOTS, 4, VOCAB)
    out = y.clone()
    compiled(out, x)
    assert (
        len(graphs) == 1 and "vllm.ascend_lora_shrink" in graphs[0] and "vllm.ascend_lora_expand" in graphs[0]
    )
    step_one = _linear_equation(x[:n], a, b, y[:n], 0.5, (5,) * n)
    torch.testing.assert_close(first[:n].double(), step_one, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        out[:n].double(), _linear_equation(x[:n], a, b, y[:n], 0.5), rtol=1e-5, atol=1e-4
    )
    assert torch.equal(first[n:], y[n:]) and torch.equal(out[n:], y[n:])  # the padding rows: no adapter


@pytest.mark.parametrize("mode", ["NONE", "FULL", "PIECEWISE"])
def test_a_captured_step_runs_per_token_and_an_eager_one_segmented(monkeypatch, mode):
    """A step vLLM runs under a graph runtime mode (captured uncompiled, e.g. FULL_DECODE_ONLY) takes the
    per-token kernels even on a prefill mapping (a device graph would bake the segmented path's host ints);
    an eager step (NONE) the segmented ones. Both give the equation."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import ForwardContext, override_forward_context

    from vllm_ascend.kernels import lora

    calls = {"lora_shrink_torch": 0, "lora_shrink_segmented_torch": 0}
    for name in calls:
        original = getattr(lora, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(lora, name, counted)
    gen = torch.Generator().manual_seed(6)
    a = (torch.randn(4, 1, RANK, HIDDEN, generator=gen),)
    b = (torch.randn(4, 1, 16, RANK, generator=gen),)
    x = torch.randn(len(TOKEN_IDS), HIDDEN, generator=gen)
    y = torch.randn(len(TOKEN_IDS), 16, generator=gen)
    want = _linear_equation(x, a, b, y, 1.0)
    context = ForwardContext(
        no_compile_layers={}, attn_metadata={}, slot_mapping={}, cudagraph_runtime_mode=CUDAGraphMode[mode]
    )
    with override_forward_context(context):
        _wrapper(is_prefill=True).add_lora_linear(y, x, a, b, 1.0, (16,))
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
    per_token = mode != "NONE"
    assert calls == {"lora_shrink_torch": int(per_token), "lora_shrink_segmented_torch": int(not per_token)}


def test_where_triton_serves_each_step_orders_its_tokens_by_adapter(monkeypatch):
    """The per-token kernels get the step's tokens ordered by adapter, rebuilt in the same persistent buffers
    at each update (graphs read them); the padding rows stay in the no-adapter run."""
    from vllm_ascend.runner import punica_wrapper

    monkeypatch.setattr(punica_wrapper, "use_triton", lambda device: True)
    wrapper = _wrapper(is_prefill=False)
    order, starts = wrapper._token_order, wrapper._lora_starts
    assert order is not None and starts is not None
    n = len(TOKEN_IDS)  # slots 0 0 0 -1 2 2, then 58 padding rows
    assert starts.tolist() == [0, 64 - n + 1, 64 - n + 4, 64 - n + 4, 64, 64]
    assert order[starts[1] : starts[2]].tolist() == [0, 1, 2] and order[starts[3] : starts[4]].tolist() == [
        4,
        5,
    ]
    assert sorted(order[: starts[1]].tolist()) == [3, *range(n, 64)]
    from vllm_ascend.kernels import lora

    given = []
    for name in ("lora_shrink_slices_torch", "lora_expand_slices_torch"):
        original = getattr(lora, name)

        def recording(*args, _original=original, **kwargs):
            given.append(args[-2:])
            return _original(*args, **kwargs)

        monkeypatch.setattr(lora, name, recording)
    gen = torch.Generator().manual_seed(9)
    slices = (16, 8, 8)
    a = tuple(torch.randn(4, 1, RANK, HIDDEN, generator=gen) for _ in slices)
    b = tuple(torch.randn(4, 1, width, RANK, generator=gen) for width in slices)
    x, y = torch.randn(n, HIDDEN, generator=gen), torch.randn(n, sum(slices), generator=gen)
    want = _linear_equation(x, a, b, y, 0.5)
    buffer = torch.zeros(len(slices), n, RANK)
    wrapper.add_shrink(buffer, x, a, 0.5)  # vLLM's column-parallel call pattern, then the merged expand
    wrapper.add_expand(y, buffer, b, slices)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-4)
    assert len(given) == 2 and all(o is order and s is starts for o, s in given)  # one call each way, ordered
    wrapper.update_metadata(
        LoRAMapping((9,) * n, (9,) * 3, is_prefill=False), SLOTS, max_loras=4, vocab_size=VOCAB
    )
    assert wrapper._token_order is order and wrapper._lora_starts is starts
    assert starts.tolist() == [0, 64 - n, 64 - n, 64 - n, 64, 64]  # every token on adapter 9 (slot 2)


def test_the_kernels_state_is_reserved_when_vllm_builds_the_wrapper(monkeypatch):
    """vLLM builds the wrapper with its LoRA config before any step: the kernels' split counters for that many
    adapter slots are reserved then (eagerly), not at a first launch that a graph capture may record."""
    from types import SimpleNamespace

    from vllm_ascend.runner import punica_wrapper

    reserved = []
    monkeypatch.setattr(
        punica_wrapper, "lora_reserve", lambda device, loras: reserved.append((device, loras))
    )
    AscendPunicaWrapper(64, 8, "cpu", lora_config=SimpleNamespace(max_loras=6))
    assert reserved == [(torch.device("cpu"), 6)]
