"""Quantized checkpoints vLLM cannot serve fail with errors naming the layer, the field and the expectation.

Config-time problems (method, description) are checked by building vLLM's config; load-time problems
(tensors that do not match their description) by starting an engine on a damaged export.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_ascend.quant.export import export_modelslim
from vllm_ascend.testing.process import OUTPUT_TAIL_CHARS, run_vllm_script

DESCRIPTION = "quant_model_description.json"
QKV_SCALE = "model.layers.0.self_attn.q_proj.weight_scale"


@pytest.fixture(scope="module")
def w8a8_dynamic(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3: Path) -> Path:
    out = tmp_path_factory.mktemp("w8a8-dynamic") / "model"
    export_modelslim(tiny_qwen3, out, "W8A8_DYNAMIC", progress=False)
    return out


@pytest.fixture
def damaged(tmp_path: Path, w8a8_dynamic: Path) -> Callable[..., Path]:
    """A copy of the W8A8_DYNAMIC export with its description and/or tensors edited."""

    def make(
        description: Callable[[dict], None] | None = None, tensors: Callable[[dict], None] | None = None
    ) -> Path:
        copy = tmp_path / "damaged"
        shutil.copytree(w8a8_dynamic, copy)
        if description is not None:
            data = json.loads((copy / DESCRIPTION).read_text())
            description(data)
            (copy / DESCRIPTION).write_text(json.dumps(data))
        if tensors is not None:
            for file in copy.glob("*.safetensors"):
                state = load_file(file)
                tensors(state)
                save_file(state, file, metadata={"format": "pt"})
        return copy

    return make


def _config(model: Path, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(model), dtype="float32", max_model_len=256, block_size=16, **kwargs)
    return args.create_engine_config()


def test_cuda_methods_are_refused_by_name(tiny_qwen3):
    with pytest.raises(
        Exception, match=r"quantization='fp8' is not supported by vllm-ascend.*supported: 'ascend'"
    ):
        _config(tiny_qwen3, quantization="fp8")


def test_ascend_on_a_float_checkpoint_is_refused(tiny_qwen3):
    with pytest.raises(FileNotFoundError, match=f"quant description not found: {tiny_qwen3}/{DESCRIPTION}"):
        _config(tiny_qwen3, quantization="ascend")


def _json(edit: Callable[[dict], None]) -> Callable[[dict], bytes]:
    def write(good: dict) -> bytes:
        data = dict(good)
        edit(data)
        return json.dumps(data).encode()

    return write


def _expert_shards(data: dict) -> None:
    data.update(
        {
            f"model.layers.0.mlp.experts.{e}.{p}.weight": "W8A8_DYNAMIC"
            for e in (0, 1)
            for p in ("gate_proj", "down_proj")
        }
    )
    data["model.layers.0.mlp.experts.0.up_proj.weight"] = "W8A8_DYNAMIC"


#: (description bytes from the good description, problem); each refused with the file's name at config time.
MALFORMED: dict[str, tuple[Callable[[dict], bytes], str]] = {
    "string-naming-a-good-description": (
        lambda good: json.dumps(DESCRIPTION).encode(),
        "top level must be a JSON object, got a string",
    ),
    "deep-nesting": (lambda good: b"[" * 100_000 + b"]" * 100_000, "nested 100000 levels deep; at most 64"),
    "empty": (lambda good: b"", "empty: expected a JSON document"),
    "bom": (
        lambda good: b"\xef\xbb\xbf" + json.dumps(good).encode(),
        "not valid JSON: it starts with a UTF-8 byte order mark",
    ),
    "latin-1": (
        lambda good: json.dumps(good).encode()[:-1] + b', "note.weight": "caf\xe9"}',
        "not UTF-8: byte 0xe9 at offset",
    ),
    "top-level-array": (
        lambda good: json.dumps([good]).encode(),
        "top level must be a JSON object, got an array",
    ),
    "nan": (
        lambda good: json.dumps(good).encode()[:-1] + b', "group_size": NaN}',
        "not valid JSON: NaN is not a JSON number",
    ),
    "missing-v-shard": (
        _json(lambda d: [d.pop(k) for k in list(d) if k.startswith("model.layers.1.self_attn.v_proj.")]),
        "fused layer 'model.layers.1.self_attn.qkv_proj' is missing shard(s) v_proj: "
        "model.layers.1.self_attn.v_proj.weight not described (described: q_proj, k_proj)",
    ),
    "missing-expert-shard": (
        _json(_expert_shards),
        "MoE layer 'model.layers.0.mlp.experts' is missing expert shard(s) 1.up_proj",
    ),
    "unknown-type": (
        _json(lambda d: d.update({"model.layers.0.self_attn.o_proj.weight": "W9A9"})),
        "model.layers.0.self_attn.o_proj.weight = 'W9A9': expected one of FLOAT, W8A8,",
    ),
    "unsupported-linear-type": (
        _json(lambda d: d.update({k: "W4A4_DYNAMIC" for k in d if ".o_proj." in k})),
        "W4A4_DYNAMIC linear layers (2: model.layers.0.self_attn.o_proj, model.layers.1.self_attn.o_proj) are not "
        "supported by vllm-ascend-quant; supported for linear layers: W4A16, W4A8_DYNAMIC, W8A16, W8A8, "
        "W8A8_DYNAMIC",
    ),
    "unsupported-expert-type": (
        _json(
            lambda d: d.update(
                {
                    f"model.layers.1.mlp.experts.0.{p}.weight": "W4A16"
                    for p in ("gate_proj", "up_proj", "down_proj")
                }
            )
        ),
        "W4A16 MoE experts (1: model.layers.1.mlp.experts) are not supported by vllm-ascend-quant; supported for "
        "MoE experts: W4A8_DYNAMIC, W8A8_DYNAMIC",
    ),
}


@pytest.mark.parametrize("quantization", ["ascend", None], ids=["quantization-ascend", "detected"])
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_descriptions_are_refused_naming_the_file(
    tmp_path, monkeypatch, w8a8_dynamic, case, quantization
):
    """Through vLLM's config (``--quantization ascend``, and core's detection of the file): the bounded reader
    and the description checks refuse each, naming the file, before any worker starts. The working directory
    holds a good description, which a string description must not be followed to."""
    model = tmp_path / "model"
    shutil.copytree(w8a8_dynamic, model)
    good = json.loads((w8a8_dynamic / DESCRIPTION).read_text())
    content, problem = MALFORMED[case]
    (model / DESCRIPTION).write_bytes(content(good))
    monkeypatch.chdir(w8a8_dynamic)
    with pytest.raises(Exception) as info:
        _config(model, quantization=quantization)
    message = str(info.value)
    assert f"invalid quant description {model / DESCRIPTION}: 1 problem(s)" in message, message
    assert problem in message, message


@pytest.mark.parametrize("quantization", ["ascend", None], ids=["quantization-ascend", "detected"])
def test_oversize_and_unreadable_descriptions_are_refused_naming_the_file(
    tmp_path, w8a8_dynamic, quantization
):
    model = tmp_path / "model"
    shutil.copytree(w8a8_dynamic, model)
    with open(model / DESCRIPTION, "wb") as f:
        f.truncate(64 * 1024 * 1024 + 1)  # sparse: refused from its size, never read
    with pytest.raises(Exception, match=r"too large: 67108865 bytes; at most 67108864 are allowed") as info:
        _config(model, quantization=quantization)
    assert f"invalid quant description {model / DESCRIPTION}" in str(info.value)
    (model / DESCRIPTION).unlink()
    (model / DESCRIPTION).mkdir()  # detected all the same: never served as a float model
    with pytest.raises(Exception, match=r"unreadable: Is a directory") as info:
        _config(model, quantization=quantization)
    assert f"invalid quant description {model / DESCRIPTION}" in str(info.value)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda d: d.update({"model.layers.0.self_attn.o_proj.weight": "W9A9"}),
            r"model\.layers\.0\.self_attn\.o_proj\.weight = 'W9A9': expected one of .*W8A8_DYNAMIC",
        ),
        (
            lambda d: d.update({"model.layers.0.self_attn.k_proj.weight": "W8A16"}),
            r"fused layer 'model\.layers\.0\.self_attn\.qkv_proj' mixes quant types",
        ),
        (lambda d: d.update({"kv_cache_type": "C8"}), r"kv_cache_type='C8'.*not supported yet"),
        (lambda d: d.pop("model_quant_type"), r"missing required key 'model_quant_type'"),
        (lambda d: d.update({"group_size": -4}), r"group_size = -4: expected an integer in 0\.\."),
    ],
    ids=["unknown-type", "mixed-fused-shards", "c8-kv-cache", "no-model-type", "negative-group"],
)
def test_bad_descriptions_are_refused_at_config_time(damaged, edit, match):
    with pytest.raises(Exception, match=match):
        _config(damaged(description=edit), quantization="ascend")


def _drop(name: str) -> Callable[[dict], None]:
    return lambda state: state.pop(name)


def _set(name: str, value: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    def edit(state: dict) -> None:
        state[name] = value(state[name])

    return edit


@pytest.mark.parametrize(
    ("tensors", "description", "match"),
    [
        (
            _set("model.layers.0.mlp.down_proj.weight", lambda t: t.float()),
            None,
            r"model\.layers\.0\.mlp\.down_proj\.weight: expected torch\.int8, got torch\.float32",
        ),
        (
            _set(QKV_SCALE, lambda t: t.repeat(1, 3)),
            None,
            r"model\.layers\.0\.self_attn\.qkv_proj\.weight_scale: expected one value per output channel",
        ),
        (_drop(QKV_SCALE), None, r"weight_scale"),
        (
            None,
            lambda d: [d.pop(k) for k in list(d) if k.startswith("model.layers.1.mlp.down_proj.")],
            r"layer 'model\.layers\.1\.mlp\.down_proj' \(linear\) is not fully described: tensor "
            r"'model\.layers\.1\.mlp\.down_proj\.weight' is not in the quant description .*damaged/"
            r"quant_model_description\.json",
        ),
        (
            None,
            lambda d: [d.pop(k) for k in list(d) if k.startswith("model.layers.0.mlp.up_proj.")],
            r"layer 'model\.layers\.0\.mlp\.gate_up_proj' \(linear\) is not fully described: fused layer "
            r"'model\.layers\.0\.mlp\.gate_up_proj' is missing shard\(s\) up_proj: "
            r"model\.layers\.0\.mlp\.up_proj\.weight not in the quant description .*damaged/",
        ),
    ],
    ids=["float-weight", "scale-shape", "missing-scale", "layer-not-described", "gate-without-up"],
)
def test_bad_tensors_are_refused_at_load_time(make_llm, damaged, tensors, description, match):
    with pytest.raises(Exception, match=match):
        make_llm(damaged(description=description, tensors=tensors), quantization="ascend")


def test_without_the_quant_distribution_the_error_names_it(w8a8_dynamic):
    """``quantization="ascend"`` and an auto-detected ModelSlim checkpoint both name `vllm-ascend[quant]`."""
    code = f"""
        import json
        from vllm.engine.arg_utils import EngineArgs
        outcomes = []
        for quantization in ("ascend", None):
            try:
                EngineArgs(model={str(w8a8_dynamic)!r}, dtype="float32", max_model_len=256,
                           quantization=quantization).create_engine_config()
            except Exception as exc:
                outcomes.append(f"{{type(exc).__name__}} | {{exc}}")
            else:
                outcomes.append("accepted")
        print("RESULT " + json.dumps(outcomes))
        """
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(
        HF_HUB_OFFLINE="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_ASCEND_DEVICE="reference",
        VLLM_ASCEND_DISABLED_EXTENSIONS="quant",
    )
    outcomes, output = run_vllm_script(textwrap.dedent(code), env=env, timeout=300)
    assert outcomes is not None and len(outcomes) == 2, output[-OUTPUT_TAIL_CHARS:]
    for outcome in outcomes:
        assert "vllm-ascend[quant]" in outcome and "vllm-ascend-quant" in outcome, outcome
