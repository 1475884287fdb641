"""The ModelSlim exporter: tensors per scheme checked by independent dequantisation, the description,
static W8A8 calibration, sharded output, the ``vllm-ascend quantize`` command and every refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vllm_ascend.quant.description import QuantDescription, QuantDescriptionError
from vllm_ascend.quant.export import (
    DEFAULT_CALIBRATION_PROMPTS,
    SCHEMES,
    SPARSE_SCHEMES,
    ExportError,
    calibrate,
    export_modelslim,
    quantize_linear,
)

#: (bits, symmetric, default group size) of each scheme's weight quantization.
WEIGHT_FORMAT = {
    "W8A8": (8, True, 0),
    "W8A8_DYNAMIC": (8, True, 0),
    "W8A16": (8, False, 0),
    "W4A16": (4, False, 32),
    "W4A8_DYNAMIC": (4, True, 0),
}
MOE_SCHEMES = {"W8A8_DYNAMIC", "W4A8_DYNAMIC"}
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


# -- tiny Hugging Face checkpoints, built on disk (no downloads) --------------------------------------

WORDS = (
    "the a quick brown fox jumps over lazy dog model layer weight scale token ascend device kernel "
    "river mountain forest ocean cloud rain snow wind stone light red green blue one two three"
).split()
SPECIALS = ("[UNK]", "[PAD]", "[EOS]")


def save_tokenizer(out: Path) -> int:
    """Save a whitespace WordLevel tokenizer (tokenizer.json + tokenizer_config.json); return its vocab size."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIALS, *WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )
    fast.save_pretrained(out)
    return len(vocab)


def build_checkpoint(out: Path, kind: str, *, seed: int = 0, max_shard_size: str | None = None) -> Path:
    """Write a tiny random ``kind`` ("qwen3" | "qwen3_moe") checkpoint (hidden 64, 2 layers) with its tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    out.mkdir(parents=True)
    common = dict(
        vocab_size=save_tokenizer(out),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        initializer_range=0.1,
        pad_token_id=1,
        eos_token_id=2,
    )
    if kind == "qwen3":
        config = Qwen3Config(**common, tie_word_embeddings=True)
    else:  # layer 0 MoE (4 experts, top 2), layer 1 a dense MLP; an untied lm_head
        config = Qwen3MoeConfig(
            **common,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
            tie_word_embeddings=False,
        )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
    return out


@pytest.fixture(scope="module")
def hf_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Dense Qwen3, tied embeddings (no lm_head tensor), one safetensors file."""
    return build_checkpoint(tmp_path_factory.mktemp("hf") / "qwen3", "qwen3")


@pytest.fixture(scope="module")
def hf_qwen3_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3-MoE (layer 0 MoE, layer 1 dense), untied lm_head, sharded with an index."""
    return build_checkpoint(
        tmp_path_factory.mktemp("hf") / "qwen3_moe", "qwen3_moe", seed=1, max_shard_size="100KB"
    )


def _load(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(file, framework="pt") as reader:
            for name in reader.keys():
                tensors[name] = reader.get_tensor(name)
    return tensors


def _is_linear(name: str, tensor: torch.Tensor, scheme: str) -> bool:
    """Independent statement of contract §1: which source tensors the exporter must quantize."""
    if not name.startswith("model.layers.") or not name.endswith("_proj.weight") or tensor.dim() != 2:
        return False
    return scheme in MOE_SCHEMES or ".experts." not in name


def _dequantize(out: dict[str, torch.Tensor], prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(Wq - offset) * scale with per-group columns expanded; returns the weight and each element's step."""
    q = out[f"{prefix}.weight"].to(torch.float64)
    scale = out[f"{prefix}.weight_scale"].to(torch.float64)
    offset = out[f"{prefix}.weight_offset"].to(torch.float64)
    columns = q.shape[1] // scale.shape[1]
    scale = scale.repeat_interleave(columns, dim=1)
    offset = offset.repeat_interleave(columns, dim=1)
    return (q - offset) * scale, scale


@pytest.fixture(scope="module")
def exported(tmp_path_factory, hf_qwen3, hf_qwen3_moe):
    """``exported(model, scheme)`` -> (dst, report), each export done once per session."""
    sources = {"qwen3": hf_qwen3, "qwen3_moe": hf_qwen3_moe}
    done = {}

    def get(model: str, scheme: str):
        if (model, scheme) not in done:
            dst = tmp_path_factory.mktemp("out") / f"{model}-{scheme}"
            done[model, scheme] = dst, export_modelslim(sources[model], dst, scheme, progress=False)
        return done[model, scheme]

    return get


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("model", ["qwen3", "qwen3_moe"])
def test_tensors_match_independent_dequantisation(exported, hf_qwen3, hf_qwen3_moe, model, scheme):
    src = hf_qwen3 if model == "qwen3" else hf_qwen3_moe
    dst, report = exported(model, scheme)
    source, out = _load(src), _load(dst)
    bits, symmetric, group_size = WEIGHT_FORMAT[scheme]
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    linears = [n for n, t in source.items() if _is_linear(n, t, scheme)]
    assert report.tensors_quantized == len(linears) > 0
    assert report.tensors_float == len(source) - len(linears)
    for name, tensor in source.items():
        if name not in linears:
            assert torch.equal(out[name], tensor), name
            continue
        prefix = name.removesuffix(".weight")
        weight = tensor.to(torch.float64)
        q, scale, offset = (out[f"{prefix}.{s}"] for s in ("weight", "weight_scale", "weight_offset"))
        groups = 1 if group_size == 0 else weight.shape[1] // group_size
        assert q.dtype == torch.int8 and q.shape == weight.shape, name
        assert scale.dtype == offset.dtype == torch.float32, name
        assert scale.shape == offset.shape == (weight.shape[0], groups), name
        assert int(q.min()) >= qmin and int(q.max()) <= qmax, name
        assert torch.all(scale > 0), name
        assert torch.equal(offset, offset.round()) and offset.min() >= qmin and offset.max() <= qmax, name
        if symmetric:
            assert torch.count_nonzero(offset) == 0, name
            # The scale is tight: every row's largest |w| lands on the top code.
            assert torch.equal(q.abs().amax(dim=1).to(torch.int64), torch.full((weight.shape[0],), qmax)), (
                name
            )
        deq, step = _dequantize(out, prefix)
        assert torch.all((deq - weight).abs() <= step * (0.5 + 1e-5)), name
    expected_keys = set(out) | {"model_quant_type", "version"} | ({"group_size"} if group_size else set())
    assert set(json.loads((dst / "quant_model_description.json").read_text())) == expected_keys


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("model", ["qwen3", "qwen3_moe"])
def test_description_names_every_tensor(exported, model, scheme):
    dst, _ = exported(model, scheme)
    d = QuantDescription(dst)
    assert (d.model_quant_type, d.version) == (scheme, "1.0.0")
    assert d.group_size == (WEIGHT_FORMAT[scheme][2] or None)
    out = _load(dst)
    assert set(d.tensors) == set(out)
    assert d.tensor_type("model.embed_tokens.weight") == "FLOAT"
    assert d.tensor_type("model.norm.weight") == "FLOAT"
    for layer in (0, 1):
        for norm in ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
            assert d.tensor_type(f"model.layers.{layer}.{norm}.weight") == "FLOAT"
        assert d.layer_type(f"model.layers.{layer}.self_attn.qkv_proj", "linear") == scheme
        assert d.layer_type(f"model.layers.{layer}.self_attn.o_proj", "linear") == scheme
    quantized = {
        n.removesuffix(".weight") for n, t in out.items() if n.endswith(".weight") and t.dtype == torch.int8
    }
    for name, kind in d.tensors.items():
        assert kind == (scheme if name.rpartition(".")[0] in quantized else "FLOAT"), name
    if model == "qwen3":
        assert "lm_head.weight" not in out  # tied embeddings: nothing written for lm_head
        assert d.layer_type("model.layers.1.mlp.gate_up_proj", "linear") == scheme
        return
    assert d.tensor_type("lm_head.weight") == "FLOAT"
    assert d.tensor_type("model.layers.0.mlp.gate.weight") == "FLOAT"
    assert d.layer_type("model.layers.1.mlp.down_proj", "linear") == scheme
    if scheme in MOE_SCHEMES:
        assert d.scheme_for("model.layers.0.mlp.experts", "moe") == f"moe:{scheme}"
        assert out["model.layers.0.mlp.experts.3.down_proj.weight"].dtype == torch.int8
    else:
        assert d.layer_type("model.layers.0.mlp.experts", "moe") == "FLOAT"
        assert out["model.layers.0.mlp.experts.3.down_proj.weight"].dtype == torch.float32


@pytest.mark.parametrize("model", ["qwen3", "qwen3_moe"])
def test_side_files_copied_and_report_counts_bytes(exported, hf_qwen3, hf_qwen3_moe, model):
    src = hf_qwen3 if model == "qwen3" else hf_qwen3_moe
    dst, report = exported(model, "W8A8_DYNAMIC")
    for name in SIDE_FILES:
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name
    source, out = _load(src), _load(dst)
    assert report.bytes_in == sum(t.numel() * t.element_size() for t in source.values())
    assert report.bytes_out == sum(t.numel() * t.element_size() for t in out.values())
    assert report.bytes_out < report.bytes_in
    assert report.seconds > 0 and report.throughput_mb_s == pytest.approx(
        report.bytes_in / 1e6 / report.seconds
    )
    assert (
        f"{report.tensors_quantized} tensors quantized, {report.tensors_float} left FLOAT" in report.summary()
    )
    assert not list(dst.parent.glob(".*tmp*"))
    from transformers import AutoTokenizer

    assert (
        AutoTokenizer.from_pretrained(dst)("the quick fox")["input_ids"]
        == AutoTokenizer.from_pretrained(src)("the quick fox")["input_ids"]
    )


def test_sharded_source_gives_sharded_output_with_index(exported, hf_qwen3_moe):
    dst, report = exported("qwen3_moe", "W4A8_DYNAMIC")
    shards = sorted(p.name for p in hf_qwen3_moe.glob("*.safetensors"))
    assert len(shards) > 1
    assert sorted(p.name for p in dst.glob("*.safetensors")) == shards
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == report.bytes_out
    assert set(index["weight_map"]) == set(QuantDescription(dst).tensors)
    for name, file in index["weight_map"].items():
        with safe_open(dst / file, framework="pt") as reader:
            assert name in reader.keys(), name


def _observed_ranges(model_dir: Path, prompts) -> dict[str, tuple[float, float]]:
    """Input range of every nn.Linear over ``prompts``, recorded here with the test's own hooks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seen: dict[str, list[torch.Tensor]] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(lambda _m, args, n=name: seen.setdefault(n, []).append(args[0]))
    with torch.no_grad():
        for prompt in prompts:
            model(input_ids=tokenizer(prompt, return_tensors="pt")["input_ids"])
    return {
        f"{n}.weight": (min(float(x.min()) for x in xs), max(float(x.max()) for x in xs))
        for n, xs in seen.items()
    }


def _check_static_w8a8(out: dict[str, torch.Tensor], prefix: str, observed: tuple[float, float], weight):
    scale, offset = out[f"{prefix}.input_scale"], out[f"{prefix}.input_offset"]
    assert scale.shape == offset.shape == (1,) and scale.dtype == offset.dtype == torch.float32, prefix
    s, o = float(scale), float(offset)
    assert o == round(o) and -128 <= o <= 127, prefix
    lo, hi = min(observed[0], 0.0), max(observed[1], 0.0)
    assert s == pytest.approx((hi - lo) / 255, rel=1e-5), prefix
    # The int8 grid covers the observed range (to within half a step at each end).
    assert (-128 - o) * s <= lo + s / 2 and (127 - o) * s >= hi - s / 2, prefix
    q = out[f"{prefix}.weight"].to(torch.int64)
    weight_scale = out[f"{prefix}.weight_scale"][:, 0]
    deq_scale, quant_bias = out[f"{prefix}.deq_scale"], out[f"{prefix}.quant_bias"]
    assert deq_scale.dtype == torch.float32 and deq_scale.shape == (q.shape[0],), prefix
    assert torch.equal(deq_scale, (scale * weight_scale).to(torch.float32)), prefix
    assert quant_bias.dtype == torch.int32 and torch.equal(
        quant_bias.to(torch.int64), -int(o) * q.sum(dim=1)
    ), prefix
    # Integer emulation of the static matmul on inputs inside the observed range tracks the float layer.
    x = torch.linspace(observed[0], observed[1], 5 * q.shape[1]).reshape(5, q.shape[1])
    xq = (torch.round(x / s) + o).clamp(-128, 127).to(torch.int64)
    y = (xq @ q.T + quant_bias.to(torch.int64)).to(torch.float64) * deq_scale.to(torch.float64)
    reference = x.to(torch.float64) @ weight.to(torch.float64).T
    assert (y - reference).norm() <= 0.05 * reference.norm(), prefix


@pytest.mark.parametrize("model", ["qwen3", "qwen3_moe"])
def test_static_w8a8_calibration_covers_observed_range(exported, hf_qwen3, hf_qwen3_moe, model):
    src = hf_qwen3 if model == "qwen3" else hf_qwen3_moe
    dst, report = exported(model, "W8A8")
    assert report.calibration_prompts == len(DEFAULT_CALIBRATION_PROMPTS)
    observed = _observed_ranges(src, DEFAULT_CALIBRATION_PROMPTS)
    source, out = _load(src), _load(dst)
    prefixes = [n.removesuffix(".input_scale") for n in out if n.endswith(".input_scale")]
    assert len(prefixes) == report.tensors_quantized
    assert not any(".experts." in p for p in prefixes)
    for prefix in prefixes:
        _check_static_w8a8(out, prefix, observed[f"{prefix}.weight"], source[f"{prefix}.weight"])


def test_custom_calibration_prompts_set_the_ranges(hf_qwen3, tmp_path):
    prompts = ["red green blue", "one two three river mountain the dog jumps"]
    report = export_modelslim(hf_qwen3, tmp_path / "out", "W8A8", calibration_prompts=prompts, progress=False)
    assert report.calibration_prompts == 2
    observed = _observed_ranges(hf_qwen3, prompts)
    source, out = _load(hf_qwen3), _load(tmp_path / "out")
    for prefix in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        _check_static_w8a8(out, prefix, observed[f"{prefix}.weight"], source[f"{prefix}.weight"])


def test_group_size_options(hf_qwen3, tmp_path):
    export_modelslim(hf_qwen3, tmp_path / "w4-pc", "W4A16", group_size=0, progress=False)
    assert QuantDescription(tmp_path / "w4-pc").group_size is None
    assert _load(tmp_path / "w4-pc")["model.layers.0.mlp.down_proj.weight_scale"].shape == (64, 1)
    export_modelslim(hf_qwen3, tmp_path / "w8-g16", "W8A16", group_size=16, progress=False)
    assert QuantDescription(tmp_path / "w8-g16").group_size == 16
    out = _load(tmp_path / "w8-g16")
    assert out["model.layers.0.mlp.down_proj.weight_offset"].shape == (64, 128 // 16)
    deq, step = _dequantize(out, "model.layers.0.mlp.down_proj")
    weight = _load(hf_qwen3)["model.layers.0.mlp.down_proj.weight"].to(torch.float64)
    assert torch.all((deq - weight).abs() <= step * (0.5 + 1e-5))


def test_progress_bar_shown_unless_disabled(hf_qwen3, tmp_path, capsys):
    export_modelslim(hf_qwen3, tmp_path / "a", "W8A8", calibration_prompts=["red blue"], progress=True)
    err = capsys.readouterr().err
    assert "quantize W8A8" in err and "calibrate" in err
    export_modelslim(hf_qwen3, tmp_path / "b", "W8A8", calibration_prompts=["red blue"], progress=False)
    err = capsys.readouterr().err
    assert "quantize W8A8" not in err and "calibrate" not in err


# -- the CLI --------------------------------------------------------------------------------------


def test_cli_quantize_end_to_end(hf_qwen3, tmp_path, capsys):
    from vllm_ascend.core.cli import main

    dst = tmp_path / "q"
    assert main(["quantize", "--scheme", "W8A8_DYNAMIC", "--no-progress", str(hf_qwen3), str(dst)]) == 0
    captured = capsys.readouterr()
    assert f"exported {hf_qwen3} -> {dst} as W8A8_DYNAMIC (per channel): 14 tensors quantized" in captured.out
    assert "quantize W8A8_DYNAMIC" not in captured.err
    assert QuantDescription(dst).model_quant_type == "W8A8_DYNAMIC"

    assert main(["quantize", "--scheme", "W8A16", "--no-progress", str(hf_qwen3), str(dst)]) == 2
    assert "is not empty; pass overwrite=True (--overwrite)" in capsys.readouterr().err
    argv = ["quantize", "--scheme", "W8A16", "--group-size", "32", "--overwrite", str(hf_qwen3), str(dst)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "as W8A16 (group_size 32)" in captured.out and "quantize W8A16" in captured.err
    assert QuantDescription(dst).group_size == 32

    argv = ["quantize", "--scheme", "W8A8", "--calib-prompt", "red", "--calib-prompt", "blue dog"]
    assert main([*argv, "--no-progress", "--overwrite", str(hf_qwen3), str(dst)]) == 0
    assert "calibrated on 2 prompt(s)" in capsys.readouterr().out
    assert QuantDescription(dst).model_quant_type == "W8A8"


def test_cli_reports_export_errors(hf_qwen3, tmp_path, capsys):
    from vllm_ascend.core.cli import main
    from vllm_ascend.quant import cli

    assert cli._SCHEMES == ", ".join(SCHEMES + SPARSE_SCHEMES)
    assert main(["quantize", "--scheme", "W2A2", str(hf_qwen3), str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == (
        "vllm-ascend quantize: cannot export: unknown scheme 'W2A2'; allowed: W8A8, W8A8_DYNAMIC, W8A16, W4A16, W4A8_DYNAMIC, "
        "W8A8S, W8A8SC"
    )
    assert not (tmp_path / "x").exists()


def _write(name: str, content: bytes):
    return lambda src, tmp: (src / name).write_bytes(content)


@pytest.mark.parametrize(
    ("scheme", "source", "dst", "edit", "message"),
    [
        ("W8A16", "missing", "out", None, "source {tmp}/missing is not a directory"),
        (
            "W8A8_MIX",
            "src",
            "out",
            None,
            "unknown scheme 'W8A8_MIX'; allowed: W8A8, W8A8_DYNAMIC, W8A16, W4A16, W4A8_DYNAMIC, W8A8S, W8A8SC",
        ),
        (
            "W8A16",
            "src",
            "file/out",
            lambda src, tmp: (tmp / "file").write_text("x"),
            "destination {tmp}/file/out cannot be created: {tmp}/file is not a writable directory",
        ),
        ("W8A16", "src", "o" * 250, None, "export to {tmp}/" + "o" * 250 + " failed at {tmp}/." + "o" * 250),
        (
            "W8A16",
            "src",
            "out",
            _write("config.json", b"\xef\xbb\xbf{}"),
            "{src}/config.json is not valid JSON: it starts with a UTF-8 byte order mark (save it without a BOM)",
        ),
        (
            "W8A16",
            "src",
            "out",
            _write("config.json", b""),
            "{src}/config.json is empty: expected a JSON document",
        ),
        (
            "W8A16",
            "src",
            "out",
            _write("config.json", b'{"a": "\xe9"}'),
            "{src}/config.json is not UTF-8: byte 0xe9 at offset 7 (invalid continuation byte)",
        ),
        (
            "W8A16",
            "src",
            "out",
            _write("config.json", b"[" * 70 + b"]" * 70),
            "{src}/config.json is nested 70 levels deep; at most 64 levels are allowed",
        ),
        (
            "W8A16",
            "src",
            "out",
            _write("config.json", b'"../other/config.json"'),
            "{src}/config.json: expected a JSON object, got a string",
        ),
        (
            "W8A16",
            "src",
            "out",
            _write("model.safetensors.index.json", b'{"weight_map": NaN}'),
            "{src}/model.safetensors.index.json is not valid JSON: NaN is not a JSON number",
        ),
        (
            "W8A16",
            "src",
            "out",
            _write("model.safetensors", b"garbage"),
            "{src}/model.safetensors is not a readable safetensors file: ",
        ),
    ],
    ids=[
        "missing-source",
        "unknown-scheme",
        "output-under-a-file",
        "output-name-too-long",
        "config-bom",
        "config-empty",
        "config-latin-1",
        "config-deep",
        "config-string",
        "index-nan",
        "corrupt-safetensors",
    ],
)
def test_cli_mistakes_are_one_line_naming_the_file_or_option(
    tmp_path, capsys, scheme, source, dst, edit, message
):
    from vllm_ascend.core.cli import main

    src = _checkpoint(tmp_path / "src", _linear(8, 64))
    if edit is not None:
        edit(src, tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert (
        main(["quantize", "--scheme", scheme, "--no-progress", str(tmp_path / source), str(tmp_path / dst)])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("vllm-ascend quantize: cannot export: " + message.format(src=src, tmp=tmp_path)), (
        err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no temporary left


# -- refusals -------------------------------------------------------------------------------------


def _checkpoint(path: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config or {"model_type": "qwen3"}))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def _linear(out: int, inp: int) -> dict[str, torch.Tensor]:
    return {"model.layers.0.mlp.down_proj.weight": torch.randn(out, inp)}


@pytest.mark.parametrize(
    ("tensors", "scheme", "group_size", "match"),
    [
        (
            _linear(8, 20),
            "W4A16",
            0,
            r"model\.layers\.0\.mlp\.down_proj\.weight \[8, 20\]: W4A16 packs 8 int4",
        ),
        (
            _linear(8, 20),
            "W4A8_DYNAMIC",
            None,
            r"down_proj\.weight \[8, 20\]: W4A8_DYNAMIC packs .* in_features 20",
        ),
        (
            _linear(8, 48),
            "W4A16",
            None,
            r"down_proj\.weight \[8, 48\]: in_features 48 is not a multiple of group_size 32",
        ),
        (_linear(8, 48), "W8A16", 32, r"in_features 48 is not a multiple of group_size 32"),
        (
            _linear(8, 64),
            "W4A8_DYNAMIC",
            32,
            r"W4A8_DYNAMIC is per channel only: group_size must be 0 or unset, got 32",
        ),
        (_linear(8, 64), "W8A8_DYNAMIC", 64, r"W8A8_DYNAMIC is per channel only"),
        (_linear(8, 64), "W8A16", -1, r"group_size must be an integer >= 0 \(0 = per channel\), got -1"),
        (
            _linear(8, 64),
            "w8a8_dynamic",
            None,
            r"unknown scheme 'w8a8_dynamic'; allowed: W8A8, W8A8_DYNAMIC,",
        ),
        (
            {**_linear(8, 64), "model.layers.0.mlp.up_proj.weight": torch.ones(8, 64, dtype=torch.int8)},
            "W8A8_DYNAMIC",
            None,
            r"tensor model\.layers\.0\.mlp\.up_proj\.weight \(model\.safetensors\) has dtype I8: the exporter "
            r"needs floating-point",
        ),
        ({"model.embed_tokens.weight": torch.randn(8, 8)}, "W8A8_DYNAMIC", None, r"no tensor to quantize in"),
    ],
    ids=[
        "w4-in8",
        "w4a8-in8",
        "w4-group-default",
        "w8-group",
        "w4a8-group",
        "w8a8d-group",
        "negative-group",
        "scheme-case",
        "int8-source",
        "nothing-to-quantize",
    ],
)
def test_refusals_name_the_tensor_and_write_nothing(tmp_path, tensors, scheme, group_size, match):
    src = _checkpoint(tmp_path / "src", tensors)
    with pytest.raises(ExportError, match=match):
        export_modelslim(src, tmp_path / "dst", scheme, group_size=group_size, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_every_bad_tensor_is_listed(tmp_path):
    tensors = {
        "model.layers.0.mlp.down_proj.weight": torch.randn(8, 20),
        "model.layers.1.self_attn.o_proj.weight": torch.randn(8, 12),
        "model.layers.1.self_attn.q_proj.weight": torch.zeros(8, 8, dtype=torch.int64),
    }
    with pytest.raises(ExportError) as info:
        export_modelslim(
            _checkpoint(tmp_path / "src", tensors), tmp_path / "d", "W4A8_DYNAMIC", progress=False
        )
    assert len(info.value.problems) == 3
    assert str(info.value).startswith("cannot export: 3 problem(s)\n  - ")
    for name in tensors:
        assert name in str(info.value)


def test_source_problems(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        ExportError, match=r"empty has no config\.json \(expected a Hugging Face model directory\)"
    ):
        export_modelslim(empty, tmp_path / "d", "W8A16")
    with pytest.raises(ExportError, match=r"source .*missing is not a directory"):
        export_modelslim(tmp_path / "missing", tmp_path / "d", "W8A16")
    (empty / "config.json").write_text("{}")
    with pytest.raises(ExportError, match=r"has no \*\.safetensors file"):
        export_modelslim(empty, tmp_path / "d", "W8A16")
    (empty / "config.json").write_text("{oops")
    with pytest.raises(ExportError, match=r"config\.json is not valid JSON"):
        export_modelslim(empty, tmp_path / "d", "W8A16")
    quantized = _checkpoint(
        tmp_path / "hfq", _linear(8, 64), {"quantization_config": {"quant_method": "fp8"}}
    )
    with pytest.raises(ExportError, match=r"has a quantization_config: the source is already quantized"):
        export_modelslim(quantized, tmp_path / "d", "W8A16")
    modelslim = _checkpoint(tmp_path / "ms", _linear(8, 64))
    (modelslim / "quant_model_description.json").write_text("{}")
    with pytest.raises(ExportError, match=r"is already a ModelSlim checkpoint"):
        export_modelslim(modelslim, tmp_path / "d", "W8A16")
    broken = _checkpoint(tmp_path / "idx", _linear(8, 64))
    (broken / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a.weight": "gone.safetensors"}})
    )
    with pytest.raises(ExportError, match=r"index\.json names missing shard\(s\): gone\.safetensors"):
        export_modelslim(broken, tmp_path / "d", "W8A16")
    assert not (tmp_path / "d").exists()


def test_destination_problems_and_overwrite(tmp_path):
    src = _checkpoint(tmp_path / "src", _linear(8, 64))
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "old.txt").write_text("keep me")
    with pytest.raises(
        ExportError, match=r"dst is not empty; pass overwrite=True \(--overwrite\) to replace it"
    ):
        export_modelslim(src, dst, "W8A16", progress=False)
    assert (dst / "old.txt").read_text() == "keep me"
    export_modelslim(src, dst, "W8A16", progress=False, overwrite=True)
    assert sorted(p.name for p in dst.iterdir()) == [
        "config.json",
        "model.safetensors",
        "quant_model_description.json",
    ]
    for bad in (src, src / "inner", tmp_path):
        with pytest.raises(ExportError, match=r"overlaps the source"):
            export_modelslim(src, bad, "W8A16", overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match=r"file exists and is not a directory"):
        export_modelslim(src, tmp_path / "file", "W8A16", overwrite=True)
    assert (src / "model.safetensors").is_file()


def test_calibration_problems(hf_qwen3, tmp_path):
    with pytest.raises(
        ExportError,
        match=r"calibration prompts are used by the static schemes \(W8A8, W8A8S, W8A8SC\) only, not W8A16",
    ):
        export_modelslim(hf_qwen3, tmp_path / "d", "W8A16", calibration_prompts=["red"])
    with pytest.raises(ExportError, match=r"static W8A8 needs at least one calibration prompt"):
        export_modelslim(hf_qwen3, tmp_path / "d", "W8A8", calibration_prompts=[])
    with pytest.raises(ExportError, match=r"calibration prompt '' tokenizes to no tokens"):
        export_modelslim(hf_qwen3, tmp_path / "d", "W8A8", calibration_prompts=["red", ""], progress=False)
    no_tokenizer = _checkpoint(tmp_path / "src", _linear(8, 64))
    with pytest.raises(
        ExportError, match=r"calibration needs the tokenizer of .*src: none of tokenizer\.json,"
    ):
        export_modelslim(no_tokenizer, tmp_path / "d", "W8A8", progress=False)
    save_tokenizer(no_tokenizer)
    (no_tokenizer / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    with pytest.raises(
        ExportError, match=r"calibration could not load the float model and tokenizer from .*src"
    ):
        export_modelslim(no_tokenizer, tmp_path / "d", "W8A8", progress=False)
    with pytest.raises(
        ExportError, match=r"calibration recorded no input for model\.layers\.0\.mlp\.fc9\.weight"
    ):
        calibrate(
            hf_qwen3, ["model.layers.0.mlp.fc9.weight", "model.layers.0.mlp.up_proj.weight"], ["red"], False
        )
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("scheme", ["W8A8_DYNAMIC", "W4A16"])
def test_bf16_source_and_zero_rows(tmp_path, scheme):
    weight = torch.randn(8, 64).to(torch.bfloat16)
    weight[3] = 0
    src = _checkpoint(
        tmp_path / "src",
        {
            "model.layers.0.mlp.down_proj.weight": weight,
            "model.norm.weight": torch.ones(64, dtype=torch.bfloat16),
        },
    )
    export_modelslim(src, tmp_path / "dst", scheme, progress=False)
    out = _load(tmp_path / "dst")
    assert out["model.norm.weight"].dtype == torch.bfloat16
    assert out["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.float32
    deq, step = _dequantize(out, "model.layers.0.mlp.down_proj")
    assert torch.all((deq - weight.to(torch.float64)).abs() <= step * (0.5 + 1e-5))
    assert torch.all(deq[3] == 0) and torch.all(out["model.layers.0.mlp.down_proj.weight_scale"][3] == 1)


def test_quantize_linear_direct_refusals():
    with pytest.raises(
        ExportError, match=r"x\.weight: quant_bias does not fit in int32 \(in_features 140000\)"
    ):
        quantize_linear("x.weight", torch.ones(1, 140_000), "W8A8", 0, (-1.0, 0.0))
    with pytest.raises(ExportError, match=r"x\.weight: static W8A8 needs the calibrated input range"):
        quantize_linear("x.weight", torch.ones(2, 8), "W8A8", 0)
    with pytest.raises(
        ExportError, match=r"unknown scheme 'W2A2'; allowed: W8A8, W8A8_DYNAMIC, W8A16, W4A16"
    ):
        quantize_linear("x.weight", torch.ones(2, 8), "W2A2", 0)


# -- the Atlas 310P sparse schemes --------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SPARSE_SCHEMES)
def test_sparse_exports_prune_fold_and_compress(exported, hf_qwen3, scheme):
    from vllm_ascend.quant.compress import decompress_weight

    dst, report = exported("qwen3", scheme)
    source, out, static = _load(hf_qwen3), _load(dst), _load(exported("qwen3", "W8A8")[0])
    d = QuantDescription(dst, family="310P")
    assert d.model_quant_type == scheme and report.calibration_prompts == len(DEFAULT_CALIBRATION_PROMPTS)
    linears = [n for n, t in source.items() if _is_linear(n, t, scheme)]
    for name in linears:
        prefix = name.removesuffix(".weight")
        assert f"{prefix}.weight_scale" not in out and f"{prefix}.weight_offset" not in out, name
        if scheme == "W8A8SC":
            q = decompress_weight(*(out[f"{prefix}.{s}"] for s in ("weight", "index", "info")))
            assert out[f"{prefix}.weight"].numel() < q.numel(), name  # half the weights are 0: it compresses
            assert d.tensor_type(f"{prefix}.index") == d.tensor_type(f"{prefix}.info") == scheme
        else:
            q = out[name]
        assert q.shape == source[name].shape and q.dtype == torch.int8, name
        # half of every row pruned (the smallest |w|), the rest quantized as static W8A8 quantizes them
        in_features = q.shape[1]
        assert torch.all((q == 0).sum(dim=1) >= round(0.5 * in_features)), name
        kept = q != 0
        assert torch.equal(q[kept], static[name][kept]), name
        assert torch.equal(out[f"{prefix}.input_scale"], static[f"{prefix}.input_scale"]), name
        assert torch.equal(out[f"{prefix}.deq_scale"], static[f"{prefix}.deq_scale"]), name
        expected_bias = -out[f"{prefix}.input_offset"].long() * q.long().sum(dim=1)
        assert torch.equal(out[f"{prefix}.quant_bias"], expected_bias.to(torch.int32)), name
        assert d.tensor_type(name) == scheme
    with pytest.raises(QuantDescriptionError, match=f"{scheme} is only supported on the 310P family"):
        QuantDescription(dst, family="A2")


def test_sparse_export_refusals(hf_qwen3, tmp_path):
    with pytest.raises(
        ExportError, match=r"sparsity is used by the sparse schemes \(W8A8S, W8A8SC\) only, not W8A8"
    ):
        export_modelslim(hf_qwen3, tmp_path / "d", "W8A8", sparsity=0.5)
    for bad in (1.0, -0.1, True, "half"):
        with pytest.raises(ExportError, match=r"sparsity must be a number in \[0, 1\)"):
            export_modelslim(hf_qwen3, tmp_path / "d", "W8A8SC", sparsity=bad)
    assert not (tmp_path / "d").exists()
