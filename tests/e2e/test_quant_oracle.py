"""The independent oracle (``quant_oracle``) against HF transformers, no vLLM engine.

Float checkpoints: its logits equal HF's (fp32) and its greedy tokens are HF's. Quantized checkpoints
(written here by a small quantiser of the contract's formulas, independent of ``vllm_ascend.quant``):
with the activation quantisation off it equals HF run on the dequantised weights (the dequant path),
with it on it differs from that and equals HF (fp64) with the same fake quantisation hooked onto the
inputs of every quantized linear and inside every expert (the activation path).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from tests.e2e.quant_oracle import DESCRIPTION_FILE, OracleError, load_oracle

GREEDY_TOKENS = 16
ATOL = 1e-4


def _hf(model_dir: Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    # HF's default "grouped_mm" experts refuse float64; "eager" is its plain per-expert loop.
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, experts_implementation="eager").eval()


@torch.inference_mode()
def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0].double()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("which", ["qwen3", "qwen3_moe"])
def test_float_oracle_matches_hf(request, which):
    from vllm_ascend.testing.hf_reference import hf_greedy

    model_dir = request.getfixturevalue("tiny_qwen3" if which == "qwen3" else "tiny_qwen3_moe")
    prompts = request.getfixturevalue("qwen3_prompts" if which == "qwen3" else "qwen3_moe_prompts")[:3]
    oracle = load_oracle(model_dir)
    assert oracle.model_quant_type is None and set(oracle.linear_types.values()) == {"FLOAT"}
    hf = _hf(model_dir)
    for ids in prompts:
        ours, theirs = oracle.logits(ids), _hf_logits(hf, ids)
        assert ours.shape == (len(ids), oracle.vocab)
        assert _max_diff(ours, theirs) < ATOL
    expected = hf_greedy(model_dir, prompts, GREEDY_TOKENS).token_ids
    assert [oracle.greedy(ids, GREEDY_TOKENS) for ids in prompts] == expected
    assert len({tuple(t) for t in expected}) == len(expected)
    ids = prompts[1]
    logprobs = torch.log_softmax(_hf_logits(hf, ids)[:-1], dim=-1)
    nll = -logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean().item()
    assert oracle.perplexity(ids) == pytest.approx(torch.tensor(nll).exp().item(), rel=1e-4)


# --- a quantiser of the contract's formulas (test-side, so the oracle is checked against HF) ---


def _is_quantized(name: str, tensor: torch.Tensor, scheme: str) -> bool:
    """Contract §1: 2-D linear weights inside model.layers, not norms or the router; experts only for MoE schemes."""
    if not (name.startswith("model.layers.") and name.endswith(".weight") and tensor.dim() == 2):
        return False
    if "norm" in name or name.endswith(".mlp.gate.weight"):
        return False
    return ".experts." not in name or scheme in ("W8A8_DYNAMIC", "W4A8_DYNAMIC")


def _symmetric(w: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1, keepdim=True) / qmax
    return torch.round(w / scale).clamp(-qmax - 1, qmax).to(torch.int8), scale


def _asymmetric(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, ...]:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    groups = w.view(w.shape[0], -1, group_size or w.shape[1])
    mins, maxs = groups.amin(dim=-1).clamp(max=0), groups.amax(dim=-1).clamp(min=0)
    scale = (maxs - mins) / (high - low)
    offset = torch.round(low - mins / scale).clamp(low, high)
    q = (torch.round(groups / scale[..., None]) + offset[..., None]).clamp(low, high)
    return q.view_as(w).to(torch.int8), scale, offset


def _quantize(src: Path, dst: Path, scheme: str, group_size: int = 0, calibration=None) -> Path:
    """Write ``scheme``'s ModelSlim checkpoint of ``src`` to ``dst`` (static W8A8 needs input min/max per layer)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    types = {"model_quant_type": scheme, "version": "1.0.0"} | (
        {"group_size": group_size} if group_size else {}
    )
    for name, w in load_file(src / "model.safetensors").items():
        if not _is_quantized(name, w, scheme):
            tensors[name], types[name] = w, "FLOAT"
            continue
        p = name.removesuffix(".weight")
        if scheme in ("W8A16", "W4A16"):
            q, scale, offset = _asymmetric(w, 8 if scheme == "W8A16" else 4, group_size)
        else:
            q, scale = _symmetric(w, 7 if scheme == "W4A8_DYNAMIC" else 127)
            offset = torch.zeros_like(scale)
        new = {"weight": q, "weight_scale": scale, "weight_offset": offset}
        if scheme == "W8A8":
            lo, hi = calibration[p]
            in_scale = torch.tensor([(hi - lo) / 255])
            in_offset = torch.round(-128 - lo / in_scale).clamp(-128, 127)
            new |= {"input_scale": in_scale, "input_offset": in_offset}
            new["deq_scale"] = (in_scale * scale[:, 0]).float()
            new["quant_bias"] = (-in_offset * q.int().sum(dim=1)).to(torch.int32)
        for suffix, tensor in new.items():
            tensors[f"{p}.{suffix}"], types[f"{p}.{suffix}"] = tensor.contiguous(), scheme
    save_file(tensors, dst / "model.safetensors")
    (dst / DESCRIPTION_FILE).write_text(json.dumps(types, indent=1))
    return dst


def _dequantize(quant_dir: Path, dst: Path) -> Path:
    """The float64 checkpoint HF runs: every quantized weight replaced by (q - offset) * scale."""
    shutil.copytree(quant_dir, dst, ignore=shutil.ignore_patterns("*.safetensors", DESCRIPTION_FILE))
    types = json.loads((quant_dir / DESCRIPTION_FILE).read_text())
    tensors = load_file(quant_dir / "model.safetensors")
    out = {}
    for name, tensor in tensors.items():
        if types[name] == "FLOAT":
            out[name] = tensor
        elif name.endswith(".weight"):
            p = name.removesuffix(".weight")
            width = tensor.shape[1] // tensors[f"{p}.weight_scale"].shape[1]
            scale = tensors[f"{p}.weight_scale"].repeat_interleave(width, dim=1)
            offset = tensors[f"{p}.weight_offset"].repeat_interleave(width, dim=1)
            out[name] = ((tensor.double() - offset.double()) * scale.double()).contiguous()
    save_file(out, dst / "model.safetensors")
    return dst


def _calibrate(model_dir: Path, prompts: list[list[int]]) -> dict[str, tuple[float, float]]:
    """Input min/max of every linear of the float model over ``prompts`` (for static W8A8)."""
    model, ranges = _hf(model_dir), {}

    def record(name):
        def hook(_module, args):
            lo, hi = ranges.get(name, (0.0, 0.0))
            ranges[name] = (min(lo, args[0].min().item()), max(hi, args[0].max().item()))

        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.startswith("model.layers."):
            module.register_forward_pre_hook(record(name))
    for ids in prompts:
        _hf_logits(model, ids)
    return ranges


# --- HF with the scheme's activation fake-quantisation hooked in ---


def _fake_dynamic(x: torch.Tensor) -> torch.Tensor:
    """Contract §1 per-token symmetric int8 (written here, not taken from the oracle): q * scale."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.where(scale > 0, torch.round(x / scale.clamp_min(torch.finfo(x.dtype).tiny)), 0).clamp(
        -127, 127
    )
    return q * scale


class _FakeQuantExperts(torch.nn.Module):
    """HF's per-expert loop over its own fused weights, with per-token fake quant of the input and of silu(g)*u."""

    def __init__(self, experts: torch.nn.Module):
        super().__init__()
        self.gate_up_proj, self.down_proj = experts.gate_up_proj, experts.down_proj

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        out = torch.zeros_like(hidden)
        for expert in range(self.gate_up_proj.shape[0]):
            rows, slots = torch.where(top_k_index == expert)
            gate, up = F.linear(_fake_dynamic(hidden[rows]), self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(_fake_dynamic(F.silu(gate) * up), self.down_proj[expert])
            out.index_add_(0, rows, y * top_k_weights[rows, slots, None])
        return out


def _hook_activation_quant(model, quant_dir: Path, scheme: str) -> None:
    types = json.loads((quant_dir / DESCRIPTION_FILE).read_text())
    tensors = load_file(quant_dir / "model.safetensors")
    for name, module in list(model.named_modules()):
        if name.endswith(".mlp.experts") and types.get(f"{name}.0.gate_proj.weight") == scheme:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, _FakeQuantExperts(module))
        if not isinstance(module, torch.nn.Linear) or types.get(f"{name}.weight", "FLOAT") == "FLOAT":
            continue
        if scheme in ("W8A8_DYNAMIC", "W4A8_DYNAMIC"):
            module.register_forward_pre_hook(lambda _m, args: (_fake_dynamic(args[0]),))
        elif scheme == "W8A8":
            s, o = tensors[f"{name}.input_scale"].double(), tensors[f"{name}.input_offset"].double()
            module.register_forward_pre_hook(
                lambda _m, args, s=s, o=o: (((torch.round(args[0] / s) + o).clamp(-128, 127) - o) * s,)
            )


QUANT_CASES = [
    ("qwen3", "W8A8_DYNAMIC", 0),
    ("qwen3_moe", "W8A8_DYNAMIC", 0),
    ("qwen3_moe", "W4A8_DYNAMIC", 0),
    ("qwen3", "W8A8", 0),
    ("qwen3", "W8A16", 0),
    ("qwen3", "W4A16", 32),
]


@pytest.mark.parametrize(("which", "scheme", "group_size"), QUANT_CASES, ids=lambda v: str(v))
def test_quantized_oracle_dequant_and_activation_paths(request, tmp_path, which, scheme, group_size):
    model_dir = request.getfixturevalue("tiny_qwen3" if which == "qwen3" else "tiny_qwen3_moe")
    prompts = request.getfixturevalue("qwen3_prompts" if which == "qwen3" else "qwen3_moe_prompts")
    calibration = _calibrate(model_dir, prompts) if scheme == "W8A8" else None
    quant_dir = _quantize(model_dir, tmp_path / "quant", scheme, group_size, calibration)
    oracle, weights_only = load_oracle(quant_dir), load_oracle(quant_dir, activation_quant=False)
    assert oracle.model_quant_type == scheme
    expected_experts = scheme if which == "qwen3_moe" else None
    assert {t for n, t in oracle.linear_types.items() if ".experts." not in n} == {scheme}
    assert {t for n, t in oracle.linear_types.items() if ".experts." in n} <= {expected_experts}

    hf = _hf(_dequantize(quant_dir, tmp_path / "dequant"), torch.float64)
    ids = prompts[1]
    plain = _hf_logits(hf, ids)
    assert _max_diff(weights_only.logits(ids), plain) < ATOL
    _hook_activation_quant(hf, quant_dir, scheme)
    hooked = _hf_logits(hf, ids)
    ours = oracle.logits(ids)
    assert _max_diff(ours, hooked) < ATOL
    if scheme in ("W8A16", "W4A16"):
        assert _max_diff(ours, plain) < ATOL  # weight-only: no activation quantisation
    else:
        assert _max_diff(ours, plain) > 100 * ATOL  # the activation quantisation is applied
    if scheme == "W8A8":  # deq_scale stored as int64 (float32 bits in the low half) reads the same
        as_int64 = _edit(quant_dir, tmp_path / "int64", tensors=_deq_scale_as_int64)
        assert torch.equal(load_oracle(as_int64).logits(ids), ours)


def _deq_scale_as_int64(tensors: dict[str, torch.Tensor]) -> None:
    for name in [n for n in tensors if n.endswith(".deq_scale")]:
        tensors[name] = tensors[name].view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _edit(quant_dir: Path, dst: Path, tensors=None, types=None) -> Path:
    shutil.copytree(quant_dir, dst)
    if types is not None:
        description = json.loads((dst / DESCRIPTION_FILE).read_text())
        types(description)
        (dst / DESCRIPTION_FILE).write_text(json.dumps(description))
    if tensors is not None:
        loaded = load_file(dst / "model.safetensors")
        tensors(loaded)
        save_file(loaded, dst / "model.safetensors")
    return dst


Q = "model.layers.0.self_attn.q_proj"
EXPERT = "model.layers.0.mlp.experts.3.up_proj"
MALFORMED = {
    "unknown type": (dict(types=lambda d: d.update({f"{Q}.weight": "W2A2"})), "W2A2"),
    "missing scale": (dict(tensors=lambda t: t.pop(f"{Q}.weight_scale")), f"{Q}.weight_scale is missing"),
    "float weight": (
        dict(tensors=lambda t: t.update({f"{Q}.weight": t[f"{Q}.weight"].float()})),
        "torch.int8",
    ),
    "asymmetric": (
        dict(tensors=lambda t: t[f"{Q}.weight_offset"].add_(1)),
        f"{Q}.weight_offset must be all 0",
    ),
    "expert W8A16": (dict(types=lambda d: d.update({f"{EXPERT}.weight": "W8A16"})), "allowed here"),
    "stray tensor": (dict(tensors=lambda t: t.update({"extra.bias": torch.zeros(2)})), "extra.bias"),
}


@pytest.fixture(scope="module")
def moe_w8a8_dynamic(tiny_qwen3_moe: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _quantize(tiny_qwen3_moe, tmp_path_factory.mktemp("oracle") / "quant", "W8A8_DYNAMIC")


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_checkpoint_is_refused(moe_w8a8_dynamic, tmp_path, case):
    load_oracle(moe_w8a8_dynamic)  # the unedited checkpoint loads
    edits, message = MALFORMED[case]
    with pytest.raises(OracleError, match=message):
        load_oracle(_edit(moe_w8a8_dynamic, tmp_path / "bad", **edits))
