"""Suffix decoding on the reference device: the runner drafts with
``vllm_ascend.specdecode.suffix.SuffixDecodingProposer`` (no arctic-inference installed), fed each
request's prompt and generated tokens; the drafts are verified and greedy output equals plain greedy."""

from __future__ import annotations

PROMPTS = [list(range(10, 30)) * 3, [5, 6, 7, 8] * 10, [40, 41, 42, 43, 44, 40, 41, 42] * 4]
SUFFIX = {
    "method": "suffix",
    "num_speculative_tokens": 4,
    "suffix_decoding_max_tree_depth": 16,
    "suffix_decoding_max_cached_requests": 2,
}


def _tokens(llm):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _counter(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name)


def test_suffix_decoding_matches_plain_greedy(make_llm, tiny_qwen3, monkeypatch):
    from vllm_ascend.specdecode.suffix import SuffixDecodingProposer

    want = _tokens(make_llm(tiny_qwen3))
    spec = make_llm(tiny_qwen3, speculative_config=SUFFIX, disable_log_stats=False)
    runner = spec.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner
    drafter = runner.drafter
    assert type(drafter) is SuffixDecodingProposer  # not vLLM's arctic-inference proposer
    assert (drafter.k, drafter.cache.max_tree_depth, drafter.cache.max_cached_requests) == (4, 16, 2)

    seen: list[set[str]] = []
    real = SuffixDecodingProposer.propose

    def propose(self, *args, **kwargs):
        seen.append(set(kwargs["req_ids"]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SuffixDecodingProposer, "propose", propose)
    assert _tokens(spec) == want
    assert seen and max(len(s) for s in seen) == len(PROMPTS)  # the runner passed the batch's requests
    drafted = _counter(spec, "vllm:spec_decode_num_draft_tokens")
    accepted = _counter(spec, "vllm:spec_decode_num_accepted_tokens")
    assert drafted > 0 and 0 < accepted <= drafted, (drafted, accepted)
    # three requests generated; the global tree keeps the newest two (max_cached_requests)
    assert len(drafter.cache.cached_requests) == 2
    assert drafter.cache.global_tree.num_tokens <= 2 * 48
