"""vLLM's OpenAI pooling endpoints through ``vllm-ascend serve --device reference --runner pooling`` on
127.0.0.1: ``/v1/embeddings`` of a tiny BERT embedder, ``/v1/score``, ``/rerank`` and ``/v1/rerank`` of a tiny
BERT cross-encoder (and ``/rerank`` of the embedder: a bi-encoder's cosine similarities), each number equal to
HF transformers fp32 (within 1e-5 relative). Two server starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from .serving import request_json, served

REL_TOL = 1e-5
QUERY = "the quick river"
DOCUMENTS = [
    "river mountain forest ocean cloud rain snow wind stone light",
    "bright dark warm cold old new first last",
    "red green blue yellow black white quick slow small large",
]
#: A pooling server of the tiny model, served as ``tiny``.
SERVE_ARGS = [
    "--runner", "pooling", "--dtype", "float32", "--max-model-len", "128",
    "--kv-cache-memory-bytes", str(16 << 20), "--served-model-name", "tiny", "--max-num-seqs", "4",
]  # fmt: skip


def _assert_close(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert float((got - ref).norm() / ref.norm()) <= REL_TOL, (got, ref)


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pooling-server")


def test_embeddings_endpoint_matches_hf(models_root):
    from transformers import AutoTokenizer

    from vllm_ascend.testing.tiny_pooling import build_tiny_bert, hf_embeddings

    model_dir = build_tiny_bert(models_root)
    texts = [QUERY, *DOCUMENTS]
    token_ids = [AutoTokenizer.from_pretrained(model_dir)(t)["input_ids"] for t in texts]
    ref = hf_embeddings(model_dir, token_ids, "CLS")
    with served(model_dir, SERVE_ARGS, models_root / "embed.log") as base:
        status, body = request_json(f"{base}/v1/embeddings", {"model": "tiny", "input": texts})
        assert status == 200, body
        assert [item["index"] for item in body["data"]] == list(range(len(texts)))
        assert body["usage"]["prompt_tokens"] == sum(len(ids) for ids in token_ids)
        for item, expected in zip(body["data"], ref, strict=True):
            _assert_close(torch.tensor(item["embedding"]), expected)
        # Token ids are accepted as input too, and give the same vectors.
        status, body = request_json(f"{base}/v1/embeddings", {"model": "tiny", "input": token_ids[:2]})
        assert status == 200, body
        for item, expected in zip(body["data"], ref[:2], strict=True):
            _assert_close(torch.tensor(item["embedding"]), expected)
        # An embedder reranks as a bi-encoder: the cosine similarity of the query's and each document's vector.
        status, body = request_json(
            f"{base}/rerank", {"model": "tiny", "query": QUERY, "documents": DOCUMENTS}
        )
        assert status == 200, body
        got = torch.tensor([r["relevance_score"] for r in sorted(body["results"], key=lambda r: r["index"])])
        _assert_close(got, torch.stack([ref[0] @ doc for doc in ref[1:]]))


def test_score_and_rerank_endpoints_match_hf(models_root):
    from transformers import AutoTokenizer

    from vllm_ascend.testing.tiny_pooling import build_tiny_bert, hf_class_probs

    model_dir = build_tiny_bert(models_root, num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ref = torch.cat(hf_class_probs(model_dir, [dict(tokenizer(QUERY, doc)) for doc in DOCUMENTS]))
    assert len({round(float(r), 4) for r in ref}) == len(DOCUMENTS)  # a strict ranking to check
    with served(model_dir, SERVE_ARGS, models_root / "score.log") as base:
        status, body = request_json(
            f"{base}/v1/score", {"model": "tiny", "queries": QUERY, "documents": DOCUMENTS}
        )
        assert status == 200, body
        assert [item["index"] for item in body["data"]] == list(range(len(DOCUMENTS)))
        _assert_close(torch.tensor([item["score"] for item in body["data"]]), ref)
        for path in ("/rerank", "/v1/rerank"):
            status, body = request_json(
                f"{base}{path}", {"model": "tiny", "query": QUERY, "documents": DOCUMENTS}
            )
            assert status == 200, (path, body)
            results = body["results"]
            assert [r["index"] for r in results] == ref.argsort(descending=True).tolist(), results
            assert [r["document"]["text"] for r in results] == [DOCUMENTS[r["index"]] for r in results]
            got = torch.tensor([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
            _assert_close(got, ref)
        status, body = request_json(
            f"{base}/v1/rerank", {"model": "tiny", "query": QUERY, "documents": DOCUMENTS, "top_n": 1}
        )
        assert status == 200, body
        assert [r["index"] for r in body["results"]] == [int(ref.argmax())]
        # A request missing the documents is refused by name.
        status, body = request_json(f"{base}/v1/rerank", {"model": "tiny", "query": QUERY})
        assert status == 400 and "documents" in json.dumps(body), body
