"""QuantDescription: parsing, validation messages, fused-layer checks and scheme selection."""

from __future__ import annotations

import json

import pytest

from vllm_ascend.quant.description import UNQUANTIZED, QuantDescription, QuantDescriptionError

EXPERT_PROJ = ("gate_proj", "up_proj", "down_proj")


def _description(**overrides):
    base = {
        "model_quant_type": "W8A8_DYNAMIC",
        "version": "1.0.0",
        "group_size": 0,
        "model.embed_tokens.weight": "FLOAT",
        "model.layers.0.self_attn.q_proj.weight": "W8A8",
        "model.layers.0.self_attn.q_proj.input_scale": "W8A8",
        "model.layers.0.self_attn.k_proj.weight": "W8A8",
        "model.layers.0.self_attn.v_proj.weight": "W8A8",
        "model.layers.0.self_attn.o_proj.weight": "W8A8_DYNAMIC",
        "model.layers.0.self_attn.o_proj.weight_scale": "W8A8_DYNAMIC",
        "model.layers.0.mlp.gate_proj.weight": "W8A8_DYNAMIC",
        "model.layers.0.mlp.up_proj.weight": "W8A8_DYNAMIC",
        "model.layers.0.mlp.down_proj.weight": "FLOAT",
        **{f"model.layers.1.mlp.experts.{e}.{p}.weight": "W4A8_DYNAMIC" for e in (0, 1) for p in EXPERT_PROJ},
        "model.layers.1.mlp.experts.1.down_proj.weight_scale": "W4A8_DYNAMIC",
        "lm_head.weight": "FLOAT",
    }
    base.update(overrides)
    return base


def _problems(raw, **kwargs) -> list[str]:
    with pytest.raises(QuantDescriptionError) as info:
        QuantDescription(raw, **kwargs)
    return info.value.problems


def test_parses_globals_and_tensors():
    d = QuantDescription(
        _description(max_supported_tp=8, is_rot_used=True, kv_cache_type="C8", fa_quant_type="FAKQuant"),
        family="Ascend910_9392",
    )
    assert d.family == "A3"
    assert d.model_quant_type == "W8A8_DYNAMIC"
    assert (d.version, d.group_size, d.max_supported_tp, d.is_rot_used) == ("1.0.0", 0, 8, True)
    assert (d.kv_cache_type, d.fa_quant_type, d.indexer_quant_type) == ("C8", "FAKQuant", None)
    assert d.tensor_type("model.embed_tokens.weight") == "FLOAT"
    assert len(d.tensors) == 18


def test_scheme_for_linear_fused_moe_and_float():
    d = QuantDescription(_description())
    assert d.scheme_for("model.layers.0.self_attn.o_proj", "linear") == "linear:W8A8_DYNAMIC"
    assert d.scheme_for("model.layers.0.self_attn.qkv_proj", "linear") == "linear:W8A8"
    assert d.scheme_for("model.layers.0.mlp.gate_up_proj", "linear") == "linear:W8A8_DYNAMIC"
    assert d.scheme_for("model.layers.0.mlp.down_proj", "linear") == UNQUANTIZED
    assert d.scheme_for("model.layers.1.mlp.experts", "moe") == "moe:W4A8_DYNAMIC"
    assert d.scheme_for("model.layers.0.self_attn", "attention") == UNQUANTIZED


def test_attention_scheme_from_fa_type_kv_cache_type_and_tensors():
    assert QuantDescription(_description(fa_quant_type="FAKQuant")).scheme_for("x.attn", "attention") == (
        "attention:FAKQuant"
    )
    assert (
        QuantDescription(_description(kv_cache_type="C8")).scheme_for("x.attn", "attention") == "attention:C8"
    )
    d = QuantDescription(_description(**{"model.layers.0.self_attn.fa_k.scale": "FAKQuant"}))
    assert d.scheme_for("model.layers.0.self_attn", "attention") == "attention:FAKQuant"


def test_unknown_type_for_layer_kind_is_a_clear_error():
    with pytest.raises(QuantDescriptionError) as info:
        QuantDescription(_description(**{"model.layers.0.mlp.down_proj.weight": "W4A16_MXFP4"})).scheme_for(
            "model.layers.0.mlp.down_proj", "linear"
        )
    assert info.value.problems == [
        "layer 'model.layers.0.mlp.down_proj' has quant type 'W4A16_MXFP4', which has no linear scheme; allowed "
        "for linear: W8A8, W8A8_DYNAMIC, W8A16, W4A16, W4A8_DYNAMIC, W4A4_DYNAMIC, W4A4_FLATQUANT_DYNAMIC, W4A4_MXFP4, "
        "W4A4_MXFP4_FLATQUANT, W4A8_MXFP, W8A8_MXFP8, W8A8_MIX, W8A8FP8_DYNAMIC"
    ]
    experts_w8a8 = QuantDescription(
        _description(**{f"m.experts.0.{p}.weight": "W8A8" for p in ("w1", "w2", "w3")})
    )
    with pytest.raises(
        QuantDescriptionError, match=r"layer 'm\.experts' has quant type 'W8A8', which has no moe scheme"
    ):
        experts_w8a8.scheme_for("m.experts", "moe")


def test_bad_layer_kind_and_missing_layers():
    d = QuantDescription(_description())
    with pytest.raises(ValueError, match="layer_kind must be one of linear, moe, attention, got 'mlp'"):
        d.scheme_for("model.layers.0.mlp.down_proj", "mlp")
    with pytest.raises(
        KeyError, match=r"tensor 'model\.layers\.9\.fc\.weight' is not in the quant description <dict>"
    ):
        d.scheme_for("model.layers.9.fc", "linear")
    with pytest.raises(
        KeyError, match=r"fused layer 'model\.layers\.7\.self_attn\.qkv_proj': none of its shards"
    ):
        d.scheme_for("model.layers.7.self_attn.qkv_proj", "linear")
    with pytest.raises(KeyError, match=r"MoE layer 'model.layers.0.mlp.experts': no"):
        d.scheme_for("model.layers.0.mlp.experts", "moe")


def test_fused_shards_must_share_one_type():
    problems = _problems(
        _description(
            **{
                "model.layers.0.self_attn.k_proj.weight": "W8A8_DYNAMIC",
                "model.layers.1.mlp.experts.1.gate_proj.weight": "W8A8_DYNAMIC",
            }
        )
    )
    assert problems == [
        "fused layer 'model.layers.0.self_attn.qkv_proj' mixes quant types across its shards "
        "(q_proj=W8A8, k_proj=W8A8_DYNAMIC, v_proj=W8A8); all shards must share one type",
        "fused layer 'model.layers.1.mlp.experts' mixes quant types across its shards (0.gate_proj=W4A8_DYNAMIC, "
        "0.up_proj=W4A8_DYNAMIC, 0.down_proj=W4A8_DYNAMIC, 1.gate_proj=W8A8_DYNAMIC, 1.up_proj=W4A8_DYNAMIC, "
        "1.down_proj=W4A8_DYNAMIC); all shards must share one type",
    ]


def test_gate_up_mismatch_and_custom_packed_modules():
    raw = _description(**{"model.layers.0.mlp.up_proj.weight": "W8A8"})
    assert _problems(raw) == [
        "fused layer 'model.layers.0.mlp.gate_up_proj' mixes quant types across its shards "
        "(gate_proj=W8A8_DYNAMIC, up_proj=W8A8); all shards must share one type"
    ]
    # With no packed modules, gate/up are separate layers and may differ.
    d = QuantDescription(raw, packed_modules={})
    assert d.scheme_for("model.layers.0.mlp.up_proj", "linear") == "linear:W8A8"


def test_add_packed_modules_adds_fused_layers_and_rechecks_their_shards():
    """A model's own fused modules (vLLM's ``packed_modules_mapping``, lists) join the description's."""
    raw = _description(**{"model.layers.0.mlp.up_proj.weight": "W8A8"})
    d = QuantDescription(raw, packed_modules={})
    d.add_packed_modules({"qkv_proj": ["q_proj", "k_proj", "v_proj"]})
    assert d.packed_modules == {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
    assert d.scheme_for("model.layers.0.self_attn.qkv_proj", "linear") == "linear:W8A8"
    with pytest.raises(QuantDescriptionError) as info:
        d.add_packed_modules({"gate_up_proj": ["gate_proj", "up_proj"]})
    assert info.value.problems == [
        "fused layer 'model.layers.0.mlp.gate_up_proj' mixes quant types across its shards "
        "(gate_proj=W8A8_DYNAMIC, up_proj=W8A8); all shards must share one type"
    ]


def test_310p_types_only_for_310p_family():
    raw = _description(model_quant_type="W8A8SC", **{"model.layers.0.mlp.down_proj.weight": "W8A8S"})
    assert _problems(raw, family="A2") == [
        "model.layers.0.mlp.down_proj.weight = 'W8A8S': W8A8S is only supported on the 310P family, "
        "this description is for family A2",
        "model_quant_type = 'W8A8SC': W8A8SC is only supported on the 310P family, "
        "this description is for family A2",
    ]
    assert len(_problems(raw)) == 2  # unknown family: not accepted either
    d = QuantDescription(raw, family="310P")
    assert d.scheme_for("model.layers.0.mlp.down_proj", "linear") == "linear:W8A8S"
    with pytest.raises(QuantDescriptionError, match="has quant type 'W8A8S', which has no moe scheme"):
        QuantDescription(
            _description(**{f"m.experts.0.{p}.weight": "W8A8S" for p in ("w1", "w2", "w3")}), family="310P"
        ).scheme_for("m.experts", "moe")


def test_every_problem_is_reported_with_field_and_allowed_values():
    raw = {
        "version": "",
        "group_size": -1,
        "max_supported_tp": True,
        "is_rot_used": "yes",
        "kv_cache_type": "C4",
        "fa_quant_type": "FAQuant",
        "indexer_quant_type": 3,
        "metadata": {},
        "model.layers.0.mlp.down_proj.weight": "w8a8",
    }
    problems = _problems(raw, family="A2")
    assert problems[0] == (
        "unknown key 'metadata': expected a tensor name ('<prefix>.weight', ...) or one of the global keys "
        "model_quant_type, version, group_size, fa_quant_type, indexer_quant_type, kv_cache_type, "
        "max_supported_tp, is_rot_used"
    )
    assert problems[1].startswith(
        "model.layers.0.mlp.down_proj.weight = 'w8a8': expected one of FLOAT, W8A8,"
    )
    assert "W8A8S" not in problems[1]
    assert problems[2].startswith("missing required key 'model_quant_type' (one of W8A8, W8A8_DYNAMIC,")
    assert problems[3:] == [
        "version = '': expected a non-empty string",
        "group_size = -1: expected an integer in 0..9223372036854775807",
        "max_supported_tp = True: expected an integer in 1..9223372036854775807",
        "is_rot_used = 'yes': expected true or false",
        "kv_cache_type = 'C4': expected one of C8",
        "fa_quant_type = 'FAQuant': expected one of FAKQuant, INT8_DYNAMIC",
        "indexer_quant_type = 3: expected one of FAKQuant, INT8_DYNAMIC",
    ]


def test_error_message_lists_all_problems():
    with pytest.raises(QuantDescriptionError) as info:
        QuantDescription({"model_quant_type": "W9A9", "x.weight": "INT3"})
    assert str(info.value) == (
        "invalid quant description <dict>: 2 problem(s)\n"
        "  - x.weight = 'INT3': expected one of FLOAT, W8A8, W8A8_DYNAMIC, W8A16, W4A16, W4A8_DYNAMIC, "
        "W4A4_DYNAMIC, W4A4_FLATQUANT_DYNAMIC, W4A4_MXFP4, W4A4_MXFP4_FLATQUANT, W4A8_MXFP, W8A8_MXFP8, "
        "W8A8_MIX, W8A8FP8_DYNAMIC, W4A16_MXFP4, FAKQuant, INT8_DYNAMIC, C8\n"
        "  - model_quant_type = 'W9A9': expected one of W8A8, W8A8_DYNAMIC, W8A16, W4A16, W4A8_DYNAMIC, "
        "W4A4_DYNAMIC, W4A4_FLATQUANT_DYNAMIC, W4A4_MXFP4, W4A4_MXFP4_FLATQUANT, W4A8_MXFP, W8A8_MXFP8, "
        "W8A8_MIX, W8A8FP8_DYNAMIC, W4A16_MXFP4"
    )


def test_load_from_file_and_model_dir(tmp_path):
    (tmp_path / "quant_model_description.json").write_text(json.dumps(_description()))
    by_dir = QuantDescription(tmp_path)
    by_file = QuantDescription(str(tmp_path / "quant_model_description.json"))
    assert by_dir.tensors == by_file.tensors
    assert by_dir.source == str(tmp_path / "quant_model_description.json")
    assert repr(by_dir) == f"QuantDescription(W8A8_DYNAMIC, 18 tensors, family=None, source={by_dir.source})"


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"quant description not found: .*quant_model_description\.json"
    ):
        QuantDescription(tmp_path)
    bad = tmp_path / "d.json"
    bad.write_text('{"model_quant_type": "W8A8",\n "x.weight": }')
    with pytest.raises(QuantDescriptionError) as info:
        QuantDescription(bad)
    assert info.value.problems == ["not valid JSON: Expecting value at line 2 column 14"]
    assert info.value.source == str(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(QuantDescriptionError, match="top level must be a JSON object, got an array"):
        QuantDescription(bad)
    with pytest.raises(TypeError, match="quant description must be a mapping or a path, got int"):
        QuantDescription(3)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested 100000 levels deep; at most 64 levels are allowed"),
        (b'{"model_quant_type": "W8A8", "group_size": NaN}', "not valid JSON: NaN is not a JSON number"),
        (
            b'{"model_quant_type": "W8A8", "x.weight": "\xc3\x28"}',
            "not UTF-8: byte 0xc3 at offset 42 (invalid continuation byte)",
        ),
        (
            b'{"model_quant_type": "W8A8", "group_size": 1' + b"0" * 5000 + b"}",
            "not valid JSON: Exceeds the limit (4300 digits) for integer string conversion",
        ),
    ],
    ids=["deep", "nan", "utf8", "long-int"],
)
def test_hostile_description_files_are_description_errors_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "quant_model_description.json"
    path.write_bytes(content)
    with pytest.raises(QuantDescriptionError) as info:
        QuantDescription(tmp_path)
    assert info.value.source == str(path)
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(problem)
    assert str(info.value).startswith(f"invalid quant description {path}: 1 problem(s)")


def test_oversize_description_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "quant_model_description.json"
    with open(path, "wb") as f:
        f.truncate(64 * 1024 * 1024 + 1)  # sparse: refused from its size, never read
    with pytest.raises(QuantDescriptionError) as info:
        QuantDescription(tmp_path)
    assert info.value.problems == ["too large: 67108865 bytes; at most 67108864 are allowed"]


def test_absurd_integers_are_refused():
    with pytest.raises(QuantDescriptionError) as info:
        QuantDescription(_description(group_size=10**30, max_supported_tp=2**63))
    assert info.value.problems == [
        f"group_size = {10**30}: expected an integer in 0..9223372036854775807",
        f"max_supported_tp = {2**63}: expected an integer in 1..9223372036854775807",
    ]


def test_unknown_family_and_tp_limit():
    with pytest.raises(ValueError, match="unknown SOC_VERSION 'B9'"):
        QuantDescription(_description(), family="B9")
    d = QuantDescription(_description(max_supported_tp=4))
    d.check_tensor_parallel(4)
    with pytest.raises(
        ValueError, match="tensor_parallel_size=8 exceeds max_supported_tp=4 of the quant description"
    ):
        d.check_tensor_parallel(8)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"x.weight": 8}, "x.weight = 8: expected one of FLOAT, W8A8,"),
        ({"x.weight": None}, "x.weight = None: expected one of FLOAT, W8A8,"),
        ({"x.weight": ["W8A8"]}, "x.weight = ['W8A8']: expected one of FLOAT, W8A8,"),
        ({"x.weight": "float"}, "x.weight = 'float': expected one of FLOAT, W8A8,"),
        ({"model_quant_type": "FLOAT"}, "model_quant_type = 'FLOAT': expected one of W8A8, W8A8_DYNAMIC,"),
        ({"model_quant_type": "C8"}, "model_quant_type = 'C8': expected one of W8A8,"),
        ({"model_quant_type": "FAKQuant"}, "model_quant_type = 'FAKQuant': expected one of W8A8,"),
        ({"model_quant_type": 8}, "model_quant_type = 8: expected one of W8A8,"),
        ({"model_quant_type": ""}, "model_quant_type = '': expected one of W8A8,"),
        (
            {"model_quant_type": "W8A8S"},
            "model_quant_type = 'W8A8S': W8A8S is only supported on the 310P family, this description is for "
            "family None",
        ),
        ({"version": 1}, "version = 1: expected a non-empty string"),
        ({"version": "  "}, "version = '  ': expected a non-empty string"),
        ({"group_size": 32.0}, "group_size = 32.0: expected an integer in 0..9223372036854775807"),
        ({"group_size": "32"}, "group_size = '32': expected an integer in 0..9223372036854775807"),
        ({"max_supported_tp": 0}, "max_supported_tp = 0: expected an integer in 1..9223372036854775807"),
        ({"is_rot_used": 1}, "is_rot_used = 1: expected true or false"),
        ({"kv_cache_type": "c8"}, "kv_cache_type = 'c8': expected one of C8"),
        ({"lm_head": "FLOAT"}, "unknown key 'lm_head': expected a tensor name ('<prefix>.weight', ...)"),
        ({"": "FLOAT"}, "unknown key '': expected a tensor name ('<prefix>.weight', ...)"),
        (
            {
                "m.experts.0.gate_proj.weight": "FLOAT",
                "m.experts.0.up_proj.weight": "FLOAT",
                "m.experts.1.gate_proj.weight": "W8A8_DYNAMIC",
                "m.experts.1.up_proj.weight": "W8A8_DYNAMIC",
            },
            "fused layer 'm.experts' mixes quant types across its shards (0.gate_proj=FLOAT, 0.up_proj=FLOAT, "
            "1.gate_proj=W8A8_DYNAMIC, 1.up_proj=W8A8_DYNAMIC); all shards must share one type",
        ),
    ],
    ids=[
        "type-int",
        "type-null",
        "type-list",
        "type-lowercase-float",
        "model-type-float",
        "model-type-kv-cache",
        "model-type-attention",
        "model-type-int",
        "model-type-empty",
        "model-type-310p-unknown-family",
        "version-number",
        "version-blank",
        "group-size-float",
        "group-size-string",
        "tp-zero",
        "rot-int",
        "kv-cache-lowercase",
        "key-without-dot",
        "key-empty",
        "experts-float-and-quantized",
    ],
)
def test_malformed_description_values(overrides, problem):
    raw = {
        "model_quant_type": "W8A8_DYNAMIC",
        "model.layers.0.mlp.down_proj.weight": "W8A8_DYNAMIC",
        **overrides,
    }
    problems = _problems(raw)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_mixed_attention_and_unsupported_moe_types_fail_at_selection():
    d = QuantDescription(_description(**{"a.attn.k.scale": "FAKQuant", "a.attn.v.scale": "C8"}))
    with pytest.raises(
        QuantDescriptionError, match=r"attention layer 'a\.attn' mixes attention quant types C8, FAKQuant"
    ):
        d.scheme_for("a.attn", "attention")
    d = QuantDescription(_description(**{f"m.experts.0.{p}.weight": "W8A8_MIX" for p in ("w1", "w2", "w3")}))
    with pytest.raises(
        QuantDescriptionError, match=r"layer 'm\.experts' has quant type 'W8A8_MIX', which has no moe"
    ):
        d.scheme_for("m.experts", "moe")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty: expected a JSON document"),
        (b" \n\t", "empty: expected a JSON document"),
        (b'"W8A8_DYNAMIC"', "top level must be a JSON object, got a string"),
        (b"null", "top level must be a JSON object, got null"),
        (b"[]", "top level must be a JSON object, got an array"),
        (b"8", "top level must be a JSON object, got a number"),
        (b"true", "top level must be a JSON object, got true/false"),
        (
            b'\xef\xbb\xbf{"model_quant_type": "W8A8"}',
            "not valid JSON: it starts with a UTF-8 byte order mark",
        ),
        (
            b'{"model_quant_type": "W8A8", "x.weight": "FLOAT\xe9"}',
            "not UTF-8: byte 0xe9 at offset 47 (invalid continuation byte)",
        ),
    ],
    ids=[
        "empty-file",
        "blank-file",
        "top-level-string",
        "top-level-null",
        "top-level-array",
        "top-level-number",
        "top-level-bool",
        "bom",
        "latin-1",
    ],
)
def test_malformed_description_files(tmp_path, content, problem):
    (tmp_path / "quant_model_description.json").write_bytes(content)
    problems = _problems(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_fused_layer_with_some_shards_described_must_have_all():
    raw = _description()
    del raw["model.layers.0.self_attn.v_proj.weight"]
    assert _problems(raw) == [
        "fused layer 'model.layers.0.self_attn.qkv_proj' is missing shard(s) v_proj: "
        "model.layers.0.self_attn.v_proj.weight not described (described: q_proj, k_proj); a fused layer needs "
        "all of q_proj, k_proj, v_proj"
    ]


def test_a_lone_shard_parses_but_its_fused_layer_needs_every_shard():
    """A lone ``q_proj`` may be an unfused layer (MLA without q-LoRA); the fused layer needs every shard."""
    raw = _description()
    del raw["model.layers.0.mlp.up_proj.weight"]
    for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"):
        del raw[name]
    d = QuantDescription(raw)
    assert d.scheme_for("model.layers.0.self_attn.q_proj", "linear") == "linear:W8A8"
    with pytest.raises(KeyError) as info:
        d.layer_type("model.layers.0.mlp.gate_up_proj", "linear")
    assert info.value.args[0] == (
        "fused layer 'model.layers.0.mlp.gate_up_proj' is missing shard(s) up_proj: "
        "model.layers.0.mlp.up_proj.weight not in the quant description <dict>"
    )
    with pytest.raises(KeyError, match=r"qkv_proj' is missing shard\(s\) k_proj, v_proj: .*k_proj\.weight, "):
        d.layer_type("model.layers.0.self_attn.qkv_proj", "linear")


def _experts(count: int, projections=EXPERT_PROJ, skip=(), quant_type="W8A8_DYNAMIC") -> dict[str, str]:
    return {
        f"m.experts.{e}.{p}.weight": quant_type
        for e in range(count)
        for p in projections
        if f"{e}.{p}" not in skip
    }


@pytest.mark.parametrize(
    ("experts", "problem"),
    [
        (
            _experts(4, skip={"1.down_proj"}),
            "MoE layer 'm.experts' is missing expert shard(s) 1.down_proj ('m.experts.<expert>.<proj>.weight'); "
            "experts 0..3 must each describe down_proj, gate_proj, up_proj",
        ),
        (
            _experts(4, skip={"2.gate_proj", "2.up_proj", "2.down_proj"}),
            "MoE layer 'm.experts' is missing expert shard(s) 2.down_proj, 2.gate_proj, 2.up_proj",
        ),
        (
            _experts(2, projections=("gate_proj", "down_proj")),
            "MoE layer 'm.experts' is missing expert shard(s) 0.up_proj, 1.up_proj ",
        ),
        (
            _experts(2, projections=("w2", "w3")),
            "MoE layer 'm.experts' is missing expert shard(s) 0.w1, 1.w1 ",
        ),
        (
            {**_experts(2), "m.experts.999999999.gate_proj.weight": "W8A8_DYNAMIC"},
            "MoE layer 'm.experts' is missing expert shard(s) 2.down_proj, 2.gate_proj, 2.up_proj, 3.down_proj, "
            "3.gate_proj, 3.up_proj, 4.down_proj, 4.gate_proj, ... (2999999993 in all) "
            "('m.experts.<expert>.<proj>.weight'); experts 0..999999999 must each describe",
        ),
        (
            {**_experts(2), f"m.experts.1{'0' * 5000}.gate_proj.weight": "W8A8_DYNAMIC"},
            f"m.experts.1{'0' * 5000}.gate_proj.weight: expert index out of range (at most 9 digits)",
        ),
    ],
    ids=["one-shard", "whole-expert", "gate-without-up", "w3-without-w1", "huge-index", "absurd-index"],
)
def test_incomplete_moe_experts_are_refused(experts, problem):
    problems = _problems({"model_quant_type": "W8A8_DYNAMIC", **experts})
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_many_mixed_expert_types_are_listed_briefly():
    experts = {**_experts(8), "m.experts.7.down_proj.weight": "W4A8_DYNAMIC"}
    assert _problems({"model_quant_type": "W8A8_DYNAMIC", **experts}) == [
        "fused layer 'm.experts' mixes quant types across its shards (0.gate_proj=W8A8_DYNAMIC, "
        "0.up_proj=W8A8_DYNAMIC, 0.down_proj=W8A8_DYNAMIC, 1.gate_proj=W8A8_DYNAMIC, 1.up_proj=W8A8_DYNAMIC, "
        "1.down_proj=W8A8_DYNAMIC, 2.gate_proj=W8A8_DYNAMIC, 2.up_proj=W8A8_DYNAMIC, ... (24 in all)); "
        "all shards must share one type"
    ]
