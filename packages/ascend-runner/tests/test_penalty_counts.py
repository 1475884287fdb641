"""Penalty counts kept across steps by the V1 persistent batch: through requests joining, leaving, being
swapped and condensed, resumed, rewritten lists and async placeholders, the sampler's penalties equal
vLLM's reference formulas (``vllm.v1.sample.ops.penalties.apply_all_penalties``) on the same lists."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch
from vllm import SamplingParams
from vllm.v1.sample.ops.penalties import apply_all_penalties
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.worker.gpu_input_batch import CachedRequestState

from vllm_ascend.runner.input_batch import NPUInputBatch
from vllm_ascend.runner.sample.penalty_counts import KeptCountsMetadata, PenaltyCounts, uses_penalties
from vllm_ascend.runner.sample.rejection_sampler import AscendRejectionSampler
from vllm_ascend.runner.sample.sampler import AscendSampler

V, MAX_REQS, MAX_LEN = 40, 6, 96


def _batch() -> NPUInputBatch:
    return NPUInputBatch(
        max_num_reqs=MAX_REQS,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=MAX_LEN,
        device=torch.device("cpu"),
        vocab_size=V,
        block_sizes=[16],
        max_num_blocks_per_req=[MAX_LEN // 16],
    )


def _request(rng: random.Random, name: str) -> CachedRequestState:
    kind = rng.randrange(4)  # one in four without penalties
    params = SamplingParams(
        repetition_penalty=rng.uniform(0.5, 2.0) if kind in (1, 3) else 1.0,
        frequency_penalty=rng.uniform(-0.5, 1.0) if kind in (2, 3) else 0.0,
        presence_penalty=rng.uniform(-0.5, 1.0) if kind in (2, 3) else 0.0,
    )
    prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 12))]
    return CachedRequestState(
        req_id=name,
        prompt_token_ids=prompt,
        mm_features=[],
        sampling_params=params,
        generator=None,
        block_ids=([0],),
        num_computed_tokens=0,
        output_token_ids=[rng.randrange(V) for _ in range(rng.randrange(3))],
    )


def _vllm(logits: torch.Tensor, md, outputs: list[list[int]]) -> torch.Tensor:
    return apply_all_penalties(
        logits.clone(),
        md.prompt_token_ids,
        md.presence_penalties,
        md.frequency_penalties,
        md.repetition_penalties,
        outputs,
    )


def test_kept_counts_follow_the_batch_and_match_vllm():
    rng = random.Random(1234)
    batch = _batch()
    waiting = [_request(rng, f"r{i}") for i in range(14)]
    preempted: list[CachedRequestState] = []
    running: dict[str, CachedRequestState] = {}
    checked = 0
    for _ in range(40):
        # Requests leave (finished or preempted, to come back with their output) and join.
        for name in list(running):
            if rng.random() < 0.15:
                batch.remove_request(name)
                request = running.pop(name)
                if rng.random() < 0.5:
                    preempted.append(request)
        while (preempted or waiting) and len(running) < MAX_REQS and rng.random() < 0.7:
            source = preempted if preempted and (not waiting or rng.random() < 0.5) else waiting
            request = source.pop(rng.randrange(len(source)))
            batch.add_request(request)
            running[request.req_id] = request
        batch.condense()
        if batch.num_reqs > 1 and rng.random() < 0.4:
            batch.swap_states(*rng.sample(range(batch.num_reqs), 2))
        batch.refresh_metadata()
        md = batch.sampling_metadata
        assert isinstance(md, KeptCountsMetadata) and md.penalty_counts is batch.penalty_counts
        if batch.num_reqs and not md.no_penalties:
            logits = torch.randn(batch.num_reqs, V) * 3
            got = AscendSampler.apply_penalties(logits.clone(), md)
            want = _vllm(logits, md, md.output_token_ids)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            checked += 1
        # The step's accepted tokens: one, several (speculative decoding), an unresolved async
        # placeholder now and then (resolved the step after), a list cut back now and then.
        for request in running.values():
            out = request.output_token_ids
            if out and out[-1] == -1:
                out[-1] = rng.randrange(V)
            out.extend(rng.randrange(V) for _ in range(rng.choice((1, 1, 2, 3))))
            if rng.random() < 0.1:
                out.append(-1)
            elif rng.random() < 0.05 and len(out) > 2:
                del out[-2:]
                out.append(rng.randrange(V))
    assert checked > 20
    counts = batch.penalty_counts
    assert counts is not None
    for name, request in running.items():  # a slot exactly for the penalised requests
        has_slot = counts.slot_of_row[batch.req_id_to_index[name]] >= 0
        assert has_slot == uses_penalties(request.sampling_params)


def test_bonus_token_counts_the_drafts_and_verification_counts_earlier_drafts():
    rng = random.Random(7)
    batch = _batch()
    requests = [_request(rng, f"r{i}") for i in range(4)]
    for request in requests:
        request.sampling_params = SamplingParams(
            repetition_penalty=1.7, frequency_penalty=0.4, presence_penalty=0.3
        )
        batch.add_request(request)
    batch.refresh_metadata()
    md = batch.sampling_metadata
    drafts = [[3, 3, 9], [], [7], [1, 2]]
    for row, d in enumerate(drafts):
        batch.spec_token_ids[row][:] = d
    logits = torch.randn(4, V) * 3
    got = AscendSampler.apply_penalties(logits.clone(), md, md.spec_token_ids)
    want = _vllm(logits, md, [out + d for out, d in zip(md.output_token_ids, drafts, strict=True)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    num_drafts = [len(d) for d in drafts]
    metadata = SimpleNamespace(num_draft_tokens=num_drafts)
    repeat = torch.arange(4).repeat_interleave(torch.tensor(num_drafts))
    combined = RejectionSampler._combine_outputs_with_spec_tokens(md.output_token_ids, md.spec_token_ids)
    target = torch.randn(sum(num_drafts), V) * 3
    got = AscendRejectionSampler.apply_penalties(target.clone(), md, metadata, repeat, combined)
    want = RejectionSampler.apply_penalties(target.clone(), md, metadata, repeat, combined)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_counts_from_token_lists_serve_metadata_built_elsewhere():
    prompts = [[1, 2, 2, V], [5, V, V, V]]  # V pads
    outputs = [[2, 7, 7], []]
    counts = PenaltyCounts.from_token_lists(prompts, outputs, V, torch.device("cpu"))
    counts.sync()
    logits = torch.ones(2, V)
    ones = torch.ones(2)
    counts.apply(logits, [0, 1], ones * 2, ones, ones)
    assert logits[0, [1, 2, 7]].tolist() == [0.5, 0.5 - 2, 0.5 - 3]
    assert logits[1, 5] == 0.5 and (logits[1, :5] == 1).all()
