"""DeepSeek-V3 MTP speculative decoding on the MLA backend (reference device).

A tiny DeepSeek-V3 (the builder of ``test_mla_deepseek``) gets one multi-token-prediction layer appended
the way DeepSeek-V3 checkpoints store it (``num_nextn_predict_layers = 1``; at ``model.layers.{L}``:
``enorm``/``hnorm``/``eh_proj``, a full decoder layer with MLA attention, ``shared_head.norm`` and
``shared_head.head``, and a copy of the embedding). Served with ``speculative_config.method = "mtp"``
(vLLM's ``DeepSeekMTP`` drafting through our ``AscendEagleProposer``), the target verifies 1 + k tokens per
request and the drafter runs its own MLA layer over its own latent cache. Checked: greedy tokens equal
plain greedy decoding and HF fp32, drafts are produced and accepted (vLLM's spec-decode counters), each
propose call's drafts equal an independent HF forward of the MTP layer, and the verification batches are
attended by the latent (absorbed) path as multi-token decodes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from vllm_ascend.testing.draft_reference import DeepseekMtpReference, DraftReference
from vllm_ascend.testing.tiny_models import build_tiny_model, publish_build

from .test_mla_deepseek import PROMPTS, deepseek_v3_spec

MAX_NEW_TOKENS = 24


def add_deepseek_mtp_layer(
    target_dir: Path, root: Path, noise: float = 0.001, first_layer_scale: float = 0.01, seed: int = 11
) -> Path:
    """A copy of the tiny DeepSeek-V3 at ``target_dir`` with one MTP layer at index ``num_hidden_layers``,
    built so that its drafts are often right (random MTP weights are almost never accepted).

    An MTP layer at position ``i`` reads token ``i + 1`` and predicts token ``i + 2``, which the target
    predicts at position ``i + 1`` from the same token. So the target is made close to one decoder layer
    (its first layer's output projections scaled by ``first_layer_scale``, its embedding rows scaled to
    RMS 1 so ``enorm`` keeps them) and the MTP layer is that last layer's weights plus ``noise`` (a MoE
    layer when the last one is, as in DeepSeek-V3), fed mostly the token (``eh_proj`` = ``[I | 0]`` plus
    ``noise``); ``shared_head.head`` and the layer's ``embed_tokens`` copy the target's (DeepSeek-V3 stores
    both). The drafts still differ from the target's tokens now and then (the MTP's context lacks the
    first token, the noise, the scaled first layer), so verification both accepts and rejects."""
    from safetensors.torch import load_file, save_file

    target = json.loads((target_dir / "config.json").read_text())
    if target.get("model_type") not in ("deepseek_v3", "deepseek_v32"):
        raise ValueError(
            "add_deepseek_mtp_layer needs a deepseek_v3 or deepseek_v32 checkpoint; "
            f"got {target.get('model_type')!r}"
        )
    out = root / f"{target_dir.name}-mtp-n{noise}-f{first_layer_scale}-s{seed}"
    if (out / "complete").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    hidden, layer = target["hidden_size"], target["num_hidden_layers"]
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(target_dir / "model.safetensors"))
    embed = weights["model.embed_tokens.weight"]
    weights["model.embed_tokens.weight"] = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()
    for name in weights:
        if name.startswith("model.layers.0.") and name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * first_layer_scale
    last, prefix = f"model.layers.{layer - 1}.", f"model.layers.{layer}."
    for name, value in list(weights.items()):
        if name.startswith(last):
            perturbed = value + torch.randn(value.shape, generator=gen) * noise if value.dim() > 1 else value
            weights[prefix + name[len(last) :]] = perturbed.clone()
    eh_proj = torch.randn(hidden, 2 * hidden, generator=gen) * noise
    eh_proj[:, :hidden] += torch.eye(hidden)
    weights[prefix + "eh_proj.weight"] = eh_proj
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        weights[f"{prefix}{norm}.weight"] = torch.ones(hidden)
    weights[prefix + "shared_head.head.weight"] = weights["lm_head.weight"].clone()
    weights[prefix + "embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
    target["num_nextn_predict_layers"] = 1
    if target["first_k_dense_replace"] >= layer:  # a dense-only target gets a dense MTP layer too
        target["first_k_dense_replace"] = layer + 1
    (tmp / "config.json").write_text(json.dumps(target, indent=2))
    for name in os.listdir(target_dir):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "generation_config.json"):
            shutil.copy(target_dir / name, tmp / name)
    marker = {"target": target_dir.name, "noise": noise, "first_layer_scale": first_layer_scale, "seed": seed}
    return publish_build(tmp, out, json.dumps(marker))


def _greedy(llm, prompts: list[list[int]], max_tokens: int = MAX_NEW_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _counters(llm) -> tuple[float, float]:
    """vLLM's spec-decode counters: (draft tokens, accepted tokens)."""
    metrics = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    return metrics["vllm:spec_decode_num_draft_tokens"], metrics["vllm:spec_decode_num_accepted_tokens"]


CASES = {
    "dense-kv512-rope64": deepseek_v3_spec(),
    "moe-kv32-rope16": deepseek_v3_spec(
        kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, first_k_dense_replace=1
    ),
}


@pytest.mark.usefixtures("v1_runner")  # the specdecode sibling's MTP proposer: a V1 drafter
@pytest.mark.parametrize(
    ("case", "num_speculative_tokens"), [("dense-kv512-rope64", 2), ("moe-kv32-rope16", 1)]
)
def test_deepseek_mtp_greedy_equals_plain_and_hf(
    make_llm, tiny_models_root: Path, monkeypatch, case: str, num_speculative_tokens: int
):
    """MTP drafting (k draft tokens per step) over the MLA backend: plain greedy = HF fp32 = speculative
    greedy, drafts accepted and rejected, verification on the latent path, drafts equal HF's MTP layer."""
    from transformers import AutoTokenizer

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.runner.attention.mla.metadata import AscendMLAMetadataBuilder
    from vllm_ascend.specdecode.proposer import AscendEagleProposer
    from vllm_ascend.testing.hf_reference import hf_greedy

    model_dir = add_deepseek_mtp_layer(build_tiny_model(CASES[case], tiny_models_root), tiny_models_root)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS).token_ids
    assert len({tuple(t) for t in expected}) == len(expected), expected
    plain = make_llm(model_dir, max_num_batched_tokens=32, max_num_seqs=4)
    assert _greedy(plain, prompts) == expected

    calls: list[list[int]] = []
    real_propose = AscendEagleProposer.propose

    def propose(self, *args, **kwargs):
        drafts = real_propose(self, *args, **kwargs)
        calls.append(drafts[0].tolist())
        return drafts

    monkeypatch.setattr(AscendEagleProposer, "propose", propose)
    decode_query_lens: set[int] = set()
    real_build = AscendMLAMetadataBuilder.build

    def build(self, *args, **kwargs):
        metadata = real_build(self, *args, **kwargs)
        if metadata.decode is not None:
            decode_query_lens.update(metadata.decode.query_start_loc_cpu.diff().tolist())
        return metadata

    monkeypatch.setattr(AscendMLAMetadataBuilder, "build", build)
    spec = {"method": "mtp", "num_speculative_tokens": num_speculative_tokens}
    llm = make_llm(model_dir, speculative_config=spec, max_num_batched_tokens=32, max_num_seqs=4,
                   enable_prefix_caching=True, disable_log_stats=False)  # fmt: skip
    runner = llm.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner
    assert type(runner.drafter) is AscendEagleProposer
    assert type(runner.drafter.model).__name__ == "DeepSeekMTP"
    adaptor = get_device_adaptor()
    adaptor.reset_counts()
    assert _greedy(llm, prompts) == expected
    drafted, accepted = _counters(llm)
    assert drafted >= num_speculative_tokens * len(prompts) * (MAX_NEW_TOKENS // (num_speculative_tokens + 1))
    assert 0 < accepted < drafted, (drafted, accepted)
    # Verification (1 + k query tokens per request) ran as latent decodes, never wider than that.
    assert max(decode_query_lens) == 1 + num_speculative_tokens, decode_query_lens
    counts = adaptor.call_counts
    assert counts["mla_latent_attention"] > 0 and counts["mla_prefill_attention"] > 0, counts

    # One prompt alone: each propose call's drafts are the MTP layer's, recomputed with HF.
    calls.clear()
    (output,) = _greedy(llm, prompts[:1], 12)
    assert output == expected[0][:12]
    _assert_drafts_match(DeepseekMtpReference(model_dir), prompts[0], output, calls)


def _assert_drafts_match(reference: DraftReference, prompt: list[int], output: list[int], calls) -> None:
    """Each propose call's drafts equal the reference's for the context the call saw (greedy verification
    accepts the drafts equal to the output, so each call's context follows from the previous ones)."""
    known, checked = 1, 0
    for drafts in calls:
        if known >= len(output):
            break
        assert drafts == reference.drafts(prompt + output[:known], len(drafts)), (known, drafts)
        checked += 1
        for draft, token in zip(drafts, output[known:], strict=False):
            if draft != token:
                break
            known += 1
        known += 1
    assert known >= len(output) and checked >= 3, (known, len(output), checked)


def test_deepseek_mtp_on_model_runner_v2_equals_hf(make_llm, tiny_models_root: Path):
    """The runner vLLM selects (V2, async scheduling): vLLM's V2 MTP speculator drafts with the DeepSeek MTP
    layer over the MLA backend (verification as latent decodes of 1 + k tokens); tokens equal HF fp32."""
    from transformers import AutoTokenizer

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.testing.hf_reference import hf_greedy

    from .test_runner_v2 import refused_for_missing_verification

    model_dir = add_deepseek_mtp_layer(
        build_tiny_model(CASES["dense-kv512-rope64"], tiny_models_root), tiny_models_root
    )
    if refused_for_missing_verification(make_llm, model_dir, {"method": "mtp", "num_speculative_tokens": 2}):
        return
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS).token_ids
    llm = make_llm(model_dir, speculative_config={"method": "mtp", "num_speculative_tokens": 2},
                   max_num_batched_tokens=32, max_num_seqs=4, disable_log_stats=False)  # fmt: skip
    config = llm.llm_engine.vllm_config
    assert config.use_v2_model_runner and config.scheduler_config.async_scheduling
    adaptor = get_device_adaptor()
    adaptor.reset_counts()
    assert _greedy(llm, prompts) == expected
    drafted, accepted = _counters(llm)
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    assert adaptor.call_counts["mla_latent_attention"] > 0
