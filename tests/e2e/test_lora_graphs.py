"""Multi-LoRA with compiled and captured graphs: PEFT adapters on tiny Qwen3 served by vLLM in graph mode
(``torch.compile`` mode 3), a mixed base + adapters batch token for token equal to HF + PEFT in fp32.

- Model Runner V2 (vLLM's default) with PIECEWISE graphs and ``cudagraph_specialize_lora=True``: graphs are
  captured per batch size for no adapter (0) and for adapters active (``max_loras + 1``).
- The V1 runner with FULL_DECODE_ONLY and no compilation: decode replays captured whole-model graphs (per
  token inside them), mixed steps run eagerly (segmented).
- The V1 runner with FULL_AND_PIECEWISE (decode replays whole-model graphs; V2 refuses FULL graphs on the
  reference device) and ``cudagraph_specialize_lora=False``: only adapter-active graphs are captured (their
  base rows and padding mapped to no adapter); a base-only batch runs the compiled model without graphs.

Inside the compiled model the punica wrapper runs per token (``torch.ops.vllm.ascend_lora_shrink`` /
``ascend_lora_expand`` on the persistent mapping buffer): the segmented kernels, which read the step's runs as
host integers, never run there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.lora_adapters import MAX_LORA_RANK, count_reference_calls

#: Two adapters with different ranks, scalings and target layers (attention; MLP).
NAMES = ("attn-r8", "mlp-r16")
CAPTURE_SIZES = [1, 2, 4, 16]
#: Long prompts are prefilled over several 16-token steps mixed with decodes (PIECEWISE, padded to 16).
CHUNKED = dict(max_num_seqs=4, max_num_batched_tokens=16, enable_chunked_prefill=True)


@pytest.fixture
def shrink_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of the reference shrink kernels' calls (per token; segmented) while the test runs."""
    return count_reference_calls(("lora_shrink_torch", "lora_shrink_segmented_torch"), monkeypatch.setattr)


def _engine(make_llm, model: Path, graphs: str, specialize: bool, mode: int = 3):
    return make_llm(
        model,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=MAX_LORA_RANK,
        compilation_config={
            "mode": mode,
            "cudagraph_mode": graphs,
            "cudagraph_capture_sizes": CAPTURE_SIZES,
            "cudagraph_specialize_lora": specialize,
        },
        **CHUNKED,
    )


def _generate(llm, qwen3_lora_adapters, requests: list[tuple[list[int], str | None]]) -> list[list[int]]:
    from vllm import SamplingParams, TokensPrompt
    from vllm.lora.request import LoRARequest

    from tests.e2e.conftest import MAX_NEW_TOKENS

    ids = {name: i + 1 for i, name in enumerate(NAMES)}
    loras = [None if n is None else LoRARequest(n, ids[n], str(qwen3_lora_adapters[n])) for _, n in requests]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, min_tokens=MAX_NEW_TOKENS)
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p, _ in requests], params, lora_request=loras, use_tqdm=False
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def _wrappers(llm) -> dict[str, list]:
    """The graph wrappers by runtime mode (FULL: this engine's model; PIECEWISE: every compiled piece, of
    earlier engines too: compare replay counts before and after)."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    from vllm_ascend.runner.graph_wrapper import ACLGraphWrapper

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    found: dict[str, list] = {"FULL": [], "PIECEWISE": []}
    for wrapper in list(CUDAGraphWrapper._all_instances):
        assert isinstance(wrapper, ACLGraphWrapper), type(wrapper)
        if wrapper.runtime_mode.name == "FULL" and wrapper is not runner.model:
            continue
        found[wrapper.runtime_mode.name].append(wrapper)
    return found


def _replays(wrappers: list) -> int:
    return sum(w.replays for w in wrappers)


def _check_mixed_batch(
    llm, qwen3_lora_adapters, qwen3_lora_hf_tokens, prompts, shrink_calls, compiled: bool = True
) -> None:
    """Each prompt under the base model and under each adapter, in one batch: every request equals HF + PEFT;
    a compiled model ran the per-token shrink, never the segmented one (an uncompiled one runs its eager
    prefill steps segmented)."""
    requests, expected = [], []
    for i, prompt in enumerate(prompts):
        for name in (None, *NAMES):
            requests.append((prompt, name))
            expected.append(qwen3_lora_hf_tokens[name][i])
    got = _generate(llm, qwen3_lora_adapters, requests)
    for (_, name), want, have in zip(requests, expected, got, strict=True):
        assert have == want, f"adapter {name}"
    assert shrink_calls["lora_shrink_torch"] > 0, shrink_calls
    assert (shrink_calls["lora_shrink_segmented_torch"] == 0) == compiled, shrink_calls


@pytest.mark.usefixtures("fresh_compile_cache")
def test_piecewise_graphs_specialized_per_lora_equal_hf_peft(
    make_llm, tiny_qwen3, qwen3_lora_adapters, qwen3_lora_hf_tokens, qwen3_prompts, shrink_calls
):
    """V2, PIECEWISE, ``cudagraph_specialize_lora=True``: graphs for 0 and 3 active adapters per size; the
    mixed batch replays adapter-active graphs."""
    llm = _engine(make_llm, tiny_qwen3, "PIECEWISE", specialize=True)
    pieces = _wrappers(llm)["PIECEWISE"]
    before = _replays(pieces)
    mine = [w for w in pieces if w.entries]
    keys = {(d.num_tokens, d.num_active_loras) for w in mine for d in w.entries}
    assert {(n, loras) for n in CAPTURE_SIZES for loras in (0, 3)} <= keys, sorted(keys)
    _check_mixed_batch(llm, qwen3_lora_adapters, qwen3_lora_hf_tokens, qwen3_prompts, shrink_calls)
    assert _replays(pieces) > before
    replayed = {d.num_active_loras for w in mine for d, e in w.entries.items() if e.graph.replays}
    assert 3 in replayed, replayed


@pytest.mark.usefixtures("fresh_compile_cache", "v1_runner")
def test_full_and_piecewise_graphs_unspecialized_equal_hf_peft(
    make_llm, tiny_qwen3, qwen3_lora_adapters, qwen3_lora_hf_tokens, qwen3_prompts, shrink_calls
):
    """V1, FULL_AND_PIECEWISE, ``cudagraph_specialize_lora=False``: only adapter-active graphs exist; decode
    replays FULL graphs, mixed steps PIECEWISE ones; vLLM dispatches a base-only batch to no graph (none
    captured without adapters), and the compiled model still gives HF's tokens."""
    llm = _engine(make_llm, tiny_qwen3, "FULL_AND_PIECEWISE", specialize=False)
    wrappers = _wrappers(llm)
    (full,) = wrappers["FULL"]
    assert {d.num_active_loras for d in full.entries} == {3}, list(full.entries)
    before_full, before_pieces = _replays(wrappers["FULL"]), _replays(wrappers["PIECEWISE"])
    _check_mixed_batch(llm, qwen3_lora_adapters, qwen3_lora_hf_tokens, qwen3_prompts, shrink_calls)
    assert _replays(wrappers["FULL"]) > before_full and _replays(wrappers["PIECEWISE"]) > before_pieces
    before_full = _replays(wrappers["FULL"])
    base = _generate(llm, qwen3_lora_adapters, [(p, None) for p in qwen3_prompts])
    assert base == qwen3_lora_hf_tokens[None]
    assert _replays(wrappers["FULL"]) == before_full


@pytest.mark.usefixtures("v1_runner")
def test_full_decode_graphs_without_compilation_equal_hf_peft(
    make_llm, tiny_qwen3, qwen3_lora_adapters, qwen3_lora_hf_tokens, qwen3_prompts, shrink_calls
):
    """V1, FULL_DECODE_ONLY, mode 0: the decode steps of the mixed batch replay the captured FULL graphs."""
    llm = _engine(make_llm, tiny_qwen3, "FULL_DECODE_ONLY", specialize=True, mode=0)
    (full,) = _wrappers(llm)["FULL"]
    assert {d.num_active_loras for d in full.entries} == {0, 3}, list(full.entries)
    before = _replays([full])
    _check_mixed_batch(
        llm, qwen3_lora_adapters, qwen3_lora_hf_tokens, qwen3_prompts, shrink_calls, compiled=False
    )
    assert _replays([full]) > before
    assert any(e.graph.replays for d, e in full.entries.items() if d.num_active_loras == 3)
