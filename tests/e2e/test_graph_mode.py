"""Graph mode on the reference device, through vLLM: captured graphs and compiled pieces give eager's tokens.

- FULL_DECODE_ONLY (no compilation): decode batches replay whole-model graphs captured for 1, 2 and 4
  requests; a batch of 3 is padded to 4; chunked prefill steps (mixed batches) run eagerly. A replay only
  sees the step through its static buffers and the attention-parameter update; skipping that update
  (a test-only hook) must change the tokens.
- VLLM_COMPILE with FULL_AND_PIECEWISE (vLLM's graph mode): Inductor compiles the pieces between
  attention ops with every Ascend fusion pass on; decode replays FULL graphs, mixed batches replay
  PIECEWISE graphs of the compiled pieces. Each pass's match count is asserted: > 0 where its pattern
  occurs in the model, 0 where it cannot.

Eager's tokens: the HF oracle (``qwen3_hf``, which eager serving equals in ``test_runner_greedy``) for the
dense model; an eager engine for the MoE (GLM-4.5) and quantized (W8A8_DYNAMIC Qwen3) models. The quantized
model is compiled by AscendCompiler (the NPUs' compile path: AOT graph + Ascend passes, no Inductor).
"""

from __future__ import annotations

import pytest

#: The V1 runner's graph paths (the model wrapped in ``ACLGraphWrapper`` for FULL graphs); V2 (vLLM's
#: default) serves compiled PIECEWISE graphs through the same wrapper (``test_dsa_deepseek_v32.py``,
#: ``test_runner_v2.py``) and refuses FULL graphs on the reference device by name.
pytestmark = pytest.mark.usefixtures("v1_runner")

#: Requests get different lengths, so the decode batch shrinks 4 -> 3 (padded to 4) -> 2 -> 1.
LENGTHS = (12, 9, 6, 3)
CAPTURE_SIZES = [1, 2, 4]
#: Long prompts are prefilled over several 16-token steps, mixed with the others' decodes.
CHUNKED = dict(max_num_seqs=4, max_num_batched_tokens=16, enable_chunked_prefill=True)
#: Mixed (prefill + decode) steps of up to 16 tokens replay PIECEWISE graphs, padded to 16.
COMPILED = {
    "mode": 3,
    "cudagraph_mode": "FULL_AND_PIECEWISE",
    "cudagraph_capture_sizes": [*CAPTURE_SIZES, 16],
}
FULL_DECODE_ONLY = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": CAPTURE_SIZES}


@pytest.fixture(autouse=True)
def _fresh_compile_cache(fresh_compile_cache: None) -> None:
    """Every test here compiles afresh (a cache hit skips the post-grad passes: no matches recorded)."""


def _greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in LENGTHS]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _prefixes(token_ids: list[list[int]]) -> list[list[int]]:
    return [list(ids[:n]) for ids, n in zip(token_ids, LENGTHS, strict=True)]


def _wrappers(llm) -> dict[str, list]:
    """The engine's graph wrappers by runtime mode (FULL: the model's; PIECEWISE: the compiled pieces')."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    from vllm_ascend.runner.graph_wrapper import ACLGraphWrapper

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    found: dict[str, list] = {"FULL": [], "PIECEWISE": []}
    for wrapper in list(CUDAGraphWrapper._all_instances):
        assert isinstance(wrapper, ACLGraphWrapper), type(wrapper)
        if wrapper.runtime_mode.name == "FULL" and wrapper is not runner.model:
            continue  # another engine's model (this process ran several); pieces: compare counts before/after
        found[wrapper.runtime_mode.name].append(wrapper)
    return found


def _replays(wrappers: list) -> int:
    return sum(w.replays for w in wrappers)


def test_full_decode_graphs_replay_eager_tokens_and_a_stale_buffer_changes_them(
    make_llm, tiny_qwen3, qwen3_prompts, qwen3_hf
):
    from vllm_ascend.testing.graph_hooks import stale_attention_params

    llm = make_llm(tiny_qwen3, compilation_config=FULL_DECODE_ONLY, **CHUNKED)
    full = _wrappers(llm)["FULL"]
    assert len(full) == 1 and sorted(d.num_tokens for d in full[0].entries) == CAPTURE_SIZES
    expected = _prefixes(qwen3_hf.token_ids)
    assert _greedy(llm, qwen3_prompts) == expected
    replayed = _replays(full)
    assert replayed >= sum(LENGTHS) // 4  # most decode steps ran as graph replays

    with stale_attention_params():
        stale = _greedy(llm, qwen3_prompts)
    assert _replays(full) > replayed
    assert stale != expected  # the replays read the captured sequence lengths / block tables
    assert _greedy(llm, qwen3_prompts) == expected  # the update brings the same graphs back in step


def test_compiled_graph_mode_with_fusion_passes_dense(make_llm, tiny_qwen3, qwen3_prompts, qwen3_hf):
    from vllm_ascend.runner.compilation.pass_manager import fusion_match_counts, reset_fusion_match_counts

    reset_fusion_match_counts()
    llm = make_llm(tiny_qwen3, compilation_config=COMPILED, **CHUNKED)
    counts = fusion_match_counts()
    before = _replays(_wrappers(llm)["PIECEWISE"])
    assert _greedy(llm, qwen3_prompts) == _prefixes(qwen3_hf.token_ids)
    wrappers = _wrappers(llm)
    assert _replays(wrappers["FULL"]) > 0 and _replays(wrappers["PIECEWISE"]) > before
    # Qwen3: per-head q/k RMSNorm then RoPE in every layer (2); no quantization, no x * scalar + y. Inductor
    # drops no-op views before the post-grad passes, so no-op elimination runs and finds none.
    assert counts["QKNormRopeFusionPass"] == 2, counts
    zero = (
        "AddRMSNormQuantFusionPass",
        "RMSNormQuantFusionPass",
        "SwiGLUQuantFusionPass",
        "MulsAddFusionPass",
    )
    assert {name: counts[name] for name in (*zero, "NoOpEliminationPass")} == dict.fromkeys(
        (*zero, "NoOpEliminationPass"), 0
    ), counts


def test_npu_compile_path_with_fusion_passes_w8a8_dynamic(
    make_llm, tiny_qwen3, qwen3_prompts, tmp_path, monkeypatch
):
    """The NPUs' compiler (AscendCompiler: AOT graph, Ascend passes, no Inductor) on the reference device's ops."""
    from vllm_ascend.core.platform import NPUPlatform, ReferencePlatform
    from vllm_ascend.quant.export import export_modelslim
    from vllm_ascend.runner.compilation.pass_manager import fusion_match_counts, reset_fusion_match_counts

    model = tmp_path / "qwen3-w8a8-dynamic"
    export_modelslim(tiny_qwen3, model, "W8A8_DYNAMIC", progress=False)
    eager = _greedy(make_llm(model, enforce_eager=True, **CHUNKED), qwen3_prompts)
    monkeypatch.setattr(ReferencePlatform, "get_compile_backend", NPUPlatform.get_compile_backend)
    reset_fusion_match_counts()
    llm = make_llm(model, compilation_config=COMPILED, **CHUNKED)
    assert llm.llm_engine.vllm_config.compilation_config.backend.endswith(".AscendCompiler")
    counts = fusion_match_counts()
    assert _greedy(llm, qwen3_prompts) == eager
    # Every quantized linear's input is a norm's output (qkv, gate_up) or swiglu's (down_proj).
    assert counts["AddRMSNormQuantFusionPass"] > 0 and counts["SwiGLUQuantFusionPass"] > 0, counts
    assert counts["RMSNormQuantFusionPass"] > 0 and counts["QKNormRopeFusionPass"] > 0, counts
    assert counts["NoOpEliminationPass"] > 0, counts  # without Inductor the AOT graph keeps its no-op views
    assert counts["MulsAddFusionPass"] == 0, counts


def test_moe_graph_modes_give_eager_tokens(make_llm, tiny_models_root):
    """GLM-4.5 MoE: shared experts added to the routed output times ``routed_scaling_factor`` (x * s + y)."""
    from tests.e2e.conftest import _token_ids
    from vllm_ascend.runner.compilation.pass_manager import fusion_match_counts, reset_fusion_match_counts
    from vllm_ascend.testing.tiny_models import build_tiny_model, glm4_moe_spec

    model = build_tiny_model(glm4_moe_spec(), tiny_models_root)
    prompts = _token_ids(model)
    eager = _greedy(make_llm(model, enforce_eager=True, **CHUNKED), prompts)
    assert len({tuple(t) for t in eager}) == len(
        eager
    )  # distinct continuations: the comparison means something
    full = make_llm(model, compilation_config=FULL_DECODE_ONLY, **CHUNKED)
    assert _greedy(full, prompts) == eager
    assert _replays(_wrappers(full)["FULL"]) > 0
    reset_fusion_match_counts()
    compiled = make_llm(model, compilation_config=COMPILED, **CHUNKED)
    counts = fusion_match_counts()
    assert _greedy(compiled, prompts) == eager
    assert counts["MulsAddFusionPass"] > 0, counts
    quant = ("AddRMSNormQuantFusionPass", "RMSNormQuantFusionPass", "SwiGLUQuantFusionPass")
    assert {name: counts[name] for name in quant} == dict.fromkeys(quant, 0), counts
