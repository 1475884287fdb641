"""``AscendQuantConfig`` as vLLM sees it: registry name, description file, name mapping, fused modules."""

from __future__ import annotations

import pytest
from vllm.model_executor.models.utils import WeightsMapper

from vllm_ascend.quant.config import AscendQuantConfig
from vllm_ascend.quant.description import QuantDescriptionError
from vllm_ascend.quant.errors import QuantLoadError


@pytest.fixture(autouse=True)
def reference_device(monkeypatch):
    """The config reads the active family (to accept 310P-only types there): the reference device."""
    from vllm_ascend.core.device.config import clear_device_caches

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    clear_device_caches()
    yield
    clear_device_caches()


def _description(**tensors: str) -> dict:
    return {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0", **tensors}


def test_vllm_lists_no_config_file_and_the_config_reads_the_description(tmp_path):
    """vLLM's get_quant_config would ``json.load`` a listed file unbounded: none is listed, vLLM builds the
    config bare and maybe_update_config reads the model's description through the bounded reader."""
    import json

    assert AscendQuantConfig.get_config_filenames() == []
    config = AscendQuantConfig()
    assert repr(config) == "AscendQuantConfig(None)"
    with pytest.raises(QuantLoadError, match=r"AscendQuantConfig has no quant description: build it with"):
        config.description  # noqa: B018
    assert config.get_name() == "ascend"
    assert config.get_min_capability() == 0
    assert {str(d) for d in config.get_supported_act_dtypes()} == {
        "torch.bfloat16",
        "torch.float16",
        "torch.float32",
    }
    (tmp_path / "quant_model_description.json").write_text(
        json.dumps(_description(**{"model.layers.0.mlp.down_proj.weight": "W8A8_DYNAMIC"}))
    )
    config.maybe_update_config(str(tmp_path))
    assert config.description.source == str(tmp_path / "quant_model_description.json")
    assert config.description.tensor_type("model.layers.0.mlp.down_proj.weight") == "W8A8_DYNAMIC"
    with pytest.raises(
        FileNotFoundError, match=r"quant description not found: .*empty/quant_model_description"
    ):
        (tmp_path / "empty").mkdir()
        AscendQuantConfig().maybe_update_config(str(tmp_path / "empty"))


def test_a_hub_model_reads_the_description_vllm_cached(tmp_path, monkeypatch):
    """A model named by Hub id: the description vLLM's get_quant_config fetched into the HF cache."""
    import json

    import huggingface_hub

    snapshot = tmp_path / "models--org--tiny" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("a" * 40)
    (snapshot / "quant_model_description.json").write_text("[]")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(QuantDescriptionError) as info:
        AscendQuantConfig().maybe_update_config("org/tiny")
    assert info.value.source == str(snapshot / "quant_model_description.json")
    assert info.value.problems == ["top level must be a JSON object, got an array"]
    (snapshot / "quant_model_description.json").write_text(json.dumps(_description()))
    config = AscendQuantConfig()
    config.maybe_update_config("org/tiny")
    assert config.description.model_quant_type == "W8A8_DYNAMIC"
    with pytest.raises(
        FileNotFoundError,
        match=r"'org/other' is not a local directory and the Hugging Face cache has no quant_model_description\.json",
    ):
        AscendQuantConfig().maybe_update_config("org/other")


@pytest.mark.parametrize(
    ("config", "problem"),
    [("/models/other/quant_model_description.json", "a string"), ([], "an array"), (None, "null")],
)
def test_from_config_refuses_anything_but_an_object(config, problem):
    """A parsed description that is a string is never followed as a path."""
    with pytest.raises(QuantDescriptionError) as info:
        AscendQuantConfig.from_config(config)
    assert info.value.problems == [f"top level must be a JSON object, got {problem}"]
    assert str(info.value).startswith("invalid quant description <quantization config>: 1 problem(s)")


def test_hf_names_are_mapped_to_vllm_names_but_fused_shards_keep_theirs():
    config = AscendQuantConfig.from_config(
        _description(
            **{f"model.layers.0.self_attn.{p}_proj.weight": "W8A8_DYNAMIC" for p in "qkv"},
            **{"model.layers.0.mlp.down_proj.weight": "FLOAT", "model.visual.proj.weight": "FLOAT"},
        )
    )
    mapper = WeightsMapper(
        orig_to_new_prefix={"model.visual.": None, "model.": "language_model.model."},
        orig_to_new_stacked={".q_proj": (".qkv_proj", "q")},
    )
    config.apply_vllm_mapper(mapper)
    assert config.description.tensors == {
        **{f"language_model.model.layers.0.self_attn.{p}_proj.weight": "W8A8_DYNAMIC" for p in "qkv"},
        "language_model.model.layers.0.mlp.down_proj.weight": "FLOAT",
    }
    assert config._layer_type("language_model.model.layers.0.self_attn.qkv_proj", "linear") == "W8A8_DYNAMIC"
    assert config._layer_type("language_model.model.layers.0.mlp.down_proj", "linear") == "FLOAT"


def test_a_layer_missing_from_the_description_is_named():
    config = AscendQuantConfig.from_config(
        _description(**{"model.layers.0.mlp.down_proj.weight": "W8A8_DYNAMIC"})
    )
    with pytest.raises(
        QuantLoadError,
        match=r"layer 'model\.layers\.0\.mlp\.up_proj' \(linear\) is not fully described: tensor "
        r"'model\.layers\.0\.mlp\.up_proj\.weight' is not in the quant description <dict>; ModelSlim lists",
    ):
        config._layer_type("model.layers.0.mlp.up_proj", "linear")


def test_model_type_packed_modules_check_the_shards_types():
    """DeepSeek fuses q_a_proj with kv_a_proj_with_mqa: the two must share a type."""
    from types import SimpleNamespace

    config = AscendQuantConfig.from_config(
        _description(
            **{
                "model.layers.0.self_attn.q_a_proj.weight": "W8A8_DYNAMIC",
                "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": "FLOAT",
            }
        )
    )
    with pytest.raises(QuantDescriptionError, match=r"'model\.layers\.0\.self_attn\.fused_qkv_a_proj' mixes"):
        config.maybe_update_config("m", SimpleNamespace(model_type="deepseek_v3"))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"kv_cache_type": "C8"}, r"kv_cache_type='C8' \(an INT8 \(C8\) KV cache\) is not supported yet"),
        ({"fa_quant_type": "FAKQuant"}, r"fa_quant_type='FAKQuant' .*not supported yet"),
        (
            {"indexer_quant_type": "INT8_DYNAMIC"},
            r"indexer_quant_type='INT8_DYNAMIC' \(a quantized sparse-attention indexer\) is not supported yet",
        ),
    ],
)
def test_quantized_attention_is_refused(extra, match):
    with pytest.raises(QuantDescriptionError, match=match):
        AscendQuantConfig.from_config({**_description(), **extra})


def test_w8a8_row_parallel_over_ranks_is_refused():
    """Each rank would add W8A8's folded quant_bias: refused instead of serving wrong sums."""
    import torch
    from vllm.model_executor.layers.linear import RowParallelLinear

    from vllm_ascend.quant.methods import AscendLinearMethod
    from vllm_ascend.quant.schemes import get_scheme_class

    layer = torch.nn.Module.__new__(RowParallelLinear)
    torch.nn.Module.__init__(layer)
    layer.tp_size = 2
    scheme = get_scheme_class("W8A8", "linear")(
        prefix="model.layers.0.self_attn.o_proj", group_size=None, params_dtype=torch.float32
    )
    with pytest.raises(QuantLoadError, match=r"o_proj: W8A8 row-parallel layers with tensor_parallel_size=2"):
        AscendLinearMethod(scheme).create_weights(
            layer, 64, [128], 128, 128, torch.float32, weight_loader=None
        )
    assert not list(layer.parameters())


def test_a_quantized_lm_head_is_refused():
    """vLLM would copy int8 values into the float LM head: refused by name instead."""
    import torch
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    config = AscendQuantConfig.from_config(_description(**{"lm_head.weight": "W8A8_DYNAMIC"}))
    head = torch.nn.Module.__new__(ParallelLMHead)
    torch.nn.Module.__init__(head)
    with pytest.raises(QuantLoadError, match=r"lm_head\.weight is W8A8_DYNAMIC .*not supported yet"):
        config.get_quant_method(head, "lm_head")
    assert config.get_quant_method(head, "model.embed_tokens") is None  # absent = FLOAT


LINEAR_SUPPORTED = "W4A16, W4A8_DYNAMIC, W8A16, W8A8, W8A8_DYNAMIC"
EXPERTS = ("gate_proj", "up_proj", "down_proj")


def _experts(quant_type: str, layer: int = 1) -> dict[str, str]:
    return {f"model.layers.{layer}.mlp.experts.{e}.{p}.weight": quant_type for e in range(2) for p in EXPERTS}


@pytest.mark.parametrize(
    ("tensors", "problem"),
    [
        (
            {
                "model.layers.0.self_attn.o_proj.weight": "W4A4_DYNAMIC",
                "model.layers.0.self_attn.o_proj.weight_scale": "W4A4_DYNAMIC",
                "model.layers.1.self_attn.o_proj.weight": "W4A4_DYNAMIC",
            },
            "W4A4_DYNAMIC linear layers (2: model.layers.0.self_attn.o_proj, model.layers.1.self_attn.o_proj) are "
            f"not supported by vllm-ascend-quant; supported for linear layers: {LINEAR_SUPPORTED}",
        ),
        (
            {f"model.layers.{i}.mlp.down_proj.weight": "W8A8_MIX" for i in range(5)},
            "W8A8_MIX linear layers (5: model.layers.0.mlp.down_proj, model.layers.1.mlp.down_proj, "
            "model.layers.2.mlp.down_proj, ... (5 in all)) are not supported by vllm-ascend-quant; supported for "
            f"linear layers: {LINEAR_SUPPORTED}",
        ),
        (
            {"model.layers.0.mlp.down_proj.weight": "W8A8_MXFP8"},
            "W8A8_MXFP8 linear layers (1: model.layers.0.mlp.down_proj) are not supported",
        ),
        (
            {"model.layers.0.mlp.down_proj.weight": "W8A8FP8_DYNAMIC"},
            "W8A8FP8_DYNAMIC linear layers (1: model.layers.0.mlp.down_proj) are not supported",
        ),
        (
            _experts("W4A16"),
            "W4A16 MoE experts (1: model.layers.1.mlp.experts) are not supported by vllm-ascend-quant; supported "
            "for MoE experts: W4A8_DYNAMIC, W8A8_DYNAMIC",
        ),
        (
            {**_experts("W4A4_MXFP4"), **_experts("W4A4_MXFP4", layer=2)},
            "W4A4_MXFP4 MoE experts (2: model.layers.1.mlp.experts, model.layers.2.mlp.experts) are not supported",
        ),
        (
            {"model.layers.0.self_attn.fa_k.scale": "FAKQuant"},
            "FAKQuant tensors (1: model.layers.0.self_attn.fa_k.scale): quantized attention / KV cache is not "
            "supported yet by vllm-ascend-quant",
        ),
    ],
    ids=["w4a4-linear", "w8a8-mix-many", "mxfp8", "fp8", "w4a16-experts", "mxfp4-experts", "fa-tensor"],
)
def test_types_without_a_scheme_are_refused_when_the_config_is_built(tensors, problem):
    """Refused while vLLM builds its config (from_config / maybe_update_config), before any worker or layer."""
    with pytest.raises(QuantDescriptionError) as info:
        AscendQuantConfig.from_config(_description(**tensors))
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(problem), info.value.problems


def test_w4a8_dynamic_per_group_is_refused_when_the_config_is_built(tmp_path):
    import json

    raw = {**_description(**_experts("W4A8_DYNAMIC")), "group_size": 256}
    (tmp_path / "quant_model_description.json").write_text(json.dumps(raw))
    with pytest.raises(QuantDescriptionError) as info:
        AscendQuantConfig().maybe_update_config(str(tmp_path))
    assert info.value.source == str(tmp_path / "quant_model_description.json")
    assert info.value.problems == [
        "W4A8_DYNAMIC MoE experts (1: model.layers.1.mlp.experts) with group_size=256 (per-group int4 weights) "
        "are not supported; supported: per-channel W4A8_DYNAMIC (group_size 0 or absent)"
    ]
    raw["group_size"] = 0
    (tmp_path / "quant_model_description.json").write_text(json.dumps(raw))
    AscendQuantConfig().maybe_update_config(str(tmp_path))


def test_310p_types_are_supported_only_on_310p(monkeypatch):
    from vllm_ascend.core.device.config import clear_device_caches

    tensors = {"model.layers.0.mlp.down_proj.weight": "W8A8SC"}
    with pytest.raises(QuantDescriptionError, match=r"W8A8SC is only supported on the 310P family"):
        AscendQuantConfig.from_config(_description(**tensors))
    monkeypatch.setenv("VLLM_ASCEND_REFERENCE_FAMILY", "310p")
    clear_device_caches()
    assert AscendQuantConfig.from_config(_description(**tensors)).description.family == "310P"
    with pytest.raises(QuantDescriptionError) as info:
        AscendQuantConfig.from_config(_description(**{"model.layers.0.mlp.down_proj.weight": "W4A4_DYNAMIC"}))
    assert info.value.problems[0].endswith(
        "supported for linear layers: W4A16, W4A8_DYNAMIC, W8A16, W8A8, W8A8S, W8A8SC, W8A8_DYNAMIC"
    )
