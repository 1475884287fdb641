"""``speculative_config.method = "ngram_gpu"`` on the reference device: vLLM's runner keeps the token
history on the device and drives our ``NgramDeviceProposer`` (in place of vLLM's ``NgramProposerGPU``),
which drafts with ``vllm_ascend.kernels.ngram_propose``; greedy output equals plain greedy.

The proposers are the specdecode sibling's V1 drafters, so the module runs on the V1 runner (vLLM's V2
runner drafts with its own speculators on the V2 kernels: ``test_runner_v2.py``).
"""

from __future__ import annotations

import pytest

import vllm_ascend.kernels as kernels

pytestmark = pytest.mark.usefixtures("v1_runner")

PROMPTS = [list(range(10, 30)) * 3, [5, 6, 7, 8] * 10, [40, 41, 42, 43, 44, 40, 41, 42] * 4]
NGRAM_GPU = {
    "method": "ngram_gpu",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 2,
}


def _tokens(llm):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _counter(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name)


def test_ngram_gpu_drafts_on_the_device_kernel(make_llm, tiny_qwen3, monkeypatch):
    from vllm.v1.spec_decode.ngram_proposer_gpu import NgramProposerGPU

    from vllm_ascend.core.registry import SPEC_DECODE_METHODS
    from vllm_ascend.specdecode.ngram import NgramProposer
    from vllm_ascend.specdecode.ngram_device import NgramDeviceProposer

    want = _tokens(make_llm(tiny_qwen3))
    # synchronous scheduling: the spy compares the device history with the host's copy, which async scheduling
    # fills one step late (placeholders where the device already has the token)
    spec = make_llm(tiny_qwen3, speculative_config=NGRAM_GPU, disable_log_stats=False, async_scheduling=False)
    runner = spec.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner
    assert SPEC_DECODE_METHODS.get("ngram_gpu") is NgramDeviceProposer
    assert type(runner.drafter) is NgramDeviceProposer and isinstance(runner.drafter, NgramProposerGPU)
    assert (runner.drafter.min_n, runner.drafter.max_n, runner.drafter.k) == (2, 3, 3)

    cpu = NgramProposer(2, 3, 3, runner.max_model_len)
    drafted: list[int] = []
    compared: list[int] = []
    real = kernels.ngram_propose

    def spy(token_ids, num_tokens, *args):
        drafts, counts = real(token_ids, num_tokens, *args)
        host = runner.input_batch  # the device history agrees with the host's copy as far as both go
        for row, total in enumerate(num_tokens.tolist()):
            same = min(total, int(host.num_tokens_no_spec[row]))
            assert same == 0 or token_ids[row, :same].tolist() == host.token_ids_cpu[row, :same].tolist()
            compared.append(same)
        # the device history and the kernel's drafts: those of the CPU proposer on the same tokens
        want_drafts, want_counts = cpu.propose_batch(token_ids.cpu().numpy(), num_tokens.cpu().numpy())
        assert drafts.cpu().tolist() == want_drafts.tolist() and counts.cpu().tolist() == want_counts.tolist()
        drafted.append(int(counts.sum()))
        return drafts, counts

    monkeypatch.setattr(kernels, "ngram_propose", spy)
    assert _tokens(spec) == want
    assert drafted and sum(drafted) > 0, drafted  # vLLM's runner called our drafter, which drafted
    assert max(compared) > len(PROMPTS[0])  # generated tokens reached the device history
    # vLLM's scheduler counts k slots per request for ngram_gpu (its runner trims the invalid ones),
    # so the accepted count is bounded by the drafts the kernel actually made
    accepted = _counter(spec, "vllm:spec_decode_num_accepted_tokens")
    assert 0 < accepted <= sum(drafted), (accepted, sum(drafted))
