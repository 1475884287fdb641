"""Pooling models through ``vllm.LLM(runner="pooling")`` with the plugin on the reference device equal HF
transformers fp32 (within 1e-5 relative): a BERT embedder (CLS), a Qwen3 embedder (LAST token with chunked
prefill; MEAN on the V1 runner), a BERT cross-encoder (``score``, on both runners) and Qwen3 sequence
classification.

Encoder-only layers must run on the adaptor's ``packed_attention`` (counted), decoder layers on
``fused_infer_attention``. One engine per class, shut down when the class ends.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

#: Relative error (L2 norm of the difference over the reference's) allowed against HF fp32.
REL_TOL = 1e-5

TEXTS = (
    "the quick river",
    "river mountain forest ocean cloud rain snow wind stone light",
    "bright dark warm cold old new first last",
    "red green blue yellow black white quick slow small large bright dark warm cold morning evening "
    "winter summer river mountain forest ocean cloud rain snow wind stone light shadow tensor kernel",
)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).norm() / ref.norm())


def _assert_close(got: list[torch.Tensor], ref: list[torch.Tensor]) -> None:
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        assert g.shape == r.shape, (g.shape, r.shape)
        assert _rel_err(g, r) <= REL_TOL, (_rel_err(g, r), g, r)


def _ids(model_dir: Path, texts=TEXTS) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    token_ids = [tokenizer(text)["input_ids"] for text in texts]
    assert all(tokenizer.unk_token_id not in ids for ids in token_ids)  # real words, not a run of [UNK]
    return token_ids


def _llm(model_dir: Path, **overrides):
    from vllm import LLM

    kwargs = dict(
        model=str(model_dir),
        runner="pooling",
        dtype="float32",
        block_size=16,
        max_model_len=128,
        kv_cache_memory_bytes=16 << 20,
        max_num_seqs=4,
        seed=0,
    )
    kwargs.update(overrides)
    return LLM(**kwargs)


def _shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    gc.collect()


def _runner(llm):
    return llm.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner


def _embed(llm, token_ids: list[list[int]]) -> list[torch.Tensor]:
    outputs = llm.embed([{"prompt_token_ids": ids} for ids in token_ids], use_tqdm=False)
    return [torch.tensor(o.outputs.embedding) for o in outputs]


@pytest.fixture(scope="module")
def pooling_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pooling-models")


@pytest.fixture(scope="module")
def tiny_bert(pooling_root: Path) -> Path:
    from vllm_ascend.testing.tiny_pooling import build_tiny_bert

    return build_tiny_bert(pooling_root)


@pytest.fixture(scope="module")
def tiny_cross_encoder(pooling_root: Path) -> Path:
    from vllm_ascend.testing.tiny_pooling import build_tiny_bert

    return build_tiny_bert(pooling_root, num_labels=1)


@pytest.fixture(scope="module")
def tiny_qwen3_classifier(pooling_root: Path) -> Path:
    from vllm_ascend.testing.tiny_pooling import build_tiny_qwen3_classifier

    return build_tiny_qwen3_classifier(pooling_root, num_labels=3)


@pytest.fixture(scope="class")
def bert_llm(tiny_bert):
    llm = _llm(tiny_bert)
    yield llm
    _shutdown(llm)


@pytest.fixture(scope="class")
def qwen3_last_llm(tiny_qwen3):
    llm = _llm(
        tiny_qwen3,
        pooler_config={"seq_pooling_type": "LAST"},
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        async_scheduling=True,
    )
    yield llm
    _shutdown(llm)


@pytest.fixture(scope="class")
def cross_encoder_llm(tiny_cross_encoder):
    llm = _llm(tiny_cross_encoder)
    yield llm
    _shutdown(llm)


@pytest.fixture(scope="class")
def classifier_llm(tiny_qwen3_classifier):
    llm = _llm(tiny_qwen3_classifier)
    yield llm
    _shutdown(llm)


class TestBertEmbedder:
    """``BertModel`` (vLLM's ``BertEmbeddingModel``: encoder-only attention, CLS pooling, normalised)."""

    def test_runs_on_model_runner_v2(self, bert_llm):
        from vllm_ascend.runner.model_runner_v2 import NPUModelRunnerV2

        assert type(_runner(bert_llm)) is NPUModelRunnerV2
        config = bert_llm.llm_engine.vllm_config
        # vLLM turns async scheduling off by default for pooling models (the async test asks for it).
        assert config.scheduler_config.async_scheduling is False
        assert config.model_config.pooler_config.seq_pooling_type == "CLS"

    def test_cls_embeddings_match_hf(self, bert_llm, tiny_bert):
        from vllm_ascend.testing.tiny_pooling import hf_embeddings

        token_ids = _ids(tiny_bert)
        assert len({len(ids) for ids in token_ids}) == len(token_ids)  # different lengths in one batch
        got = _embed(bert_llm, token_ids)
        assert all(g.shape == (64,) for g in got)
        assert all(abs(float(g.norm()) - 1.0) < 1e-5 for g in got)
        _assert_close(got, hf_embeddings(tiny_bert, token_ids, "CLS"))

    def test_encoder_layers_run_on_packed_attention(self, bert_llm, tiny_bert):
        from vllm_ascend.core.sdk import get_device_adaptor

        adaptor = get_device_adaptor()
        adaptor.call_counts.clear()
        _embed(bert_llm, _ids(tiny_bert)[:2])
        # Two layers, one step: at least one call per layer; no paged attention at all.
        assert adaptor.call_counts["packed_attention"] >= 2, dict(adaptor.call_counts)
        assert adaptor.call_counts["fused_infer_attention"] == 0, dict(adaptor.call_counts)

    def test_chunked_prefill_is_refused_for_encoder_only(self, tiny_bert):
        """vLLM turns chunked prefill off by default for encoder-only pooling and only warns when it is asked
        for; the plugin refuses it by name, as a chunk of a bidirectional prompt would see itself only."""
        from vllm.engine.arg_utils import EngineArgs

        default = EngineArgs(model=str(tiny_bert), runner="pooling", dtype="float32", max_model_len=128)
        assert default.create_engine_config().scheduler_config.enable_chunked_prefill is False
        chunked = EngineArgs(
            model=str(tiny_bert),
            runner="pooling",
            dtype="float32",
            max_model_len=128,
            enable_chunked_prefill=True,
            max_num_batched_tokens=16,
        )
        # The platform's ConfigError reaches the caller inside pydantic's ValidationError (a ValueError).
        with pytest.raises(
            ValueError, match=r"enable_chunked_prefill=True .* allowed: enable_chunked_prefill=False"
        ):
            chunked.create_engine_config()

    def test_prompt_longer_than_the_model_is_refused(self, bert_llm, tiny_bert):
        # Without chunking, a prompt must fit max_model_len (128) in one step.
        from vllm.exceptions import VLLMValidationError

        long_prompt = (_ids(tiny_bert)[3] * 8)[:200]
        with pytest.raises(VLLMValidationError, match="maximum context length is 128 tokens"):
            _embed(bert_llm, [long_prompt])


def test_bert_embeddings_in_graph_mode_match_hf(tiny_bert):
    """Compiled (VLLM_COMPILE) with graphs asked for: vLLM keeps PIECEWISE for pooling models (no FULL graphs),
    the encoder layers' attention runs between the captured pieces with no KV cache; equal to HF."""
    from vllm.config import CUDAGraphMode

    from vllm_ascend.testing.tiny_pooling import hf_embeddings

    llm = _llm(tiny_bert, compilation_config={"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"})
    try:
        assert llm.llm_engine.vllm_config.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
        token_ids = _ids(tiny_bert)
        for _ in range(2):  # the second pass replays what the first captured or compiled
            _assert_close(_embed(llm, token_ids), hf_embeddings(tiny_bert, token_ids, "CLS"))
    finally:
        _shutdown(llm)


class TestQwen3LastTokenEmbedder:
    """A Qwen3 decoder as an embedder (Qwen3-Embedding: LAST-token pooling, normalised), chunked prefill with
    a 16-token step budget so the long prompts span several steps, and async scheduling asked for."""

    def test_chunked_last_token_embeddings_match_hf(self, qwen3_last_llm, tiny_qwen3):
        from vllm_ascend.core.sdk import get_device_adaptor
        from vllm_ascend.runner.model_runner_v2 import NPUModelRunnerV2
        from vllm_ascend.testing.tiny_pooling import hf_embeddings

        config = qwen3_last_llm.llm_engine.vllm_config
        assert config.scheduler_config.enable_chunked_prefill is True
        assert config.scheduler_config.async_scheduling is True
        assert type(_runner(qwen3_last_llm)) is NPUModelRunnerV2
        token_ids = _ids(tiny_qwen3)
        assert max(len(ids) for ids in token_ids) > config.scheduler_config.max_num_batched_tokens
        adaptor = get_device_adaptor()
        adaptor.call_counts.clear()
        got = _embed(qwen3_last_llm, token_ids)
        assert all(g.shape == (128,) for g in got)
        _assert_close(got, hf_embeddings(tiny_qwen3, token_ids, "LAST"))
        assert adaptor.call_counts["fused_infer_attention"] > 0
        assert adaptor.call_counts["packed_attention"] == 0


def test_qwen3_mean_embeddings_on_the_v1_runner_match_hf(v1_runner, tiny_qwen3):
    """MEAN pooling (no chunked prefill for it in vLLM) on vLLM's V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``)."""
    from vllm_ascend.runner.model_runner import NPUModelRunner
    from vllm_ascend.testing.tiny_pooling import hf_embeddings

    llm = _llm(tiny_qwen3, pooler_config={"seq_pooling_type": "MEAN"})
    try:
        assert type(_runner(llm)) is NPUModelRunner
        assert llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill is False
        token_ids = _ids(tiny_qwen3)
        _assert_close(_embed(llm, token_ids), hf_embeddings(tiny_qwen3, token_ids, "MEAN"))
    finally:
        _shutdown(llm)


def test_bert_cross_encoder_on_the_v1_runner_matches_hf(v1_runner, tiny_cross_encoder):
    """Encoder-only layers on vLLM's V1 runner (which gives them an encoder-only KV cache group the backend
    never writes): scores equal HF's, computed by packed_attention."""
    from transformers import AutoTokenizer

    from vllm_ascend.core.sdk import get_device_adaptor
    from vllm_ascend.runner.model_runner import NPUModelRunner
    from vllm_ascend.testing.tiny_pooling import hf_class_probs

    llm = _llm(tiny_cross_encoder)
    try:
        assert type(_runner(llm)) is NPUModelRunner
        adaptor = get_device_adaptor()
        adaptor.call_counts.clear()
        outputs = llm.score(TEXTS[0], list(TEXTS[1:]), use_tqdm=False)
        assert (
            adaptor.call_counts["packed_attention"] >= 2 and adaptor.call_counts["fused_infer_attention"] == 0
        )
        tokenizer = AutoTokenizer.from_pretrained(tiny_cross_encoder)
        ref = hf_class_probs(tiny_cross_encoder, [dict(tokenizer(TEXTS[0], doc)) for doc in TEXTS[1:]])
        _assert_close([torch.tensor([o.outputs.score]) for o in outputs], ref)
    finally:
        _shutdown(llm)


class TestBertCrossEncoder:
    """``BertForSequenceClassification`` with one label: ``score(query, documents)`` is the sigmoid of the
    classifier's logit over ``[CLS] query [SEP] document [SEP]`` with token types."""

    def test_scores_match_hf(self, cross_encoder_llm, tiny_cross_encoder):
        from transformers import AutoTokenizer

        from vllm_ascend.testing.tiny_pooling import hf_class_probs

        query, documents = TEXTS[0], list(TEXTS[1:])
        outputs = cross_encoder_llm.score(query, documents, use_tqdm=False)
        got = [torch.tensor([o.outputs.score]) for o in outputs]
        tokenizer = AutoTokenizer.from_pretrained(tiny_cross_encoder)
        pairs = [dict(tokenizer(query, doc)) for doc in documents]
        assert all(1 in pair["token_type_ids"] for pair in pairs)
        ref = hf_class_probs(tiny_cross_encoder, pairs)
        assert len({round(float(r), 4) for r in ref}) == len(ref)  # distinct scores: the order matters
        _assert_close(got, ref)


class TestQwen3Classifier:
    """``Qwen3ForSequenceClassification`` with three labels: ``classify`` is the softmax of the last token's
    logits."""

    def test_class_probabilities_match_hf(self, classifier_llm, tiny_qwen3_classifier):
        from vllm_ascend.testing.tiny_pooling import hf_class_probs

        token_ids = _ids(tiny_qwen3_classifier)
        outputs = classifier_llm.classify([{"prompt_token_ids": ids} for ids in token_ids], use_tqdm=False)
        got = [torch.tensor(o.outputs.probs) for o in outputs]
        assert all(g.shape == (3,) for g in got)
        _assert_close(got, hf_class_probs(tiny_qwen3_classifier, [{"input_ids": ids} for ids in token_ids]))
