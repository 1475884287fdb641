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


def test_vllm_reads_the_modelslim_description_file():
    assert AscendQuantConfig.get_config_filenames() == ["quant_model_description.json"]
    config = AscendQuantConfig.from_config(
        _description(**{"model.layers.0.mlp.down_proj.weight": "W8A8_DYNAMIC"})
    )
    assert config.get_name() == "ascend"
    assert config.get_min_capability() == 0
    assert {str(d) for d in config.get_supported_act_dtypes()} == {
        "torch.bfloat16",
        "torch.float16",
        "torch.float32",
    }


def test_hf_names_are_mapped_to_vllm_names_but_fused_shards_keep_theirs():
    config = AscendQuantConfig.from_config(
        _description(
            **{
                "model.layers.0.self_attn.q_proj.weight": "W8A8_DYNAMIC",
                "model.layers.0.mlp.down_proj.weight": "FLOAT",
                "model.visual.proj.weight": "FLOAT",
            }
        )
    )
    mapper = WeightsMapper(
        orig_to_new_prefix={"model.visual.": None, "model.": "language_model.model."},
        orig_to_new_stacked={".q_proj": (".qkv_proj", "q")},
    )
    config.apply_vllm_mapper(mapper)
    assert config.description.tensors == {
        "language_model.model.layers.0.self_attn.q_proj.weight": "W8A8_DYNAMIC",
        "language_model.model.layers.0.mlp.down_proj.weight": "FLOAT",
    }
    assert config._layer_type("language_model.model.layers.0.self_attn.qkv_proj", "linear") == "W8A8_DYNAMIC"
    assert config._layer_type("language_model.model.layers.0.mlp.down_proj", "linear") == "FLOAT"


def test_a_layer_missing_from_the_description_is_named():
    config = AscendQuantConfig.from_config(
        _description(**{"model.layers.0.mlp.down_proj.weight": "W8A8_DYNAMIC"})
    )
    with pytest.raises(
        QuantLoadError, match=r"layer 'model\.layers\.0\.mlp\.up_proj' \(linear\) has no entry"
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
