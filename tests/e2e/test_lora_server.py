"""Dynamic LoRA adapters through ``vllm-ascend serve --device reference`` on 127.0.0.1 (one server start): one
adapter preloaded (``--lora-modules``), another loaded and unloaded at run time (``/v1/load_lora_adapter``,
``/v1/unload_lora_adapter``), one adapter slot and one host slot so every switch evicts and reloads; every
completion's token ids equal HF + PEFT greedy in fp32. Malformed adapters are refused with 400 naming the file
and the field or tensor; unknown adapters with vLLM's 404."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.e2e.conftest import MAX_NEW_TOKENS
from tests.e2e.lora_adapters import build_adapter, hf_greedy

from .serving import request_json, served

#: name -> (rank, alpha, target modules, seed)
ADAPTERS = {
    "attn": (8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"], 0),
    "mlp": (16, 8, ["gate_proj", "up_proj", "down_proj"], 1),
}
SERVE_ARGS = [
    "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory-bytes", str(64 << 20),
    "--served-model-name", "tiny", "--max-num-seqs", "4", "--seed", "0",
    "--enable-lora", "--max-loras", "1", "--max-cpu-loras", "1", "--max-lora-rank", "16",
]  # fmt: skip


@pytest.fixture(scope="module")
def adapters(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-server")
    built = {}
    for name, (rank, alpha, targets, seed) in ADAPTERS.items():
        built[name] = root / name
        build_adapter(tiny_qwen3, built[name], rank, alpha, targets, seed)
    return built


@pytest.fixture(scope="module")
def hf_tokens(tiny_qwen3, adapters, qwen3_prompts) -> dict[str, list[list[int]]]:
    """HF + PEFT greedy tokens per served model name (``tiny``: the base model)."""
    table = {"tiny": hf_greedy(tiny_qwen3, None, qwen3_prompts)}
    table.update({name: hf_greedy(tiny_qwen3, path, qwen3_prompts) for name, path in adapters.items()})
    assert len({json.dumps(tokens) for tokens in table.values()}) == len(
        table
    )  # the adapters change the output
    return table


@pytest.fixture(scope="module")
def server(tiny_qwen3, adapters, tmp_path_factory):
    log = tmp_path_factory.mktemp("lora-server-log") / "serve.log"
    args = [*SERVE_ARGS, "--lora-modules", f"attn={adapters['attn']}"]
    with served(tiny_qwen3, args, log, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as base:
        yield base


def _complete(base: str, model: str, prompts: list[list[int]]) -> tuple[int, dict]:
    body = {
        "model": model,
        "prompt": prompts,
        "max_tokens": MAX_NEW_TOKENS,
        "min_tokens": MAX_NEW_TOKENS,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    return request_json(f"{base}/v1/completions", body)


def _tokens(base: str, model: str, prompts: list[list[int]]) -> list[list[int]]:
    status, body = _complete(base, model, prompts)
    assert status == 200, body
    assert body["model"] == model
    return [choice["token_ids"] for choice in sorted(body["choices"], key=lambda c: c["index"])]


def _adapter_call(base: str, action: str, body: dict) -> tuple[int, dict | str]:
    """POST to ``/v1/{action}_lora_adapter``: vLLM answers success in plain text, errors in JSON."""
    req = urllib.request.Request(
        f"{base}/v1/{action}_lora_adapter", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _models(base: str) -> dict[str, dict]:
    status, body = request_json(f"{base}/v1/models")
    assert status == 200, body
    return {card["id"]: card for card in body["data"]}


def test_the_preloaded_adapter_equals_hf_peft(server, adapters, hf_tokens, qwen3_prompts):
    assert _tokens(server, "attn", qwen3_prompts) == hf_tokens["attn"]
    models = _models(server)
    assert set(models) == {"tiny", "attn"}
    assert models["attn"]["root"] == str(adapters["attn"])


def test_a_runtime_loaded_adapter_and_switches_between_adapters(server, adapters, hf_tokens, qwen3_prompts):
    """One adapter slot and one host slot: each switch evicts the other adapter and loads it again from disk."""
    status, body = _adapter_call(server, "load", {"lora_name": "mlp", "lora_path": str(adapters["mlp"])})
    assert (status, body) == (200, "Success: LoRA adapter 'mlp' added successfully."), body
    assert set(_models(server)) == {"tiny", "attn", "mlp"}
    for model in ("mlp", "attn", "tiny", "mlp", "attn", "mlp", "tiny"):
        assert _tokens(server, model, qwen3_prompts) == hf_tokens[model], model


def test_unloaded_and_unknown_adapters_get_vllms_404(server, adapters, hf_tokens, qwen3_prompts):
    status, body = _adapter_call(server, "unload", {"lora_name": "mlp"})
    assert (status, body) == (200, "Success: LoRA adapter 'mlp' removed successfully."), body
    assert set(_models(server)) == {"tiny", "attn"}
    for name in ("mlp", "never-loaded"):
        status, body = _complete(server, name, qwen3_prompts[:1])
        assert status == 404, body
        assert body["error"]["message"] == f"The model `{name}` does not exist. Valid aliases: tiny.", body
        assert (body["error"]["type"], body["error"]["param"]) == ("NotFoundError", "model"), body
    status, body = _adapter_call(server, "unload", {"lora_name": "mlp"})
    assert status == 404 and "mlp" in body["error"]["message"], body
    # The preloaded adapter still serves.
    assert _tokens(server, "attn", qwen3_prompts[:2]) == hf_tokens["attn"][:2]


def _malformed(source: Path, target: Path, config_edit: dict | None = None, widen: str | None = None) -> Path:
    shutil.copytree(source, target)
    if config_edit is not None:
        config = json.loads((target / "adapter_config.json").read_text())
        (target / "adapter_config.json").write_text(json.dumps(config | config_edit))
    if widen is not None:
        tensors = load_file(target / "adapter_model.safetensors")
        tensors[widen] = tensors[widen][:, :-8].contiguous()
        save_file(tensors, target / "adapter_model.safetensors")
    return target


def test_malformed_adapters_are_refused_with_400_naming_file_and_field(
    server, adapters, hf_tokens, qwen3_prompts, tmp_path
):
    """vLLM 0.32 alone answers these with 500 (``TypeError`` without a name) or loads them silently (a
    ``lora_A`` too narrow: the slot is zero-padded); the runner's checks refuse them, the server with 400."""
    key = "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"
    cases = {
        "string-rank": (
            _malformed(adapters["attn"], tmp_path / "string-rank", config_edit={"r": "8"}),
            "adapter_config.json: field 'r' must be an integer in 1..16 (--max-lora-rank); got '8'",
        ),
        "rank-too-big": (
            _malformed(adapters["attn"], tmp_path / "rank-too-big", config_edit={"r": 32}),
            "adapter_config.json: field 'r' must be an integer in 1..16 (--max-lora-rank); got 32",
        ),
        "narrow-lora-a": (
            _malformed(adapters["mlp"], tmp_path / "narrow-lora-a", widen=key),
            f"adapter_model.safetensors: tensor '{key}' has shape [16, 248]; the model's module and the config's "
            "rank (field 'r' / 'rank_pattern': 16) need [16, 256]",
        ),
    }
    (tmp_path / "no-config").mkdir()
    cases["no-config"] = (
        tmp_path / "no-config",
        "adapter_config.json is missing: a PEFT LoRA adapter directory holds adapter_config.json and one of "
        "adapter_model.safetensors, adapter_model.bin, adapter_model.pt",
    )
    for name, (path, detail) in cases.items():
        status, body = _adapter_call(server, "load", {"lora_name": name, "lora_path": str(path)})
        assert status == 400, (name, body)
        # vLLM's server writes paths in error messages as <path>; the file name and the field stay.
        assert body["error"]["message"] == f"Invalid LoRA adapter: <path>: {detail}", body
        assert body["error"]["type"] == "BadRequestError"
    assert set(_models(server)) == {"tiny", "attn"}
    assert _tokens(server, "attn", qwen3_prompts[:2]) == hf_tokens["attn"][:2]
