"""Fused-MoE LoRA end to end: PEFT adapters on tiny Qwen3-MoE (attention and the routed experts), served by
vLLM on Model Runner V2 through ``AscendMoERunner``'s expert LoRA path, token for token equal to HF + PEFT.

The experts adapter targets transformers-5's 3D experts (``target_parameters`` on ``gate_up_proj`` /
``down_proj``): vLLM serves it on Qwen3-MoE (2D expert weights) with ``enable_mixed_moe_lora_format`` and the
request's ``is_3d_lora_weight``. The same adapter rewritten with per-expert module names
(``experts.<e>.gate_proj`` ...) is vLLM's other MoE adapter format and must give the same tokens.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import MAX_NEW_TOKENS
from tests.e2e.lora_adapters import build_adapter, hf_greedy

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
MAX_LORA_RANK = 8
#: name -> (slot id, HF reference adapter, vLLM loads it as 3D experts).
REQUESTS = {"experts-r8": (1, "experts-r8", True), "attn-r4": (2, "attn-r4", False)}
PER_EXPERT = "experts-r8-per-expert"


def _split_per_expert(src: Path, dst: Path, num_experts: int) -> None:
    """The 3D adapter in per-expert module names: ``experts.base_layer`` (gate_up: A ``[E*r, H]``, B
    ``[2I, E*r]``, expert-major A rows, rank-major B columns) → ``experts.<e>.gate_proj``/``up_proj`` sharing A;
    ``experts`` (down) → ``experts.<e>.down_proj``."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "adapter_model.safetensors")
    out = {}
    for key, value in tensors.items():
        if ".mlp.experts." not in key:
            out[key] = value
            continue
        prefix, _, rest = key.partition(".mlp.experts.")
        fused = rest.startswith("base_layer.")
        factor = rest.removeprefix("base_layer.").split(".")[0]  # lora_A / lora_B
        for e in range(num_experts):
            if factor == "lora_A":
                per = value.reshape(num_experts, -1, value.shape[-1])[e]
                names = {"gate_proj": per, "up_proj": per} if fused else {"down_proj": per}
            else:
                per = value.reshape(value.shape[0], -1, num_experts)[..., e]
                half = per.shape[0] // 2
                names = {"gate_proj": per[:half], "up_proj": per[half:]} if fused else {"down_proj": per}
            for module, weight in names.items():
                out[f"{prefix}.mlp.experts.{e}.{module}.{factor}.weight"] = weight.clone()
    dst.mkdir()
    save_file(out, dst / "adapter_model.safetensors")
    config = json.loads((src / "adapter_config.json").read_text())
    config["target_modules"] = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]
    config["target_parameters"] = None
    (dst / "adapter_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def adapters(tiny_qwen3_moe: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe-lora")
    built = {name: root / name for name in (*REQUESTS, PER_EXPERT)}
    build_adapter(
        tiny_qwen3_moe, built["experts-r8"], 8, 32, ATTENTION, seed=0, std=0.1, target_parameters=EXPERTS
    )
    build_adapter(tiny_qwen3_moe, built["attn-r4"], 4, 16, ATTENTION, seed=1)
    num_experts = json.loads((tiny_qwen3_moe / "config.json").read_text())["num_local_experts"]
    _split_per_expert(built["experts-r8"], built[PER_EXPERT], num_experts)
    yield built
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def hf_tokens(tiny_qwen3_moe, adapters, qwen3_moe_prompts) -> dict[str | None, list[list[int]]]:
    """HF + PEFT greedy tokens per adapter (``None``: the base model)."""
    table = {None: hf_greedy(tiny_qwen3_moe, None, qwen3_moe_prompts)}
    for name in REQUESTS:
        table[name] = hf_greedy(tiny_qwen3_moe, adapters[name], qwen3_moe_prompts)
    return table


@pytest.fixture(scope="module")
def expert_lora_calls():
    """Calls of the expert LoRA delta and the rows it gave an adapter (``row_slots >= 0``)."""
    from vllm_ascend.runner.ops import moe_lora

    counts = {"calls": 0, "rows": 0}
    original = moe_lora.add_expert_lora

    def counted(out, x, lora_a, lora_b, row_slots):
        counts["calls"] += 1
        counts["rows"] += int((row_slots >= 0).sum())
        return original(out, x, lora_a, lora_b, row_slots)

    patch = pytest.MonkeyPatch()
    patch.setattr(moe_lora, "add_expert_lora", counted)
    yield counts
    patch.undo()


@pytest.fixture(scope="module", params=["eager", "piecewise"])
def llm(request, tiny_qwen3_moe, expert_lora_calls):
    """One engine per mode (vLLM's defaults: Model Runner V2, async scheduling), both MoE adapter formats
    accepted: eager, then compiled PIECEWISE graphs (the MoE layer runs between the captured pieces)."""
    from vllm import LLM

    graphs = {"mode": 3, "cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]}
    engine = LLM(
        compilation_config=graphs if request.param == "piecewise" else None,
        model=str(tiny_qwen3_moe),
        dtype="float32",
        block_size=16,
        max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=MAX_LORA_RANK,
        enable_mixed_moe_lora_format=True,
    )
    yield engine
    engine.llm_engine.engine_core.shutdown()


def _generate(llm, adapters, prompts, names):
    from vllm import SamplingParams, TokensPrompt
    from vllm.lora.request import LoRARequest

    def request(name):
        if name is None:
            return None
        if name == PER_EXPERT:
            return LoRARequest(name, 3, str(adapters[name]))
        slot, _, is_3d = REQUESTS[name]
        return LoRARequest(name, slot, str(adapters[name]), is_3d_lora_weight=is_3d)

    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, min_tokens=MAX_NEW_TOKENS)
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], params, lora_request=[request(n) for n in names]
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def test_adapters_change_the_hf_output(hf_tokens):
    """Diversity guard: each adapter's HF + PEFT tokens differ from the base model's and from each other's."""
    rows = [tuple(map(tuple, tokens)) for tokens in hf_tokens.values()]
    assert len(set(rows)) == len(rows) == 3


def test_a_mixed_batch_equals_hf_peft(llm, adapters, hf_tokens, qwen3_moe_prompts, expert_lora_calls):
    """Base, the experts adapter and the attention adapter in one batch (each prompt under each): every request
    equals HF + PEFT, and the experts' LoRA delta ran on adapter rows (w13 and w2 per MoE layer and step)."""
    names = [None, *REQUESTS]
    prompts = [p for p in qwen3_moe_prompts for _ in names]
    labels = names * len(qwen3_moe_prompts)
    before = dict(expert_lora_calls)
    got = _generate(llm, adapters, prompts, labels)
    for i, (label, have) in enumerate(zip(labels, got, strict=True)):
        assert have == hf_tokens[label][i // len(names)], f"adapter {label}, prompt {i // len(names)}"
    calls = expert_lora_calls["calls"] - before["calls"]
    rows = expert_lora_calls["rows"] - before["rows"]
    assert calls > 0 and calls % 2 == 0, expert_lora_calls
    assert rows > 0, expert_lora_calls


def test_per_expert_module_names_serve_the_same_adapter(llm, adapters, hf_tokens, qwen3_moe_prompts):
    """vLLM's per-expert adapter format (``experts.<e>.gate_proj`` ...) of the same weights gives the same
    tokens as HF + PEFT on the 3D adapter, next to base requests."""
    labels = [PER_EXPERT, None] * len(qwen3_moe_prompts)
    prompts = [p for p in qwen3_moe_prompts for _ in range(2)]
    got = _generate(llm, adapters, prompts, labels)
    for i, (label, have) in enumerate(zip(labels, got, strict=True)):
        want = hf_tokens["experts-r8" if label else None][i // 2]
        assert have == want, f"adapter {label}, prompt {i // 2}"


def test_vllm_wrapped_the_ascend_runner_in_the_ascend_moe_lora_layer(llm):
    """vLLM's ``from_layer`` picked the Ascend 2D MoE LoRA layer (Qwen3-MoE has 2D expert weights) for every
    ``AscendMoERunner``, and each runner holds its layer's adapter weights."""
    from vllm_ascend.runner.ops.moe import AscendMoERunner
    from vllm_ascend.runner.ops.moe_lora import AscendFusedMoEWithLoRA

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    layers = [m for m in runner.model.modules() if isinstance(m, AscendFusedMoEWithLoRA)]
    assert len(layers) == 2  # one per decoder layer
    for layer in layers:
        assert type(layer.base_layer) is AscendMoERunner
        assert layer.base_layer.expert_lora.w13_a is layer.w13_lora_a_stacked
        assert [tuple(t.shape) for t in layer.w13_lora_a_stacked] == [(2, 8, MAX_LORA_RANK, 128)] * 2


def test_moe_lora_over_two_tp_ranks_equals_hf_peft(tiny_qwen3_moe, adapters, hf_tokens, qwen3_moe_prompts):
    """Tensor parallel 2 (vLLM's multiprocess executor, gloo): each rank holds every expert's slice of the
    intermediate size and vLLM's MoE LoRA layer slices the adapters' w13 B / w2 A the same way; base, the
    per-expert adapter and the attention adapter in one batch equal HF + PEFT."""
    from tests.e2e.distributed import run_case

    names = {None: None, PER_EXPERT: "experts-r8", "attn-r4": "attn-r4"}
    slots = {PER_EXPERT: 1, "attn-r4": 2}
    prompts, requests, expected = [], [], []
    for i, prompt in enumerate(qwen3_moe_prompts):
        for name, oracle in names.items():
            prompts.append(prompt)
            requests.append(None if name is None else (name, slots[name], str(adapters[name])))
            expected.append(hf_tokens[oracle][i])
    result, output = run_case(
        tiny_qwen3_moe,
        prompts,
        lora_requests=requests,
        tensor_parallel_size=2,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=MAX_LORA_RANK,
        max_num_seqs=4,
    )
    assert sorted(w[3] for w in result["workers"]) == [0, 1], result["workers"]
    for request, want, have in zip(requests, expected, result["tokens"], strict=True):
        assert have == want, f"adapter {request and request[0]}"
    assert "Traceback" not in output, output[-6000:]
