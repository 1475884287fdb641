"""RL weight updates through vLLM 0.32's weight-transfer API on the reference device (``backend="gloo"``).

A trainer process (``vllm_ascend.testing.weight_sync``: vLLM's ``WeightTransferTrainerFactory`` → the runner's
trainer engine) holds perturbed weights and drives the engine's ``init_weight_transfer_engine`` /
``start_weight_update`` / ``update_weights`` / ``finish_weight_update``; the tensors travel over a gloo group
between the trainer and every worker. After the update the next greedy generation equals HF's on the perturbed
checkpoint (and differs from the old tokens), every parameter kept its address, and captured graphs replay.

- tiny Qwen3 in-process on Model Runner V2 (vLLM's default) with compiled PIECEWISE graphs;
- tiny Qwen3-MoE in-process with a static expert map holding redundant experts (one process, 2 x 5 slots);
- tiny Qwen3-MoE over TP=2 with expert parallelism (vLLM's multiprocess executor, a fresh interpreter) and a
  permuted expert map: each rank's slots are re-filled from the new checkpoint experts by the placement.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_ascend.eplb.expert_map_file import save_expert_map
from vllm_ascend.testing.process import OUTPUT_TAIL_CHARS
from vllm_ascend.testing.script_host import shared_script_host
from vllm_ascend.testing.weight_sync import llm_handlers, run_trainer

from .conftest import MAX_NEW_TOKENS

CAPTURE_SIZES = [1, 2, 4]
#: One process, two ranks of five slots: experts 0 and 1 have a second copy (redundant experts).
REDUNDANT = [[0, 1, 2, 3, 4], [5, 6, 7, 0, 1]]
#: Expert parallel over two ranks, every expert away from where vLLM loads it (rank r loads 4r..4r+3).
PERMUTED = [[6, 4, 7, 5], [2, 0, 3, 1]]


def _perturbed(model: Path, out: Path, seed: int) -> Path:
    """A copy of ``model`` whose floating-point weights moved by a third of their spread (seeded)."""
    shutil.copytree(model, out)
    weights = load_file(out / "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    for name, tensor in weights.items():
        if tensor.is_floating_point() and tensor.numel() > 1 and float(tensor.std()) > 0:
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32).to(tensor.dtype)
            weights[name] = tensor + noise * tensor.std() / 3
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _hf(model: Path, prompts: list[list[int]]) -> list[list[int]]:
    from vllm_ascend.testing.hf_reference import hf_greedy

    return hf_greedy(model, prompts, MAX_NEW_TOKENS).token_ids


def _greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _addresses(llm) -> dict[str, int]:
    (found,) = llm.apply_model(lambda model: {n: p.data_ptr() for n, p in model.named_parameters()})
    return found


def _replays() -> int:
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    return sum(w.replays for w in list(CUDAGraphWrapper._all_instances))


@pytest.mark.usefixtures("fresh_compile_cache")
def test_update_in_piecewise_graphs_equals_hf_of_new_weights(
    make_llm, tiny_qwen3, qwen3_prompts, qwen3_hf, tmp_path
):
    new = _perturbed(tiny_qwen3, tmp_path / "qwen3-new", seed=1)
    expected = _hf(new, qwen3_prompts)
    assert expected != qwen3_hf.token_ids  # the update must show
    llm = make_llm(
        tiny_qwen3,
        weight_transfer_config={"backend": "gloo"},
        compilation_config={
            "mode": 3,
            "cudagraph_mode": "PIECEWISE",
            "cudagraph_capture_sizes": CAPTURE_SIZES,
        },
        max_num_seqs=4,
        enable_sleep_mode=True,
    )
    assert type(
        llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    ).__name__ == ("NPUModelRunnerV2")
    assert _greedy(llm, qwen3_prompts) == qwen3_hf.token_ids
    before = _addresses(llm)
    spec = {"backend": "gloo", "world_size": 2, "model": str(new), "packed_buffer_size_bytes": 256 << 10}
    report, output = run_trainer(spec, llm_handlers(llm), timeout_s=120)
    assert report["engine"] == "CollectiveTrainerWeightTransferEngine", output[-OUTPUT_TAIL_CHARS:]
    replays = _replays()
    assert _greedy(llm, qwen3_prompts) == expected
    assert _replays() > replays  # the captured graphs ran on the new weights
    assert _addresses(llm) == before

    # An RL step: sleep (level 2: nothing kept), wake the weights, update them from the trainer, wake the KV
    # cache, generate — in the graphs captured at start.
    from vllm_ascend.core.sdk import get_device_adaptor

    newer = _perturbed(tiny_qwen3, tmp_path / "qwen3-newer", seed=3)
    expected_newer = _hf(newer, qwen3_prompts)
    assert expected_newer != expected
    pool = get_device_adaptor().memory_pool()
    llm.sleep(level=2)
    assert pool.get_current_usage() == 0
    with pytest.raises(Exception, match=r"start_weight_update while the weights are asleep: call wake_up"):
        llm.start_weight_update()
    llm.wake_up(tags=["weights"])
    assert pool.get_current_usage("kv_cache") == 0 < pool.get_current_usage("weights")
    run_trainer({**spec, "model": str(newer)}, llm_handlers(llm), timeout_s=120)
    llm.wake_up(tags=["kv_cache"])
    replays = _replays()
    assert _greedy(llm, qwen3_prompts) == expected_newer
    assert _replays() > replays
    assert _addresses(llm) == before


def test_update_refills_redundant_expert_slots(make_llm, tiny_qwen3_moe, qwen3_moe_prompts, tmp_path):
    """One process, a static placement with redundant copies: every physical slot (both copies of experts 0
    and 1 included) gets its logical expert's new weights, in place."""
    old = _hf(tiny_qwen3_moe, qwen3_moe_prompts)
    new = _perturbed(tiny_qwen3_moe, tmp_path / "moe-new", seed=2)
    expected = _hf(new, qwen3_moe_prompts)
    assert expected != old
    table = np.broadcast_to(np.asarray(REDUNDANT), (2, 2, 5))
    save_expert_map(table, tmp_path / "redundant.json")
    llm = make_llm(
        tiny_qwen3_moe,
        weight_transfer_config={"backend": "gloo"},
        enable_expert_parallel=True,
        additional_config={"eplb_config": {"expert_map_path": str(tmp_path / "redundant.json")}},
    )
    assert _greedy(llm, qwen3_moe_prompts) == old
    before = _addresses(llm)
    spec = {"backend": "gloo", "world_size": 2, "safetensors": str(new / "model.safetensors")}
    run_trainer(spec, llm_handlers(llm), timeout_s=120)
    assert _greedy(llm, qwen3_moe_prompts) == expected
    assert _addresses(llm) == before
    checkpoint = load_file(new / "model.safetensors")
    (slots,) = llm.apply_model(
        lambda model: [
            m.routed_experts.w13_weight.clone() for m in model.modules() if hasattr(m, "comm_steps")
        ]
    )
    for layer, w13 in enumerate(slots):
        for phys, expert in enumerate(np.asarray(REDUNDANT).reshape(-1)):
            gate = checkpoint[f"model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight"]
            torch.testing.assert_close(w13[phys][: gate.shape[0]], gate, rtol=0, atol=0)


CASE_SCRIPT = r"""
import json, sys

spec = json.loads(sys.argv[1])
from vllm import LLM, SamplingParams

from vllm_ascend.testing.weight_sync import llm_handlers, run_trainer

llm = LLM(model=spec["model"], dtype="float32", block_size=16, max_model_len=256, kv_cache_memory_bytes=64 << 20,
          seed=0, distributed_executor_backend="mp", weight_transfer_config={"backend": "gloo"}, **spec["options"])
params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True)


def greedy():
    outs = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def addresses(wrapper):
    model = wrapper.worker.model_runner.get_model()
    return {n: p.data_ptr() for n, p in model.named_parameters()}


def slot_sums(wrapper):
    model = wrapper.worker.model_runner.get_model()
    return [m.routed_experts.w13_weight.double().sum(dim=(1, 2)).tolist() for m in model.modules() if hasattr(m, "comm_steps")]


before_tokens, before = greedy(), llm.collective_rpc(addresses)
trainer = {"backend": "gloo", "world_size": 1 + len(before), "safetensors": spec["new"]}
report, _ = run_trainer(trainer, llm_handlers(llm), timeout_s=120)
after_tokens = greedy()
print("RESULT " + json.dumps({"before": before_tokens, "after": after_tokens, "kept": llm.collective_rpc(addresses) == before,
                              "ranks": len(before), "slot_sums": llm.collective_rpc(slot_sums), "report": report}), flush=True)
llm.llm_engine.engine_core.shutdown()
"""


def test_update_over_tp2_expert_parallel_with_permuted_placement(tiny_qwen3_moe, qwen3_moe_prompts, tmp_path):
    """TP=2 + expert parallel (two processes), a placement moving every expert off the rank vLLM loaded it
    on: the update loads where vLLM loaded, then the placement's mover puts each expert back in its slot."""
    old = _hf(tiny_qwen3_moe, qwen3_moe_prompts)
    new = _perturbed(tiny_qwen3_moe, tmp_path / "moe-new", seed=3)
    expected = _hf(new, qwen3_moe_prompts)
    assert expected != old
    save_expert_map(np.broadcast_to(np.asarray(PERMUTED), (2, 2, 4)), tmp_path / "permuted.json")
    spec = {
        "model": str(tiny_qwen3_moe),
        "new": str(new / "model.safetensors"),
        "prompts": qwen3_moe_prompts,
        "max_tokens": MAX_NEW_TOKENS,
        "options": {
            "tensor_parallel_size": 2,
            "enable_expert_parallel": True,
            "additional_config": {"eplb_config": {"expert_map_path": str(tmp_path / "permuted.json")}},
        },
    }
    result, output = shared_script_host().run(CASE_SCRIPT, json.dumps(spec), timeout=300)
    assert result is not None, output[-OUTPUT_TAIL_CHARS:]
    assert "Traceback" not in output, output[-OUTPUT_TAIL_CHARS:]
    assert result["ranks"] == 2 and result["report"]["engine"] == "CollectiveTrainerWeightTransferEngine"
    assert result["before"] == old
    assert result["after"] == expected
    assert result["kept"]
    checkpoint = load_file(new / "model.safetensors")
    for rank, layers in enumerate(result["slot_sums"]):
        for layer, sums in enumerate(layers):
            want = [
                float(
                    checkpoint[f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight"].double().sum()
                    + checkpoint[f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight"].double().sum()
                )
                for e in PERMUTED[rank]
            ]
            np.testing.assert_allclose(sums, want, rtol=1e-6, atol=1e-6)


def test_backends_not_served_here_are_refused_at_config_time(tiny_qwen3):
    """vLLM's CUDA engines (``nccl``, ``ipc``) and the NPUs' ``hccl`` are refused by name on the reference
    device before any model loads."""
    from vllm import LLM

    for backend in ("nccl", "ipc", "hccl"):
        with pytest.raises(ValueError) as info:  # vLLM's config validation wraps the platform's ConfigError
            LLM(model=str(tiny_qwen3), dtype="float32", weight_transfer_config={"backend": backend})
        assert (
            f"weight_transfer_config.backend={backend!r} is not served on Ascend (reference (torch cpu)) by "
            "vllm-ascend" in str(info.value)
        )
        assert "; allowed: 'gloo' here (per device: hccl (NPU), gloo (reference device))" in str(info.value)
