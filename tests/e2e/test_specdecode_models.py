"""Model-based speculative decoding on the reference device: draft model, EAGLE, EAGLE-3 and MTP.

vLLM's runner builds our proposer classes (``vllm_ascend.specdecode.proposer``) where it builds its
own, and drives them: the drafter's KV cache, padded batches and the index kernels of the drafting
loop (our torch implementations, registered as vLLM's Triton-kernel overrides) all run here. Every
method's greedy output equals plain greedy decoding over three prompts x 48 tokens; a target drafting
for itself has every draft accepted (greedy and, with probabilistic draft sampling on our kernels,
random; prompts prefilled in chunks); seeded random runs repeat; EAGLE-1's and GLM MTP's drafts equal
an independent HF forward of the draft head, step by step.

The proposers are the specdecode sibling's V1 drafters, so the module runs on the V1 runner (vLLM's V2
runner drafts with its own speculators on the V2 kernels: ``test_runner_v2.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("v1_runner")

PROMPTS = [list(range(10, 30)), [5, 6, 7, 8] * 5, [40, 41, 42, 43, 44, 120, 7, 300, 12]]
MAX_TOKENS = 48


def _greedy(**params):
    from vllm import SamplingParams

    return SamplingParams(**{"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True, **params})


def _tokens(llm, **params) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], _greedy(**params), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _counters(llm) -> tuple[float, float]:
    """vLLM's spec-decode counters: (draft tokens, accepted tokens)."""
    metrics = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    return metrics["vllm:spec_decode_num_draft_tokens"], metrics["vllm:spec_decode_num_accepted_tokens"]


def _runner(llm):
    return llm.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner


def _engine_ids(llm) -> list[str]:
    """The ids of the requests the runner has seen (those still in its request table)."""
    return list(_runner(llm).requests)


@pytest.fixture(scope="module")
def plain_qwen3(tiny_qwen3: Path) -> list[list[int]]:
    from vllm import LLM

    llm = LLM(model=str(tiny_qwen3), dtype="float32", block_size=16, max_model_len=256,
              kv_cache_memory_bytes=64 << 20, seed=0)  # fmt: skip
    try:
        tokens = _tokens(llm)
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert len({tuple(t) for t in tokens}) == len(PROMPTS)  # diverse outputs: the comparison means something
    return tokens


def test_draft_model_drafting_for_itself_is_always_accepted(make_llm, tiny_qwen3, plain_qwen3, monkeypatch):
    import vllm_ascend.kernels as kernels
    from vllm_ascend.specdecode.proposer import AscendDraftModelProposer

    spec = {
        "method": "draft_model",
        "model": str(tiny_qwen3),
        "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic",
    }
    # 16 tokens per step: every prompt is prefilled in chunks, whose sampled tokens are thrown away
    llm = make_llm(tiny_qwen3, speculative_config=spec, disable_log_stats=False, max_num_batched_tokens=16)
    runner = _runner(llm)
    assert type(runner.drafter) is AscendDraftModelProposer
    assert _tokens(llm) == plain_qwen3
    drafted, accepted = _counters(llm)
    assert drafted >= len(PROMPTS) * (MAX_TOKENS // 4 - 1) * 3 and accepted == drafted, (drafted, accepted)

    draws: list[int] = []
    real = kernels.gumbel_sample
    monkeypatch.setattr(kernels, "gumbel_sample", lambda *a, **k: draws.append(1) or real(*a, **k))
    params = {"temperature": 0.9, "seed": 11, "max_tokens": 24}
    first = _tokens(llm, **params)
    assert draws  # drafts were sampled on our kernel
    assert _tokens(llm, **params) == first  # seeded: reproducible
    assert first != plain_qwen3
    drafted_after, accepted_after = _counters(llm)
    # same model, same temperature: the draft distribution is the target's, so every draft is accepted
    assert drafted_after > drafted and accepted_after - accepted == drafted_after - drafted


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_heads_match_plain_greedy(make_llm, tiny_qwen3, tiny_models_root, plain_qwen3, method):
    from vllm_ascend.specdecode.proposer import AscendEagleProposer
    from vllm_ascend.testing.tiny_drafters import build_eagle_head

    head = build_eagle_head(tiny_qwen3, tiny_models_root, method)
    spec = {"method": method, "model": str(head), "num_speculative_tokens": 3}
    llm = make_llm(tiny_qwen3, speculative_config=spec, disable_log_stats=False)
    runner = _runner(llm)
    assert type(runner.drafter) is AscendEagleProposer
    assert type(runner.drafter.model).__name__ == ("EagleLlamaForCausalLM" if method == "eagle" else
                                                   "Eagle3LlamaForCausalLM")  # fmt: skip
    # EAGLE-3 reads the target's hidden states after layers 0 and 1: the target returns them
    assert runner.use_aux_hidden_state_outputs is (method == "eagle3")
    assert _tokens(llm) == plain_qwen3
    drafted, _ = _counters(llm)
    assert drafted >= len(PROMPTS) * (MAX_TOKENS // 4) * 3


def _drafts_per_step(llm, monkeypatch, prompt: list[int], max_tokens: int):
    """Generate ``prompt`` alone (greedy); return the output and the drafts of each propose call."""
    from vllm_ascend.specdecode.proposer import AscendEagleProposer

    calls: list[list[int]] = []
    real = AscendEagleProposer.propose

    def propose(self, *args, **kwargs):
        drafts = real(self, *args, **kwargs)
        calls.append(drafts[0].tolist())
        return drafts

    monkeypatch.setattr(AscendEagleProposer, "propose", propose)
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    output = list(
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0].token_ids
    )
    return output, calls


def _drafts_checked(reference, prompt: list[int], output: list[int], calls: list[list[int]]) -> int:
    """Check that each call's drafts equal the reference's for the context the call saw (greedy
    verification accepts the drafts that equal the output, so each call's context follows from the
    previous ones); return how many calls were checked."""
    known, checked = 1, 0  # tokens generated when the call drafted (the first follows the prefill's token)
    for drafts in calls:
        if known >= len(output):
            break
        assert drafts == reference.drafts(prompt + output[:known], len(drafts)), known
        checked += 1
        accepted = 0
        for draft, token in zip(drafts, output[known:], strict=False):  # the output may end first
            if draft != token:
                break
            accepted += 1
        known += accepted + 1
    assert known >= len(output), (known, len(output))
    return checked


def test_eagle_drafts_equal_an_independent_hf_forward(make_llm, tiny_qwen3, tiny_models_root, monkeypatch):
    """EAGLE-1's drafts, step by step, are those of the head recomputed with HF transformers from the
    target's hidden states: the target's hidden states reach the drafter shifted by one token, the
    drafter's KV cache and positions are right, and the drafts feed back as the method says."""
    from vllm_ascend.testing.draft_reference import EagleReference
    from vllm_ascend.testing.tiny_drafters import build_eagle_head

    head = build_eagle_head(tiny_qwen3, tiny_models_root, "eagle")
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": 3}
    llm = make_llm(tiny_qwen3, speculative_config=spec)
    output, calls = _drafts_per_step(llm, monkeypatch, PROMPTS[2], 16)
    assert _drafts_checked(EagleReference(tiny_qwen3, head), PROMPTS[2], output, calls) >= 6


def test_glm_mtp_layer_drafts_and_output_is_plain_greedy(make_llm, tiny_models_root, monkeypatch):
    """GLM-4.5's MTP layer drafts (two steps reusing the one layer): greedy output is plain decoding's,
    and the drafts are those of the layer recomputed with HF transformers."""
    from vllm_ascend.specdecode.proposer import AscendEagleProposer
    from vllm_ascend.testing.draft_reference import GlmMtpReference
    from vllm_ascend.testing.tiny_drafters import add_mtp_layer
    from vllm_ascend.testing.tiny_models import build_tiny_model, glm4_moe_spec

    target = add_mtp_layer(build_tiny_model(glm4_moe_spec(), tiny_models_root), tiny_models_root)
    want = _tokens(make_llm(target))
    llm = make_llm(target, speculative_config={"method": "mtp", "num_speculative_tokens": 2},
                   disable_log_stats=False)  # fmt: skip
    runner = _runner(llm)
    assert type(runner.drafter) is AscendEagleProposer
    assert type(runner.drafter.model).__name__ == "Glm4MoeMTP"
    assert _tokens(llm) == want
    drafted, _ = _counters(llm)
    assert drafted >= len(PROMPTS) * (MAX_TOKENS // 3) * 2
    output, calls = _drafts_per_step(llm, monkeypatch, PROMPTS[0], 12)
    assert output == want[0][:12]
    assert _drafts_checked(GlmMtpReference(target), PROMPTS[0], output, calls) >= 5


def test_dynamic_draft_lengths_follow_measured_acceptance(
    make_llm, tiny_qwen3, tiny_models_root, plain_qwen3
):
    """``dynamic_spec_config`` reaches the runner: drafts that are never accepted (a random EAGLE head)
    are cut to ``min_draft_len`` after a few steps, while a target drafting for itself keeps every
    draft; greedy output stays plain decoding's."""
    from vllm_ascend.specdecode.dynamic import DynamicSpecScheduler
    from vllm_ascend.testing.tiny_drafters import build_eagle_head

    dynamic = {"dynamic_spec_config": {"enabled": True, "min_draft_len": 1, "acceptance_prior": 0.7}}
    k = 4
    head = build_eagle_head(tiny_qwen3, tiny_models_root, "eagle")
    per_step, first_rates = {}, {}
    for name, spec in {
        "rejected": {"method": "eagle", "model": str(head), "num_speculative_tokens": k},
        "accepted": {"method": "draft_model", "model": str(tiny_qwen3), "num_speculative_tokens": k},
    }.items():
        llm = make_llm(
            tiny_qwen3,
            speculative_config=spec,
            additional_config=dynamic,
            disable_log_stats=False,
            async_scheduling=False,  # the dynamic scheduler trims drafts on the host each step
        )
        scheduler = _runner(llm).dynamic_spec
        assert isinstance(scheduler, DynamicSpecScheduler)
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], _greedy(), use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outputs] == plain_qwen3
        # the engine's request ids: the output's id plus a random suffix
        tracked = [
            req_id for o in outputs for req_id in _engine_ids(llm) if req_id.startswith(o.request_id + "-")
        ]
        assert len(tracked) == len(PROMPTS) and all(req_id in scheduler for req_id in tracked)
        first_rates[name] = [scheduler.estimates(req_id)[0] for req_id in tracked]
        metrics = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
        per_step[name] = metrics["vllm:spec_decode_num_draft_tokens"] / metrics["vllm:spec_decode_num_drafts"]
        _tokens(llm, max_tokens=8)  # the next steps tell the runner the first requests finished
        assert not any(req_id in scheduler for req_id in tracked) and len(scheduler) <= len(PROMPTS)
    # 4 drafts at first, then 1 (min_draft_len) once the estimates fell: the measured rates are ~0 / ~1
    assert per_step["rejected"] < 2.0 and per_step["accepted"] == k, per_step
    assert max(first_rates["rejected"]) < 0.05 and min(first_rates["accepted"]) > 0.85, first_rates
