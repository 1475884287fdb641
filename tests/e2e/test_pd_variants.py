"""Prefill/decode disaggregation (``MooncakeConnectorV1``, Mooncake TCP on loopback) beyond the dense TP=1 case.

Each pair is a real prefill instance (``kv_producer``) and a real decode instance (``kv_consumer``), started
once per class (at most two servers alive at a time). Without a proxy, a request goes to prefill with
``max_tokens: 1`` and ``do_remote_decode``; prefill's ``kv_transfer_params`` go with the original request to
decode, which reads the prompt's blocks from prefill and generates. Decode's tokens must equal a plain run
of the same request on prefill (a normal instance when a request asks for nothing), and decode must
count the prompt as transferred (``vllm:prompt_tokens_by_source{source="external_kv_transfer"}``).

- heterogeneous TP: prefill over 2 ranks (one of the tiny Qwen3's 2 KV heads each), decode on 1 rank
  reading each prefill rank's head slice into its own blocks; greedy and seeded sampling.
- MLA: a tiny DeepSeek-V3 (MoE from layer 1); the latent cache (its c_kv and k_pe planes, the same on every
  rank) moves whole.

Prompts are longer than ``--max-num-batched-tokens 64`` (prefill computes them in chunks) and span several
16-token blocks, with lengths that end mid-block and on a block boundary.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from vllm_ascend.testing.tiny_models import build_tiny_model

from .pd import Instance, completion, free_port_block, metric, running, start_serve
from .test_mla_deepseek import deepseek_v3_spec

BLOCK = 16
MAX_TOKENS = 16
#: prompt lengths: all above 64 (chunked prefill), mid-block and on a block boundary
LENGTHS = (67, 96, 141)


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(n)] for n in LENGTHS]


def _kv(role: str, engine_id: str, port: int) -> dict[str, Any]:
    return {
        "kv_connector": "MooncakeConnectorV1",
        "kv_role": role,
        "kv_port": port,
        "engine_id": engine_id,
        "kv_connector_extra_config": {"use_ascend_direct": False, "transfer_timeout": 60},
    }


def _cached(body: dict[str, Any]) -> int:
    details = body["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _tokens(body: dict[str, Any]) -> list[int]:
    choice = body["choices"][0]
    ids = choice.get("token_ids")
    return list(ids) if ids is not None else choice["text"]


def _run(base: str, prompt: list[int], **sampling: Any) -> dict[str, Any]:
    return completion(base, prompt, MAX_TOKENS, ignore_eos=True, return_token_ids=True, **sampling)


def _through_pd(prefill: Instance, decode: Instance, prompt: list[int], **sampling: Any):
    """Prefill remotely, then decode with prefill's params: (prefill's body, decode's body)."""
    first = completion(
        prefill.base,
        prompt,
        1,
        kv_transfer_params={"do_remote_decode": True},
        ignore_eos=True,
        return_token_ids=True,
        **sampling,
    )
    params = first.get("kv_transfer_params")
    assert params and params.get("do_remote_prefill"), first
    return first, _run(decode.base, prompt, kv_transfer_params=params, **sampling)


def _source(base: str, source: str) -> float:
    return metric(base, "vllm:prompt_tokens_by_source_total", source=source)


def _check_case(
    prefill: Instance, decode: Instance, prompt: list[int], tp_size: int, spec: bool = False, **sampling: Any
) -> list[int]:
    """Through P/D = plain on prefill. Prefill computed the (fresh) prompt itself, in chunks; decode took it
    from prefill (vLLM's ``external_kv_transfer`` prompt tokens).
    vLLM 0.32 reports in decode's ``cached_tokens`` prefill's own prefix-cache hit
    (``remote_prefill_cached_tokens`` in the params), not decode's transfer hit."""
    external, computed = _source(decode.base, "external_kv_transfer"), _source(decode.base, "local_compute")
    first, decoded = _through_pd(prefill, decode, prompt, **sampling)
    params = first["kv_transfer_params"]
    assert params["remote_tp_size"] == tp_size, params
    assert len(params["remote_block_ids"]) == -(-len(prompt) // BLOCK), params
    assert _cached(first) == 0, first["usage"]  # a fresh prompt on prefill
    assert params["remote_prefill_cached_tokens"] == 0, params
    assert _cached(decoded) == 0, decoded["usage"]
    # vLLM counts the whole prompt as transferred (computed + cached + transferred = prompt), although
    # decode recomputes the last prompt token to sample the first output token
    assert _source(decode.base, "external_kv_transfer") - external == len(prompt)
    assert _source(decode.base, "local_compute") - computed == 0
    plain = _run(prefill.base, prompt, **sampling)
    # the same prompt again on prefill: its local prefix-cache hit (full blocks; the last token is computed;
    # with a drafter, vLLM keeps one block fewer: the drafter recomputes from the target's hidden states)
    assert _cached(plain) == ((len(prompt) - 1) // BLOCK - spec) * BLOCK, plain["usage"]
    assert _tokens(decoded) == _tokens(plain), (decoded["choices"][0], plain["choices"][0])
    assert decoded["choices"][0]["text"] == plain["choices"][0]["text"]
    return _tokens(decoded)


def _start_pair(logs: Path, model: Path, prefill_args: list[str], decode_args: list[str]):
    p = start_serve(
        model,
        logs / "prefill.log",
        kv_transfer=_kv("kv_producer", "prefill", free_port_block(8)),
        args=prefill_args,
    )
    d = start_serve(
        model,
        logs / "decode.log",
        kv_transfer=_kv("kv_consumer", "decode", free_port_block(8)),
        args=decode_args,
    )
    return p, d


# -- heterogeneous tensor parallelism: P TP=2 -> D TP=1 -------------------------------------------------
class TestHeterogeneousTP:
    """Tiny Qwen3 (2 KV heads): prefill's ranks hold one head each; decode reads each rank's head slice."""

    @pytest.fixture(scope="class")
    @classmethod
    def pair(cls, tmp_path_factory: pytest.TempPathFactory, tiny_qwen3: Path):
        tp2 = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"]
        with running(*_start_pair(tmp_path_factory.mktemp("pd-tp"), tiny_qwen3, tp2, [])) as pair:
            yield pair

    @pytest.mark.parametrize("index", range(len(LENGTHS)))
    def test_greedy(self, pair, index: int):
        assert len(_check_case(*pair, _prompts(1)[index], tp_size=2)) == MAX_TOKENS

    @pytest.mark.parametrize("index", range(len(LENGTHS)))
    def test_seeded(self, pair, index: int):
        tokens = _check_case(*pair, _prompts(2)[index], tp_size=2, temperature=0.8, seed=100 + index)
        assert len(tokens) == MAX_TOKENS


# -- MLA ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deepseek(tiny_models_root: Path) -> Path:
    """Tiny DeepSeek-V3 (MLA, kv_lora_rank 32, MoE from layer 1), float."""
    spec = deepseek_v3_spec(
        kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, first_k_dense_replace=1
    )
    return build_tiny_model(spec, tiny_models_root)


class TestMla:
    """The latent cache (its c_kv and k_pe planes, the same on every rank) moved whole, block by block.
    Model-based drafting (MTP) on a KV consumer is refused at config time (the kvtransfer config tests)."""

    @pytest.fixture(scope="class")
    @classmethod
    def pair(cls, tmp_path_factory: pytest.TempPathFactory, deepseek: Path):
        with running(*_start_pair(tmp_path_factory.mktemp("pd-mla"), deepseek, [], [])) as pair:
            yield pair

    @pytest.mark.parametrize("index", range(len(LENGTHS)))
    def test_greedy(self, pair, index: int):
        assert len(_check_case(*pair, _prompts(4)[index], tp_size=1)) == MAX_TOKENS

    def test_seeded(self, pair):
        assert len(_check_case(*pair, _prompts(5)[0], tp_size=1, temperature=0.8, seed=7)) == MAX_TOKENS
