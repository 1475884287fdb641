"""Host cost of the V2 torch references that used to loop over requests (CPU reference device).

Times ``<name>_torch`` of ``vllm_ascend.kernels.v2.{input_batch,block_table,sample_gumbel}`` on a decode
step shaped like serving (max_model_len 512, KV block size 16, 64 state rows, one KV-cache group) at 1,
4 and 48 requests (decode rows with 3 draft tokens: 4 logits each; ``prepare_prefill_inputs`` with every
row in an 8-token prompt chunk; ``gumbel_sample`` at vocabularies 512 and 32000, all rows sampled at
temperature 0.7 or all greedy), and prints microseconds per call (median of repeats). In-place state the kernels advance
(total lengths, computed tokens) is reset before each call, outside the timed region.

    nice -n 19 env OMP_NUM_THREADS=1 uv run --no-sync python benchmarks/v2_reference_loops.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from vllm_ascend.kernels.v2 import block_table as bt
from vllm_ascend.kernels.v2 import input_batch as ib
from vllm_ascend.kernels.v2 import sample_gumbel as sg

MAX_REQS, MAX_LEN, KV_BLOCK, DRAFTS = 64, 512, 16, 3
_KEEP: list[torch.Tensor] = []
REQUESTS = (1, 4, 48)


def _time(call: Callable[[], None], reset: Callable[[], None] | None = None, n: int = 200) -> float:
    samples = []
    for _ in range(5):
        total = 0
        for _ in range(n):
            if reset is not None:
                reset()
            t0 = time.perf_counter_ns()
            call()
            total += time.perf_counter_ns() - t0
        samples.append(total / n / 1e3)
    return statistics.median(samples)


def _qsl(lens: torch.Tensor) -> torch.Tensor:
    qsl = torch.zeros(lens.numel() + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(lens, 0)
    return qsl


def cases(r: int) -> dict[str, tuple[Callable[[], None], Callable[[], None] | None]]:
    g = torch.Generator().manual_seed(r)
    idx = torch.randperm(MAX_REQS, generator=g)[:r].to(torch.int32)
    computed = torch.randint(100, 400, (MAX_REQS,), generator=g, dtype=torch.int32)
    prefill = torch.randint(10, 90, (MAX_REQS,), generator=g, dtype=torch.int32)
    ones = torch.ones(r, dtype=torch.int32)
    qsl = _qsl(ones)
    spec_qsl = _qsl(ones * (DRAFTS + 1))
    out: dict[str, tuple[Callable[[], None], Callable[[], None] | None]] = {}

    pos = torch.zeros(MAX_REQS * 8, dtype=torch.int64)
    seq_lens = torch.zeros(MAX_REQS, dtype=torch.int32)
    out["prepare_pos_seq_lens"] = (
        lambda: ib.prepare_pos_seq_lens_torch((r + 1,), pos, seq_lens, idx, qsl, computed, MAX_REQS, 1024),
        None,
    )

    all_tokens = torch.randint(0, 32000, (MAX_REQS, MAX_LEN), generator=g, dtype=torch.int32)
    input_ids = torch.zeros(MAX_REQS * 8, dtype=torch.int32)
    next_prefill = torch.zeros((1, MAX_REQS), dtype=torch.int32)
    pf_computed = torch.zeros(MAX_REQS, dtype=torch.int32)
    pf_lens = torch.full((MAX_REQS,), 64, dtype=torch.int32)
    pf_qsl = _qsl(ones * 8)
    out["prepare_prefill_inputs"] = (
        lambda: ib.prepare_prefill_inputs_torch(
            (r,),
            input_ids,
            next_prefill,
            MAX_REQS,
            1,
            idx,
            pf_qsl,
            all_tokens,
            MAX_LEN,
            pf_lens,
            pf_computed,
            1024,
            1,
        ),
        None,
    )

    last_sampled = torch.randint(0, 32000, (MAX_REQS,), generator=g, dtype=torch.int32)
    draft_tokens = torch.randint(0, 32000, (MAX_REQS, DRAFTS), generator=g, dtype=torch.int64)
    seq_after = computed[idx.long()] + DRAFTS + 1
    logits_indices = torch.zeros(r * (DRAFTS + 1), dtype=torch.int64)
    out["combine_sampled_and_draft_tokens"] = (
        lambda: ib.combine_sampled_and_draft_tokens_torch(
            (r,),
            input_ids,
            idx,
            last_sampled,
            spec_qsl,
            seq_after,
            prefill,
            draft_tokens,
            DRAFTS,
            spec_qsl,
            logits_indices,
            8,
            1,
        ),
        None,
    )

    num_sampled = torch.randint(1, DRAFTS + 2, (r,), generator=g, dtype=torch.int32)
    num_rejected = torch.zeros(r, dtype=torch.int32)
    out["get_num_sampled_and_rejected"] = (
        lambda: ib.get_num_sampled_and_rejected_torch(
            (r,), num_sampled, num_rejected, seq_after, spec_qsl, idx, prefill
        ),
        None,
    )

    total_len = torch.randint(100, 400, (MAX_REQS,), generator=g, dtype=torch.int32)
    total_len0, computed0 = total_len.clone(), computed.clone()
    counts = torch.zeros((MAX_REQS, 32000), dtype=torch.int32)
    sampled = torch.randint(0, 32000, (r, DRAFTS + 1), generator=g, dtype=torch.int64)
    rejected = (DRAFTS + 1 - num_sampled).to(torch.int32)

    def reset() -> None:
        total_len.copy_(total_len0)
        computed.copy_(computed0)

    out["post_update"] = (
        lambda: ib.post_update_torch(
            (r,),
            idx,
            computed,
            last_sampled,
            counts,
            32000,
            sampled,
            DRAFTS + 1,
            num_sampled,
            rejected,
            spec_qsl,
            all_tokens,
            MAX_LEN,
            total_len,
        ),
        reset,
    )
    expanded = torch.zeros(r * (DRAFTS + 1), dtype=torch.int32)
    local_pos = torch.zeros(r * (DRAFTS + 1), dtype=torch.int32)
    out["expand_idx_mapping"] = (
        lambda: ib.expand_idx_mapping_torch((r,), idx, expanded, local_pos, spec_qsl, 8),
        None,
    )

    width = MAX_LEN // KV_BLOCK
    src = torch.randint(0, 4096, (MAX_REQS, width), generator=g, dtype=torch.int32)
    dst = torch.zeros((MAX_REQS, width), dtype=torch.int32)
    num_blocks = torch.randint(1, width + 1, (1, MAX_REQS), generator=g, dtype=torch.int32)
    src_ptrs = torch.tensor([src.data_ptr()], dtype=torch.uint64)
    dst_ptrs = torch.tensor([dst.data_ptr()], dtype=torch.uint64)
    strides = torch.tensor([width], dtype=torch.int64)
    _KEEP.extend((src, dst))  # the kernels reach them only through the pointer arrays
    out["gather_block_tables"] = (
        lambda: bt.gather_block_tables_torch(
            (1, r), idx, src_ptrs, dst_ptrs, strides, num_blocks, MAX_REQS, r, 1024
        ),
        None,
    )
    positions = torch.randint(0, MAX_LEN, (MAX_REQS * 8,), generator=g, dtype=torch.int64)
    slots = torch.zeros((1, MAX_REQS * 8), dtype=torch.int64)
    block_sizes = torch.tensor([KV_BLOCK], dtype=torch.int32)
    enabled, sharded = torch.tensor([True]), torch.tensor([False])
    out["compute_slot_mappings"] = (
        lambda: bt.compute_slot_mappings_torch(
            (1, r + 1),
            MAX_REQS * 8,
            idx,
            qsl,
            positions,
            src_ptrs,
            strides,
            block_sizes,
            enabled,
            sharded,
            slots,
            MAX_REQS * 8,
            0,
            1,
            1,
            -1,
            1024,
        ),
        None,
    )

    for vocab in (512, 32000):
        for label, temp_value in (("sampled", 0.7), ("greedy", 0.0)):
            num_blocks_v = -(-vocab // 1024)
            logits = torch.randn((r, vocab), generator=g)
            temp = torch.full((MAX_REQS,), temp_value)
            seeds = torch.randint(0, 2**40, (MAX_REQS,), generator=g)
            tok_pos = torch.randint(0, MAX_LEN, (r,), generator=g)
            local_argmax = torch.zeros((r, num_blocks_v), dtype=torch.int64)
            local_max = torch.zeros((r, num_blocks_v), dtype=torch.float32)

            def call(
                vocab: int = vocab,
                nb: int = num_blocks_v,
                logits: torch.Tensor = logits,
                temp: torch.Tensor = temp,
                seeds: torch.Tensor = seeds,
                tok_pos: torch.Tensor = tok_pos,
                la: torch.Tensor = local_argmax,
                lm: torch.Tensor = local_max,
            ) -> None:
                sg.gumbel_sample_torch(
                    (r, nb),
                    la,
                    nb,
                    lm,
                    nb,
                    None,
                    0,
                    0,
                    None,
                    None,
                    0,
                    logits,
                    vocab,
                    idx,
                    seeds,
                    tok_pos,
                    temp,
                    vocab,
                    1024,
                    False,
                    True,
                    False,
                    False,
                )

            out[f"gumbel_sample[V={vocab},{label}]"] = (call, None)
    return out


def main() -> None:
    torch.set_num_threads(1)
    table = {
        r: {name: _time(*c, n=20 if "32000" in name else 200) for name, c in cases(r).items()}
        for r in REQUESTS
    }
    print(f"{'function':36s}" + "".join(f"{f'R={r} us':>10s}" for r in REQUESTS))
    for name in table[1]:
        print(f"{name:36s}" + "".join(f"{table[r][name]:10.1f}" for r in REQUESTS))


if __name__ == "__main__":
    main()
