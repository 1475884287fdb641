"""Atlas 310P quantization through vLLM: a tiny Qwen3 whose layer 0 is static W8A8 and layer 1 W8A8SC (sparse,
compressed), served in float16 on the reference device emulating 310P (``VLLM_ASCEND_REFERENCE_FAMILY=310p``,
eager), against the independent fake-quant forward of ``quant_oracle``.

The oracle does not read W8A8SC, so it runs on the same integers written as W8A8: layer 0 from the W8A8 export,
layer 1 from the W8A8S export (the same calibration and pruning as the W8A8SC export, before compression) with
``weight_scale = deq_scale / input_scale`` and zero offsets — the engine has to decompress W8A8SC exactly to agree.
The engine's runtime W8A8SC weights must equal the W8A8S integers exactly. Greedy tokens must equal the
oracle's wherever its top-2 gap is clear of float16 noise (a float16 forward flips static int8 activations near a
rounding boundary; the same W8A8 model in float16 on the default reference device moves log-probabilities by up
to 0.32), and log-probabilities agree within that noise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.e2e.quant_oracle import load_oracle
from vllm_ascend.quant.export import export_modelslim

MAX_NEW_TOKENS = 8
TOP_LOGPROBS = 3
PROMPTS = (
    "the quick ascend kernel",
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening",
)
DESCRIPTION = "quant_model_description.json"
SC_LAYER = "model.layers.1."
#: Top-2 log-probability gap below which a float16 forward may pick the runner-up: float16 activations carry
#: about 5e-4 relative error, enough to move a static int8 activation by one step near a rounding boundary.
FP16_LOGIT_NOISE = 0.05
#: Log-probability difference of a float16 forward from the float64 oracle (measured: a static W8A8 checkpoint
#: served in float16 on the default reference device differs by up to 0.32; in float32 by 1e-6).
FP16_LOGPROB_NOISE = 0.4


@pytest.fixture(scope="module")
def emulate_310p():
    """The reference device emulating 310P for this module (the device caches are reset around it)."""
    from vllm_ascend.core.device.config import clear_device_caches, get_current_hardware_profile

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ASCEND_REFERENCE_FAMILY", "310p")
        clear_device_caches()
        profile = get_current_hardware_profile()
        assert profile.supported_dtypes == ("float16",), profile
        yield profile
    clear_device_caches()


def _load(model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _write(model: Path, tensors: dict[str, torch.Tensor], description: dict[str, str], like: Path) -> Path:
    from safetensors.torch import save_file

    model.mkdir()
    for side in like.iterdir():  # config, tokenizer, generation config: everything but the float weights
        if side.is_file() and not side.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy2(side, model / side.name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(model / "model.safetensors"))
    (model / DESCRIPTION).write_text(json.dumps(description, indent=2))
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3: Path) -> tuple[Path, Path]:
    """(the mixed W8A8 / W8A8SC checkpoint served, its W8A8 equivalent the oracle reads)."""
    root = tmp_path_factory.mktemp("quant310p")
    for scheme in ("W8A8", "W8A8S", "W8A8SC"):
        export_modelslim(tiny_qwen3, root / scheme, scheme, progress=False)
    w8a8, w8a8s, w8a8sc = (_load(root / s) for s in ("W8A8", "W8A8S", "W8A8SC"))
    d8 = json.loads((root / "W8A8" / DESCRIPTION).read_text())
    dsc = json.loads((root / "W8A8SC" / DESCRIPTION).read_text())

    served = {k: v for k, v in w8a8.items() if not k.startswith(SC_LAYER)}
    served |= {k: v for k, v in w8a8sc.items() if k.startswith(SC_LAYER)}
    served_desc = {k: v for k, v in d8.items() if not k.startswith(SC_LAYER)}
    served_desc |= {k: v for k, v in dsc.items() if k.startswith(SC_LAYER)} | {"model_quant_type": "W8A8SC"}
    assert {k for k, v in served_desc.items() if v == "W8A8SC" and k.endswith(".index")}, (
        "no compressed layer"
    )

    oracle = {k: v for k, v in w8a8.items() if not k.startswith(SC_LAYER)}
    oracle_desc = {k: v for k, v in d8.items() if not k.startswith(SC_LAYER)}
    for name, tensor in w8a8s.items():
        if not name.startswith(SC_LAYER):
            continue
        oracle[name] = tensor
        oracle_desc[name] = "FLOAT" if d8.get(name) == "FLOAT" else "W8A8"
        if name.endswith(".deq_scale"):
            prefix = name.removesuffix(".deq_scale")
            scale = (tensor.double() / w8a8s[f"{prefix}.input_scale"].double()).float().reshape(-1, 1)
            oracle[f"{prefix}.weight_scale"] = scale
            oracle[f"{prefix}.weight_offset"] = torch.zeros_like(scale)
            oracle_desc[f"{prefix}.weight_scale"] = oracle_desc[f"{prefix}.weight_offset"] = "W8A8"
    # W8A8S is sparse: about half of every pruned row is 0, and W8A8SC stores it in fewer bytes
    q = oracle["model.layers.1.mlp.down_proj.weight"]
    assert 0.45 <= float((q == 0).float().mean()) <= 0.6
    assert w8a8sc["model.layers.1.mlp.down_proj.weight"].numel() < q.numel() * 0.75
    return (
        _write(root / "served", served, served_desc, tiny_qwen3),
        _write(root / "oracle", oracle, oracle_desc, tiny_qwen3),
    )


def test_w8a8_and_w8a8sc_on_310p_match_fake_quant_oracle(emulate_310p, checkpoints, make_llm):
    from transformers import AutoTokenizer
    from vllm import SamplingParams, TokensPrompt

    served, oracle_dir = checkpoints
    tokenizer = AutoTokenizer.from_pretrained(served)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    llm = make_llm(served, quantization="ascend", dtype="float16", enforce_eager=True)
    assert llm.llm_engine.vllm_config.model_config.dtype == torch.float16
    params = SamplingParams(
        temperature=0.0, max_tokens=MAX_NEW_TOKENS, logprobs=TOP_LOGPROBS, ignore_eos=True
    )
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    (kinds,) = llm.apply_model(
        lambda model: {
            name: type(module.quant_method.scheme).__name__
            for name, module in model.named_modules()
            if hasattr(getattr(module, "quant_method", None), "scheme")
        }
    )
    assert kinds["model.layers.0.mlp.down_proj"] == "W8A8Linear"
    # The W8A8SC layers decompressed exactly to the W8A8S integers (fused shards in q, k, v / gate, up order).
    (runtime,) = llm.apply_model(
        lambda model: {
            n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("model.layers.1.")
        }
    )
    source = _load(oracle_dir)
    fused = {
        "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "mlp.gate_up_proj": ("gate_proj", "up_proj"),
    }
    fused |= {"self_attn.o_proj": ("o_proj",), "mlp.down_proj": ("down_proj",)}
    for layer, parts in fused.items():
        group = layer.rpartition(".")[0]
        expected = torch.cat([source[f"{SC_LAYER}{group}.{p}.weight"] for p in parts]).t()
        assert torch.equal(runtime[f"{SC_LAYER}{layer}.weight"], expected), layer
        assert f"{SC_LAYER}{layer}.index" not in runtime
    assert (
        kinds["model.layers.1.mlp.down_proj"] == kinds["model.layers.1.self_attn.qkv_proj"] == "W8A8SCLinear"
    )

    oracle = load_oracle(oracle_dir)
    clear = 0
    worst = 0.0
    for prompt, output in zip(prompts, outputs, strict=True):
        got = list(output.outputs[0].token_ids)
        # The oracle's logits along the engine's own tokens (teacher forcing).
        reference = torch.log_softmax(oracle.logits(prompt + got[:-1]).double(), dim=-1)[len(prompt) - 1 :]
        for step, (position, token, entries) in enumerate(
            zip(reference, got, output.outputs[0].logprobs, strict=True)
        ):
            top2 = torch.topk(position, 2)
            best, margin = int(top2.indices[0]), float(top2.values[0] - top2.values[1])
            # Greedy tokens equal the reference's wherever its choice is clear of float16 noise; within that
            # noise the engine's token is the runner-up the reference nearly chose.
            assert token == best or float(position[best] - position[token]) <= FP16_LOGIT_NOISE, (
                step,
                token,
                best,
            )
            if margin > FP16_LOGIT_NOISE:
                assert token == best, (prompt, step, got)
                clear += 1
            for token_id, entry in entries.items():
                worst = max(worst, abs(entry.logprob - float(position[token_id])))
                assert entry.logprob == pytest.approx(float(position[token_id]), abs=FP16_LOGPROB_NOISE)
    # Most steps are clear decisions, so the equality above is not vacuous.
    assert clear >= len(prompts) * MAX_NEW_TOKENS * 3 // 4, clear
    print(f"310P W8A8 + W8A8SC: worst log-probability difference {worst:.2e}")
