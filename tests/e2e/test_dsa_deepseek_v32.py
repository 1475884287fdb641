"""Tiny DeepSeek-V3.2 models (MLA + the DSA lightning indexer) served on the reference device = HF fp32.

Each case builds its model in the test (transformers ``DeepseekV32Config``, ``index_topk`` far below the
prompt lengths so the indexer really drops keys) and runs one engine in float32 with chunked prefill and
prefix caching: every row — prefill chunks with cached context, prefix-cache hits, decodes — is scored by
the indexer against its key cache and attended at the selected positions only. HF's tokens change when the
indexer keeps every key, so the comparison can fail if the selection is wrong.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from vllm_ascend.testing.tiny_models import (
    MODEL_BUILDERS,
    TinyModelSpec,
    build_tiny_model,
    register_model_builder,
)

from .test_mla_deepseek import PROMPTS, _deepseek_v3_weights, _greedy, deepseek_config_fields
from .test_mla_mtp import _counters, add_deepseek_mtp_layer
from .test_mla_mtp import _greedy as _greedy_n

MAX_NEW_TOKENS = 8


def _deepseek_v32_config(spec: TinyModelSpec, vocab_size: int):
    """DeepSeek-V3.2: DeepSeek-V3's MLA and MoE plus the indexer (``index_*`` in ``extra``)."""
    from transformers import DeepseekV32Config

    return DeepseekV32Config(**deepseek_config_fields(spec, vocab_size))


if "deepseek_v32" not in MODEL_BUILDERS:
    register_model_builder("deepseek_v32", _deepseek_v32_config, _deepseek_v3_weights)


def deepseek_v32_spec(**extra) -> TinyModelSpec:
    base = dict(
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=32,
        first_k_dense_replace=2,  # both layers dense
        index_topk=4,
        index_n_heads=8,
        index_head_dim=32,
    )
    base.update(extra)
    return replace(TinyModelSpec(kind="deepseek_v32", seed=7, num_kv_heads=4), extra=base)


CASES = {
    "dense-kv32-rope16-top4": deepseek_v32_spec(),
    "moe-kv512-rope64-top8": deepseek_v32_spec(
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        first_k_dense_replace=1,
        index_topk=8,
        index_head_dim=96,
    ),
    # DeepSeek-V3.2's indexer geometry (head dim 128) and YaRN (the indexer's rotary takes it too).
    "moe-yarn-index128-top6": deepseek_v32_spec(
        first_k_dense_replace=1,
        index_topk=6,
        index_head_dim=128,
        index_n_heads=16,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_deepseek_v32_sparse_attention_greedy_matches_hf(make_llm, tiny_models_root: Path, case: str):
    from transformers import AutoTokenizer

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.testing.hf_reference import hf_greedy

    spec = CASES[case]
    model_dir = build_tiny_model(spec, tiny_models_root)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    topk = spec.extra["index_topk"]
    assert topk < 32 < min(len(p) for p in prompts[1:])
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS).token_ids
    assert len({tuple(t) for t in expected}) == len(expected), expected
    dense_dir = build_tiny_model(replace(spec, extra={**spec.extra, "index_topk": 2048}), tiny_models_root)
    dense = hf_greedy(dense_dir, prompts[1:], MAX_NEW_TOKENS).token_ids
    assert dense != expected[1:], "the indexer's selection does not change HF's tokens: the test cannot fail"

    adaptor = get_device_adaptor()
    adaptor.reset_counts()
    # 16 tokens per step: the long prompts are prefilled over several steps (cached context), mixed with
    # decodes; the warm-up prompt leaves its first blocks in the prefix cache for the third prompt.
    llm = make_llm(model_dir, enable_prefix_caching=True, max_num_batched_tokens=16, max_num_seqs=4)
    assert _greedy(llm, prompts[1:2]) == expected[1:2]
    assert _greedy(llm, prompts) == expected
    counts = adaptor.call_counts
    assert counts["lightning_indexer"] > 0 and counts["indexer_cache_write"] > 0, counts
    assert counts["sparse_flash_attention"] > 0 and counts["mla_cache_write"] > 0, counts
    assert counts["mla_prefill_attention"] == 0 and counts["mla_latent_attention"] == 0, counts
    assert counts["fused_infer_attention"] == 0, counts


@pytest.mark.usefixtures("v1_runner")  # the specdecode sibling's MTP proposer: a V1 drafter
def test_deepseek_v32_mtp_greedy_equals_hf(make_llm, tiny_models_root: Path):
    """MTP (one draft token per step) on a DeepSeek-V3.2 with an MTP layer (its own indexer, built full as
    vLLM builds MTP layers): speculative greedy = HF fp32, drafts accepted and rejected, the
    target's verification rows and the drafter's rows both through the indexer and sparse attention."""
    from transformers import AutoTokenizer

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.specdecode.proposer import AscendEagleProposer
    from vllm_ascend.testing.hf_reference import hf_greedy

    target_dir = build_tiny_model(CASES["dense-kv32-rope16-top4"], tiny_models_root)
    model_dir = add_deepseek_mtp_layer(target_dir, tiny_models_root)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(model_dir, prompts, 16).token_ids
    assert len({tuple(t) for t in expected}) == len(expected), expected
    spec = {"method": "mtp", "num_speculative_tokens": 1}
    llm = make_llm(model_dir, speculative_config=spec, max_num_batched_tokens=32, max_num_seqs=4,
                   enable_prefix_caching=True, disable_log_stats=False)  # fmt: skip
    runner = llm.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner
    assert type(runner.drafter) is AscendEagleProposer
    assert type(runner.drafter.model).__name__ == "DeepSeekMTP"
    adaptor = get_device_adaptor()
    adaptor.reset_counts()
    assert _greedy_n(llm, prompts, 16) == expected
    drafted, accepted = _counters(llm)
    assert drafted >= len(prompts) * 8 and 0 < accepted < drafted, (drafted, accepted)
    counts = adaptor.call_counts
    assert counts["lightning_indexer"] > 0 and counts["sparse_flash_attention"] > 0, counts
    assert counts["mla_prefill_attention"] == 0 and counts["mla_latent_attention"] == 0, counts


def test_deepseek_v32_compiled_piecewise_graphs_equal_hf(
    make_llm, tiny_models_root: Path, tmp_path, monkeypatch
):
    """Compiled (``mode=3``) with piecewise graphs: the indexer's selection is an opaque op the graphs split
    around (``vllm::ascend_dsa_indexer``), like attention; tokens still equal HF fp32 and the pieces replay.
    vLLM turns compilation off for DeepSeek-V3.2 unless ``VLLM_USE_BREAKABLE_CUDAGRAPH=0`` is set."""
    from transformers import AutoTokenizer

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.runner.attention.mla.sparse import DSA_INDEXER_OP
    from vllm_ascend.testing.hf_reference import hf_greedy

    from .test_graph_mode import _replays, _wrappers

    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
    model_dir = build_tiny_model(CASES["dense-kv32-rope16-top4"], tiny_models_root)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS).token_ids
    compiled = {"mode": 3, "cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 16]}
    llm = make_llm(model_dir, compilation_config=compiled, max_num_batched_tokens=16, max_num_seqs=4)
    config = llm.llm_engine.vllm_config.compilation_config
    assert config.mode == 3 and DSA_INDEXER_OP in config.splitting_ops
    before = _replays(_wrappers(llm)["PIECEWISE"])
    adaptor = get_device_adaptor()
    adaptor.reset_counts()
    assert _greedy(llm, prompts) == expected
    assert _replays(_wrappers(llm)["PIECEWISE"]) > before
    assert adaptor.call_counts["lightning_indexer"] > 0 and adaptor.call_counts["sparse_flash_attention"] > 0


def test_deepseek_v32_tensor_parallel_equals_hf(tiny_models_root: Path):
    """Two tensor-parallel ranks (vLLM's multiprocess executor, gloo): the attention heads are split, each rank
    runs the replicated indexer over its own key cache; greedy tokens equal HF fp32."""
    from transformers import AutoTokenizer

    from vllm_ascend.testing.hf_reference import hf_greedy

    from .distributed import run_case

    model_dir = build_tiny_model(CASES["moe-kv512-rope64-top8"], tiny_models_root)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS).token_ids
    result, output = run_case(model_dir, prompts, max_tokens=MAX_NEW_TOKENS, tensor_parallel_size=2)
    assert sorted(w[3] for w in result["workers"]) == [0, 1], result["workers"]
    assert result["tokens"] == expected
    assert "Traceback" not in output, output[-6000:]
