"""vLLM's OpenAI pooling endpoints through ``vllm-ascend serve --device reference --runner pooling`` on
127.0.0.1: ``/v1/embeddings`` of a tiny BERT embedder, ``/v1/score``, ``/rerank`` and ``/v1/rerank`` of a tiny
BERT cross-encoder (and ``/rerank`` of the embedder: a bi-encoder's cosine similarities), each number equal to
HF transformers fp32 (within 1e-5 relative). Two server starts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

STARTUP_TIMEOUT_S = 240
REL_TOL = 1e-5
QUERY = "the quick river"
DOCUMENTS = [
    "river mountain forest ocean cloud rain snow wind stone light",
    "bright dark warm cold old new first last",
    "red green blue yellow black white quick slow small large",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@contextmanager
def _serve(model_dir: Path, log: Path) -> Iterator[str]:
    """A pooling server on a free 127.0.0.1 port, healthy within the startup bound; stopped afterwards."""
    port = _free_port()
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}
    argv = [
        sys.executable, "-m", "vllm_ascend.core.cli", "serve", str(model_dir), "--device", "reference",
        "--runner", "pooling", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "128", "--kv-cache-memory-bytes", str(16 << 20), "--served-model-name", "tiny",
        "--max-num-seqs", "4",
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"server did not become healthy in {STARTUP_TIMEOUT_S}s:\n{log.read_text()[-4000:]}"
                )
            time.sleep(1)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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
    with _serve(model_dir, models_root / "embed.log") as base:
        status, body = _post(f"{base}/v1/embeddings", {"model": "tiny", "input": texts})
        assert status == 200, body
        assert [item["index"] for item in body["data"]] == list(range(len(texts)))
        assert body["usage"]["prompt_tokens"] == sum(len(ids) for ids in token_ids)
        for item, expected in zip(body["data"], ref, strict=True):
            _assert_close(torch.tensor(item["embedding"]), expected)
        # Token ids are accepted as input too, and give the same vectors.
        status, body = _post(f"{base}/v1/embeddings", {"model": "tiny", "input": token_ids[:2]})
        assert status == 200, body
        for item, expected in zip(body["data"], ref[:2], strict=True):
            _assert_close(torch.tensor(item["embedding"]), expected)
        # An embedder reranks as a bi-encoder: the cosine similarity of the query's and each document's vector.
        status, body = _post(f"{base}/rerank", {"model": "tiny", "query": QUERY, "documents": DOCUMENTS})
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
    with _serve(model_dir, models_root / "score.log") as base:
        status, body = _post(f"{base}/v1/score", {"model": "tiny", "queries": QUERY, "documents": DOCUMENTS})
        assert status == 200, body
        assert [item["index"] for item in body["data"]] == list(range(len(DOCUMENTS)))
        _assert_close(torch.tensor([item["score"] for item in body["data"]]), ref)
        for path in ("/rerank", "/v1/rerank"):
            status, body = _post(f"{base}{path}", {"model": "tiny", "query": QUERY, "documents": DOCUMENTS})
            assert status == 200, (path, body)
            results = body["results"]
            assert [r["index"] for r in results] == ref.argsort(descending=True).tolist(), results
            assert [r["document"]["text"] for r in results] == [DOCUMENTS[r["index"]] for r in results]
            got = torch.tensor([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])])
            _assert_close(got, ref)
        status, body = _post(
            f"{base}/v1/rerank", {"model": "tiny", "query": QUERY, "documents": DOCUMENTS, "top_n": 1}
        )
        assert status == 200, body
        assert [r["index"] for r in body["results"]] == [int(ref.argmax())]
        # A request missing the documents is refused by name.
        status, body = _post(f"{base}/v1/rerank", {"model": "tiny", "query": QUERY})
        assert status == 400 and "documents" in json.dumps(body), body
