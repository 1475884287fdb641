"""V2 rejection-sampling kernels (the six launches of vLLM's ``rejection_sample``): the Ascend Triton
kernels (interpreter) against the torch references, stage by stage on the references' inputs, then the
whole pipeline on the Triton kernels only (its sampled tokens must be the references')."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import spec_decode_rejection_sampler_utils as triton_impl
from vllm_ascend.kernels.v2 import spec_decode_rejection_sampler_utils as v2

STATS_BLOCK, RESAMPLE_BLOCK = 32, 16


@dataclass(frozen=True)
class Case:
    seed: int
    draft_logits: bool = False
    block: bool = False
    synthetic: bool = False
    fp64: bool = False
    watermark: bool = False
    dedup: bool = False
    num_reqs: int = 4
    steps: int = 3
    vocab: int = 37


CASES = [
    Case(0),
    Case(1, draft_logits=True),
    Case(2, draft_logits=True, block=True),
    Case(3, block=True),
    Case(4, synthetic=True),
    Case(5, draft_logits=True, fp64=True, num_reqs=3),
    Case(6, draft_logits=True, watermark=True, dedup=True),
    Case(7, watermark=True, num_reqs=2, steps=2),
    Case(8, num_reqs=1, steps=1, vocab=20),
]


def _inputs(case: Case) -> dict:
    g = torch.Generator().manual_seed(case.seed)
    r, k, v = case.num_reqs, case.steps, case.vocab
    max_reqs = r + 2
    idx = torch.randperm(max_reqs, generator=g)[:r].to(torch.int32)
    num_logits = torch.randint(1, k + 2, (r,), generator=g)
    num_logits[0] = k + 1
    cu = torch.zeros(r + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(num_logits, 0)
    n = int(cu[-1])
    owner = torch.repeat_interleave(torch.arange(r), num_logits)
    local = (torch.arange(n) - cu[owner].long()).to(torch.int32)
    temp = torch.rand(max_reqs, generator=g) + 0.5
    temp[idx[1:2].long()] = 0.0  # one greedy request
    target = torch.randn(n, v, generator=g) * 2.0
    draft_logits = target[:1].new_zeros(0)
    if case.draft_logits:
        draft_logits = torch.randn(max_reqs, k, v, generator=g) * 2.0
        rows_state, rows_step = idx[owner].long(), local.long()
        has = rows_step < k
        # Drafts close to the target, so that some steps are accepted.
        draft_logits[rows_state[has], rows_step[has]] = target[has] + 0.3 * torch.randn(
            int(has.sum()), v, generator=g
        )
    # The drafted token of step i sits at row start + i + 1; mostly the target's argmax of the row before.
    drafts = torch.randint(0, v, (n,), generator=g)
    likely = target.argmax(dim=-1)
    prev = torch.roll(likely, 1)
    drafts = torch.where(torch.rand(n, generator=g) < 0.75, prev, drafts)
    if r > 2:
        drafts[int(cu[2]) + 1 if num_logits[2] > 1 else 0] = -1  # a placeholder draft
    args = {
        "target": target,
        "draft_logits": draft_logits if case.draft_logits else None,
        "draft_sampled": drafts.to(torch.int64),
        "cu": cu,
        "pos": (torch.randint(0, 3000, (r,), generator=g)[owner] + local.long()).to(torch.int64),
        "idx": idx,
        "expanded_idx": idx[owner].to(torch.int32),
        "local": local,
        "temp": temp,
        "seed": torch.randint(-(2**62), 2**62, (max_reqs,), generator=g, dtype=torch.int64),
        "steps": k,
        "rates": torch.tensor([0.9, 0.6, 0.5, 0.4][:k]) if case.synthetic else None,
    }
    if case.watermark:
        width = 3
        args["contexts"] = torch.randint(-1, v, (n, width), generator=g, dtype=torch.int64)
        watermarking = torch.zeros(max_reqs, dtype=torch.bool)
        watermarking[idx[::2].long()] = True
        watermarking[idx[1:2].long()] = True  # the greedy request (drawn unkeyed)
        args["watermarking"] = watermarking.view(torch.uint8)
        args["skip"] = (torch.rand(n, generator=g) < 0.4).view(torch.uint8) if case.dedup else None
        args["key"] = 0x1234_5678_9ABC_DEF0
    return args


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _stage(name: str, grid: tuple[int, ...], args: dict, impl: str) -> dict:
    """Run stage ``name`` (the Triton kernel or the torch reference) on a copy of ``args``."""
    out = _clone(args)
    if impl == "triton":
        getattr(triton_impl, name)(grid, **out)
    else:
        getattr(v2, f"{name}_torch")(grid, **out)
    return out


def _compare(name: str, grid: tuple[int, ...], args: dict, floats: tuple[str, ...] = ()) -> dict:
    expected = _stage(name, grid, args, "torch")
    got = _stage(name, grid, args, "triton")
    for key, value in expected.items():
        if not isinstance(value, torch.Tensor):
            continue
        if key in floats:
            torch.testing.assert_close(got[key], value, rtol=2e-5, atol=2e-5, equal_nan=True, msg=key)
        else:
            assert torch.equal(got[key], value), key
    return expected


def _pipeline(case: Case, inp: dict, compare: bool, impl: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """``rejection_sample``'s launches; with ``compare`` each stage checked against the reference on
    vLLM's inputs, else every stage run by ``impl``."""

    def run(name: str, grid: tuple[int, ...], args: dict, floats: tuple[str, ...] = ()) -> dict:
        if compare:
            return _compare(name, grid, args, floats)
        return _stage(name, grid, args, impl)

    target, draft_logits = inp["target"], inp["draft_logits"]
    n, vocab = target.shape
    r = inp["cu"].numel() - 1
    has_draft = draft_logits is not None
    s0, s1 = (draft_logits.stride(0), draft_logits.stride(1)) if has_draft else (0, 0)
    blocks = (vocab + STATS_BLOCK - 1) // STATS_BLOCK
    padded = 1 << (blocks - 1).bit_length()
    stat = dict.fromkeys(("tmax", "tsum", "dmax", "dsum"))
    for key in stat:
        stat[key] = torch.full((n, blocks), -3.0)
    argmax = torch.full((n, blocks), -7, dtype=torch.int64)
    out = run(
        "compute_local_logits_stats",
        (n, blocks),
        {
            "target_local_argmax_ptr": argmax,
            "target_local_argmax_stride": blocks,
            "target_local_max_ptr": stat["tmax"],
            "target_local_max_stride": blocks,
            "target_local_sumexp_ptr": stat["tsum"],
            "target_local_sumexp_stride": blocks,
            "draft_local_max_ptr": stat["dmax"],
            "draft_local_max_stride": blocks,
            "draft_local_sumexp_ptr": stat["dsum"],
            "draft_local_sumexp_stride": blocks,
            "target_logits_ptr": target,
            "target_logits_stride": vocab,
            "draft_logits_ptr": draft_logits,
            "draft_logits_stride_0": s0,
            "draft_logits_stride_1": s1,
            "expanded_idx_mapping_ptr": inp["expanded_idx"],
            "expanded_local_pos_ptr": inp["local"],
            "temp_ptr": inp["temp"],
            "vocab_size": vocab,
            "num_speculative_steps": inp["steps"],
            "BLOCK_SIZE": STATS_BLOCK,
            "HAS_DRAFT_LOGITS": has_draft,
        },
        floats=("target_local_sumexp_ptr", "draft_local_sumexp_ptr"),
    )
    argmax, tmax, tsum = (
        out["target_local_argmax_ptr"],
        out["target_local_max_ptr"],
        out["target_local_sumexp_ptr"],
    )
    dmax, dsum = out["draft_local_max_ptr"], out["draft_local_sumexp_ptr"]
    common = {
        "target_logits_ptr": target,
        "target_logits_stride": vocab,
        "target_local_max_ptr": tmax,
        "target_local_max_stride": blocks,
        "target_local_sumexp_ptr": tsum,
        "target_local_sumexp_stride": blocks,
        "draft_logits_ptr": draft_logits,
        "draft_logits_stride_0": s0,
        "draft_logits_stride_1": s1,
        "draft_local_max_ptr": dmax,
        "draft_local_max_stride": blocks,
        "draft_local_sumexp_ptr": dsum,
        "draft_local_sumexp_stride": blocks,
    }
    cum_log_p = residual = None
    if case.block:
        cum_log_p = run(
            "compute_cumulative_log_p",
            (r,),
            {
                "cumulative_log_p_ptr": torch.full((n,), 5.0),
                **{k: common[k] for k in list(common)[:6]},
                "draft_sampled_ptr": inp["draft_sampled"],
                **{k: common[k] for k in list(common)[6:]},
                "cu_num_logits_ptr": inp["cu"],
                "idx_mapping_ptr": inp["idx"],
                "temp_ptr": inp["temp"],
                "vocab_num_blocks": blocks,
                "PADDED_VOCAB_NUM_BLOCKS": padded,
                "HAS_DRAFT_LOGITS": has_draft,
            },
            floats=("cumulative_log_p_ptr",),
        )["cumulative_log_p_ptr"]
        if has_draft:
            residual = run(
                "compute_local_residual_mass",
                (n, blocks),
                {
                    "local_residual_mass_ptr": torch.full((n, blocks), 9.0),
                    "local_residual_mass_stride": blocks,
                    "cumulative_log_p_ptr": cum_log_p,
                    **common,
                    "draft_sampled_ptr": inp["draft_sampled"],
                    "expanded_idx_mapping_ptr": inp["expanded_idx"],
                    "expanded_local_pos_ptr": inp["local"],
                    "temp_ptr": inp["temp"],
                    "vocab_size": vocab,
                    "num_speculative_steps": inp["steps"],
                    "vocab_num_blocks": blocks,
                    "BLOCK_SIZE": STATS_BLOCK,
                    "PADDED_VOCAB_NUM_BLOCKS": padded,
                },
                floats=("local_residual_mass_ptr",),
            )["local_residual_mass_ptr"]
    steps = inp["steps"]
    out = run(
        "rejection",
        (r,),
        {
            "sampled_ptr": torch.full((r, steps + 1), -2, dtype=torch.int64),
            "sampled_stride": steps + 1,
            "rejected_steps_ptr": torch.full((r,), -2, dtype=torch.int32),
            "target_rejected_logsumexp_ptr": torch.full((r,), 4.0),
            "draft_rejected_logsumexp_ptr": torch.full((r,), 4.0),
            **{k: common[k] for k in ("target_logits_ptr", "target_logits_stride")},
            "target_local_argmax_ptr": argmax,
            "target_local_argmax_stride": blocks,
            **{k: common[k] for k in list(common)[2:6]},
            "draft_sampled_ptr": inp["draft_sampled"],
            **{k: common[k] for k in list(common)[6:]},
            "cu_num_logits_ptr": inp["cu"],
            "idx_mapping_ptr": inp["idx"],
            "temp_ptr": inp["temp"],
            "seed_ptr": inp["seed"],
            "pos_ptr": inp["pos"],
            "synthetic_conditional_rates_ptr": inp["rates"],
            "cumulative_log_p_ptr": cum_log_p,
            "local_residual_mass_ptr": residual,
            "local_residual_mass_stride": blocks if residual is not None else 0,
            "vocab_num_blocks": blocks,
            "PADDED_VOCAB_NUM_BLOCKS": padded,
            "HAS_DRAFT_LOGITS": has_draft,
            "SYNTHETIC_MODE": inp["rates"] is not None,
            "USE_BLOCK_VERIFICATION": case.block,
        },
        floats=("target_rejected_logsumexp_ptr", "draft_rejected_logsumexp_ptr"),
    )
    sampled, num_sampled = out["sampled_ptr"], out["rejected_steps_ptr"]
    t_lse, d_lse = out["target_rejected_logsumexp_ptr"], out["draft_rejected_logsumexp_ptr"]

    rblocks = (vocab + RESAMPLE_BLOCK - 1) // RESAMPLE_BLOCK
    contexts = inp.get("contexts")
    key = inp.get("key", 0)
    out = run(
        "resample",
        (r, rblocks),
        {
            "resampled_local_argmax_ptr": torch.full((r, rblocks), -7, dtype=torch.int64),
            "resampled_local_argmax_stride": rblocks,
            "resampled_local_max_ptr": torch.full(
                (r, rblocks), -3.0, dtype=torch.float64 if case.fp64 else torch.float32
            ),
            "resampled_local_max_stride": rblocks,
            "target_logits_ptr": target,
            "target_logits_stride": vocab,
            "target_rejected_logsumexp_ptr": t_lse,
            "draft_logits_ptr": draft_logits,
            "draft_logits_stride_0": s0,
            "draft_logits_stride_1": s1,
            "draft_rejected_logsumexp_ptr": d_lse,
            "rejected_step_ptr": num_sampled,
            "cu_num_logits_ptr": inp["cu"],
            "expanded_idx_mapping_ptr": inp["expanded_idx"],
            "draft_sampled_ptr": inp["draft_sampled"],
            "temp_ptr": inp["temp"],
            "seed_ptr": inp["seed"],
            "pos_ptr": inp["pos"],
            "cumulative_log_p_ptr": cum_log_p,
            "contexts_ptr": contexts,
            "contexts_stride": contexts.stride(0) if contexts is not None else 0,
            "watermarking_ptr": inp.get("watermarking"),
            "watermarking_skip_mask_ptr": inp.get("skip"),
            "watermark_key_0": key & 0xFFFFFFFF,
            "watermark_key_1": key >> 32,
            "vocab_size": vocab,
            "BLOCK_SIZE": RESAMPLE_BLOCK,
            "HAS_DRAFT_LOGITS": has_draft,
            "USE_FP64": case.fp64,
            "USE_BLOCK_VERIFICATION": case.block,
            "CONTEXT_WIDTH": contexts.shape[1] if contexts is not None else 1,
            "WATERMARK": contexts is not None,
            "DEDUPLICATE_CONTEXTS": inp.get("skip") is not None,
        },
        floats=("resampled_local_max_ptr",),
    )
    rpadded = 1 << (rblocks - 1).bit_length()
    out = run(
        "insert_resampled",
        (r,),
        {
            "sampled_ptr": sampled,
            "sampled_stride": steps + 1,
            "num_sampled_ptr": num_sampled,
            "resampled_local_argmax_ptr": out["resampled_local_argmax_ptr"],
            "resampled_local_argmax_stride": rblocks,
            "resampled_local_max_ptr": out["resampled_local_max_ptr"],
            "resampled_local_max_stride": rblocks,
            "resample_num_blocks": rblocks,
            "cu_num_logits_ptr": inp["cu"],
            "expanded_idx_mapping_ptr": inp["expanded_idx"],
            "temp_ptr": inp["temp"],
            "PADDED_RESAMPLE_NUM_BLOCKS": rpadded,
        },
    )
    return out["sampled_ptr"], out["num_sampled_ptr"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c.seed}")
def test_rejection_sample_stages(case: Case) -> None:
    inp = _inputs(case)
    sampled, num_sampled = _pipeline(case, inp, compare=True)
    assert (num_sampled >= 1).all()
    for row, count in zip(sampled.tolist(), num_sampled.tolist(), strict=True):
        assert all(t >= 0 for t in row[:count])


@pytest.mark.parametrize("case", CASES[:4] + CASES[6:7], ids=lambda c: f"seed{c.seed}")
def test_rejection_sample_pipeline_on_triton(case: Case) -> None:
    inp = _inputs(case)
    expected = _pipeline(case, inp, compare=False, impl="torch")
    got = _pipeline(case, inp, compare=False, impl="triton")
    assert torch.equal(got[1], expected[1])
    assert torch.equal(got[0], expected[0])


def test_accept_uniform_is_tl_rand() -> None:
    """The Triton kernel's acceptance uniform equals the reference's (bit for bit): a greedy-free walk in
    synthetic mode accepts exactly while ``u < rate``."""
    g = torch.Generator().manual_seed(3)
    n = 8
    seed = torch.randint(-(2**62), 2**62, (n,), generator=g, dtype=torch.int64)
    pos = torch.randint(0, 2**40, (n,), generator=g, dtype=torch.int64)
    u = v2.tl_rand32_torch(seed, pos)
    assert ((u > 0) & (u < 1)).all()
    # One request per (seed, pos), one draft step, rate = u itself and its float neighbours.
    for rate, expected in ((u, 0), (torch.nextafter(u, torch.ones_like(u)), 1)):
        args = {
            "sampled_ptr": torch.full((n, 2), -2, dtype=torch.int64),
            "sampled_stride": 2,
            "rejected_steps_ptr": torch.full((n,), -2, dtype=torch.int32),
            "target_rejected_logsumexp_ptr": torch.zeros(n),
            "draft_rejected_logsumexp_ptr": torch.zeros(n),
            "target_logits_ptr": torch.zeros(2 * n, 4),
            "target_logits_stride": 4,
            "target_local_argmax_ptr": torch.zeros(2 * n, 1, dtype=torch.int64),
            "target_local_argmax_stride": 1,
            "target_local_max_ptr": torch.zeros(2 * n, 1),
            "target_local_max_stride": 1,
            "target_local_sumexp_ptr": torch.full((2 * n, 1), 4.0),
            "target_local_sumexp_stride": 1,
            "draft_sampled_ptr": torch.ones(2 * n, dtype=torch.int64),
            "draft_logits_ptr": None,
            "draft_logits_stride_0": 0,
            "draft_logits_stride_1": 0,
            "draft_local_max_ptr": torch.zeros(2 * n, 1),
            "draft_local_max_stride": 1,
            "draft_local_sumexp_ptr": torch.zeros(2 * n, 1),
            "draft_local_sumexp_stride": 1,
            "cu_num_logits_ptr": torch.arange(0, 2 * n + 1, 2, dtype=torch.int32),
            "idx_mapping_ptr": torch.arange(n, dtype=torch.int32),
            "temp_ptr": torch.ones(n),
            "seed_ptr": seed,
            "pos_ptr": torch.stack([pos, pos], 1).reshape(-1),
            "synthetic_conditional_rates_ptr": None,
            "cumulative_log_p_ptr": None,
            "local_residual_mass_ptr": None,
            "local_residual_mass_stride": 0,
            "vocab_num_blocks": 1,
            "PADDED_VOCAB_NUM_BLOCKS": 1,
            "HAS_DRAFT_LOGITS": False,
            "SYNTHETIC_MODE": True,
            "USE_BLOCK_VERIFICATION": False,
        }
        for req in range(8):  # one launch per request: the rate is per step, not per request
            one = dict(args)
            one["synthetic_conditional_rates_ptr"] = rate[req : req + 1].clone()
            one["idx_mapping_ptr"] = args["idx_mapping_ptr"][req : req + 1]
            one["cu_num_logits_ptr"] = args["cu_num_logits_ptr"][req : req + 2]
            ref = _clone(one)
            v2.rejection_torch((1,), **ref)
            triton_impl.rejection((1,), **one)
            assert int(one["rejected_steps_ptr"][0]) == expected, req
            assert torch.equal(one["rejected_steps_ptr"], ref["rejected_steps_ptr"])
